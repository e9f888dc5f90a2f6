"""The steps of an authenticated truncation (the protocol:
:func:`mpc.protocols.auth_truncation.run.auth_truncate`): the dealer's authenticated
truncation pair, each party's mask and its finish.

Truncation with known MSB, as the semi-honest one (:mod:`mpc.protocols.truncation`), on
the value's low 64 bits: for |z| < 2^62 let Z = z + 2^62 in [0, 2^63). The dealer deals
authenticated r (uniform in Z/2^128; write its low 64 bits r = 2^63 r_h + r_l), U = r_l >>
f and H = r_h. The parties open c = z + 2^62 + r (all 128 bits, checked) and read its low
64 bits c = 2^63 c_h + c_l: since Z + r_l < 2^64, Z = c_l - r_l + 2^63 (c_h xor r_h), so

    [z >> f] = (c_l >> f) - 2^(62-f) + 2^(63-f) c_h - [U] + (1 - 2 c_h) 2^(63-f) [H],

linear in the dealt values with public coefficients: the MACs follow (a truncation local
to the shares would break them). The result is floor(z / 2^f) or one more, with no wrap
failure. The value's high 64 bits play no part: an error there, which the MAC check lets
through (it vouches for the low 64 bits), cannot reach the low bits.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.protocols.auth_shares.steps import (
    OPENED,
    TAG_TRUNC_H,
    TAG_TRUNC_R,
    TAG_TRUNC_U,
    VM,
    alpha_of,
    deal_value,
    kept_share,
    key_of,
    masked_opening_rule,
    pack,
    party_value,
    share_elems,
    unpack,
    with_public,
)
from mpc.protocols.rules import dealer_seeds, int_of, nonce_of, party_seed
from mpc.protocols.sizes import SLACK, numel, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume
from pointers.worker.sealing import ProtocolCall, seal

UH = "auth.trunc.uh"
_LOW63 = (1 << 63) - 1


def correction_words(n: int) -> int:
    """int64 words of the last party's correction for ``n`` elements."""
    return 8 * n


def _bits(call: ProtocolCall) -> int:
    bits = int_of(call, "bits")
    if not 1 <= bits <= 62:
        raise call.refuse("a truncation takes 1 to 62 bits")
    return bits


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    _bits(call)
    numel(call.value("shape"))
    return [seal("auth.trunc", nonce_of(call), deliveries=1)]


def _dealer_size(p: dict[str, Any]) -> int:
    n = max(len(p.get("seeds") or []), 2)
    return (n + 6) * 3 * VM * numel(p.get("shape")) + SLACK


@step(rule=_dealer_rule, size=_dealer_size, keeps=stream_records(3), makes_material=True)
def dealer_auth_trunc(
    ctx: Any,
    seeds: list[torch.Tensor],
    alpha: torch.Tensor,
    nonce: int,
    shape: list[int],
    bits: int,
) -> torch.Tensor:
    """An authenticated truncation pair: r, U = (r mod 2^63) >> bits and H = msb(r) (of
    r's low 64 bits); the last party's corrections, packed."""
    consume(ctx, seeds, nonce, TAG_TRUNC_R, TAG_TRUNC_U, TAG_TRUNC_H)
    (r_mac,), r = deal_value(seeds, nonce, TAG_TRUNC_R, shape, alpha)
    low = r[0]
    u_parts, _ = deal_value(seeds, nonce, TAG_TRUNC_U, shape, alpha, (low & _LOW63) >> bits)
    h_parts, _ = deal_value(seeds, nonce, TAG_TRUNC_H, shape, alpha, (low < 0).to(torch.int64))
    return pack([r_mac, *u_parts, *h_parts])


# -- the parties ---------------------------------------------------------------------------


_mask_rule = masked_opening_rule(
    "trunc", "auth.trunc", UH, check=_bits, extra=lambda call: (call.value("bits"),)
)


@step(rule=_mask_rule, size=lambda p: 12 * VM * share_elems(p, "z") + SLACK,
      keeps=stream_records(3), makes_material=True)  # fmt: skip
def auth_trunc_mask(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    z: torch.Tensor,
    bits: int,
    corr: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Party i's piece of c = z + 2^62 + r (to open) and its MAC share, and its shares of
    U and H (kept for the finish)."""
    consume(ctx, [seed], nonce, TAG_TRUNC_R, TAG_TRUNC_U, TAG_TRUNC_H)
    shape = list(z.shape[2:])
    n = z.numel() // 4
    r_mac = u_word = u_mac = h_word = h_mac = None
    if corr is not None:
        r_mac, u_word, u_mac, h_word, h_mac = unpack(corr, [2 * n, n, 2 * n, n, 2 * n])
    r = party_value(seed, nonce, TAG_TRUNC_R, shape, mac=r_mac)
    u = party_value(seed, nonce, TAG_TRUNC_U, shape, word=u_word, mac=u_mac)
    h = party_value(seed, nonce, TAG_TRUNC_H, shape, word=h_word, mac=h_mac)
    c = with_public(r128.add(z, r), key, first, r128.const(1 << 62, r[:, 0]))
    return [c[:, 0].contiguous(), c[:, 1].contiguous(), torch.stack([u, h])]


def _finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    key = key_of(call)
    uh = call.material("uh", UH, nonce, local=True, consume=True)
    call.material("c", OPENED + "trunc", nonce, local=True, consume=True)
    assert uh is not None
    if uh.extra != (key.nonce, call.value("bits")):
        raise call.refuse("the truncation pair was made for another key or another truncation")
    return [kept_share(key.nonce)]


@step(rule=_finish_rule, size=lambda p: 16 * VM * share_elems(p, "uh") // 2 + SLACK,
      makes_material=True)  # fmt: skip
def auth_trunc_finish(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    c: torch.Tensor,
    uh: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """Party i's authenticated share of z >> bits (see the module docstring)."""
    low = c[0]
    high = (low < 0).to(torch.int64)
    public = ((low & _LOW63) >> bits) - (1 << (62 - bits)) + (high << (63 - bits))
    coef = (1 - 2 * high) << (63 - bits)
    out = r128.sub(r128.mul(r128.lift(coef).unsqueeze(1), uh[1]), uh[0])
    return with_public(out, key, first, r128.lift(public))
