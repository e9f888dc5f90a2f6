"""The max of four values in one comparison run (issue 25, item 2; mpc/math/groups_of_four.py):
against plaintext torch, ties to the first index as torch's argmax, for 2 and 3 parties;
and its steps run once, on their own instance, like every protocol step (issue 27)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.protocols import parties as party_calls
from mpc.protocols.max_of_four.run import max_of_four


def _group(n: int) -> tuple[list[pt.VirtualWorker], pt.VirtualWorker]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("dealer")


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.lists(st.integers(-3, 3), min_size=4, max_size=4), min_size=1, max_size=40
    ),  # small integers: many ties
    st.sampled_from([2, 3]),
    st.floats(0.01, 1000.0),
)
def test_max_of_four_and_its_one_hot_argmax(rows, n, scale):
    parties, dealer = _group(n)
    v = torch.tensor(rows, dtype=torch.float32) * scale
    x = mpc.share(v, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        best, onehot = max_of_four(x.session, x.shares, onehot=True)
    assert s.rounds == 4
    got = mpc.SharedTensor(best, x.session, x.frac_bits, x.dtype).get()
    w = mpc.SharedTensor(onehot, x.session, 0, torch.int64).get()
    assert torch.allclose(got, v.max(-1).values, atol=2e-5 * scale + 1e-4)
    assert torch.equal(w, F.one_hot(v.argmax(-1), 4))  # first index on ties, as torch


# 4 rounds a level of groups of four; 3 one of pairs where it compares at most 2^15
# elements (5,000 x 1 for k = 5's last level, 5,000 x 4 for k = 8's first), 4 where it
# compares more (5,000 x 16 for k = 32's first); so k = 32 takes groups (32 to 8), pairs
# (5,000 x 4: 3) and a group: 11, where pairs first took 12 (mpc.ops.max_tree.tree_plan)
@pytest.mark.parametrize(("k", "rounds"), [(4, 4), (5, 7), (8, 7), (13, 8), (32, 11)])
def test_amax_and_max_pool_use_groups_of_four(k, rounds):
    parties, dealer = _group(2)
    v = torch.randn(5000, k)  # (rows enough that no max is by ranks: 5,000 x 10 > 32,768)
    x = mpc.share(v, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        got = x.amax(-1).get()
    assert torch.allclose(got, v.amax(-1), atol=1e-4)
    levels, left = 0, k
    while left >= 4:
        left, levels = left // 4 + left % 4, levels + 1
    while left > 1:
        left, levels = (left + 1) // 2, levels + 1
    assert 3 * levels <= rounds <= 4 * levels  # (3 or 4 rounds a level)
    assert s.rounds == rounds
    img = torch.randn(1, 2, 6, 6)
    with mpc.stats() as s:
        pooled = F.max_pool2d(mpc.share(img, *parties, crypto_provider=dealer), 2).get()
    # (18 windows: ranks, their 108 pairs' bits by digit look-ups in 2 rounds, and the
    # lookup round, where one group of four a window took 4)
    assert torch.allclose(pooled, F.max_pool2d(img, 2), atol=1e-4) and s.rounds == 3


def test_the_selection_runs_once_on_its_own_instance(monkeypatch: pytest.MonkeyPatch):
    """Called again, with other values, or with another comparison's bits: refused."""
    parties, dealer = _group(2)
    calls: list[tuple[Any, str, list[Any]]] = []
    orig = party_calls.call

    def spy(worker: Any, name: str, args: list[Any], out: Any) -> Any:
        calls.append((worker, name, list(args)))
        return orig(worker, name, args, out)

    monkeypatch.setattr(party_calls, "call", spy)
    x = mpc.share(torch.randn(3, 4), *parties, crypto_provider=dealer)
    max_of_four(x.session, x.shares)
    (worker, _, args) = next(c for c in calls if c[1] == "mpc.group_select")
    out = [((3,), torch.int64)]
    with pytest.raises(pt.RemoteError, match="spent|used for a selection before|takes a"):
        pt.call_function(worker, "mpc.group_select", args, out=out)
    other = pt.send(torch.zeros(3, 4, dtype=torch.int64), worker)
    with pytest.raises(pt.RemoteError, match="spent|before|takes a|masked"):
        pt.call_function(worker, "mpc.group_select", [*args[:7], other, False], out=out)
