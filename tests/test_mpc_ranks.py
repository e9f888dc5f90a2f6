"""The max and argmax of few rows by ranks (mpc/protocols/ranks.py): a comparison run and
a round of dealt tables whatever the number of entries, against plaintext torch (hypothesis, many ties, 2 and 3
parties, and FSS comparisons), the rounds each mode takes, and the tree where ranks would
cost more comparisons than a call may run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.ranks import MAX_PAIRS


def _share(v: torch.Tensor, n: int, fss: bool = False) -> mpc.SharedTensor:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    config = MPCConfig(comparison="fss") if fss else None
    return mpc.share(v, *parties, crypto_provider=pt.VirtualWorker("dealer"), config=config)


@settings(max_examples=15, deadline=None)
@given(
    st.integers(17, 48),  # k: a tree takes 3 levels (11 or 12 rounds) where ranks take 4
    st.integers(1, 4),  # rows
    st.sampled_from([(2, False), (3, False), (2, True)]),
    st.floats(0.01, 1000.0),
    st.randoms(use_true_random=False),
)
def test_max_and_argmax_by_ranks_agree_with_torch_ties_included(k, rows, mode, scale, rnd):
    n, fss = mode
    # small integers times a scale: many ties (the first maximum wins, as torch's)
    v = torch.tensor([[rnd.randint(-3, 3) for _ in range(k)] for _ in range(rows)]) * scale
    v = v.float()
    x = _share(v, n, fss)
    with mpc.stats() as s:
        best, idx = torch.max(x, 1)
        got, got_idx = best.get(), idx.get()
    # (ranks: a comparison run, 1 round with FSS, by default 2 by digit look-ups for at
    # most 2^13 pairs (mpc.protocols.digit_compare), and a round)
    assert s.rounds == (2 if fss else 3)
    want, want_idx = torch.max(v, 1)
    assert torch.allclose(got, want, atol=2e-5 * scale + 1e-4)
    assert torch.equal(got_idx, want_idx)
    with mpc.stats() as s:
        top = x.amax(-1, keepdim=True).get()
    assert s.rounds == (2 if fss else 3)
    assert torch.allclose(top, v.amax(-1, keepdim=True), atol=2e-5 * scale + 1e-4)
    assert torch.equal(torch.argmin(x, 1).get(), torch.argmin(v, 1))


@pytest.mark.parametrize("fss", [False, True])
def test_a_decoding_steps_softmax_takes_its_max_by_ranks(fss: bool) -> None:
    """12 heads, one query, 33 keys (GPT-2 small after a 32-token prompt): the max in 4
    rounds (2 with FSS) where the tree takes 12 (6); the softmax as torch's."""
    torch.manual_seed(3)
    v = torch.randn(1, 12, 1, 33) * 4
    v[0, 0, 0, 3] = v[0, 0, 0, 9] = 12.0  # a tie at the top
    x = _share(v, 2, fss)
    with mpc.stats() as s:
        got = torch.softmax(x, -1).get()
    assert torch.allclose(got, torch.softmax(v, -1), atol=1e-4)
    # the max and the exponential's clamp bits by ranks 4 (2: every pair compared with 0
    # and +-16 in one run, mpc.protocols.ranks.max_and_near), exp 1 (the series times
    # the bits, mpc.protocols.series_product; its truncation in the division's), division
    # 6 (fine bins and a line; FSS: 4, fine bins too since a value's comparisons share
    # one key: 5 with the cubic); 13 (8) while the clamp's own comparison took 3 (2) after
    # the max; by default each comparison run (of at most 2^15 elements) ends in 3 rounds;
    # 10 where the division's bins (12 x 449 compared values) take 2 by digit look-ups
    assert s.rounds == (7 if fss else 10)


def test_many_rows_keep_the_tree() -> None:
    """Past MAX_PAIRS comparisons a call starts with the tree (a level of pairs: 33
    entries to 17, 1,008 comparisons, 3 rounds), and finishes by ranks once the entries
    left are few (8,568 pairs: 3 + 1): 7 rounds, where the tree's levels take 11; 6 where
    the ranks compare by digit look-ups (at most 2^13 pairs, 2 rounds)."""
    rows = MAX_PAIRS["default"] // (33 * 32 // 2) + 1
    v = torch.randn(rows, 33)
    x = _share(v, 2)
    with mpc.stats() as s:
        got = x.amax(-1).get()
    assert s.rounds == 6
    assert torch.allclose(got, v.amax(-1), atol=1e-4)
