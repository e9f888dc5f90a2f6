"""A masked Fourier series times a shared value, the client's side (the steps:
:mod:`mpc.protocols.series_product.steps`): [v F(x)] in one round, the opening of
c = x + r and of e = v - a, where the series alone (:func:`mpc.protocols.fourier.run.
series_value`) takes that round and a product with v one more."""

from __future__ import annotations

import math

from mpc.math.fourier import Series
from mpc.protocols import pieces
from mpc.protocols.approx import Fx, truncate_many
from mpc.protocols.fourier.run import EXP_SERIES, SERIES_SCALE, TRIG_BITS, TRIG_COEF_BITS
from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.protocols.series_product.steps import (
    dealer_series_product,
    series_mask,
    series_product_finish,
)
from mpc.session import Session


def _params(shape: list[int], bits: int, series: Series) -> dict[str, object]:
    return {"shape": shape, "bits": bits, "terms": series.terms, "single": series.single}


def fits(session: Session, shape: list[int], series: Series) -> bool:
    """Whether a series product over ``shape`` runs in one piece (its dealer's step, the
    largest, within :data:`mpc.config.STEP_BYTES`)."""
    params = _params(list(shape), 62, series)
    return pieces.count(dealer_series_product, params, math.prod(shape)) == 1


class SeriesProductRun:
    """[v F(x)] in phases: the dealer's material and each party's masks at construction,
    the openings wherever the caller puts them (``open_in``), then ``finish``: the shares
    of v F(x) at :data:`~mpc.protocols.fourier.run.SERIES_SCALE` (v: shared integers)."""

    def __init__(self, x: Fx, series: Series, v: Shares) -> None:
        session, shape = x.session, list(x.shape)
        self.session, self.series, self.shape, self.v = session, series, shape, v
        self.bits = bits = x.scale + series.period_bits
        if bits > 62:
            raise ValueError(f"internal: a period of 2^{bits} ring units is too long")
        if [list(s.shape) for s in v] != [shape] * len(v):
            raise ValueError(f"internal: a series product of {shape} by a value of another shape")
        self.nonce = nonce = session.next_nonce()
        seed = session.party_seeds
        (self.material_last,) = deal(
            session,
            "trigonometric series times a value",
            dealer_series_product,
            [nonce, shape, bits, series.terms, TRIG_BITS, series.single],
            out=[([2, series.terms, *shape, 2], I64)],
        )
        self.c, self.e = at_parties(
            session,
            series_mask,
            lambda i: [seed[i], nonce, x.shares[i], v[i]],
            [(shape, I64), (shape, I64)],
        )

    def open_in(self, round: Round) -> tuple[Opened, Opened]:
        return round.add(self.c), round.add(self.e)

    def finish(self, c: Shares, e: Shares) -> Shares:
        session, series, seed, nonce = (
            self.session,
            self.series,
            self.session.party_seeds,
            self.nonce,
        )
        material = last_only(session, self.material_last)
        coefs = [series.const, list(series.cos), list(series.sin)]
        (z,) = at_parties(
            session,
            series_product_finish,
            lambda i: (
                [seed[i], nonce, material(i), c[i], e[i], self.v[i], self.bits, *coefs]
                + [TRIG_COEF_BITS, TRIG_BITS, series.single]
            ),
            [(self.shape, I64)],
        )
        return z


def series_times(x: Fx, series: Series, v: Shares) -> Fx:
    """[v F(x)] for shared x (at its scale) and v (shared integers: a bit, or small
    enough that v F stays below 2^9 at :data:`~mpc.protocols.fourier.run.SERIES_SCALE`)
    in one round, at SERIES_SCALE, not truncated. For shapes :func:`fits` takes."""
    run = SeriesProductRun(x, series, v)
    one = Round(x.session)
    c, e = run.open_in(one)
    one.open()
    return x.with_shares(run.finish(c.value, e.value), SERIES_SCALE)


def exp_near(d: Fx, near: Shares, out: int | None) -> Fx:
    """[near e^d] for d <= 0 (softmax's x - max) and a shared bit ``near`` that is 1 where
    d >= :data:`~mpc.protocols.fourier.run.EXP_LO` (:func:`mpc.protocols.ranks.
    max_and_near` gives it with the max): the series of :func:`mpc.protocols.fourier.run.
    exp_nonpositive` times the bit in one round, where the clamp's comparison took three or
    four. ``out``: the result's scale (its truncation, one round more); None: at
    :data:`~mpc.protocols.fourier.run.SERIES_SCALE`, not truncated. Error as
    exp_nonpositive's (1.1e-6 absolute from the fit)."""
    e = series_times(d.add_public(8.0), EXP_SERIES, near)
    return e if out is None else truncate_many([e], [out])[0]


__all__ = ["SeriesProductRun", "exp_near", "fits", "series_times"]
