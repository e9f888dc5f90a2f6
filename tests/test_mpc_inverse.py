"""v * x^-p by fine bins and a cubic (mpc/protocols/inverse.py, issue 25): softmax's and
layer norm's divisions. Against float64 on a log-uniform grid of the whole domain with its
bin edges, saturation outside it, 8 rounds, for 2 and 3 parties."""

from __future__ import annotations

import pytest
import torch

import mpc
import pointers as pt
from mpc.protocols.approx import Fx
from mpc.protocols.inverse import times_inverse_power
from mpc.shared import share_tensor


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize(("p", "lo", "hi", "mult"), [(1.0, -1, 8, 1.0), (0.5, -4.5, 25.5, 20.0)])
def test_times_inverse_power(n: int, p: float, lo: float, hi: float, mult: float) -> None:
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
    assert s.rounds == 8  # comparison 4, level 1, two truncations with products, the last
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
