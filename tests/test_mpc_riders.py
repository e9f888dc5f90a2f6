"""Truncations riding in a comparison's first round (mpc/protocols/riders): the results
equal a truncation's in its own round (floor or one more), in no round of their own, and
in a round of their own when no comparison runs in the block; and layer norm, which
uses them, against torch with an input still to be truncated and a shared weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.compare import msb
from mpc.protocols.riders.run import riding
from mpc.protocols.truncation.run import TruncRun


def _share(v: torch.Tensor, n: int = 2, fss: bool = False) -> mpc.SharedTensor:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    config = MPCConfig(comparison="fss") if fss else None
    return mpc.share(v, *parties, crypto_provider=pt.VirtualWorker("dealer"), config=config)


@settings(max_examples=10, deadline=None)
@given(
    st.lists(st.integers(-(2**40), 2**40), min_size=1, max_size=20),
    st.integers(1, 30),
    st.sampled_from([(2, False), (3, False), (2, True)]),
)
def test_a_rider_truncates_in_the_comparisons_round(values, bits, mode):
    n, fss = mode
    z = torch.tensor(values, dtype=torch.int64)
    x = _share(torch.zeros(len(values)), n, fss)
    session = x.session
    # the ring elements z, shared as the session shares (party 0 holds z, others 0)
    shares = [s * 0 for s in x.shares]
    shares[0] = shares[0] + z
    with mpc.stats() as s:
        with riding([TruncRun(session, shares, bits)]) as rides:
            lt = msb(session, shares)
    # the comparison's rounds only (2 by default: the bit alone of few elements by digit
    # look-ups, mpc.protocols.digit_compare)
    assert s.rounds == (1 if fss else 2)
    got = sum(p.get() for p in rides.results[0])
    want = z >> bits
    assert bool(((got - want) >= 0).all() and ((got - want) <= 1).all())
    assert torch.equal(sum(t.get() for t in lt), (z < 0).to(torch.int64))


def test_a_rider_with_no_comparison_opens_in_a_round_of_its_own():
    x = _share(torch.tensor([3.0, -2.5]))
    with mpc.stats() as s:
        with riding([TruncRun(x.session, x.shares, 16)]) as rides:
            pass
    assert s.rounds == 1
    got = sum(p.get() for p in rides.results[0])
    want = torch.tensor([3, -3])  # floor(3.0), floor(-2.5), or one more
    assert bool(((got - want) >= 0).all() and ((got - want) <= 1).all())


@pytest.mark.parametrize("fss", [False, True])
def test_layer_norm_of_a_pending_input_with_a_shared_weight(fss: bool) -> None:
    torch.manual_seed(1)
    n = 96
    x, w = torch.randn(3, n), torch.randn(n, n) / n**0.5
    weight, bias = torch.randn(n) * 0.5 + 1, torch.randn(n) * 0.1
    sx, sw = _share(x, 2, fss), None
    sw = mpc.share(w, *sx.session.parties, crypto_provider=sx.session.dealer)
    sweight = mpc.share(weight, *sx.session.parties, crypto_provider=sx.session.dealer)
    with mpc.stats() as s:
        got = F.layer_norm(sx @ sw, (n,), sweight, bias).get()
    want = F.layer_norm(x @ w, (n,), weight, bias)
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
    # the product's Beaver round and layer norm's (3 rows: fine bins and a line,
    # mpc.protocols.inverse.fine_bins, the bins' comparison run of 3 x 943 in 3 rounds
    # by default; with FSS too since a value's comparisons share one key: 7 with the cubic)
    assert s.rounds == (6 if fss else 7)  # (by default the bins' 3 x 943 by digits: 2)
