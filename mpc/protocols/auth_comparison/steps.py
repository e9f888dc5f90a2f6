"""The steps of an authenticated comparison with zero (the protocol:
:func:`mpc.protocols.auth_comparison.run.auth_ltz`): the dealer's authenticated random
bits, each party's mask, and its leaves of the borrow tree.

For |z| < 2^62 (its low 64 bits read signed) let Z = z + 2^62, in [0, 2^63): z < 0 exactly
when bit 62 of Z is 0. The dealer deals authenticated bits b_0..b_62 (each a value in
{0, 1}, with its MAC) and an authenticated R uniform in Z/2^128; the parties form
r = sum_i 2^i b_i + 2^63 R (uniform in Z/2^128: linear, so the MACs follow) and open
c = z + 2^62 + r (all 128 bits, checked). Since Z < 2^63, Z = (c - r) mod 2^63, and

    bit 62 of Z = c_62 xor b_62 xor u,    u = [c mod 2^62 < r mod 2^62],

the borrow out of the low 62 bits. With c public, the leaves of u's tree are linear in
the bits: g_i = (1 - c_i) b_i (r exceeds c at bit i) and p_i = 1 - (c_i xor b_i) (they
agree at bit i); the tree (:mod:`mpc.protocols.auth_comparison.run`) combines them with
authenticated products, (g, p) o (g', p') = (g + p g', p p'), into u = g of the root.

Only the low 64 bits of any value play a part: an error in a value's high bits, which
the MAC check lets through (it vouches for the low 64 bits), is a multiple of 2^64 and
stays one through every product, so it never reaches a bit.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.math.prg import PRG
from mpc.protocols.auth_shares.steps import (
    OPENED,
    TAG_CMP_BITS,
    TAG_CMP_R,
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
from mpc.protocols.rules import dealer_seeds, nonce_of, party_seed
from mpc.protocols.sizes import SLACK, numel, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume
from pointers.worker.sealing import ProtocolCall, seal

BITS = 63  # the dealt bits b_0..b_62 of r (mod 2^63)
LEAVES = BITS - 1  # the leaves of the borrow tree (bits 0..61)
KIND = "auth.cmp"  # the dealer's corrections
KEPT = "auth.cmp.bits"  # a party's shares of the bits, kept for its leaves


def correction_words(n: int) -> int:
    """int64 words of the last party's correction for ``n`` elements (per bit its low
    word and MAC; R's MAC)."""
    return (3 * BITS + 2) * n


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    numel(call.value("shape"))
    return [seal(KIND, nonce_of(call), deliveries=1)]


def _dealer_size(p: dict[str, Any]) -> int:
    n = max(len(p.get("seeds") or []), 2)
    return (n + 6) * (BITS + 1) * VM * numel(p.get("shape")) + SLACK


@step(rule=_dealer_rule, size=_dealer_size, keeps=stream_records(2), makes_material=True)
def dealer_auth_cmp(
    ctx: Any, seeds: list[torch.Tensor], alpha: torch.Tensor, nonce: int, shape: list[int]
) -> torch.Tensor:
    """Authenticated random bits b_0..b_62 (shape ``(*shape, 63)``) and an authenticated
    uniform R: the last party's corrections, packed."""
    consume(ctx, seeds, nonce, TAG_CMP_BITS, TAG_CMP_R)
    bits = PRG(os.urandom(16)).int64((*shape, BITS)) & 1
    b_parts, _ = deal_value(seeds, nonce, TAG_CMP_BITS, [*shape, BITS], alpha, bits)
    (r_mac,), _ = deal_value(seeds, nonce, TAG_CMP_R, shape, alpha)
    return pack([*b_parts, r_mac])


# -- the parties ---------------------------------------------------------------------------


_mask_rule = masked_opening_rule("cmp", KIND, KEPT)


def _mask_size(p: dict[str, Any]) -> int:
    return 8 * (BITS + 1) * VM * share_elems(p, "z") + SLACK


@step(rule=_mask_rule, size=_mask_size, keeps=stream_records(2), makes_material=True)
def auth_cmp_mask(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    z: torch.Tensor,
    corr: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Party i's piece of c = z + 2^62 + r (to open) and its MAC share, and its shares of
    the bits (kept for its leaves)."""
    consume(ctx, [seed], nonce, TAG_CMP_BITS, TAG_CMP_R)
    shape = list(z.shape[2:])
    n = z.numel() // 4
    b_word = b_mac = r_mac = None
    if corr is not None:
        b_word, b_mac, r_mac = unpack(corr, [BITS * n, 2 * BITS * n, 2 * n])
    bits = party_value(seed, nonce, TAG_CMP_BITS, [*shape, BITS], word=b_word, mac=b_mac)
    big = party_value(seed, nonce, TAG_CMP_R, shape, mac=r_mac)
    r = r128.sum128(r128.shl(bits, torch.arange(BITS)), dim=-1)  # sum_i 2^i b_i
    r128.add_(r, r128.mul64(big, 1 << 63))
    c = with_public(r128.add(z, r), key, first, r128.const(1 << 62, r[:, 0]))
    return [c[:, 0].contiguous(), c[:, 1].contiguous(), bits]


def _leaves_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    key = key_of(call)
    bits = call.material("bits", KEPT, nonce, local=True, consume=True)
    call.material("c", OPENED + "cmp", nonce, local=True, consume=True)
    assert bits is not None
    if bits.extra != (key.nonce,):
        raise call.refuse("the comparison's bits were made for another key")
    return [kept_share(key.nonce), kept_share(key.nonce)]


@step(rule=_leaves_rule, size=lambda p: 10 * VM * share_elems(p, "bits") + SLACK,
      makes_material=True)  # fmt: skip
def auth_cmp_leaves(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    c: torch.Tensor,
    bits: torch.Tensor,
) -> list[torch.Tensor]:
    """Party i's leaves of the borrow tree, ``[g | p]`` of shape ``(2, 2, *S, 2, 62)``,
    and its share of c_62 xor b_62 (see the module docstring)."""
    if c.dim() < 1 or c.shape[0] != 2 or tuple(bits.shape[2:-1]) != tuple(c.shape[1:]):
        raise ValueError(f"an opened c of {list(c.shape)} for bits of {list(bits.shape)}")
    cb = (c[0].unsqueeze(-1) >> torch.arange(BITS)) & 1  # c's low bits, (*S, 63)
    low, top = bits[..., :LEAVES], bits[..., LEAVES]
    c_low, c_top = cb[..., :LEAVES], cb[..., LEAVES]
    g = low * (1 - c_low)  # (a share times 0 or 1: both limbs, value and MAC)
    # p = 1 - (c xor b): b where c is 1, else 1 - b
    p = with_public(torch.where(c_low.bool(), low, r128.neg(low)), key, first, r128.lift(1 - c_low))
    # c_62 xor b_62: 1 - b_62 where c_62 is 1, else b_62
    x = with_public(torch.where(c_top.bool(), r128.neg(top), top), key, first, r128.lift(c_top))
    return [torch.stack([g, p], dim=-2), x]
