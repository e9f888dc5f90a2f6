"""v * x^-p (p = 1: a division, p = 1/2: a division by a square root) for a positive
shared x with few elements and a shared v broadcast over it (issue 25): softmax's division
by the row sums, layer norm's by the rows' standard deviations, in 8 rounds where the
reciprocal or rsqrt and the product took 16 (softmax) and 21 (layer norm).

Method. One comparison run of x with fine thresholds theta_k = 2^(lo + k/K) (K per octave)
selects, locally, per-bin public values (:func:`mpc.protocols.approx.select`): a slope
beta ~ 1/c for the bin's centre c and g = mult * beta^p, so that x^-p mult = g z^-p with
z = beta x in [q^-1/2, q^1/2] (q = 2^(1/K)); then z^-p = f(u), u = z - 1 small, by a
cubic f fitted on that interval (relative error 8e-6 for p = 1, 2.2e-6 for p = 1/2 at K =
4). The three product levels:

1. z = beta x and E = v g (the selected g at ``Gs`` bits);
2. E u and u^2, with h = C u + D u^2 truncated in the same truncation round;
3. (E u) h; the result A E + B (E u) + (E u) h is truncated once.

The products of levels 2 and 3 are of values just truncated, so they ride in that
truncation's round with no opening of their own (:mod:`mpc.protocols.truncated_products`): rounds
4 (comparison; 1 with FSS comparisons) + 1 (level 1) + 1 (truncation and level 2) + 1
(truncation and level 3) + 1 (truncation) = 8 (5 with FSS); they were 4 + 3 x 2 = 10. Per element of x: T = K (hi - lo) + 1 comparisons
(x has few elements: a row's sum or variance); per element of v: three products whose
other operand is x's size (broadcast: v's own openings only).

Outside [2^lo, 2^hi) the result saturates: x below (0 and negative x included) reads as
2^lo, x above as 2^hi (z = 1 in those bins). beta is encoded at ``60 - x.scale`` bits and
g recomputed from the encoded beta, so the rounding of beta only widens the interval on
which f is fitted. Cf. the bit-length normalisation of Catrina and Saxena (FC 2010) with
the bins' comparisons in parallel (:mod:`mpc.protocols.approx`), here with bins a quarter
octave wide so that a cubic replaces the Newton or Goldschmidt iterations.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

import torch

from mpc.protocols.approx import WORK, Fx, fit, select, step_bits, truncate_many
from mpc.protocols.beaver.run import BeaverRun
from mpc.protocols.opening.run import Round
from mpc.protocols.riders.run import riding
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.protocols.truncation.run import TruncRun

PER_OCTAVE = 4


#: the most fine bins' comparisons a call takes (:func:`fine_bins`): the default
#: comparison's dealer material is 53 bytes each (and 8 a value); FSS's keys are 3 KB a
#: value, whatever its number of thresholds (:func:`mpc.protocols.compare.msb_thresholds`),
#: and each comparison a DCF evaluation at each party. By default a prefill's 128 rows of
#: layer norm over 768 (122,880) fit: one round fewer than the cubic, and the factor after
#: the next product (mpc.ops.row_scaled) two more, for about 5 bytes a comparison a party
#: (W15: 731 -> 656 rounds, 1.02 -> 1.04 GB a party)
FINE_BINS = {"default": 1 << 17, "fss": 8192}
COEF_BITS = 12  # C and D of the cubic (they multiply u^2 and u^3: |u| < 0.1)


def _levels(pairs: list[tuple[Fx, Fx]]) -> list[Fx]:
    """Untruncated products of each pair in one Beaver round; an operand of fewer elements
    is broadcast by the product itself (``mul`` of two shapes: its openings are its own
    size)."""
    session = pairs[0][0].session
    runs = []
    for a, b in pairs:
        shape = tuple(torch.broadcast_shapes(tuple(a.shape), tuple(b.shape)))
        runs.append(BeaverRun(session, a.shares, b.shares, "mul", {}, shape))
    one = Round(session)
    opened = [r.open_in(one) for r in runs]
    one.open()
    return [
        Fx(session, r.finish_opened(o), a.scale + b.scale)
        for r, o, (a, b) in zip(runs, opened, pairs)
    ]


@lru_cache(maxsize=64)
def bins_table(
    p: float, lo: float, hi: float, per_octave: int, x_scale: int, mult: float, degree: int = 3
) -> tuple[list[float], list[float], list[float], list[float], int, int, list[float]]:
    """Thresholds, per-bin beta (as encoded), gamma and g, beta's and g's scales, and the
    polynomial's coefficients: the cubic's [A, B, C, D] (C and D rounded to COEF_BITS), or
    with ``degree=1`` the line's [A, B]."""
    count = max(1, math.ceil((hi - lo) * per_octave - 1e-9))
    thresholds = [2.0 ** (lo + k / per_octave) for k in range(count + 1)]
    bscale = 60 - x_scale
    q = 2.0 ** (1.0 / per_octave)
    betas, gammas, gs = [0.0], [1.0], [mult * thresholds[0] ** -p]
    zlo, zhi = 1.0, 1.0
    for a, b in zip(thresholds[:-1], thresholds[1:]):
        beta = round(2**bscale / (a * math.sqrt(q))) / 2**bscale
        if beta <= 0 or abs(beta * a * math.sqrt(q) - 1) > 2**-6:
            raise ValueError(f"internal: x up to {b:.3g} too large for {bscale} bits")
        betas.append(beta)
        gammas.append(0.0)
        gs.append(mult * beta**p)
        zlo, zhi = min(zlo, beta * a), max(zhi, beta * b)
    betas.append(0.0)
    gammas.append(1.0)
    gs.append(mult * thresholds[-1] ** -p)
    gscale = min(WORK - math.floor(math.log2(min(gs))), 58 - math.ceil(math.log2(max(gs))))
    coefs = fit(lambda u: (1 + u) ** -p, zlo - 1, zhi - 1, degree, relative=True)
    coefs = coefs[:2] + [round(c * 2**COEF_BITS) / 2**COEF_BITS for c in coefs[2:]]
    return thresholds, betas, gammas, gs, bscale, gscale, coefs


def fine_per_octave(p: float) -> int:
    """Few rows (a decoding step's layer norm or softmax) take bins 1/64 octave wide for
    p = 1 and 1/32 for p = 1/2 (whose curvature is 3/8 of 1/x's): there a line fits z^-p
    within 3e-5, one product level fewer than the cubic."""
    return 64 if p >= 1 else 32


def fine_bins(session: Any, rows: int, lo: float, hi: float, p: float = 0.5) -> bool:
    """Whether :func:`times_inverse_power` takes fine bins (:func:`fine_per_octave`) and a
    line (7 rounds, 4 with FSS) for ``rows`` values of x in [2^lo, 2^hi): within
    :data:`FINE_BINS` comparisons in the session's mode."""
    count = math.ceil((hi - lo) * fine_per_octave(p))
    return rows * count <= FINE_BINS.get(session.config.comparison, 0)


def times_inverse_power(
    v: Fx,
    x: Fx,
    p: float,
    lo: float,
    hi: float,
    out: int,
    mult: float = 1.0,
    per_octave: int = PER_OCTAVE,
    pending: tuple[int, int] = (0, 0),
) -> Fx:
    """[v * mult * x^-p] at scale ``out`` (x positive, in [2^lo, 2^hi): the module
    docstring), in 8 rounds. v's shape broadcasts x's (x: one value per row).

    ``pending``: bits of v and of x still to be truncated. The comparison reads x at its
    full scale (thresholds below 2^62 ring units: x's domain ends there), and both
    truncations ride in the comparison's first round (:mod:`mpc.protocols.riders`): no
    round of their own."""
    v_bits, x_bits = pending
    fine = fine_bins(x.session, math.prod(x.shape), lo, hi, p)
    thresholds, betas, gammas, gs, bscale, gscale, coefs = bins_table(
        p,
        lo,
        hi,
        fine_per_octave(p) if fine else per_octave,
        x.scale - x_bits,
        mult,
        1 if fine else 3,
    )
    runs = [TruncRun(t.session, t.shares, k) for t, k in ((v, v_bits), (x, x_bits)) if k]
    with riding(runs) as rides:
        bits = step_bits(x, thresholds)  # one comparison run (4 rounds)
    done = iter(rides.results)
    if v_bits:
        v = v.with_shares(next(done), v.scale - v_bits)
    if x_bits:
        x = x.with_shares(next(done), x.scale - x_bits)
    beta = select(x, bits, betas, bscale)
    gamma = select(x, bits, gammas, x.scale + bscale)
    g = select(x, bits, gs, gscale)
    # level 1: z = beta x + gamma, E = v g
    zr, er = _levels([(x, beta), (v, g)])
    if fine:  # A E + B E u: E u rides in the truncation of z and E (the line: 3 rounds)
        a, b = coefs
        (u, e), (eur,) = truncate_and_multiply(
            [zr.add(gamma), er], [WORK, WORK], [-1.0, 0.0], [(1, 0)]
        )
        # (two truncations in one round: E u B at 8 more bits, as |u| < 0.02)
        ea, eub = truncate_many([e.times_public(a, WORK), eur.times_public(b, 8)], [out, out])
        return ea.add(eub)
    a, b, c, d = coefs
    # z and E truncated, u = z - 1, and level 2's E u and u^2 from the same round
    # (mpc.protocols.truncated_products: products of freshly truncated values need no opening)
    (u, e), (eur, u2r) = truncate_and_multiply(
        [zr.add(gamma), er], [WORK, WORK], [-1.0, 0.0], [(1, 0), (0, 0)]
    )
    # h = C u + D u^2; E u and h truncated, and level 3's (E u) h in the same round
    hr = u.times_public(c, COEF_BITS).lift(2 * WORK + COEF_BITS)
    hr = hr.add(u2r.times_public(d, COEF_BITS))
    (eu, h), (euh,) = truncate_and_multiply([eur, hr], [WORK, WORK], [0.0, 0.0], [(0, 1)])
    # A E + B E u + E u h, truncated once
    total = e.times_public(a, WORK).add(eu.times_public(b, WORK)).add(euh)
    return truncate_many([total], [out])[0]
