"""The dealer's (crypto provider's) steps: it expands every party's seed, computes the
correlated material and returns the last party's corrections (the others derive theirs).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.material import rules, sizes
from mpc.math import carry4, group4
from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.math.prg import PRG
from mpc.protocols.sizes import stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
    TAG_D,
    TAG_PAIRS,
    TAG_R,
    TAG_RBITS,
    TAG_T_ARITH,
    TAG_T_BIN,
    TAG_TRIG,
    TAG_U,
    consume,
    derive,
    stream,
    sum_derived,
)


@step(rule=rules.new_seed, size=sizes.new_seed, makes_material=True)
def new_seed(ctx: Any, index: int, parties: int) -> torch.Tensor:
    """A fresh 16-byte seed from the operating system (stored at the dealer) for party
    ``index`` of ``parties`` (its label records the party's place)."""
    return torch.tensor(list(os.urandom(16)), dtype=torch.uint8)


def trunc_correction_dtype(bits: int) -> torch.dtype:
    """The narrowest integer dtype that holds ``bits`` bits (two's complement): the dtype
    in which the dealer ships the last party's share of [D] (see :func:`dealer_trunc`)."""
    if bits <= 8:
        return torch.int8
    if bits <= 16:
        return torch.int16
    if bits <= 32:
        return torch.int32
    return torch.int64


def trunc_correction_words(numel: int, bits: int) -> int:
    """int64 words of the last party's packed truncation correction for ``numel``
    elements (see :func:`pack_trunc_correction`)."""
    narrow = numel * trunc_correction_dtype(bits).itemsize
    return numel + (narrow + 7) // 8


def pack_trunc_correction(u: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """U (int64) and the narrow s of D in one flat int64 tensor, s's bytes padded to whole
    words: the dealer's truncation correction travels as one delivery, not two."""
    raw = s.reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 8
    words = torch.cat([raw, raw.new_zeros(pad)]).view(torch.int64)
    return torch.cat([u.reshape(-1), words])


def unpack_trunc_correction(
    packed: torch.Tensor, shape: list[int], bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, s) from :func:`pack_trunc_correction`'s tensor, as views of it, in ``shape``."""
    n = 1
    for d in shape:
        n *= d
    if (
        packed.dtype != torch.int64
        or packed.dim() != 1
        or packed.numel() != trunc_correction_words(n, bits)
    ):
        raise ValueError(
            f"a truncation correction for {n} elements at {bits} bits is "
            f"{trunc_correction_words(n, bits)} int64 words, got {packed.dtype} "
            f"{list(packed.shape)}"
        )
    dtype = trunc_correction_dtype(bits)
    u = packed[:n].view(shape)
    s = packed[n:].view(torch.uint8)[: n * dtype.itemsize].view(dtype).view(shape)
    return u, s


@step(
    rule=rules.dealer_trunc, size=sizes.dealer_trunc, keeps=stream_records(3), makes_material=True
)
def dealer_trunc(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int
) -> torch.Tensor:
    """Truncation material for the mask r = sum of derived shares (see :func:`trunc_finish`):
    the last party's shares of U = -(r' >> f) - 2^(62-f) and D = 2^(64-f) (1 - msb(r')),
    where r' = r - 2^62 and f = ``bits``.

    D is a multiple of 2^(64-f), so it is shared as D_i = 2^(64-f) s_i with s_i in Z/2^f:
    party i < n-1 takes s_i from its seed (its derived word shifted left by 64 - f keeps
    the word's low f bits as the top f bits of D_i), and the last party gets only
    s_{n-1} = (1 - h) - sum_{i<n-1} s_i mod 2^f, f bits, in the narrowest dtype that holds
    them (:func:`trunc_correction_dtype`: int16 at f = 16, 2 bytes an element instead of
    8); it widens it and shifts it left by 64 - f where it uses it. Nothing leaks: s_0 is
    uniform in Z/2^f and independent of h and of the other s_i, so s_{n-1} is uniform in
    Z/2^f given everything the last party holds besides it (a one-time pad of 1 - h), and
    any n - 1 of the s_i are independent and uniform, as the full-width shares were.
    Both travel packed in one int64 tensor (:func:`pack_trunc_correction`): one delivery."""
    if type(bits) is not int or not 1 <= bits <= 62:
        raise ValueError(f"a truncation drops 1 to 62 bits, got {bits!r}")
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_D)
    r = sum_derived(seeds, nonce, TAG_R, shape).sub_(1 << 62)
    d = (r >> 63).add_(1)  # s = 1 - h, in Z/2^f
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    for s in seeds[:-1]:
        u -= derive(s, nonce, TAG_U, shape)
        d -= derive(s, nonce, TAG_D, shape)
    # s_{n-1} mod 2^f as a signed f-bit value (sign-extended from bit f - 1): it fits the
    # narrow dtype exactly, and widened and shifted left by 64 - f it is D_{n-1} mod 2^64
    d = d.bitwise_left_shift_(64 - bits).bitwise_right_shift_(64 - bits)
    return pack_trunc_correction(u, d.to(trunc_correction_dtype(bits)))


# the most values one comparison selects (:func:`mpc.protocols.compare.select_by_msb`)
MAX_SELECTED = 16


@step(
    rule=rules.dealer_compare,
    size=sizes.dealer_compare,
    keeps=sizes.dealer_compare_keeps,
    makes_material=True,
)
def dealer_compare(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    shape: list[int],
    level_nonces: list[int],
    product_nonces: list[int],
    group_nonce: int | None = None,
) -> torch.Tensor:
    """Comparison material, the last party's part as one flat tensor (one delivery): its
    binary share of r (arithmetic, derived by all), its arithmetic and binary shares of a
    random bit t (a "daBit"), its XOR share of the products of ~r's bits within each group
    of four that make the radix-4 carry tree's level 0 local (packed, over the padded
    element count; :mod:`mpc.math.carry4`), then per other level (``level_nonces``: one
    each, levels 1 and 2) its share of the products of the level's masks (the masks a are
    derived by every party), then per ``product_nonces`` entry its share of c = a t, a
    derived by every party: the pair (a, c) turns a product [v t] into one opening of
    e = v - a (see :func:`~mpc.material.party.dabit_product`). With ``group_nonce`` the
    comparison is the six pairs of groups of four (``shape`` [G, 6]) and last come its
    shares of the daBits' products and of their products with the groups' masks
    (:mod:`mpc.math.group4`; see :func:`~mpc.material.party.group_select`)."""
    check_selection(shape, product_nonces, group_nonce)
    if not (
        isinstance(level_nonces, list)
        and len(level_nonces) == carry4.LEVELS - 1
        and all(type(v) is int for v in level_nonces)
    ):
        raise ValueError(
            f"a comparison takes {carry4.LEVELS - 1} level nonces, got {level_nonces!r}"
        )
    consume(ctx, seeds, nonce, TAG_R, TAG_RBITS, TAG_T_ARITH, TAG_T_BIN, TAG_PAIRS)
    r = sum_derived(seeds, nonce, TAG_R, shape)
    r_bits = r.clone()
    for s in seeds[:-1]:
        r_bits ^= derive(s, nonce, TAG_RBITS, shape)
    t = PRG(os.urandom(16)).int64(tuple(shape)) & 1
    t_arith = t.clone()
    t_bin = t.clone()
    for s in seeds[:-1]:
        t_arith -= derive(s, nonce, TAG_T_ARITH, shape)
        t_bin ^= derive(s, nonce, TAG_T_BIN, shape) & 1
    y = ~r.reshape(-1)
    words = carry4.padded(y.numel())
    y = torch.cat([y, y.new_zeros(words - y.numel())])
    parts = [r_bits.reshape(-1), t_arith.reshape(-1), t_bin.reshape(-1)]
    mono = torch.stack(carry4.bit_monomials(y))  # bit planes: every bit is used
    for s in seeds[:-1]:
        mono ^= derive(s, nonce, TAG_PAIRS, list(mono.shape))
    parts.append(mono.reshape(-1))
    count = len(carry4.VARS)
    for level, level_nonce in enumerate(level_nonces, start=1):
        consume(ctx, seeds, level_nonce, TAG_A, TAG_C)
        w = carry4.words(words, level)
        packed = derive(seeds[0], level_nonce, TAG_A, [carry4.packed_words(count), w])
        for s in seeds[1:]:  # every party's masks (the last party's too: it derives its own)
            packed ^= derive(s, level_nonce, TAG_A, list(packed.shape))
        products = carry4.mask_monomials(carry4.unpack(packed, count, level))
        parts.append(_last_share(seeds, level_nonce, TAG_C, products, level))
    parts += selection_material(ctx, seeds, t, shape, product_nonces, group_nonce)
    return torch.cat(parts)


def check_selection(shape: list[int], product_nonces: Any, group_nonce: Any) -> None:
    """A comparison's selections: at most :data:`MAX_SELECTED` products (an int nonce
    each), and a group nonce only for the six pairs of groups of four ([G, 6]), or the six
    pairs and the four values of a max after a ReLU ([G, 10])."""
    if group_nonce is not None and (
        type(group_nonce) is not int
        or len(shape) != 2
        or shape[-1] not in (group4.PLAIN, group4.RELU)
    ):
        raise ValueError(
            "a comparison of groups of four takes an int nonce and a [G, 6] or [G, 10] shape"
        )
    if not (
        isinstance(product_nonces, list)
        and len(product_nonces) <= MAX_SELECTED
        and all(type(v) is int for v in product_nonces)
    ):
        raise ValueError(
            f"a comparison selects at most {MAX_SELECTED} values, one nonce each, "
            f"got {product_nonces!r}"
        )


def selection_material(
    ctx: Any,
    seeds: list[torch.Tensor],
    t: torch.Tensor,
    shape: list[int],
    product_nonces: list[int],
    group_nonce: int | None,
) -> list[torch.Tensor]:
    """The last party's shares of what a comparison's selections ride on, given the daBits
    ``t``: per product nonce c = a t (a derived by every party), and for groups of four
    the daBits' products and their products with the groups' masks (flat tensors)."""
    parts = []
    for product_nonce in product_nonces:
        consume(ctx, seeds, product_nonce, TAG_A, TAG_C)
        c = sum_derived(seeds, product_nonce, TAG_A, shape).mul_(t)
        for s in seeds[:-1]:
            c -= derive(s, product_nonce, TAG_C, shape)
        parts.append(c.reshape(-1))
    if group_nonce is not None:
        consume(ctx, seeds, group_nonce, TAG_A, TAG_C, TAG_U)
        groups = shape[0]
        alpha = sum_derived(seeds, group_nonce, TAG_A, [groups, 4])
        tt, at = group4.dealer_monomials(t.view(groups, shape[1]), alpha)
        for s in seeds[:-1]:
            tt -= derive(s, group_nonce, TAG_C, list(tt.shape))
            at -= derive(s, group_nonce, TAG_U, list(at.shape))
        parts += [tt.reshape(-1), at.reshape(-1)]
    return parts


def _last_share(
    seeds: list[torch.Tensor], nonce: int, tag: int, values: list[torch.Tensor], level: int
) -> torch.Tensor:
    """The last party's XOR share of aligned ``values``, packed flat: the others derive
    theirs as packed random words (:func:`mpc.math.carry4.unpack` aligns them)."""
    out = carry4.pack(values, level)  # (packing is linear: the others' shares are packed)
    for s in seeds[:-1]:
        share = derive(s, nonce, tag, list(out.shape))
        out ^= carry4.pack(carry4.unpack(share, len(values), level), level)
    return out.reshape(-1)


@step(
    rule=rules.dealer_fourier,
    size=sizes.dealer_fourier,
    keeps=stream_records(2),
    makes_material=True,
)
def dealer_fourier(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int, terms: int,
    scale: int, single: bool,
) -> torch.Tensor:  # fmt: skip
    """Material of a trigonometric series (see :func:`~mpc.material.party.fourier_finish`):
    the mask r (arithmetic, derived by all), and cos(k theta), sin(k theta) for k = 1..K
    at ``scale`` fractional bits, theta = 2 pi (r mod 2^bits) / 2^bits, shared additively:
    the last party's shares, shape [K, *shape, 2] (cos, sin pairs). ``single``: computed
    in float32 (the values then carry about 1e-6 of rounding)."""
    check_series_params(bits, terms, scale, single)
    consume(ctx, seeds, nonce, TAG_R, TAG_TRIG)
    r = sum_derived(seeds, nonce, TAG_R, shape)
    angle = ring_angle(r, bits, torch.float32 if single else torch.float64)
    out = torch.empty([terms, *shape, 2], dtype=torch.int64)
    others = [stream(s, nonce, TAG_TRIG) for s in seeds[:-1]]  # their shares, harmonic by
    for k, h in enumerate(harmonic_steps(angle, terms)):  # harmonic (no K-sized temporary)
        piece = out[k]
        piece.copy_(torch.view_as_real(h).mul(2.0**scale).round_())
        for other in others:
            piece -= other.int64(piece.shape)
    return out
