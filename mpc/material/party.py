"""The parties' steps of the protocols in :mod:`mpc.protocols` (one function per step,
run where the shares live; the party's own seed gives its share of the dealer's material).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.material import rules, sizes
from mpc.material.dealer import unpack_trunc_correction
from mpc.math import carry4, group4
from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.math.prg import PRG, SEED_BYTES
from mpc.protocols.opening.steps import open_pieces, split
from mpc.protocols.sizes import INPUT_SEED_BYTES, elementwise, fixed, stream_records
from mpc.protocols.step import SUM, XOR, step
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
)
from pointers.errors import LimitExceeded, NotAllowedError


@step(
    rule=rules.party_derive,
    size=sizes.derive,
    keeps=stream_records(1),
    makes_material=True,
    name="mpc.derive",
)
def party_derive(ctx: Any, seed: torch.Tensor, nonce: int, tag: int, shape: list[int]) -> Any:
    """The party's share of the dealer's material ``(nonce, tag)`` (e.g. a daBit's [t])."""
    consume(ctx, [seed], nonce, tag)
    return derive(seed, nonce, tag, shape)


@step(
    rule=rules.trunc_mask,
    size=elementwise(3, "z"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"trunc.c": SUM},
)
def trunc_mask(ctx: Any, seed: torch.Tensor, nonce: int, z: torch.Tensor) -> torch.Tensor:
    """Party i: c_i = z_i + r_i."""
    consume(ctx, [seed], nonce, TAG_R)
    return derive(seed, nonce, TAG_R, list(z.shape)).add_(z)


@step(rule=rules.trunc_finish, size=elementwise(5, "c"), keeps=stream_records(2))
def trunc_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    corrections: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """Party i's share of z >> bits from the opened c = z + r = (z + 2^62) + r'.

    With w = z + 2^62 (in [0, 2^63) for |z| < 2^62), h = msb(r') and b = msb(c) xor h,
    the carry out of the low 63 bits of w + r': w = (c mod 2^63) - (r' mod 2^63) + 2^63 b.
    Shifting by f (floor(A / 2^f) - floor(B / 2^f) is floor((A - B) / 2^f) or one more)
    and writing x mod 2^63 >> f = (x >> f) + 2^(63-f) msb(x) for the arithmetic shift:
    z >> f ~ (c >> f) - (r' >> f) - 2^(62-f) + 2^(63-f) (msb(c) - h + b)
           = (c >> f) + U + msb(c) D,
    since msb(c) - h + b = 2 msb(c) (1 - h). The public msb(c) selects [D] or 0, so:
    [z >> f] = [U] + ([D] & (c >> 63)) (+ c >> f at party 0).

    D's shares are D_i = 2^(64-f) s_i (see :func:`~mpc.material.dealer.dealer_trunc`):
    s_i is the derived word (its low f bits count) here, the dealer's narrow correction
    s_{n-1} (f bits, int16 at f = 16) at the last party, packed with its U in one tensor
    (:func:`~mpc.material.dealer.pack_trunc_correction`); both are shifted left by 64 - f.
    """
    consume(ctx, [seed], nonce, TAG_U, TAG_D)
    if corrections is None:
        u = derive(seed, nonce, TAG_U, list(c.shape))
        s = derive(seed, nonce, TAG_D, list(c.shape))
    else:
        u, s = unpack_trunc_correction(corrections, list(c.shape), bits)
        s = s.to(torch.int64)  # widen the dealer's f-bit s_{n-1}
    d = s.bitwise_left_shift_(64 - bits)  # D_i = 2^(64-f) s_i
    u += d.bitwise_and_(c >> 63)  # c >> 63: all ones where msb(c) = 1, else 0
    if first:  # c is the opened copy, this call's own
        u += c.bitwise_right_shift_(bits)
    return u


# -- trigonometric series, party side -------------------------------------------------


@step(rule=rules.fourier_finish, size=sizes.fourier_finish, keeps=stream_records(1))
def fourier_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    trig: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
    const: float,
    cos: list[float],
    sin: list[float],
    coef_bits: int,
    scale: int,
    single: bool,
) -> torch.Tensor:
    """Party i's share of F(x) = const + sum_k a_k cos(k alpha) + b_k sin(k alpha), alpha =
    2 pi (x mod 2^bits) / 2^bits, at ``coef_bits + scale`` fractional bits, from the opened
    c = x + r. With phi the angle of c and theta that of r, alpha = phi - theta, and
    a cos(k alpha) + b sin(k alpha) = Re[(a - i b) e^(i k phi) e^(-i k theta)]
                                    = P cos k theta + Q sin k theta
    for P + i Q = (a - i b) e^(i k phi): public coefficients (encoded at ``coef_bits``)
    times the shares of cos k theta and sin k theta (``trig``, shape [K, *x.shape, 2]: the
    dealer's at the last party; derived elsewhere). Local. ``single``: the trigonometry in
    float32 (about 2.5 times faster; see :class:`mpc.math.fourier.Series`)."""
    terms = len(sin)
    check_series_params(bits, terms, scale, single)
    if len(cos) != terms or type(coef_bits) is not int or not 8 <= coef_bits <= 30:
        raise ValueError("a series needs as many cosine as sine terms and 8-30 coefficient bits")
    if not all(math.isfinite(v) and abs(v) <= 2.0**20 for v in [const, *cos, *sin]):
        raise ValueError("a series' coefficients must be finite, at most 2^20 in magnitude")
    consume(ctx, [seed], nonce, TAG_TRIG)
    piece = [*c.shape, 2]  # one harmonic's (cos, sin) pairs
    pieces = stream(seed, nonce, TAG_TRIG)  # (read only where the dealer sent none)
    if trig is not None and list(trig.shape) != [terms, *piece]:
        raise ValueError(f"series material of shape {list(trig.shape)} for {list(c.shape)}")
    real = torch.float32 if single else torch.float64
    g = torch.complex(torch.tensor(cos, dtype=real), -torch.tensor(sin, dtype=real))
    g = g.mul_(2.0**coef_bits).view([terms] + [1] * c.dim())
    # one harmonic at a time, into one buffer: a [K, *c.shape, 2] temporary (63 MB for
    # GELU's 10 harmonics at (1, 128, 3072)) cost more in page faults than in arithmetic
    out = torch.zeros(c.shape, dtype=torch.int64)
    buf = torch.empty(piece, dtype=torch.int64)
    for k, h in enumerate(harmonic_steps(ring_angle(c, bits, real), terms)):
        buf.copy_(torch.view_as_real(h * g[k]).round_())
        buf.mul_(pieces.int64(piece) if trig is None else trig[k])
        out += buf[..., 0]
        out += buf[..., 1]
    if first:
        out += round(const * 2.0 ** (coef_bits + scale))
    return out


# -- comparison (MSB extraction), party side ---------------------------------------------


@step(
    rule=rules.cmp_mask,
    size=elementwise(3, "x"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"cmp.c": SUM},
)
def cmp_mask(ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor) -> torch.Tensor:
    """c_i = x_i + r_i: the party's share of x masked by the dealer's r."""
    consume(ctx, [seed], nonce, TAG_R)
    return x + derive(seed, nonce, TAG_R, list(x.shape))


@step(rule=rules.cmp_init, size=sizes.comparison_step, keeps=stream_records(4), makes_material=True)
def cmp_init(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    r_bits: torch.Tensor | None,
    monomials: torch.Tensor | None,
    c: torch.Tensor,
    next_nonce: int,
) -> list[torch.Tensor]:
    """XOR shares of the generate/propagate words of c + ~r + 1 (that is c - r) with the
    carry-in folded into bit 0 and bit 63 set to propagate, after the radix-4 carry tree's
    level 0, which is local here given the dealer's products of ~r's bits within each
    group of four (``monomials``: the last party's, as bit planes; derived elsewhere; see
    :mod:`mpc.math.carry4`); the party's XOR share of msb(c) ^ msb(~r); and level 1's
    operands masked for its multi-input ANDs with the masks of ``next_nonce``
    (:func:`_mask_level`)."""
    consume(ctx, [seed], nonce, TAG_RBITS, TAG_PAIRS)
    y = derive(seed, nonce, TAG_RBITS, list(c.shape)) if r_bits is None else r_bits
    if first:
        y = ~y
    top = (y >> 63) & 1
    if first:
        top ^= (c >> 63) & 1
    n = c.numel()
    words = carry4.padded(n)
    want = [len(carry4.BIT_MONOMIALS), words // 4]
    if monomials is None:
        monomials = derive(seed, nonce, TAG_PAIRS, want)
    if monomials.numel() != want[0] * want[1]:
        raise ValueError(f"bit products of {monomials.numel()} words for {n} elements")
    cw, yw = c.reshape(-1), y.reshape(-1)
    if words > n:
        cw = torch.cat([cw, cw.new_zeros(words - n)])
        yw = torch.cat([yw, yw.new_zeros(words - n)])
    g, p = carry4.level0(cw, yw, list(monomials.view(want).unbind(0)), first)
    return [g, p, top, *_mask_level(ctx, seed, next_nonce, g, p, 1)]


def _mask_level(
    ctx: Any, seed: torch.Tensor, nonce: int, g: torch.Tensor, p: torch.Tensor, level: int
) -> list[torch.Tensor]:
    """A carry-tree level's operands (:data:`mpc.math.carry4.VARS`) masked with the random
    bits a of ``nonce``: e = x ^ a packed flat (opened as one value), and a packed."""
    if type(level) is not int or not 1 <= level < carry4.LEVELS:
        raise ValueError(f"a carry-tree level is 1 to {carry4.LEVELS - 1}, got {level!r}")
    consume(ctx, [seed], nonce, TAG_A)
    count = len(carry4.VARS)
    a = derive(seed, nonce, TAG_A, [carry4.packed_words(count), g.shape[0]])
    masks = carry4.unpack(a, count, level)
    e = carry4.pack([x ^ m for x, m in zip(carry4.operands(g, p, level), masks)], level)
    return [e.reshape(-1), a.reshape(-1)]


@step(
    rule=rules.carry_step, size=sizes.comparison_step, keeps=stream_records(3), makes_material=True
)
def carry_step(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    c: torch.Tensor | None,
    a: torch.Tensor,
    ef_pieces: list[torch.Tensor],
    g: torch.Tensor,
    p: torch.Tensor,
    level: int,
    next_nonce: int | None,
) -> list[torch.Tensor]:
    """Finish one carry-tree level's multi-input ANDs from the masked operands e, opened
    here as the XOR of ``ef_pieces`` (this party's share and the ones the others sent it: no
    separate opening step), with this party's masks ``a`` and its shares of the masks'
    products (``c``: the dealer's, packed, at the last party; derived elsewhere): the next
    (G, P) (:func:`mpc.math.carry4.combine`); and, but after the last level, the next
    level's masked operands (:func:`_mask_level` with ``next_nonce``)."""
    ef = open_pieces(ef_pieces, xor=True)
    if type(level) is not int or not 1 <= level < carry4.LEVELS:
        raise ValueError(f"a carry-tree level is 1 to {carry4.LEVELS - 1}, got {level!r}")
    last = level == carry4.LEVELS - 1
    if (next_nonce is None) != last:
        raise ValueError("a next nonce is given for every carry-tree level but the last")
    w = g.shape[0]
    count, n_mono = len(carry4.VARS), len(carry4.MONOMIALS)
    shape_e = [carry4.packed_words(count), w]
    if ef.numel() != shape_e[0] * w or a.numel() != shape_e[0] * w:
        raise ValueError("the opened operands and the masks must be two packed words per word")
    consume(ctx, [seed], nonce, TAG_C)
    shape_m = [carry4.packed_words(n_mono), w]
    if c is None:
        c = derive(seed, nonce, TAG_C, shape_m)
    if c.numel() != shape_m[0] * w:
        raise ValueError(f"mask products of {c.numel()} words for {w} words")
    g_new, p_new = carry4.combine(
        g,
        carry4.unpack(a.view(shape_e), count, level),
        carry4.unpack(ef.view(shape_e), count, level),
        carry4.unpack(c.view(shape_m), n_mono, level),
        level,
        first,
    )
    if last or next_nonce is None:
        return [g_new]
    return [g_new, p_new, *_mask_level(ctx, seed, next_nonce, g_new, p_new, level + 1)]


@step(
    rule=rules.cmp_bit_mask,
    size=sizes.cmp_bit_mask,
    keeps=stream_records(1),
    makes_material=True,
    opens={"cmp.d": XOR},
)
def cmp_bit_mask(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    t_bin: torch.Tensor | None,
    g: torch.Tensor,
    top: torch.Tensor,
) -> torch.Tensor:
    """The party's XOR share of msb(x) = top ^ carry_63, masked by the daBit t: d_i."""
    consume(ctx, [seed], nonce, TAG_T_BIN)
    carry = carry4.unpack_carries(g, top.numel()).view(top.shape)
    t = derive(seed, nonce, TAG_T_BIN, list(top.shape)) & 1 if t_bin is None else t_bin
    return carry.bitwise_xor_(top).bitwise_xor_(t)


@step(rule=rules.cmp_bit_finish, size=elementwise(5, "d"), keeps=stream_records(1))
def cmp_bit_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    t_arith: torch.Tensor | None,
    d: torch.Tensor,
) -> torch.Tensor:
    """Arithmetic share of msb(x) = d + (1 - 2d) t from the opened d = msb(x) ^ t."""
    consume(ctx, [seed], nonce, TAG_T_ARITH)
    t = derive(seed, nonce, TAG_T_ARITH, list(d.shape)) if t_arith is None else t_arith
    out = (1 - 2 * d) * t
    if first:
        out += d
    return out


@step(
    rule=rules.dabit_mask,
    size=elementwise(3, "v"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"dabit.e": SUM},
)
def dabit_mask(ctx: Any, seed: torch.Tensor, nonce: int, v: torch.Tensor) -> torch.Tensor:
    """e_i = v_i - a_i: the party's share of v masked for a product with the daBit's t
    (see :func:`dabit_product`)."""
    return _minus_mask(ctx, seed, nonce, v)


def _minus_mask(ctx: Any, seed: torch.Tensor, nonce: int, v: torch.Tensor) -> torch.Tensor:
    """v_i - a_i for the mask a of ``nonce`` (each party derives its share from its seed)."""
    consume(ctx, [seed], nonce, TAG_A)
    return v - derive(seed, nonce, TAG_A, list(v.shape))


@step(
    rule=rules.dabit_product, size=sizes.dabit_product, keeps=stream_records(1), makes_material=True
)
def dabit_product(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    c: torch.Tensor | None,
    t: torch.Tensor,
    e: torch.Tensor,
) -> torch.Tensor:
    """Party i's share of v t = c + e t, from the opened e = v - a: the dealer's c = a t
    (its correction ``c`` at the last party, None elsewhere: derived), summed over the
    parties a t + (v - a) t. t is the dealer's own random bit, so unlike a Beaver
    product of two values only e is opened (one word an element, not two), and nothing
    of the dealer's is needed before that opening."""
    consume(ctx, [seed], nonce, TAG_C)
    if e.shape != t.shape:
        raise ValueError(f"an opened e of shape {list(e.shape)} for a t of {list(t.shape)}")
    z = torch.mul(e, t)
    z += derive(seed, nonce, TAG_C, list(z.shape)) if c is None else c
    return z


@step(rule=rules.cmp_select_finish, size=sizes.cmp_select_finish)
def cmp_select_finish(
    ctx: Any,
    complement: bool,
    d: torch.Tensor,
    v: torch.Tensor,
    vt: torch.Tensor,
) -> torch.Tensor:
    """Share of v * msb(x) = d v + (1 - 2d) [v t] (complement: (1 - d) v - (1 - 2d) [v t]).

    Every party holds d (public) and its shares of v and v t; d v is linear in v."""
    coef = 1 - 2 * d
    if complement:
        return (1 - d) * v - coef * vt
    return d * v + coef * vt


@step(
    rule=rules.group_mask,
    size=elementwise(3, "a"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"group.e": SUM},
)
def group_mask(ctx: Any, seed: torch.Tensor, nonce: int, a: torch.Tensor) -> torch.Tensor:
    """e_i = a_i - alpha_i: the party's share of the groups of four (``a``: [G, 4]) masked
    for their selection (see :func:`group_select`)."""
    if a.dim() != 2 or a.shape[1] != 4:
        raise ValueError(f"the values of groups of four are [G, 4], got {list(a.shape)}")
    return _minus_mask(ctx, seed, nonce, a)


@step(rule=rules.group_select, size=sizes.group_select, keeps=stream_records(2))
def group_select(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    material: torch.Tensor | None,
    d: torch.Tensor,
    t: torch.Tensor,
    e: torch.Tensor,
    a: torch.Tensor,
    onehot: bool,
) -> list[torch.Tensor]:
    """The party's share of the max of each group of four (first index on ties) and, with
    ``onehot``, of its one-hot argmax, from the comparison of the six pairs (the opened d
    and its daBits' shares t, [G, 6]; [G, 10]: the pairs and the four values, the max of
    0 and the four, :data:`mpc.math.group4.RELU`), the opened e = a - alpha ([G, 4]) and the products of
    the daBits (and of the masks with them): the dealer's ``material`` at the last party,
    derived elsewhere (:func:`mpc.math.group4.select`). Local."""
    groups = a.shape[0] if a.dim() == 2 else -1
    bits = d.shape[-1] if d.dim() == 2 else -1  # 6, or 10 for the max after a ReLU
    if not (
        a.dim() == 2
        and a.shape[1] == 4
        and list(e.shape) == [groups, 4]
        and list(d.shape) == list(t.shape) == [groups, bits]
        and bits in (group4.PLAIN, group4.RELU)
        and type(onehot) is bool
    ):
        raise ValueError(
            "a selection of groups of four takes [G, 4] values and [G, 6] or [G, 10] bits"
        )
    consume(ctx, [seed], nonce, TAG_C, TAG_U)
    _, t_monomials, at_monomials = group4.layout(bits)
    n_t, n_at = len(t_monomials), len(at_monomials)
    if material is None:
        tt = derive(seed, nonce, TAG_C, [groups, n_t])
        at = derive(seed, nonce, TAG_U, [groups, n_at])
    elif material.numel() == groups * (n_t + n_at):
        tt = material[: groups * n_t].view(groups, n_t)
        at = material[groups * n_t :].view(groups, n_at)
    else:
        raise ValueError(f"the dealer's selection material has {material.numel()} words")
    out, w = group4.select(d, t, tt, at, e, a, first, onehot)
    return [out] if w is None else [out, w]


# An input share drawn from a seed: at most this many bytes (1 GiB), checked before the
# tensor is allocated (a sent tensor is bounded by the message size limit the same way).
MAX_SEEDED_BYTES = 1 << 30


@step(size=sizes.derive, keeps=INPUT_SEED_BYTES)
def share_from_seed(ctx: Any, seed: bytes, shape: list[int]) -> torch.Tensor:
    """Party i's input share, expanded from a 16-byte seed the data owner drew (os.urandom)
    and sent it instead of the share itself: the owner expands the same seed to compute the
    last party's share. Each seed gives one share at a worker; a second use is refused."""
    if type(seed) is not bytes or len(seed) != SEED_BYTES:
        raise ValueError(f"an input seed is {SEED_BYTES} bytes, got {type(seed).__name__}")
    if not (
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ValueError(f"an input share's shape is a list of sizes, got {shape!r}")
    numel = 1
    for d in shape:
        numel *= d
    if numel * 8 > MAX_SEEDED_BYTES:
        raise LimitExceeded(
            f"an input share of {numel} elements exceeds the {MAX_SEEDED_BYTES} bytes a "
            "seeded share may take"
        )
    used: set[bytes] = ctx.function_state.setdefault("mpc.input_seeds", set())
    if seed in used:
        raise NotAllowedError(
            f"worker {ctx.id!r}: this input seed was used before; a seed gives one share"
        )
    used.add(seed)
    return PRG(seed).int64(tuple(shape))


@step(rule=rules.unpack, size=fixed, makes_material=True)
def unpack(ctx: Any, packed: torch.Tensor, shapes: list[list[int]]) -> list[torch.Tensor]:
    """The last party splits the dealer's comparison material (views: no copy)."""
    return split(packed, shapes)
