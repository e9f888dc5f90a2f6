"""Approximations of non-linear functions on fixed-point shares.

Notation: [x] is an additive sharing of round(x 2^s) for a scale s (fractional bits);
the scale travels with the shares in :class:`Fx`. Each function here is built from three
registered steps only: Beaver products (:class:`~mpc.protocols.beaver.run.BeaverRun`),
truncations (:class:`~mpc.protocols.truncation.run.TruncRun`) and the comparison protocol
(:func:`~mpc.protocols.compare.msb`). Every *level* of products costs two rounds (the
Beaver opening, then one truncation for all the products of the level together); the
comparisons of one call all run in one 7-round comparison.

The common tool is a **bin selection** (:func:`step_bits`, :func:`select`): one comparison
run on the stacked differences x - theta_k gives the bits c_k = [x >= theta_k] for sorted
thresholds theta_0 < ... < theta_{T-1}. A value that is constant on each bin
(below theta_0, [theta_k, theta_{k+1}), at or above theta_{T-1}) is then *linear* in the
bits, v(x) = v_below + sum_k c_k (v_{bin k} - v_{bin k-1}), so a per-bin coefficient, a
per-bin power of two or a per-bin exponent costs no round once the bits are known. This is
the parallel-comparison form of the bit-length normalisation of Catrina and Saxena,
"Secure computation with fixed-point numbers", FC 2010, and of the segment selection of
piecewise polynomials (cf. Knott et al., "CrypTen", NeurIPS 2021, for the polynomial
evaluations; Catrina-Saxena for Newton-Raphson and Goldschmidt iterations).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import cast

import torch

from mpc.math.fourier import chebyshev_nodes
from mpc.protocols.beaver.run import BeaverRun
from mpc.protocols.compare import msb_thresholds, select_by_msb
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares
from mpc.protocols.truncation.run import TruncRun
from mpc.session import Session

# Internal working scale of normalised values (mantissas in [1/4, 1], polynomial variables
# in [0, 1]): products of two such values stay far below the truncation's 2^62 bound.
WORK = 24


class Fx:
    """A shared fixed-point value: ``shares`` of round(v 2^scale), one per party."""

    def __init__(self, session: Session, shares: Shares, scale: int) -> None:
        self.session, self.shares, self.scale = session, list(shares), scale

    @property
    def shape(self) -> list[int]:
        return list(self.shares[0].shape)

    def with_shares(self, shares: Shares, scale: int | None = None) -> Fx:
        return Fx(self.session, shares, self.scale if scale is None else scale)

    def lift(self, scale: int) -> Fx:
        """The same value at a larger scale (exact: a shift of every share)."""
        if scale == self.scale:
            return self
        if scale < self.scale:
            raise ValueError("internal: lift to a smaller scale needs a truncation")
        k = 1 << (scale - self.scale)
        return self.with_shares([s * k for s in self.shares], scale)

    def add(self, other: Fx, sign: int = 1) -> Fx:
        s = max(self.scale, other.scale)
        a, b = self.lift(s), other.lift(s)
        shares = [x + y if sign > 0 else x - y for x, y in zip(a.shares, b.shares)]
        return self.with_shares(shares, s)

    def add_public(self, c: float) -> Fx:
        shares = list(self.shares)
        shares[0] = shares[0] + int(round(c * 2**self.scale))
        return self.with_shares(shares)

    def neg(self) -> Fx:
        return self.with_shares([-s for s in self.shares])

    def times_public(self, c: float, bits: int) -> Fx:
        """v * c with c encoded at ``bits`` fractional bits: the scale grows by ``bits``
        (no truncation here; no round)."""
        k = int(round(c * 2**bits))
        return self.with_shares([s * k for s in self.shares], self.scale + bits)

    def halve(self, k: int = 1) -> Fx:
        """v / 2^k: the same shares read at a larger scale (free and exact)."""
        return self.with_shares(self.shares, self.scale + k)


def truncate_many(values: Sequence[Fx], scales: Sequence[int]) -> list[Fx]:
    """Each value brought down to its target scale; all truncations open in one round."""
    out: list[Fx | None] = [None] * len(values)
    runs: list[tuple[int, TruncRun]] = []
    for i, (v, s) in enumerate(zip(values, scales)):
        if v.scale <= s:
            out[i] = v.lift(s)
        else:
            runs.append((i, TruncRun(v.session, v.shares, v.scale - s)))
    if runs:
        one = Round(values[0].session)
        opened = [(i, r, r.open_in(one)) for i, r in runs]
        one.open()
        for i, r, o in opened:
            out[i] = values[i].with_shares(r.finish(o.value), scales[i])
    return [o for o in out if o is not None]


def mul_many(
    pairs: Sequence[tuple[Fx, Fx]], scales: Sequence[int | None] | None = None
) -> list[Fx]:
    """[a b] for every pair, one level: the Beaver openings in one round, then the
    truncations (to ``scales``; None: left untruncated at scale s_a + s_b) in one round."""
    session = pairs[0][0].session
    runs = []
    for a, b in pairs:
        shape = list(torch.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        xs = [s if list(s.shape) == shape else s.expand(shape).clone() for s in a.shares]
        ys = [s if list(s.shape) == shape else s.expand(shape).clone() for s in b.shares]
        runs.append(BeaverRun(session, xs, ys, "mul", {}, tuple(shape)))
    one = Round(session)
    opened = [r.open_in(one) for r in runs]
    one.open()
    prods = [
        Fx(session, r.finish_opened(o), a.scale + b.scale)
        for r, o, (a, b) in zip(runs, opened, pairs)
    ]
    if scales is None:
        return prods
    return truncate_many(prods, [p.scale if s is None else s for p, s in zip(prods, scales)])


def mul(a: Fx, b: Fx, scale: int) -> Fx:
    return mul_many([(a, b)], [scale])[0]


# -- bins -------------------------------------------------------------------------------


def step_bits(x: Fx, thresholds: Sequence[float]) -> Shares:
    """Shares of the stacked bits c_k = [x >= theta_k] (shape [T, *x.shape], integers), in
    one comparison run (4 rounds, 3 within ``three_round_up_to``; 1 with FSS):
    c_k = 1 - msb(x - theta_k), each element
    of x opened once masked for all its thresholds
    (:func:`~mpc.protocols.compare.msb_thresholds`)."""
    enc = [round(th * 2**x.scale) for th in thresholds]
    bits = msb_thresholds(x.session, x.shares, enc)
    c = [-b for b in bits]
    c[0] = c[0] + 1
    return c


def select(x: Fx, bits: Shares, per_bin: Sequence[float], scale: int) -> Fx:
    """The value that is ``per_bin[b]`` on bin b (T + 1 bins for T thresholds: below the
    first, between consecutive ones, at or above the last), at ``scale``; local, no round.
    Exact: sum_k c_k (v_k - v_{k-1}) + v_below in integers."""
    enc = torch.tensor([round(v * 2**scale) for v in per_bin], dtype=I64)
    diffs = (enc[1:] - enc[:-1]).view([len(per_bin) - 1] + [1] * len(x.shape))
    shares = [(c * diffs).sum(0) for c in bits]
    shares[0] = shares[0] + int(enc[0])
    return x.with_shares(shares, scale)


def powers(u: Fx, n: int, scale: int) -> list[Fx]:
    """[u, u^2, ..., u^n] at ``scale``, by levels: level l computes every power up to 2^l
    from two known ones (ceil(log2 n) levels, two rounds each)."""
    known: dict[int, Fx] = {1: u if u.scale == scale else truncate_many([u], [scale])[0]}
    while len(known) < n:
        top = max(known)
        todo = [k for k in range(top + 1, min(2 * top, n) + 1)]
        pairs = [(known[k - top], known[top]) for k in todo]
        for k, p in zip(todo, mul_many(pairs, [scale] * len(pairs))):
            known[k] = p
    return [known[k] for k in range(1, n + 1)]


def poly_public(pows: Sequence[Fx], coefs: Sequence[float], bits: int) -> Fx:
    """sum_d coefs[d] u^d with public coefficients (encoded at ``bits``), untruncated at
    scale s + bits (local; the caller truncates with whatever else it truncates)."""
    acc = pows[0].times_public(coefs[1], bits)
    for p, c in zip(pows[1:], coefs[2:]):
        acc = acc.add(p.times_public(c, bits))
    return acc.add_public(coefs[0])


def fit(
    f: Callable[[torch.Tensor], torch.Tensor],
    lo: float,
    hi: float,
    deg: int,
    relative: bool = False,
    zero_at_zero: bool = False,
) -> list[float]:
    """Least-squares polynomial fit of f on Chebyshev nodes of [lo, hi] (float64), near
    minimax; ``zero_at_zero``: no constant term (p(0) = 0 exactly)."""
    x = chebyshev_nodes(lo, hi, 256)
    first = 1 if zero_at_zero else 0
    v = torch.stack([x**d for d in range(first, deg + 1)], 1)
    y = f(x)
    w = 1 / y.abs() if relative else torch.ones_like(y)
    c = torch.linalg.lstsq(v * w[:, None], (y * w)[:, None]).solution[:, 0].tolist()
    return [0.0] * first + c


# -- exp --------------------------------------------------------------------------------

LOG2E = 1.0 / math.log(2.0)
EXP_T_LO, EXP_T_HI, EXP_STEP, EXP_DEG = -24, 16, 8, 8
# 2^(8u) for u in [0, 1), in the centred variable w = 2u - 1 (smaller coefficients)
_EXP_POLY = fit(lambda w: torch.exp2(EXP_STEP * (w + 1) / 2), -1.0, 1.0, EXP_DEG, relative=True)


def exp(x: Fx, out: int, t_hi: int = EXP_T_HI) -> Fx:
    """[e^x] by range reduction: t = x log2(e), n = t rounded down to a multiple of 8,
    e^x = 2^n 2^(t - n), 2^(t-n) = p(w) for u = (t - n)/8 in [0, 1) and w = 2u - 1
    (degree 8, relative error 1e-4), 2^n selected by the bin bits (exact).

    Domain t in [-24, t_hi) (x in [-16.6, 11.09) for t_hi = 16): below it the result is 0,
    at or above it 2^t_hi (saturation). Rounds: truncation of x log2 e (1), comparison with
    6 thresholds (7), powers w^2..w^8 (6), the polynomial's truncation (1), the product
    2^n p(w) (2): 17. Bins of 2 (a degree-4 polynomial) would take 15 rounds but 21
    comparisons per element instead of 6.
    """
    edges_t = list(range(EXP_T_LO, t_hi + 1, EXP_STEP))
    thresholds = [e / LOG2E for e in edges_t]
    bits = step_bits(x, thresholds)
    # bins: below, [e_k, e_k+1) for k < T-1, top
    ns = [float(EXP_T_LO)] + [float(e) for e in edges_t[:-1]] + [float(t_hi)]
    t = x.times_public(LOG2E / EXP_STEP, 24)  # (t / 2) at scale s + 24
    u = t.add(select(x, bits, [-n / EXP_STEP for n in ns], t.scale))
    (u,) = truncate_many([u], [WORK])
    w = u.with_shares(u.shares, WORK - 1).add_public(-1.0).lift(WORK)  # 2u - 1, exact
    pows = powers(w, EXP_DEG, WORK)
    p = poly_public(pows, _EXP_POLY, 20)
    # p < 2^8 at scale 20, 2^n <= 2^16 at out: the product stays below 2^62
    (p,) = truncate_many([p], [WORK - 4])
    gamma = select(x, bits, [0.0] + [2.0**n for n in ns[1:-1]] + [0.0], out)
    top = select(x, bits, [0.0] * (len(ns) - 1) + [2.0**t_hi], out)
    return mul(gamma, p, out).add(top)


# -- normalisation x = m 2^E --------------------------------------------------------------


def normalise(
    x: Fx,
    jmin: int,
    jtop: int,
    step: int,
    signed: bool,
    per_e: Callable[[int, int], float],
    out: int,
) -> tuple[Fx, Fx]:
    """x = sign * m * 2^E with m in [2^-step, 1) on the bins [2^j, 2^(j+step)) (E = j + step),
    saturating: |x| < 2^jmin reads as 2^jmin (m = 1, E = jmin; 0 and, unsigned, negative
    x too), |x| >= 2^jtop as 2^jtop. Returns [m] (scale WORK) and [per_e(sign, E)] at
    ``out`` (a value constant on each bin: linear in the bits, no round).

    Rounds: one comparison (7) and the product m = alpha(x) x with the selected 2^-E (2).
    Catrina and Saxena (FC 2010) find the bit length by a bit decomposition; the bins'
    comparisons here all run in parallel instead.
    """
    pos = list(range(jmin, jtop + 1, step))
    if pos[-1] != jtop:
        raise ValueError("internal: jtop - jmin must be a multiple of step")
    # bins, as (sign, alpha, beta, E): m = alpha x + beta
    pos_bins = [(1, 2.0 ** -(j + step), 0.0, j + step) for j in pos[:-1]] + [(1, 0.0, 1.0, jtop)]
    if signed:
        thresholds = [-(2.0**j) for j in reversed(pos)] + [0.0] + [2.0**j for j in pos]
        neg_bins = [(-1, 0.0, 1.0, jtop)] + [
            (-1, -(2.0 ** -(j + step)), 0.0, j + step) for j in reversed(pos[:-1])
        ]
        bins = neg_bins + [(-1, 0.0, 1.0, jmin), (1, 0.0, 1.0, jmin)] + pos_bins
    else:
        thresholds = [2.0**j for j in pos]
        bins = [(1, 0.0, 1.0, jmin)] + pos_bins
    bits = step_bits(x, thresholds)
    abits = max(WORK, jtop + 2)
    alpha = select(x, bits, [b[1] for b in bins], abits)
    beta = select(x, bits, [b[2] for b in bins], WORK)
    m = mul(alpha, x, WORK).add(beta)
    return m, select(x, bits, [per_e(b[0], b[3]) for b in bins], out)


# reciprocal: 1/x = sign 2^-E / m, m in [1/4, 1)
REC_JMIN, REC_JTOP, REC_STEP = -12, 12, 2
# linear start for 1/m on [1/4, 1] with integer slope: y0 = 3.75 - 3 m, |1 - m y0| <= 1/4
# (the minimax slope 3.12 gives 0.22 but costs a truncation round)


def reciprocal(
    x: Fx, out: int, jmin: int = REC_JMIN, jtop: int = REC_JTOP, signed: bool = True
) -> Fx:
    """[1/x]: normalise |x| = m 2^E (9 rounds), then Goldschmidt on m in [1/4, 1):
    y0 = 3.75 - 3 m (|eps| <= 1/4, no round), eps = 1 - m y0,
    1/m = y0 (1 + eps)(1 + eps^2)(1 + eps^4) (relative error eps^8 <= 1.5e-5), with the
    scale 2^-E multiplied into y0 in the first level: 4 levels, 8 rounds. 17 rounds.

    ``signed``: first |x| = x - 2 x msb(x) and the sign 1 - 2 msb(x) from one comparison
    (7 rounds, the products ride on it), the sign multiplied in at the end (1 round, an
    integer: no truncation): 25 rounds, 14 comparisons per element on the default domain
    (normalising x itself over both signs takes 8 fewer rounds but 27 comparisons).

    Domain 2^-12 <= |x| < 2^12: smaller magnitudes saturate to +-2^12 (x = 0 gives +2^12),
    larger ones to +-2^-12.
    """
    if signed:
        # 1 shared trivially, made where the shares live (ones_like of a pointer is one)
        one = cast(
            Shares,
            [torch.ones_like(s) if i == 0 else torch.zeros_like(s) for i, s in enumerate(x.shares)],
        )
        xm, ms = select_by_msb(x.session, x.shares, [x.shares, one])
        absx = x.with_shares([s - 2 * t for s, t in zip(x.shares, xm)])
        sign = x.with_shares([-2 * t for t in ms], 0).add_public(1.0)
        r = reciprocal(absx, out, jmin, jtop, signed=False)
        return mul_many([(r, sign)], None)[0]
    m, g = normalise(x, jmin, jtop, REC_STEP, False, lambda s, e: 2.0**-e, out)
    y0 = m.times_public(-3.0, 0).add_public(3.75)  # exact, no round
    # |g y| < 2^14 for |x| >= 2^-12: the products stay below the truncation's 2^62
    my0, gy = mul_many([(m, y0), (g, y0)], [WORK, out])
    eps = my0.neg().add_public(1.0)
    eps2, acc = mul_many([(eps, eps), (gy, eps.add_public(1.0).lift(WORK))], [WORK, out])
    eps4, acc = mul_many([(eps2, eps2), (acc, eps2.add_public(1.0))], [WORK, out])
    return mul(acc, eps4.add_public(1.0), out)


# rsqrt: x^-1/2 = 2^(-E/2) m^-1/2, m in [1/4, 1), E even
SQ_JMIN, SQ_JTOP, SQ_STEP = -14, 16, 2
_RSQRT_START = fit(lambda m: m**-0.5, 0.25, 1.0, 2, relative=True)


def rsqrt(x: Fx, out: int) -> Fx:
    """[1/sqrt(x)]: normalise x = m 2^E with E even (9 rounds); y0 = q(m) a quadratic
    (relative error 3e-2, 3 rounds: m^2 and a truncation); two Newton-Raphson steps
    y <- 1.5 y - 0.5 m y^3 (relative error 1.5 e^2 per step: 1e-6): the first in two
    levels (m y and y^2, then their product: 4 rounds), the second with the scale
    2^(-E/2) multiplied in, as g y (1.5 - 0.5 (m y) y) in three levels (6 rounds):
    22 rounds.

    Domain [2^-14, 2^16): below, the result saturates to 2^7 (x <= 0 included), above
    to 2^-8.
    """
    m, g = normalise(x, SQ_JMIN, SQ_JTOP, SQ_STEP, False, lambda s, e: 2.0 ** (-e / 2), WORK)
    (m2,) = mul_many([(m, m)], [WORK])
    y = poly_public([m, m2], _RSQRT_START, 16)
    (y,) = truncate_many([y], [WORK])
    my, y2 = mul_many([(m, y), (y, y)], [WORK, WORK])
    (my3,) = mul_many([(my, y2)], None)  # untruncated, scale 2 WORK
    y = y.times_public(1.5, 1).add(my3.halve().neg())  # scale 2 WORK + 1, exact
    (y,) = truncate_many([y], [WORK])  # the level's one truncation
    my, gy = mul_many([(m, y), (g, y)], [WORK, WORK])
    (my2,) = mul_many([(my, y)], [WORK])
    h = my2.neg().halve().add_public(1.5)  # 1.5 - m y^2 / 2 at scale WORK + 1
    return mul(gy, h, out)


# log: ln x = ln m + E ln 2, m in [1/2, 1)
LOG_JMIN, LOG_JTOP, LOG_STEP, LOG_DEG = -16, 16, 2, 7
_LOG_POLY = fit(torch.log, 0.25, 1.0, LOG_DEG)


def log(x: Fx, out: int, jmin: int = LOG_JMIN, jtop: int = LOG_JTOP) -> Fx:
    """[ln x]: normalise x = m 2^E, m in [1/4, 1) (bins of 2 bits: 17 comparisons per
    element on the default domain; 9 rounds), ln m = p(m) of degree 7 (abs error 5.4e-5,
    coefficients at 20 bits; powers 6 rounds, truncation 1), plus E ln 2 selected by the
    bits (no round): 16 rounds. Bins of 1 bit with a degree-4 polynomial take 14 rounds
    but 33 comparisons per element. Domain [2^-16, 2^16): below (x <= 0 included) the
    result saturates to -16 ln 2 = -11.09, above to 16 ln 2.
    """
    m, g = normalise(x, jmin, jtop, LOG_STEP, False, lambda s, e: e * math.log(2.0), out)
    pows = powers(m, LOG_DEG, WORK)
    p = poly_public(pows, _LOG_POLY, 20)
    (p,) = truncate_many([p], [out])
    return p.add(g)


# -- piecewise polynomials on few, wide bins ------------------------------------------------


def piecewise_wide(
    x: Fx,
    edges: Sequence[float],
    shift: int,
    inner: Sequence[Sequence[float]],
    below: Sequence[float],
    above: Sequence[float],
    out: int,
) -> Fx:
    """f(x) = q_b(x / 2^shift) on the inner bin b = [edges[b], edges[b+1]), each q_b a
    polynomial of the same degree D in v = x / 2^shift (coefficients ``inner[b]``, low
    first), and ``below[0] + below[1] x`` / ``above[0] + above[1] x`` outside (constant or
    linear).

    Rounds: the powers v^2..v^D at 24 bits (2 ceil(log2 D)), one comparison of x with the
    T edges (7), the products [x in bin b] q_b(v) of the 0/1 bin indicators with the
    locally evaluated polynomials, and the linear outer pieces, in one Beaver round (no
    truncation: the indicators are integers), then one truncation: 15 rounds for D = 7.
    Per element: T comparisons and D - 1 + T + 1 products. Piecewise cubics on narrow bins
    (a comparison per bin) cost two to four times more: a comparison sends about three
    times the bytes of a product.

    Outside the inner bins the powers overflow for large |x|; they are multiplied by a
    zero indicator there, which is exact in the ring.
    """
    deg = len(inner[0]) - 1
    for piece in (below, above):
        if len(piece) > 1 and piece[1] not in (0.0, 1.0):
            raise ValueError("internal: an outer piece is a constant, or a constant plus x")
    v = x.halve(shift).lift(max(WORK, x.scale + shift))
    pows = powers(v, deg, WORK)
    bits = step_bits(x, edges)  # c_k = [x >= edges[k]], integers
    t = len(edges)
    cbits = 20
    # the constants of every bin by select (free); the rest times the bin's indicator
    consts = [below[0]] + [q[0] for q in inner] + [above[0]]
    base = select(x, bits, consts, WORK + cbits)
    pairs: list[tuple[Fx, Fx]] = []
    for b, q in enumerate(inner):  # [x in bin b] = c_b - c_(b+1)
        ind = x.with_shares([c[b] - c[b + 1] for c in bits], 0)
        pairs.append((ind, poly_public(pows, [0.0, *q[1:]], cbits)))
    linear: list[tuple[Fx, Fx]] = []
    if len(below) > 1 and below[1]:
        low = [-c[0] for c in bits]
        low[0] = low[0] + 1
        linear.append((x.with_shares(low, 0), x))
    if len(above) > 1 and above[1]:
        linear.append((x.with_shares([c[t - 1] for c in bits], 0), x))
    prods = mul_many(pairs + linear, None)
    acc = base
    for p in prods[: len(pairs)]:
        acc = acc.add(p)
    (res,) = truncate_many([acc], [out])
    for p in prods[len(pairs) :]:  # x at its own scale: no overflow for large x
        res = res.add(p if p.scale <= out else truncate_many([p], [out])[0])
    return res
