"""v * x^-p by fine bins and a cubic (mpc/protocols/inverse.py, issue 25): softmax's and
layer norm's divisions. Against float64 on a log-uniform grid of the whole domain with its
bin edges, saturation outside it, 7 or 8 rounds, for 2 and 3 parties."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.approx import Fx
from mpc.protocols.inverse import fine_bins, times_inverse_power
from mpc.shared import share_tensor


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(
    ("p", "lo", "hi", "mult", "rounds"), [(1.0, -1, 8, 1.0, 7), (0.5, -4.5, 25.5, 20.0, 8)]
)
def test_times_inverse_power(
    n: int, p: float, lo: float, hi: float, mult: float, rounds: int
) -> None:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("dealer")
    session = mpc.share(torch.zeros(1), *parties, crypto_provider=dealer).session
    edges = [2.0 ** (lo + k / 4) for k in range(int(4 * (hi - lo)) + 1)]
    grid = torch.logspace(lo, hi, 400, base=2.0, dtype=torch.float64)
    inside = torch.cat([grid[grid < 2.0**hi], torch.tensor(edges, dtype=torch.float64)])
    xs = torch.cat([inside, torch.tensor([2.0 ** (lo - 1), 0.0, -3.0, 2.0 ** (hi + 1)])])
    v = torch.randn(xs.numel(), 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    x_sh = share_tensor(xs[:, None].float(), session, 24)
    v_sh = share_tensor(v.float(), session, 16)
    with mpc.stats() as s:
        out = times_inverse_power(
            Fx(session, v_sh.shares, 16), Fx(session, x_sh.shares, 24), p, lo, hi, 20, mult
        )
    # the comparison 3 (37 edges x 440 values: at most 2^15, its last level arithmetic) or 4
    # (121 x 524: more), level 1, two truncations with products, the last
    assert s.rounds == rounds
    got = mpc.SharedTensor(out.shares, session, 20, torch.float32).get().double()
    xq = torch.round(xs * 2**24) / 2**24  # the encoded x
    vq = torch.round(v.float().double() * 2**16) / 2**16
    want = vq * mult * xq.clamp(2.0**lo, 2.0**hi)[:, None] ** -p
    k = inside.numel()
    # the cubic's 8e-6 (p = 1) or 2.2e-6 (p = 1/2), intermediates at 24 bits, output at 20
    excess = (got - want).abs()[:k] - (3e-5 * want.abs()[:k] + 2.0**-18)
    assert excess.max() <= 0, excess.max()
    # outside: x below the domain (0 and negative too) reads as 2^lo, above as 2^hi
    excess = (got - want).abs()[k:] - (3e-5 * want.abs()[k:] + 2.0**-18)
    assert excess.max() <= 0, excess


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([(2, "default"), (3, "default"), (2, "fss")]),
    st.sampled_from([(1.0, -1, 8, 1.0), (0.5, -4.5, 25.5, 20.0)]),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
)
def test_times_inverse_power_of_few_rows_by_fine_bins(mode, case, rows, rnd):
    """Few rows take fine bins (1/64 octave for 1/x, 1/32 for x^-1/2) and a line (6
    rounds, 4 with FSS) where their comparisons fit the budget: within 3e-5 of float64 over the domain, edges included."""
    (n, comparison), (p, lo, hi, mult) = mode, case
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    config = MPCConfig(comparison=comparison)
    session = mpc.share(
        torch.zeros(1), *parties, crypto_provider=pt.VirtualWorker("dealer"), config=config
    ).session
    fine = fine_bins(session, rows, lo, hi, p)
    # log-uniform inside, a bin edge, and the domain's ends
    picks = [2.0 ** rnd.uniform(lo, hi) for _ in range(rows)]
    picks[0] = rnd.choice(
        [2.0**lo, 2.0 ** (hi - 1e-3), 2.0 ** (lo + rnd.randint(0, 64) / 64), picks[0]]
    )
    xs = torch.tensor(picks, dtype=torch.float64)
    v = torch.randn(rows, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(rows))
    x_sh = share_tensor(xs[:, None].float(), session, 24)
    v_sh = share_tensor(v.float(), session, 16)
    with mpc.stats() as s:
        out = times_inverse_power(
            Fx(session, v_sh.shares, 16), Fx(session, x_sh.shares, 24), p, lo, hi, 20, mult
        )
    fss = comparison == "fss"
    # the comparison 2 by default (at most 961 bins x 4 rows: within 2^13, the bits alone
    # by digit look-ups), 1 with FSS
    assert s.rounds == (1 if fss else 2) + (3 if fine else 4)
    got = mpc.SharedTensor(out.shares, session, 20, torch.float32).get().double()
    xq = torch.round(xs * 2**24) / 2**24
    vq = torch.round(v.float().double() * 2**16) / 2**16
    want = vq * mult * xq.clamp(2.0**lo, 2.0**hi)[:, None] ** -p
    excess = (got - want).abs() - (3e-5 * want.abs() + 2.0**-18)
    assert excess.max() <= 0, excess.max()


def test_fine_bins_take_few_rows_only() -> None:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    session = mpc.share(torch.zeros(1), *parties, crypto_provider=pt.VirtualWorker("d")).session
    assert fine_bins(session, 1, -4.5, 25.5)  # a decoding step's layer norm: 960 bins
    assert fine_bins(session, 128, -4.5, 25.5)  # a prefill's 128 rows: 122,880 (default)
    assert not fine_bins(session, 256, -4.5, 25.5)  # 256 rows keep the cubic
    fss = mpc.share(
        torch.zeros(1), *parties, crypto_provider=pt.VirtualWorker("e"),
        config=MPCConfig(comparison="fss"),
    ).session  # fmt: skip
    assert fine_bins(fss, 8, -4.5, 25.5) and not fine_bins(fss, 16, -4.5, 25.5)
