"""A product scaled by an inverse power of a per-row value, the product and the factor in
the same rounds: ``mult x^-p op(v, y)`` for a positive x with one value per row of v.

Softmax's division by the row sums is a factor per row, and it commutes with the
product that follows it, attention's ``softmax(s) V = diag(1 / sum e) (e V)``. So the
product e V needs no division first: it opens in the same round as the factor's own
product, and the factor multiplies its result in the truncation round that follows. One
comparison run of x with fine bins (:func:`mpc.protocols.inverse.fine_bins`, a line
between the bins' ends) gives the factor as

    S = mult x^-p = g (A + B u),  u = beta x + gamma - 1,
      = K + H x,  K = g (A + B (gamma - 1)),  H = B g beta,

with g, beta and gamma public per bin (:func:`mpc.protocols.inverse.bins_table`), so K and H
are selected locally from the bins' bits (:func:`mpc.protocols.approx.select`) and H x is
one product. The rounds after the comparison:

1. H x (a Beaver product of row size) and the caller's product P = op(v, y), opened
   together;
2. S and P truncated, with S P riding in that truncation (:mod:`mpc.protocols.
   truncated_products`): no opening of its own.

The result is S P untruncated, at the scale of S plus P's: its truncation is left to the
value's next use (a product's operand pays it anyway). Division then product took the
comparison, three rounds (:func:`mpc.protocols.inverse.times_inverse_power`) and the
product's round; here two. H keeps :data:`H_BITS` significant bits in every bin: where
x's range is wide (layer norm's 30 octaves), the bins are split in up to
:data:`MAX_PIECES` pieces, each with x truncated to its own scale (in the comparison's
first round) and a product of its own in round 1. Where more pieces would be needed, or
x's rows take coarse bins, :func:`row_factor` returns None before any round and the
caller divides first. :mod:`mpc.ops.softmax_product` and :mod:`mpc.ops.row_scaled` use
it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import lru_cache
from typing import Any, NamedTuple, Protocol

import torch

from mpc.protocols.approx import Fx, select, step_bits
from mpc.protocols.beaver.run import BeaverRun
from mpc.protocols.digit_compare.run import digit_select, selects_fit
from mpc.protocols.inverse import bins_table, fine_bins, fine_per_octave
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64
from mpc.protocols.riders.run import riding
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.protocols.truncation.run import TruncRun

#: the least significant bits of H (= B g beta) in any bin: its rounding moves u by
#: 2^-H_BITS relative (4e-6), well below the line's fit (3e-5)
H_BITS = 18
#: the significant bits of x at the bottom of its domain in the product H x (x is
#: truncated to that scale in the comparison's first round: the wider H's range can be)
X_BITS = 20
#: the most pieces H is split in (each one more product of row size in the same round)
MAX_PIECES = 3
#: the relative precision of the factor S before it multiplies P (7.6e-6 at its least,
#: below the line's fit; layer norm's S then comes down to 24 bits, and S times a product
#: at 16 bits to 40, which GELU's series still reads at full scale)
S_BITS = 17


class ProductRun(Protocol):
    """A product in phases (a Beaver product, a product with a model's weight): its
    openings join a round, then its result."""

    def open_in(self, round: Round) -> None: ...

    def finish(self) -> Fx: ...


class BeaverProduct:
    """op(a, b) by a Beaver triple, as a :class:`ProductRun`."""

    def __init__(self, a: Fx, b: Fx, op: str, out_shape: tuple[int, ...]) -> None:
        self.scale = a.scale + b.scale
        self.session = a.session
        self.run = BeaverRun(a.session, a.shares, b.shares, op, {}, out_shape)

    def open_in(self, round: Round) -> None:
        self.opened = self.run.open_in(round)

    def finish(self) -> Fx:
        return Fx(self.session, self.run.finish_opened(self.opened), self.scale)


class _Table(NamedTuple):
    thresholds: list[float]
    ks: list[float]  # K per bin, at s_scale
    pieces: list[tuple[list[float], int, int]]  # (H per bin, 0 outside; x's scale; H's)
    s_scale: int  # S = K + sum of the pieces' H x
    s_bits: int  # S's scale once truncated (S_BITS significant bits at its least)


@lru_cache(maxsize=64)
def _factor_table(p: float, lo: float, hi: float, scale: int, mult: float) -> _Table | None:
    """The bins' thresholds, K, and H split in pieces of bins whose H keeps
    :data:`H_BITS` significant bits with x at one scale (at most :data:`MAX_PIECES`: x's
    range split where it is wide, layer norm's 30 octaves in three); None where that fails
    or S is not positive. ``scale``: x's scale once its pending truncation is applied."""
    thresholds, betas, gammas, gs, _, _, coefs = bins_table(
        p, lo, hi, fine_per_octave(p), min(scale, x_scale(lo)), mult, 1
    )
    a, b = coefs
    ks = [g * (a + b * (gamma - 1.0)) for g, gamma in zip(gs, gammas)]
    hs = [b * g * beta for g, beta in zip(gs, betas)]
    # |S| per bin: K + H x at the bin's ends (below the first threshold and at or above
    # the last, H = 0)
    ends = [thresholds[0]] + thresholds[1:] + [thresholds[-1]]
    lows = [thresholds[0]] + thresholds
    top = max(abs(k) + abs(h) * e for k, h, e in zip(ks, hs, ends))
    least = min(min(k + h * e, k + h * w) for k, h, e, w in zip(ks, hs, ends, lows))
    if least <= 0:
        return None
    s_scale = 61 - math.ceil(math.log2(top))
    pieces: list[tuple[list[float], int, int]] = []
    bins = [i for i, h in enumerate(hs) if h != 0.0]
    while bins:
        xs = min(scale, X_BITS - math.floor(math.log2(lows[bins[0]])))
        h_scale = s_scale - xs
        # the piece: the bins from here on whose H keeps its bits at this scale
        n = 0
        while n < len(bins) and math.log2(abs(hs[bins[n]])) + h_scale >= H_BITS:
            n += 1
        run = bins[:n]
        if not run or len(pieces) == MAX_PIECES:
            return None
        inside = set(run)
        pieces.append(([h if i in inside else 0.0 for i, h in enumerate(hs)], xs, h_scale))
        bins = bins[len(run) :]
    s_bits = min(S_BITS - math.floor(math.log2(least)), s_scale - 1)
    return _Table(thresholds, ks, pieces, s_scale, s_bits)


def x_scale(lo: float) -> int:
    """The scale of x in the product H x where x's range starts at 2^lo: :data:`X_BITS`
    significant bits there."""
    return X_BITS - math.floor(lo)


def fused_factor_fits(p: float, lo: float, hi: float, scale: int, mult: float) -> bool:
    """Whether the factor of x in [2^lo, 2^hi), x at ``scale``, fits the fused step (the
    module docstring; the rows' count is :func:`mpc.protocols.inverse.fine_bins`')."""
    return _factor_table(p, lo, hi, scale, mult) is not None


class RowFactor:
    """S = mult x^-p per row after the bins' comparison: K, the pieces' (H, x), and v
    truncated (the comparison's riders); :meth:`products` forms S in one round with the
    caller's products. Its row-shaped values can be viewed as v is
    (:meth:`reshaped`)."""

    def __init__(
        self, v: Fx, k: Fx, pieces: list[tuple[Fx, Fx]], s_scale: int, s_bits: int
    ) -> None:
        self.v, self.k, self.pieces = v, k, pieces
        self.s_scale, self.s_bits = s_scale, s_bits

    def reshaped(self, v_shape: list[int]) -> RowFactor:
        """The same factor with v viewed as ``v_shape`` (its last dimension unchanged) and
        the rows alike."""
        rows = list(v_shape[:-1]) + [1]

        def view(t: Fx, shape: list[int]) -> Fx:
            return t.with_shares([s.reshape(shape) for s in t.shares])

        return RowFactor(
            view(self.v, list(v_shape)),
            view(self.k, rows),
            [(view(h, rows), view(x, rows)) for h, x in self.pieces],
            self.s_scale,
            self.s_bits,
        )

    def mapped(self, fn: Callable[[Any], Any]) -> RowFactor:
        """The same factor with ``fn`` applied to each share of v and of the rows (an
        index or a slice of a leading dimension, which both have)."""

        def each(t: Fx) -> Fx:
            return t.with_shares([fn(s) for s in t.shares])

        return RowFactor(
            each(self.v),
            each(self.k),
            [(each(h), each(x)) for h, x in self.pieces],
            self.s_scale,
            self.s_bits,
        )

    @property
    def v_scale(self) -> int:
        """v's scale once truncated (the factor's products read it there)."""
        return self.v.scale

    def products(self, make: Callable[[Fx], list[ProductRun]]) -> tuple[Fx, list[ProductRun]]:
        """(S untruncated at its scale, the caller's runs): S from the products H x,
        opened in one round with the openings of the runs ``make`` gives for v (finish
        those after)."""
        extra = make(self.v)
        runs = [BeaverProduct(h, x, "mul", tuple(x.shape)) for h, x in self.pieces]
        one = Round(self.k.session)
        for r in [*runs, *extra]:
            r.open_in(one)
        one.open()
        s = self.k
        for r in runs:
            s = s.add(r.finish())
        return s, extra


class DigitRowFactor:
    """S = mult x^-p per row whose bins' comparison (digit look-ups,
    :func:`mpc.protocols.digit_compare.run.digit_select`) runs in :meth:`products`: its
    first round truncates v and x's copies at the pieces' scales (riders), its second
    opens the caller's runs (made for the truncated v) with the selections
    [msb_k x_p], and S = K + sum over pieces of H_p x_p is local after it:

        H_p x_p = sum_k D_k c_k x_p + h_0 x_p = h_top x_p - sum_k D_k [msb_k x_p]

    (c_k = 1 - msb_k the bins' bits, D_k the piece's steps of H at its scale, h_0 and
    h_top its values below the first and at or above the last threshold): exact in the
    ring, as the Beaver product H x_p is. The comparison's 2 rounds and the truncation
    round after them, where the eager :class:`RowFactor` takes a round more for H x."""

    def __init__(self, v: Fx, x: Fx, table: _Table, pending: tuple[int, int]) -> None:
        self.v, self.x, self.table, self.pending = v, x, table, pending
        self.s_scale, self.s_bits = table.s_scale, table.s_bits

    @property
    def v_scale(self) -> int:
        return self.v.scale - self.pending[0]

    def reshaped(self, v_shape: list[int]) -> DigitRowFactor:
        """The same factor with v viewed as ``v_shape`` (its last dimension unchanged) and
        x's rows alike."""
        rows = list(v_shape[:-1]) + [1]
        v = self.v.with_shares([t.reshape(v_shape) for t in self.v.shares])
        x = self.x.with_shares([t.reshape(rows) for t in self.x.shares])
        return DigitRowFactor(v, x, self.table, self.pending)

    def mapped(self, fn: Callable[[Any], Any]) -> DigitRowFactor:
        """The same factor with ``fn`` applied to each share of v and of x (an index or a
        slice of a leading dimension: the comparison then runs on those rows only)."""
        v = self.v.with_shares([fn(t) for t in self.v.shares])
        x = self.x.with_shares([fn(t) for t in self.x.shares])
        return DigitRowFactor(v, x, self.table, self.pending)

    def products(self, make: Callable[[Fx], list[ProductRun]]) -> tuple[Fx, list[ProductRun]]:
        """(S untruncated at its scale, the caller's runs) in the comparison's two rounds
        (the class docstring); ``v`` is the truncated v after it."""
        v, x, table = self.v, self.x, self.table
        v_bits = self.pending[0]
        scales = sorted({xs for _, xs, _ in table.pieces if xs < x.scale})
        runs = [TruncRun(v.session, v.shares, v_bits)] if v_bits else []
        runs += [TruncRun(x.session, x.shares, x.scale - xs) for xs in scales]
        steps = []  # per piece: its scale, h_top, and (threshold, D_k) where D_k != 0
        for per_bin, xs, h_scale in table.pieces:
            enc = [round(h * 2**h_scale) for h in per_bin]
            diffs = [(k, enc[k + 1] - enc[k]) for k in range(len(enc) - 1) if enc[k + 1] != enc[k]]
            steps.append((xs, enc[-1], diffs))
        picks = [k for _, _, diffs in steps for k, _ in diffs]
        held: dict[str, Any] = {}

        def after_first() -> tuple[list[Any], list[ProductRun]]:
            done = iter(rides.results)
            truncated = v.with_shares(next(done), v.scale - v_bits) if v_bits else v
            at = {xs: x.with_shares(next(done), xs) for xs in scales} | {x.scale: x}
            held["v"], held["at"] = truncated, at
            held["extra"] = extra = make(truncated)
            values = [
                [t.unsqueeze(0).expand(len(diffs), *t.shape) for t in at[xs].shares]
                for xs, _, diffs in steps
            ]
            return values, extra

        enc_t = [round(t * 2**x.scale) for t in table.thresholds]
        with riding(runs) as rides:
            msb, selected = digit_select(x.session, list(x.shares), enc_t, picks, after_first)
        self.v = held["v"]
        bits = [-b for b in msb]  # c_k = 1 - msb_k
        bits[0] = bits[0] + 1
        s = select(x, bits, table.ks, table.s_scale)
        start = 0
        for xs, top, diffs in steps:
            d = torch.tensor([dk for _, dk in diffs], dtype=I64).view([-1] + [1] * len(x.shape))
            end = start + len(diffs)
            shares = [
                t * top - (u[start:end] * d).sum(0) for t, u in zip(held["at"][xs].shares, selected)
            ]
            s = s.add(Fx(x.session, shares, table.s_scale))
            start = end
        return s, held["extra"]


def row_factor(
    v: Fx, x: Fx, p: float, lo: float, hi: float, mult: float, pending: tuple[int, int]
) -> RowFactor | DigitRowFactor | None:
    """The bins' comparison of x (``pending``: bits of v and of x still to be truncated,
    riding in its first round, with x's copies at the pieces' scales): the factor, or
    None where x's rows take coarse bins or the fused factor does not fit (nothing run).
    Where the comparison and its selections fit the digit look-ups
    (:func:`mpc.protocols.digit_compare.run.selects_fit`), it waits for the factor's
    products (:class:`DigitRowFactor`)."""
    v_bits, x_bits = pending
    if not fine_bins(x.session, math.prod(x.shape), lo, hi, p):
        return None
    table = _factor_table(p, lo, hi, x.scale - x_bits, mult)
    if table is None:
        return None
    picks = sum(sum(1 for a, b in zip(h, h[1:]) if a != b) for h, _, _ in table.pieces)
    if selects_fit(x.session, list(x.shape), len(table.thresholds), picks):
        return DigitRowFactor(v, x, table, pending)
    runs = [TruncRun(v.session, v.shares, v_bits)] if v_bits else []
    scales = sorted({xs for _, xs, _ in table.pieces if xs < x.scale})
    runs += [TruncRun(x.session, x.shares, x.scale - xs) for xs in scales]
    with riding(runs) as rides:
        bits = step_bits(x, table.thresholds)  # one comparison run (4 rounds, 1 with FSS)
    done = iter(rides.results)
    if v_bits:
        v = v.with_shares(next(done), v.scale - v_bits)
    at = {xs: x.with_shares(next(done), xs) for xs in scales} | {x.scale: x}
    pieces = []
    for per_bin, xs, h_scale in table.pieces:
        pieces.append((select(at[xs], bits, per_bin, h_scale), at[xs]))
    k = select(x, bits, table.ks, table.s_scale)
    return RowFactor(v, k, pieces, table.s_scale, table.s_bits)


def times_product_inverse_power(
    v: Fx,
    x: Fx,
    p: float,
    lo: float,
    hi: float,
    product: Callable[[Fx], ProductRun],
    product_scale: int,
    mult: float = 1.0,
    pending: tuple[int, int] = (0, 0),
) -> tuple[Fx, int] | None:
    """(S P, bits to lose) with S = mult x^-p per row of x (x positive, in [2^lo, 2^hi)
    as in :func:`mpc.protocols.inverse.times_inverse_power`, saturating outside) and
    P = ``product(v)`` brought to ``product_scale``, in one comparison run and two rounds
    (the module docstring); None where x's rows take coarse bins or x's range is too
    wide for the fused factor (the caller divides first).

    ``pending``: bits of v and of x still to be truncated; both truncations ride in the
    comparison's first round. ``product`` receives v at its truncated scale and returns
    the product's run (its result must have bits to lose down to ``product_scale``)."""
    factor = row_factor(v, x, p, lo, hi, mult, pending)
    if factor is None:
        return None
    # round 1 (or the digit comparison's second): H x and the caller's product
    s, (prod,) = factor.products(lambda v: [product(v)])
    p_raw = prod.finish()
    if p_raw.scale <= product_scale:
        raise ValueError("internal: the product has no bits to lose")
    # round 2: S and P truncated, S P riding
    _, (sp,) = truncate_and_multiply(
        [s, p_raw], [factor.s_bits, product_scale], [0.0, 0.0], [(0, 1)]
    )
    return sp, factor.s_bits


__all__ = [
    "BeaverProduct",
    "DigitRowFactor",
    "ProductRun",
    "RowFactor",
    "fused_factor_fits",
    "row_factor",
    "times_product_inverse_power",
]
