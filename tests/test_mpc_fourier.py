"""Masked Fourier series on shares (mpc.protocols.fourier.run.fourier_series, mpc.math.fourier).

The protocol is tested against the series itself evaluated in float64 on the encoded input
(so the bound is the fixed point's, not a fit's), for random series, periods and inputs
far outside one period (the ring's wrap-around is the period's), on 2 and 3 parties; then
its cost, and what a worker refuses.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.math.fourier import (
    MAX_TERMS,
    Series,
    fit_series,
    harmonic_steps,
    harmonics,
    ring_angle,
)
from mpc.protocols import approx
from mpc.protocols import parties as party_calls
from mpc.protocols.comparison.steps import cmp_mask
from mpc.protocols.fourier import run as trig
from mpc.protocols.opening.run import open_among
from pointers.wire.messages import Describe

U = 2.0**-16
PROPS = settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def plain_series(series: Series, x: torch.Tensor) -> torch.Tensor:
    k = torch.arange(1, series.terms + 1, dtype=torch.float64)
    ang = 2 * math.pi * x[..., None] * k / 2.0**series.period_bits
    a = torch.tensor(series.cos, dtype=torch.float64)
    b = torch.tensor(series.sin, dtype=torch.float64)
    return series.const + (torch.cos(ang) * a).sum(-1) + (torch.sin(ang) * b).sum(-1)


def evaluate(x: torch.Tensor, series: Series, group: Any) -> torch.Tensor:
    shared = mpc.share(x.float(), *group[0], crypto_provider=group[1])
    fx = approx.Fx(shared.session, list(shared.shares), shared.frac_bits)
    y = trig.fourier_series(fx, series, 24)
    # decoded in float64: a float32 result would add up to half its ulp (2 units of 2^-24
    # for |F| in [2, 4)), which the bounds below do not count (it failed CI once so)
    out = mpc.SharedTensor(y.shares, shared.session, y.scale, torch.float64)
    return out.get()


series_st = st.builds(
    lambda k, p, const, coefs, single: Series(
        p, 1.0, const, tuple(coefs[:k]), tuple(coefs[MAX_TERMS : MAX_TERMS + k]), 0.0, single
    ),
    st.integers(1, 12),
    st.integers(1, 8),
    st.floats(-2, 2),
    st.lists(st.floats(-1, 1), min_size=2 * MAX_TERMS, max_size=2 * MAX_TERMS),
    st.booleans(),
)


@PROPS
@given(series=series_st, x=st.lists(st.floats(-3000, 3000), min_size=1, max_size=20))
def test_series_matches_float64_on_the_encoded_input(
    series: Series, x: list[float], group: Any
) -> None:
    xt = torch.tensor(x, dtype=torch.float32).double()
    encoded = torch.round(xt * 2**16) / 2**16  # the ring holds this; the period is exact
    got = evaluate(xt, series, group)
    # dealt cos/sin at 2^-30 and public coefficients at 2^-24, each rounded by half a
    # unit, per term; the output's unit (2^-24) and the truncation's one more
    total = sum(abs(c) for c in (*series.cos, *series.sin))
    bound = total * 2**-31 + 2 * series.terms * 2**-25 + 2 * 2**-24 + 1e-12
    if series.single:
        # float32: the angle off by up to 2^-24 of a turn (F's slope times that shift),
        # the harmonics' recurrence (~k 2^-24 relative) and the products' rounding
        slope = sum(
            k * (abs(a) + abs(b)) for k, (a, b) in enumerate(zip(series.cos, series.sin), 1)
        )
        bound += slope * 2 * math.pi * 2**-23 + total * series.terms * 2**-22
    want = plain_series(series, encoded)
    assert bool(((got - want).abs() <= bound).all()), (got - want).abs().max()


def test_fit_and_harmonics() -> None:
    s = fit_series(lambda t: torch.sigmoid(t) - 0.5, 10.0, 5, 12, odd=True)
    grid = torch.linspace(-10, 10, 4001, dtype=torch.float64)
    assert (plain_series(s, grid) - (torch.sigmoid(grid) - 0.5)).abs().max() <= s.max_error + 1e-12
    assert s.max_error < 1e-4 and s.cos == (0.0,) * 12
    ang = torch.tensor([0.0, 0.3, -2.0, 3.1], dtype=torch.float64)
    h = harmonics(ang, 7)
    k = torch.arange(1, 8, dtype=torch.float64)[:, None]
    assert torch.allclose(h.real, torch.cos(k * ang), atol=1e-14)
    assert torch.allclose(h.imag, torch.sin(k * ang), atol=1e-14)
    for dtype in (torch.float64, torch.float32):  # one at a time: the same values, bit for bit
        a = ang.to(dtype)
        assert torch.equal(torch.stack(list(harmonic_steps(a, 7))), harmonics(a, 7))
    z = torch.tensor([0, 1 << 20, -(1 << 20), (1 << 21) + 5, -1], dtype=torch.int64)
    want = torch.tensor([0, 2**20, 2**20, 5, 2**21 - 1], dtype=torch.float64) * 2 * math.pi / 2**21
    assert torch.allclose(ring_angle(z, 21), want)
    for bad in (dict(terms=0), dict(terms=MAX_TERMS + 1)):
        with pytest.raises(ValueError, match="terms"):
            fit_series(torch.sin, 1.0, 3, **bad)
    with pytest.raises(ValueError, match="period"):
        fit_series(torch.sin, 5.0, 3, 4)


def test_sigmoid_and_exp_cost_no_products(group: Any) -> None:
    x = mpc.share(torch.randn(500) * 6, *group[0], crypto_provider=group[1])
    with mpc.stats() as s:
        torch.sigmoid(x).get()
    # the clamp's comparison run (3: 500 elements, within MPCConfig.three_round_up_to, no d
    # round; 4 with it), in whose rounds the series' opening and its products with the
    # clamp's bits ride, then the truncation
    assert s.rounds == 4
    row = mpc.share(torch.randn(4, 50) * 3, *group[0], crypto_provider=group[1])
    with mpc.stats() as sm:
        torch.softmax(row, 1).get()
    with mpc.stats() as mx:
        row.max(1)
    # exp of x - max: its clamp (7) and series (2); the reciprocal and product after it
    assert sm.rounds - mx.rounds <= 9 + 24


def test_a_worker_refuses_bad_series_steps(group: Any) -> None:
    parties, carol = group
    alice = parties[0]
    x = mpc.share(torch.ones(3), *parties, crypto_provider=carol)
    session = x.session
    dseeds, seed = session.dealer_seeds, session.party_seeds[0]
    out = [((3, 3, 2), torch.int64)]
    bad_dealer = [
        ([21, 0, 30, False], "terms"),
        ([21, MAX_TERMS + 1, 30, False], "terms"),
        ([63, 3, 30, False], "period bits"),
        ([21, 3, 31, False], "scale"),
        ([21, 3.0, 30, False], "terms"),
        ([21, 3, 30, 1], "precision flag"),
    ]
    for params, what in bad_dealer:
        with pytest.raises(pt.RemoteError, match=what):
            pt.call_function(
                carol, "mpc.dealer_fourier", [dseeds, session.next_nonce(), [3], *params], out=out
            )
            carol.request(Describe([]))
    nonce = session.next_nonce()
    pt.call_function(carol, "mpc.dealer_fourier", [dseeds, nonce, [3], 21, 3, 30, False], out=out)
    with pytest.raises(pt.RemoteError, match="already used"):
        pt.call_function(
            carol, "mpc.dealer_fourier", [dseeds, nonce, [3], 21, 3, 30, False], out=out
        )
        carol.request(Describe([]))
    share = x.shares[0]

    def opened() -> tuple[int, Any]:
        """A masked x opened among the parties for a fresh instance (the step's input)."""
        nonce = session.next_nonce()
        (masked,) = party_calls.at_parties(
            session,
            cmp_mask,
            lambda i: [session.party_seeds[i], nonce, x.shares[i]],
            [((3,), torch.int64)],
        )
        (c,) = open_among(session, [masked])
        return nonce, c[0]

    ok = [21, 0.5, [0.1] * 3, [0.2] * 3, 24, 30, False]
    bad_party = [
        ([21, 0.5, [0.1] * 2, [0.2] * 3, 24, 30, False], "as many cosine"),
        ([21, float("nan"), [0.1] * 3, [0.2] * 3, 24, 30, False], "finite"),
        ([21, 0.5, [1e9] * 3, [0.2] * 3, 24, 30, False], "finite"),
        ([21, 0.5, [0.1] * 3, [0.2] * 3, 40, 30, False], "coefficient bits"),
    ]
    for params, what in bad_party:
        nonce, c = opened()
        with pytest.raises(pt.RemoteError, match=what):
            pt.call_function(
                alice,
                "mpc.fourier_finish",
                [seed, nonce, True, None, c, *params],
                out=[((3,), torch.int64)],
            )
            alice.request(Describe([]))
    # an opened value of another instance, or one not opened, is refused
    nonce, c = opened()
    with pytest.raises(pt.RemoteError, match="instance"):
        pt.call_function(
            alice,
            "mpc.fourier_finish",
            [seed, session.next_nonce(), True, None, c, *ok],
            out=[((3,), torch.int64)],
        )
        alice.request(Describe([]))
    # the opened value must be material (sealed): a client's own tensor is refused
    with pytest.raises(pt.RemoteError, match="sealed|material"):
        pt.call_function(
            alice,
            "mpc.fourier_finish",
            [seed, session.next_nonce(), True, None, share, *ok],
            out=[((3,), torch.int64)],
        )
        alice.request(Describe([]))
    assert torch.equal(x.get(), torch.ones(3))  # the workers stay usable
