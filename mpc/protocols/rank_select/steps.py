"""The steps of the selection of the entry of rank 0 (the protocol:
:func:`mpc.protocols.rank_select.run.select_rank_zero`): the dealer's tables, each
party's masks and its lookups.

Instance: one nonce. The masks r (of the ranks) and u (of the values) are the sums of the
parties' derived words. The dealer's tables, per entry, over v in [0, 2^m):
D[v] = [(v - r) mod 2^m = 0] and U[v] = u D[v], shared additively: the parties before the
last derive theirs, the last party's are dealt (one delivery). Each party opens
c = rank + r and e = x - u, then delta = D[c mod 2^m] and delta x = e delta + U[c mod 2^m].
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.rules import OPENED, dealer_seeds, int_of, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, elementwise, numel, stream_records, tensor_elems
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
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

#: the widest rank a table covers (2^8 words an entry and table)
MAX_RANK_BITS = 8


def _check_bits(bits: Any) -> int:
    if type(bits) is not int or not 1 <= bits <= MAX_RANK_BITS:
        raise ValueError(f"ranks of 1 to {MAX_RANK_BITS} bits, got {bits!r}")
    return bits


def _entries(bits: Any) -> int:
    return 1 << bits if type(bits) is int and 1 <= bits <= MAX_RANK_BITS else 1


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rank_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.rank", nonce_of(call), int_of(call, "bits"), deliveries=1)]


def _dealer_rank_size(p: dict[str, Any]) -> int:
    """The two tables and their flat copy (4 words an entry of a table, measured at 2^17
    entries, tests/test_limits_memory.py; one party's derived table at a time comes and
    goes before the copy), and r's and u's words."""
    n = numel(p.get("shape"))
    return declared(WORD * n * (4 * _entries(p.get("bits")) + 4))


@step(rule=_dealer_rank_rule, size=_dealer_rank_size, keeps=stream_records(4), makes_material=True)
def dealer_rank_select(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int
) -> torch.Tensor:
    """The last party's shares of the tables D[v] = [(v - r) mod 2^bits = 0] and
    U[v] = u D[v] for v in [0, 2^bits), per entry (flat: D's tables, then U's, each entry's
    2^bits consecutive words), where r and u are the sums of the parties' derived masks.
    The other parties derive their shares of both, so the last party's are the tables
    minus words it cannot predict: uniform given its view."""
    bits = _check_bits(bits)
    consume(ctx, seeds, nonce, TAG_R, TAG_A, TAG_TABLE, TAG_C)
    r = sum_derived(seeds, nonce, TAG_R, shape).unsqueeze(-1)
    u = sum_derived(seeds, nonce, TAG_A, shape).unsqueeze(-1)
    v = torch.arange(1 << bits, dtype=torch.int64)
    d = ((v - r).bitwise_and_((1 << bits) - 1) == 0).to(torch.int64)
    return last_shares([d, d * u], seeds, nonce, [TAG_TABLE, TAG_C])


# -- the parties ---------------------------------------------------------------------------


def _rank_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("rank")
    call.share("x")
    return [seal("rank.c", nonce), seal("rank.e", nonce)]


@step(
    rule=_rank_mask_rule,
    size=elementwise(2, "rank"),
    keeps=stream_records(2),
    makes_material=True,
    opens={"rank.c": SUM, "rank.e": SUM},
)
def rank_mask(
    ctx: Any, seed: torch.Tensor, nonce: int, rank: torch.Tensor, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Party i: c_i = rank_i + r_i and e_i = x_i - u_i."""
    if rank.shape != x.shape:
        raise ValueError(f"ranks {list(rank.shape)} and values {list(x.shape)} differ in shape")
    consume(ctx, [seed], nonce, TAG_R, TAG_A)
    shape = list(rank.shape)
    c = derive(seed, nonce, TAG_R, shape).add_(rank)
    e = derive(seed, nonce, TAG_A, shape).neg_().add_(x)
    return c, e


def _rank_finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "tables")
    tables = call.material("tables", "dealer.rank", nonce, local=False, optional=True, consume=True)
    if tables is not None and tables.index != call.value("bits"):
        raise call.refuse(f"the dealer's tables are for {tables.index} bits")
    call.material("c", OPENED + "rank.c", nonce, local=True, consume=True)
    call.material("e", OPENED + "rank.e", nonce, local=True, consume=True)
    return None


def _rank_finish_size(p: dict[str, Any]) -> int:
    """The party's two tables (derived or dealt: 2^bits words an entry each), the indices
    and the outputs."""
    return declared(WORD * tensor_elems(p, "c") * (2 * _entries(p.get("bits")) + 5))


@step(rule=_rank_finish_rule, size=_rank_finish_size, keeps=stream_records(2))
def rank_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    tables: torch.Tensor | None,
    c: torch.Tensor,
    e: torch.Tensor,
    bits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Party i's shares of delta = [rank = 0] = D[c mod 2^bits] and of delta x =
    e delta + U[c mod 2^bits] (c = rank + r, e = x - u opened; rank in [0, 2^bits))."""
    bits = _check_bits(bits)
    consume(ctx, [seed], nonce, TAG_TABLE, TAG_C)
    if c.shape != e.shape:
        raise ValueError(f"c {list(c.shape)} and e {list(e.shape)} differ in shape")
    mine = party_tables(seed, nonce, [TAG_TABLE, TAG_C], tables, list(c.shape), bits)
    delta, selected = entries_at(mine, c, bits)
    return delta, selected.add_(delta * e)
