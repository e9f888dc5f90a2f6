"""Functions as masked Fourier series on fixed-point shares: the clamp by public bounds
(:func:`relus_public`, :func:`clamp_public`), the series itself (:func:`fourier_series`),
and what is built on them: e^x for x <= 0 (softmax's), sigmoid, and the activations that
are 0 far below zero and x far above it (GELU, SiLU: :func:`relu_like`). Each costs one
comparison run for the clamp and 2 rounds for the series, with no products; the fits
are in :mod:`mpc.math.fourier`. Notation as in :mod:`mpc.protocols.approx`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import torch

from mpc.math.fourier import Series, fit_series
from mpc.protocols import pieces
from mpc.protocols.approx import Fx, truncate_many
from mpc.protocols.compare import late_fits, select_by_msb, select_late, truncating_fits
from mpc.protocols.comparison.steps import cmp_mask
from mpc.protocols.fourier.steps import dealer_fourier, fourier_finish
from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only

# -- clamping, and exp of non-positive values ------------------------------------------------

EXP_LO = -16.0  # exp_nonpositive reads x below it as EXP_LO


def relus_public(x: Fx, bounds: Sequence[float]) -> list[Fx]:
    """relu(x - b) for each public bound b, all in one comparison run (the products ride
    on its daBit), at x's scale."""
    stacked = [s.unsqueeze(0).repeat([len(bounds)] + [1] * len(x.shape)) for s in x.shares]
    enc = torch.tensor([round(b * 2**x.scale) for b in bounds], dtype=I64)
    stacked[0] = stacked[0] - enc.view([len(bounds)] + [1] * len(x.shape))
    (r,) = select_by_msb(x.session, stacked, [stacked], complement=True)
    return [x.with_shares([s[k] for s in r]) for k in range(len(bounds))]


def clamp_public(x: Fx, lo: float | None, hi: float | None) -> Fx:
    """clamp(x, lo, hi) for public bounds: lo + relu(x - lo) - relu(x - hi), both ReLUs in
    one comparison run (:func:`relus_public`)."""
    parts = [b for b in (lo, hi) if b is not None]
    if not parts:
        return x
    r = relus_public(x, parts)
    if lo is None:
        return x.add(r[0], -1)
    out = r[0].add_public(lo)
    if hi is not None:
        out = out.add(r[1], -1)
    return out


# e^u on [-16, 0] as e^(v - 8), v = u + 8 in [-8, 8]: 10 harmonics of period 32
# (fit error 1.1e-6; the other half of the period is free, so no jump to smooth over)
EXP_SERIES = fit_series(lambda t: torch.exp(t - 8.0), 8.0, 5, 10)


def exp_nonpositive(x: Fx, out: int | None) -> Fx:
    """[e^x] for x <= 0 (softmax's x - max): e^x = b F(x + 8) with b = [x >= -16] and F
    the masked Fourier series :data:`EXP_SERIES` (e^(v - 8) on [-8, 8]) of x + 8
    unclamped: one comparison run of x + 16 (4 rounds, 2 with FSS comparisons) in whose
    first round the series' masked value opens, and in whose next round F's product with
    the daBit (:func:`mpc.protocols.compare.select_late`): no round of the series' own.
    Where b = 0 the series reads x out of its period (any value), and the product is 0:
    x < -16 gives 0 (e^-16 = 1.1e-7). ``out``: the result's scale (its truncation, one
    more round); None: the value before truncation, at :data:`SERIES_SCALE`, for a caller
    that truncates it in a round it pays anyway (softmax's division). An operand too big
    for one run clamps first (relu(x + 16) - 16, one comparison run) and runs the series
    after it (2 rounds).

    Error: 1.1e-6 absolute (the fit) plus about 1e-7 (fixed point); x > 0 is outside the
    domain (the series is periodic: x in (0, 16] reads as a value of the free half-period,
    not e^x)."""
    shifted = x.add_public(8.0)
    if late_fits(x.session, x.shape, 0) and _pieces(shifted, EXP_SERIES) == 1:
        run = SeriesRun(shifted, EXP_SERIES)
        (e,) = select_late(x.session, x.add_public(-EXP_LO).shares, [], run)
        f = x.with_shares(e, SERIES_SCALE)
        return f if out is None else truncate_many([f], [out])[0]
    z = clamp_public(x, EXP_LO, None).add_public(8.0)
    if out is None:
        return series_value(z, EXP_SERIES)
    return fourier_series(z, EXP_SERIES, out)


# -- trigonometric series -------------------------------------------------------------------

# the dealer's cos / sin values and the public coefficients, in fractional bits: the
# series' value at scale 54 stays below the truncation's 2^62 while |F| < 2^8, and the
# rounding error is about (sum of |coefficients|) 2^-31 (1e-7 for exp's 134)
TRIG_BITS, TRIG_COEF_BITS = 30, 24
SERIES_SCALE = TRIG_BITS + TRIG_COEF_BITS  # a series' value before its truncation


def fourier_series(x: Fx, series: Series, out: int) -> Fx:
    """F(x) at scale ``out``: :func:`series_value`, then its truncation (2 rounds)."""
    return truncate_many([series_value(x, series)], [out])[0]


def series_value(x: Fx, series: Series) -> Fx:
    """F(x) for a trigonometric series of period P = 2^p (:mod:`mpc.math.fourier`), in 1
    round for any number of terms (a mask opening), not yet truncated.

    The angle 2 pi k x / P of x at scale s is 2 pi k z / 2^(s + p) for the ring element z:
    periodic modulo 2^(s + p), which divides 2^64. So with the dealer's r (uniform, shared)
    the parties open c = x + r (round 1; c is uniform, it reveals nothing), and
    x = c - r modulo 2^(s + p) exactly, whatever the wrap-arounds. sin and cos of k(phi -
    theta), phi the public angle of c and theta the secret one of r, expand into public
    coefficients times the dealer's shares of sin k theta and cos k theta (2K values per
    element): F is *linear* in the material, local once c is open (no products, no
    comparison): the value returned, at scale TRIG_COEF_BITS + TRIG_BITS, one round. Its
    truncation (:func:`fourier_series`) is the second.

    This is the masked-Fourier-series evaluation of Boura, Chillotti, Gama, Jetchev,
    Peceny and Petric, "High-precision privacy-preserving real-valued function evaluation"
    (FC 2018), with the period a power of two so that the ring's own wrap-around is the
    period's. Error: the fit's (``series.max_error`` on [-T, T]; F is periodic, so the
    caller clamps x into [-T, T] first) plus about K 2^-23 from the fixed point."""
    session, shape = x.session, x.shape
    k = _pieces(x, series)
    if k > 1:  # (an operand too big for one run: in pieces, mpc.protocols.pieces)
        parts = pieces.each(
            session,
            pieces.split(x.shares, k),
            lambda p: series_value(x.with_shares(p), series),
        )
        return parts[0].with_shares(pieces.join([p.shares for p in parts], shape))
    run = SeriesRun(x, series)
    one = Round(session)
    c = run.open_in(one)
    one.open()
    return x.with_shares(run.finish(c.value), SERIES_SCALE)


def _pieces(x: Fx, series: Series) -> int:
    params = {"shape": x.shape, "terms": series.terms, "single": series.single}
    return pieces.count(dealer_fourier, params, math.prod(x.shape))


class SeriesRun:
    """:func:`series_value` in phases: the dealer's material and each party's masked c at
    construction, the opening wherever the caller puts it (``open_in``: a comparison's
    first round, :class:`~mpc.protocols.comparison.base.Late`), then ``finish``: the
    shares of F(x) at :data:`SERIES_SCALE`, ``copies`` times stacked along a new first
    dim (for a comparison of stacked bounds)."""

    def __init__(self, x: Fx, series: Series, copies: int = 1) -> None:
        session, shape, terms = x.session, x.shape, series.terms
        self.session, self.series, self.shape, self.copies = session, series, shape, copies
        self.bits = bits = x.scale + series.period_bits
        if bits > 62:
            raise ValueError(f"internal: a period of 2^{bits} ring units is too long")
        self.nonce = nonce = session.next_nonce()
        seed = session.party_seeds
        (self.trig_last,) = deal(
            session,
            "trigonometric series",
            dealer_fourier,
            [nonce, shape, bits, terms, TRIG_BITS, series.single],
            out=[([terms, *shape, 2], I64)],
        )
        (self.masked,) = at_parties(
            session, cmp_mask, lambda i: [seed[i], nonce, x.shares[i]], [(shape, I64)]
        )

    def open_in(self, round: Round) -> Opened:
        return round.add(self.masked)

    def finish(self, c: Shares) -> Shares:
        session, series, seed, nonce = (
            self.session,
            self.series,
            self.session.party_seeds,
            self.nonce,
        )
        trig = last_only(session, self.trig_last)
        coefs = [series.const, list(series.cos), list(series.sin)]
        (z,) = at_parties(
            session,
            fourier_finish,
            lambda i: (
                [seed[i], nonce, i == 0, trig(i), c[i], self.bits, *coefs]
                + [TRIG_COEF_BITS, TRIG_BITS, series.single]
            ),
            [(self.shape, I64)],
        )
        if self.copies == 1:
            return z
        return cast(Shares, [torch.stack([s] * self.copies) for s in z])


def series_at(series: Series, t: float) -> float:
    """F(t) in float64 (the plaintext series)."""
    w = 2 * math.pi * t / 2.0**series.period_bits
    total = series.const
    for k, (a, b) in enumerate(zip(series.cos, series.sin), start=1):
        total += a * math.cos(k * w) + b * math.sin(k * w)
    return total


# sigmoid on [-10, 10] by 12 sines of period 32 (fit error 1.1e-4; 1 - sigmoid(10) =
# 4.5e-5 is the saturation's error outside)
SIGMOID_CLAMP = 10.0
SIGMOID_SERIES = fit_series(lambda t: torch.sigmoid(t) - 0.5, SIGMOID_CLAMP, 5, 12, odd=True)
SIGMOID_SERIES = Series(**{**SIGMOID_SERIES.__dict__, "const": 0.5, "single": True})


# Activations that are 0 far below zero and x far above it, each a masked Fourier series of
# x clamped to [-T, T] plus relu(x - T) (:func:`relu_like`): GELU on [-5, 5] by 10
# harmonics of period 16, erf and tanh forms (fit errors 3.7e-6 and 3.8e-7; past +-5 GELU
# is x, or 0, within 1.5e-6); SiLU on [-12, 12] by 16 harmonics of period 32 (fit error
# 3.5e-5; past +-12 SiLU is x, or 0, within 7.4e-5)
GELU_CLAMP = 5.0
SILU_CLAMP = 12.0


def _gelu_erf(t: torch.Tensor) -> torch.Tensor:
    return t / 2 * (1 + torch.erf(t / math.sqrt(2.0)))


def _gelu_tanh(t: torch.Tensor) -> torch.Tensor:
    return t / 2 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t**3)))


GELU_SERIES = replace(fit_series(_gelu_erf, GELU_CLAMP, 4, 10), single=True)
GELU_TANH_SERIES = replace(fit_series(_gelu_tanh, GELU_CLAMP, 4, 10), single=True)
SILU_SERIES = replace(fit_series(lambda t: t * torch.sigmoid(t), SILU_CLAMP, 5, 16), single=True)


def _series_at_bounds(
    x: Fx,
    series: Series,
    values: Callable[[Shares, torch.Tensor], list[Any]],
    out: int | None = None,
) -> tuple[Shares, Shares, bool] | None:
    """One comparison run of x + T and x - T (stacked; T the series' half width) selecting
    ``values(stacked x, the encoded shifts [T, -T])`` (at x's scale) and, late, F(x)
    unclamped: per party the selected values and [F b_lo, F b_hi] (b_lo = [x >= -T],
    b_hi = [x >= T]), and whether they came down to ``out`` in their selection
    (:func:`mpc.protocols.compare.truncating_fits`: no truncation round after it); None
    where the operand does not fit one run."""
    if not (late_fits(x.session, [2, *x.shape], 1) and _pieces(x, series) == 1):
        return None
    bits = None
    if out is not None and truncating_fits(x.session, [2, *x.shape], 1):
        bits = [x.scale - out, SERIES_SCALE - out]
    t = series.half_width
    run = SeriesRun(x, series, copies=2)
    stacked = cast(Shares, [torch.stack([s, s]) for s in x.shares])
    shift = torch.tensor([t, -t], dtype=torch.float64).view([2] + [1] * len(x.shape))
    enc = (shift * 2**x.scale).round().to(I64)
    cmp = cast(Shares, [s + enc if i == 0 else s for i, s in enumerate(stacked)])
    sel, fsel = select_late(x.session, cmp, [cast(Shares, values(stacked, enc))], run, bits)
    return sel, fsel, bits is not None


def relu_like(x: Fx, series: Series, out: int) -> Fx:
    """f(x) for an f that is 0 below -T and x above T (GELU, SiLU), F the series
    ``series`` fitted to f on [-T, T] (:data:`GELU_SERIES`, :data:`GELU_TANH_SERIES`,
    :data:`SILU_SERIES`): with b_lo = [x >= -T] and b_hi = [x >= T] from one comparison
    run of x + T and x - T,

        f(x) = (b_lo - b_hi) F(x) + b_hi (x - T + F(T)),

    F read at x unclamped (out of its period where its factor is 0). The series' masked
    value opens in the comparison's first round, its products with the daBits in the
    next (:func:`mpc.protocols.compare.select_late`), and b_hi (x - T + F(T)) rides on
    the comparison as a ReLU; each selected value comes down to ``out`` in its selection
    where :func:`~mpc.protocols.compare.truncating_fits` (3 rounds; 2 with FSS
    comparisons), else one truncation after: 5 rounds, 2
    comparisons per element and no products. An operand too big for one run takes the
    clamp first (relu(x + T) - relu(x - T) - T, one comparison run), then the series of
    the clamped value (2 rounds, its truncation with relu(x - T)'s): 6 rounds. Error: the
    fit's, plus f's distance from 0 or x past the clamp, plus the fixed point's.

    x may be a product still to be truncated (its scale up to 62 - the series' period
    bits): the comparisons and the series read it as it is, and the selected values come
    down to ``out`` in the final truncation, so x's own truncation costs no round."""
    t = series.half_width
    hi = round(series_at(series, t) * 2**x.scale)  # (x - T, then + F(T))
    both = _series_at_bounds(
        x, series, lambda st, enc: [s + enc + hi if i == 0 else s for i, s in enumerate(st)], out
    )
    if both is not None:
        sel, fsel, done = both
        if done:  # (selected truncated: F b_lo - F b_hi + b_hi (x - T + F(T)) at out)
            return x.with_shares([f[0] - f[1] + s[1] for f, s in zip(fsel, sel)], out)
        series_part = x.with_shares([f[0] - f[1] for f in fsel], SERIES_SCALE)
        f, above = truncate_many([series_part, x.with_shares([s[1] for s in sel])], [out, out])
        return f.add(above)
    below, above = relus_public(x, [-t, t])
    f = series_value(below.add(above, -1).add_public(-t), series)
    f, above = truncate_many([f, above], [out, out])
    return f.add(above)


def sigmoid(x: Fx, out: int) -> Fx:
    """sigmoid(x) = F(clamp(x, -10, 10)), F the 12-sine series of period 32 fitted on
    [-10, 10]. With b_lo = [x >= -10] and b_hi = [x >= 10] from one comparison run (2
    comparisons per element), F(clamp(x)) = (b_lo - b_hi) F(x) + b_hi F(10) + (1 - b_lo)
    F(-10), F read at x unclamped (out of its period where its factor is 0): the series'
    masked value opens in the comparison's first round and its products with the daBits
    in the next (:func:`mpc.protocols.compare.select_late`), the constants ride as
    selections, then one truncation: 5 rounds (3 with FSS comparisons), no products. An
    operand too big for one run clamps first (one comparison run) and runs the series after
    it (2 rounds): 6. Error: 1.1e-4 (fit) + 4.5e-5 (saturation past +-10) + fixed point."""
    t = SIGMOID_CLAMP
    # the constants -F(-10) (with b_lo) and F(10) (with b_hi), at the series' scale
    ends = [-series_at(SIGMOID_SERIES, -t), series_at(SIGMOID_SERIES, t)]
    const = torch.tensor(ends, dtype=torch.float64).view([2] + [1] * len(x.shape))
    const = (const * 2**SERIES_SCALE).round().to(I64)
    both = _series_at_bounds(
        x,
        SIGMOID_SERIES,
        lambda st, enc: [s * 0 + const if i == 0 else s * 0 for i, s in enumerate(st)],
    )
    if both is not None:
        sel, fsel, _ = both
        shares = [f[0] - f[1] + c[0] + c[1] for f, c in zip(fsel, sel)]
        shares[0] = shares[0] + round(series_at(SIGMOID_SERIES, -t) * 2**SERIES_SCALE)
        return truncate_many([x.with_shares(shares, SERIES_SCALE)], [out])[0]
    xc = clamp_public(x, -SIGMOID_CLAMP, SIGMOID_CLAMP)
    return fourier_series(xc, SIGMOID_SERIES, out)
