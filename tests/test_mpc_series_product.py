"""A masked Fourier series times a shared value in one round
(mpc/protocols/series_product/), and softmax's max with the exponential's clamp bits from
the ranks' own comparison run (mpc.protocols.ranks.max_and_near): against float64
plaintext (hypothesis, 2 and 3 parties, both comparison modes), the rounds they save, and
a client that sends the steps out of order."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from refusals import refused
from tampering import args_of, tamper

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.approx import Fx
from mpc.protocols.fourier.run import EXP_LO, EXP_SERIES, GELU_SERIES, SERIES_SCALE, series_at
from mpc.protocols.opening.run import Round
from mpc.protocols.ranks import max_and_near
from mpc.protocols.series_product import run as product_run
from mpc.protocols.series_product.run import exp_near, series_times
from mpc.protocols.series_product.steps import series_product_finish
from mpc.protocols.step import name_of
from mpc.shared import SharedTensor, public_to_shares

I64 = torch.int64
MODES = [(2, "default"), (3, "default"), (2, "fss")]


def _session(n: int, comparison: str = "default") -> tuple[list[Any], Any, MPCConfig]:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    return parties, pt.VirtualWorker("dealer"), MPCConfig(comparison=comparison)


def _open(session: Any, shares: Any, scale: int) -> torch.Tensor:
    return SharedTensor(list(shares), session, scale, torch.float64).get().double()


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(MODES),
    st.lists(st.floats(-16.0, 0.0), min_size=1, max_size=40),
    st.integers(0, 2**16),
)
@example(mode=(2, "default"), xs=[0.0, -2.2863783584787708e-05], seed=0)
def test_a_series_times_a_value_against_float64(mode, xs, seed) -> None:
    """v F(x) for EXP's and GELU's series over their fit ranges (ends included), v a bit
    or a small integer: within the fit's error (times |v|) plus the fixed point's."""
    n, comparison = mode
    parties, dealer, config = _session(n, comparison)
    gen = torch.Generator().manual_seed(seed)
    x = torch.tensor(xs + [-16.0, 0.0], dtype=torch.float64)
    for series, shift, v in [
        (EXP_SERIES, 8.0, torch.randint(0, 2, x.shape, generator=gen)),
        (GELU_SERIES, 0.0, torch.randint(-3, 4, x.shape, generator=gen)),
    ]:
        # float32 first: the share encodes t.float(), whose rounding can move t by one unit
        # of 2^-16 from the float64 value (x = -2.29e-5 near e^0 did).
        t = (x + shift).clamp(-series.half_width, series.half_width).float().double()
        xs_ = mpc.share(t.float(), *parties, crypto_provider=dealer, config=config)
        xs_.materialize()
        session = xs_.session
        with mpc.stats() as s:
            out = series_times(Fx(session, list(xs_.shares), 16), series, public_to_shares(v, xs_))
        assert s.rounds == 1
        got = _open(session, out.shares, out.scale)
        enc_t = torch.round(t * 2**16) / 2**16
        want = v.double() * torch.tensor([series_at(series, float(u)) for u in enc_t])
        bound = (series.max_error + 2e-6) * v.abs() + 1e-6
        assert ((got - want).abs() <= bound).all(), float((got - want).abs().max())


def _near(x: torch.Tensor, width: float) -> torch.Tensor:
    enc = torch.round(x * 2**16) / 2**16
    return (enc - enc.amax(-1, keepdim=True) >= -width).long()


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(MODES),
    st.integers(1, 4),
    st.integers(2, 20),
    st.integers(0, 2**16),
    st.floats(0.5, 40.0),
)
def test_the_max_and_the_entries_near_it_against_plaintext(mode, rows, k, seed, spread) -> None:
    """The max (exact) and [x_j >= max - 16] per entry, ties and entries at exactly 16
    below the max (and one unit beyond) included, in the ranks' rounds."""
    n, comparison = mode
    parties, dealer, config = _session(n, comparison)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=gen) * spread
    m = x.amax(-1)
    x[:, 0] = m  # a tie with the max
    if k > 2:
        x[:, 1] = m - 16.0  # exactly at the edge: near
    if k > 3:
        x[:, 2] = m - 16.0 - 2**-16  # one unit beyond: not near
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    xs.materialize()
    session = xs.session
    with mpc.stats() as s:
        mx, near = max_and_near(session, list(xs.shares), 16 << 16)
    pairs = rows * k * (k - 1) // 2
    # (by default the bits alone: 2 rounds by digit look-ups up to 2^13 compared values)
    run = 2 if 3 * pairs <= 1 << 13 else 3 if 3 * pairs <= 1 << 15 else 4
    assert s.rounds == (2 if comparison == "fss" else run + 1)
    enc = torch.round(x * 2**16) / 2**16
    assert torch.equal(_open(session, mx, 16).float().squeeze(-1), enc.amax(-1))
    got = SharedTensor(list(near), session, 0, I64).get().long()
    assert torch.equal(got, _near(x, 16.0))


@pytest.mark.parametrize("n", [2, 3])
def test_exp_near_against_torch(n: int) -> None:
    """e^(x - max) where x - max >= -16, else 0: within 2e-6 of float64."""
    parties, dealer, config = _session(n)
    x = torch.randn(12, 33, generator=torch.Generator().manual_seed(n)) * 12
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    xs.materialize()
    session = xs.session
    mx, near = max_and_near(session, list(xs.shares), 16 << 16)
    d = Fx(session, [s - m for s, m in zip(xs.shares, mx)], 16)
    e = exp_near(d, near, None)
    assert e.scale == SERIES_SCALE
    enc = torch.round(x.double() * 2**16) / 2**16
    dd = enc - enc.amax(-1, keepdim=True)
    want = torch.exp(dd) * (dd >= EXP_LO)
    assert float((_open(session, e.shares, e.scale) - want).abs().max()) < 2e-6


@pytest.mark.parametrize(
    ("comparison", "rounds", "before"),
    # by default: ranks with the clamp's bits 3 + 1, the series' product 1, the division's
    # bins and polynomial 6: 11, where the max by ranks (4), the clamp's comparison with
    # the series riding (3) and the division took 13; with FSS 1 + 1, 1 and 4: 7 (8); 10
    # where the division's bins (12 x 449) compare by digit look-ups in 2 rounds
    [("default", 10, 13), ("fss", 7, 8)],
)
def test_a_decoding_steps_softmax(comparison: str, rounds: int, before: int) -> None:
    """12 heads over 33 keys, as a user writes it: the rounds above, within 1e-4 of torch,
    masked positions weighing exactly 0."""
    parties, dealer, config = _session(2, comparison)
    x = torch.randn(1, 12, 1, 33, generator=torch.Generator().manual_seed(7)) * 6
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        y = torch.softmax(xs, -1)
        y.materialize()
    assert s.rounds == rounds < before
    assert float((y.get() - torch.softmax(x, -1)).abs().max()) < 1e-4
    mask = torch.zeros(33)
    mask[-5:] = float("-inf")
    masked = mpc.share(x, *parties, crypto_provider=dealer, config=config) + mask
    got = torch.softmax(masked, -1).get()
    assert torch.equal(got[..., -5:], torch.zeros(1, 12, 1, 5))
    assert float((got - torch.softmax(x + mask, -1)).abs().max()) < 1e-4


def test_a_long_row_keeps_the_tree() -> None:
    """Where the pairs pass the ranks' budget (one row of 300 entries: 44,850), the max
    and the clamp's comparison as before."""
    parties, dealer, config = _session(2)
    x = torch.randn(1, 300)
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    calls: list[Any] = []
    real = product_run.SeriesProductRun.__init__

    def init(self: Any, *args: Any) -> None:
        calls.append(args)
        real(self, *args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(product_run.SeriesProductRun, "__init__", init)
        y = torch.softmax(xs, -1).get()
    assert not calls
    assert float((y - torch.softmax(x, -1)).abs().max()) < 1e-4


# -- a client that sends the steps out of order ------------------------------------------


def _finish_args(monkeypatch: pytest.MonkeyPatch) -> list[list[Any]]:
    return args_of(monkeypatch, product_run, series_product_finish)


def _tamper(monkeypatch: pytest.MonkeyPatch, change: Callable[[int, list[Any]], list[Any]]) -> None:
    tamper(monkeypatch, product_run, series_product_finish, change)


def _run(x: Any) -> Fx:
    return series_times(Fx(x.session, list(x.shares), 16), EXP_SERIES, list(x.shares))


def test_the_product_takes_the_value_it_masked(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """v is the share the mask step masked (its e was opened for it): another share, so
    that e + a no longer is v, is refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(-torch.ones(6), alice, bob, crypto_provider=carol)
    other = mpc.share(torch.full((6,), 5.0), alice, bob, crypto_provider=carol)
    _tamper(monkeypatch, lambda i, a: a[:5] + [other.shares[i]] + a[6:])
    refused(alice, lambda: _run(x), "must be the share that instance")


def test_the_product_runs_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its opened c and e (and the dealer's material) are used up by the first call."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(-torch.ones(6), alice, bob, crypto_provider=carol)
    calls = _finish_args(monkeypatch)
    _run(x)
    args = calls[0][0]
    refused(
        alice,
        lambda: pt.call_function(alice, name_of(series_product_finish), args, out=[((6,), I64)]),
        "not a spent",
    )


def test_the_product_takes_its_own_openings(make_worker: Callable[[str], Any]) -> None:
    """A finish given another live instance's opened e and c (so that its material
    multiplies another mask) is refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(-torch.ones(6), alice, bob, crypto_provider=carol)
    fx = Fx(x.session, list(x.shares), 16)
    runs = [product_run.SeriesProductRun(fx, EXP_SERIES, list(x.shares)) for _ in range(2)]
    one = Round(x.session)
    opened = [run.open_in(one) for run in runs]
    one.open()
    c, e = opened[0]
    refused(alice, lambda: runs[1].finish(c.value, e.value), "belongs to protocol instance")


def test_softmax_by_ranks_as_a_user_writes_it(make_worker: Callable[[str], Any]) -> None:
    """On both worker kinds: a decoding step's softmax of a product (attention's scores)."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    q = torch.randn(1, 12, 1, 16)
    k = torch.randn(1, 12, 9, 16)
    qs, ks = (mpc.share(t, alice, bob, crypto_provider=carol) for t in (q, k))
    got = torch.softmax(qs @ ks.transpose(-1, -2) / math.sqrt(16), -1).get()
    want = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(16), -1)
    assert float((got - want).abs().max()) < 1e-4
