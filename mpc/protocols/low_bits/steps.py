"""The steps of the low bits of a shared value (the protocol:
:func:`mpc.protocols.low_bits.run.low_bits`): the dealer's table, each party's mask and
its lookup.

Instance: one nonce. The mask r is the sum of the parties' derived words; the dealer's
table T[v] = (v - r) mod 2^m, v in [0, 2^m), is shared additively: the parties before the
last derive theirs, the last party's is dealt (one delivery). Each party masks z with its
r_i (c = z + r, opened), then takes its table's entry at c mod 2^m.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.rules import OPENED, dealer_seeds, int_of, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, elementwise, numel, stream_records, tensor_elems
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_R,
    TAG_TABLE,
    consume,
    derive,
    entries_at,
    last_shares,
    party_tables,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

#: the widest low part a table covers (2^20 words an element: 8 MiB)
MAX_LOW_BITS = 20


def _check_bits(bits: Any) -> int:
    if type(bits) is not int or not 1 <= bits <= MAX_LOW_BITS:
        raise ValueError(f"the low bits are 1 to {MAX_LOW_BITS} bits, got {bits!r}")
    return bits


# -- the dealer ----------------------------------------------------------------------------


def _dealer_low_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.low", nonce_of(call), int_of(call, "bits"), deliveries=1)]


def _dealer_low_size(p: dict[str, Any]) -> int:
    """The table and one party's derived table at a time: 2 words an entry (2^bits
    entries an element; 1.99-2.06 measured at 2^20 entries, tests/test_limits_memory.py),
    and r's words."""
    bits = p.get("bits")
    entries = 1 << bits if type(bits) is int and 1 <= bits <= MAX_LOW_BITS else 1
    n = numel(p.get("shape"))
    return declared(WORD * n * (2 * entries + 2))


@step(rule=_dealer_low_rule, size=_dealer_low_size, keeps=stream_records(2), makes_material=True)
def dealer_low_bits(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int
) -> torch.Tensor:
    """The last party's share of the table T[v] = (v - r) mod 2^bits for v in
    [0, 2^bits), per element (flat: the element's table is 2^bits consecutive words),
    where r = sum of the parties' derived masks. The other parties derive their shares of
    T, so the last party's is T minus words it cannot predict: uniform given its view."""
    bits = _check_bits(bits)
    consume(ctx, seeds, nonce, TAG_R, TAG_TABLE)
    r = sum_derived(seeds, nonce, TAG_R, shape).unsqueeze(-1)
    v = torch.arange(1 << bits, dtype=torch.int64)
    table = (v - r).bitwise_and_((1 << bits) - 1)
    return last_shares([table], seeds, nonce, [TAG_TABLE])


# -- the parties ---------------------------------------------------------------------------


def _low_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("z")
    return [seal("low.c", nonce)]


@step(
    rule=_low_mask_rule,
    size=elementwise(1, "z"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"low.c": SUM},
)
def low_mask(ctx: Any, seed: torch.Tensor, nonce: int, z: torch.Tensor) -> torch.Tensor:
    """Party i: c_i = z_i + r_i."""
    consume(ctx, [seed], nonce, TAG_R)
    return derive(seed, nonce, TAG_R, list(z.shape)).add_(z)


def _low_finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "table")
    table = call.material("table", "dealer.low", nonce, local=False, optional=True, consume=True)
    if table is not None and table.index != call.value("bits"):
        raise call.refuse(f"the dealer's table is for {table.index} bits")
    call.material("c", OPENED + "low.c", nonce, local=True, consume=True)
    return None


def _low_finish_size(p: dict[str, Any]) -> int:
    """The party's table (derived or dealt: 2^bits words an element), the index and the
    entries."""
    bits = p.get("bits")
    entries = 1 << bits if type(bits) is int and 1 <= bits <= MAX_LOW_BITS else 1
    return declared(WORD * tensor_elems(p, "c") * (entries + 3))


@step(rule=_low_finish_rule, size=_low_finish_size, keeps=stream_records(1))
def low_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    table: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """Party i's share of z mod 2^bits from the opened c = z + r: its share of the
    table's entry at c mod 2^bits, T[c mod 2^bits] = (c - r) mod 2^bits = z mod 2^bits
    (2^bits divides the ring's 2^64)."""
    bits = _check_bits(bits)
    consume(ctx, [seed], nonce, TAG_TABLE)
    mine = party_tables(seed, nonce, [TAG_TABLE], table, list(c.shape), bits)
    return entries_at(mine, c, bits)[0]
