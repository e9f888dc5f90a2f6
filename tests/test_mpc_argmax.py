"""max with indices and argmax by groups of four (issue 25, item 2): each index packed into
its value's low bits, so ties go to the first index as in torch, in the rounds of the
values-only max; against plaintext torch for 2 and 3 parties (hypothesis, many ties), and
the pairwise tree that FSS comparisons keep (neighbours paired: first index on ties)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.ops.max_tree import PAIR, plan
from mpc.ops.max_tree import levels as _levels
from mpc.ops.nonlinear import LOW_BITS_FROM
from mpc.protocols.ranks import MAX_PAIRS


def _group(n: int) -> tuple[list[pt.VirtualWorker], pt.VirtualWorker]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("dealer")


@settings(max_examples=20, deadline=None)
@given(
    st.integers(1, 40),  # k
    st.integers(1, 6),  # rows
    st.sampled_from([2, 3]),
    st.floats(0.01, 1000.0),
    st.randoms(use_true_random=False),
)
def test_max_with_indices_and_argmax_agree_with_torch_ties_included(k, rows, n, scale, rnd):
    parties, dealer = _group(n)
    # small integers times a scale: many ties
    v = torch.tensor([[rnd.randint(-3, 3) for _ in range(k)] for _ in range(rows)]) * scale
    v = v.float()
    x = mpc.share(v, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        best, idx = torch.max(x, 1)
        got_idx = idx.get()
    # the values-only max's rounds: its tree (3 a level of pairs, 4 one of groups of four:
    # a comparison run of at most 2^15 elements ends in 3 rounds but for groups of four),
    # or a comparison run and a round by ranks for few rows where that is fewer
    # (mpc.protocols.ranks; the comparison of at most 2^13 pairs, the bit alone, by digit
    # look-ups in 2 rounds: mpc.protocols.digit_compare)
    tree = sum(3 if kind == PAIR else 4 for kind, _ in plan(k))
    pairs = rows * k * (k - 1) // 2
    ranks = 3 if pairs <= 1 << 13 else 4
    by_ranks = pairs <= MAX_PAIRS["default"] and tree > ranks
    assert s.rounds == (ranks if by_ranks else tree)
    want, want_idx = torch.max(v, 1)
    assert torch.allclose(best.get(), want, atol=2e-5 * scale + 1e-4)
    assert torch.equal(got_idx, want_idx)
    assert torch.equal(torch.argmax(x, 1).get(), torch.argmax(v, 1))
    low, low_idx = torch.min(x, 1)
    assert torch.equal(low_idx.get(), torch.min(v, 1).indices)
    assert torch.equal(torch.argmin(x).get(), torch.argmin(v))


@pytest.mark.parametrize(
    ("k", "n", "rounds", "max_rounds"), [(400, 2, 6, 6), (400, 3, 6, 6), (3000, 2, 8, 8)]
)
def test_a_long_argmax_finishes_by_ranks_once_few_entries_are_left(
    k, n, rounds, max_rounds
) -> None:
    """The levels reduce k entries to few, then ranks take 4 rounds where the levels left
    took more (the max alone over 400: one level of pairs, 3 rounds, then ranks: 7), or
    levels of ranked groups take 3 or 4 each where the tree took more (a ranks' comparison
    of at most 2^13 pairs by digit look-ups in 2 rounds; the argmax over 400: its values
    and packed values, two rows, two levels, 6 where the tree took 11; over 3000 the max
    two levels, 8 where the tree took 12, and the argmax the same two levels, each entry
    carrying its index, 8 where the packed values' three took 10); ties go to the first
    index, as in torch."""
    parties, dealer = _group(n)
    gen = torch.Generator().manual_seed(k + n)
    v = torch.randint(-50, 50, (1, k), generator=gen).float() / 8
    v[0, k // 2] = v[0, 3] = v.max() + 1.0  # the max twice: the first index wins
    x = mpc.share(v, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        idx = torch.argmax(x, 1).get()
    # (3 a level of pairs, 4 one of groups of four or of ranks: a comparison run of at
    # most 2^15 elements ends in 3 rounds but for groups of four)
    assert s.rounds == rounds
    assert torch.equal(idx, torch.argmax(v, 1)) and int(idx) == 3
    with mpc.stats() as s:
        best = torch.amax(x, 1).get()
    assert s.rounds == max_rounds
    assert torch.allclose(best, v.amax(1), atol=1e-4)


@pytest.mark.parametrize(
    ("k", "levels"), [(2, 1), (3, 1), (4, 1), (6, 2), (10, 2), (16, 2), (17, 3), (64, 3)]
)
def test_levels(k: int, levels: int) -> None:
    assert _levels(k)[0] == levels


@pytest.mark.parametrize("bits", [40, 64])
def test_argmax_with_fss_uses_the_pairwise_tree_ties_included(bits: int) -> None:
    alice, bob, carol = pt.VirtualWorker("a"), pt.VirtualWorker("b"), pt.VirtualWorker("c")
    config = MPCConfig(comparison="fss", fss_bits=bits)
    v = torch.tensor([[1.0, 2.0, 2.0, 0.0, 2.0], [0.5, 0.5, 0.5, 0.5, 0.5], [3, 1, 4, 1, 5.0]])
    x = mpc.share(v, alice, bob, crypto_provider=carol, config=config)
    best, idx = torch.max(x, 1)
    assert torch.equal(idx.get(), torch.max(v, 1).indices)
    assert torch.allclose(best.get(), v.max(1).values, atol=1e-4)


def test_max_pool_backward_routes_ties_to_the_first_position_as_torch() -> None:
    """The one-hot argmax of max-pooling's backward pairs neighbours: a window [0, 1, 1, 0]
    sends its gradient to position 1 (first halves against second halves sent it to 2)."""
    import torch.nn.functional as F

    (alice, bob), carol = _group(2)
    x = torch.tensor([[[[0.0, 1.0], [1.0, 0.0]], [[2.0, 2.0], [2.0, 2.0]]]])
    x = torch.cat([x, torch.randint(0, 3, (1, 2, 2, 2)).float()], dim=1)
    for kernel, inp in ((2, x), (3, torch.randint(0, 3, (1, 2, 6, 6)).float())):
        shared = mpc.share(inp, alice, bob, crypto_provider=carol).requires_grad_()
        plain = inp.clone().requires_grad_()
        F.max_pool2d(shared, kernel).sum().backward()
        F.max_pool2d(plain, kernel).sum().backward()
        assert shared.grad is not None and plain.grad is not None
        assert torch.equal(shared.grad.get(), plain.grad)


@pytest.mark.parametrize("n", [2, 3])
def test_a_large_argmax_alone_compares_the_packed_values_only(n: int) -> None:
    """From LOW_BITS_FROM elements, the argmax alone compares only the packed values and
    takes the index from their max's low bits: at most one round more than torch.max's
    values and indices (whose stacked tree compares twice the elements), about half their
    bytes; ties go to the first index."""
    parties, dealer = _group(n)
    gen = torch.Generator().manual_seed(n)
    # many ties; 24 rows of 3,000: past the ranked levels' pairs budget (which carry the
    # index instead: tests/test_mpc_indexed_max.py)
    v = torch.randint(-40, 40, (24, 3000), generator=gen).float() / 4
    assert v.numel() >= LOW_BITS_FROM
    x = mpc.share(v, *parties, crypto_provider=dealer)
    with mpc.stats() as alone:
        assert torch.equal(torch.argmax(x, 1).get(), torch.argmax(v, 1))
    with mpc.stats() as both:
        best, idx = torch.max(x, 1)
        assert torch.equal(idx.get(), torch.argmax(v, 1))
    assert alone.rounds <= both.rounds + 1
    party = parties[0].id
    assert alone.bytes_per_party[party] < 0.6 * both.bytes_per_party[party]  # (0.57 at 24 x 3,000)


@pytest.mark.parametrize(
    ("n", "k", "truncated_first"), [(2, 50_257, False), (3, 5_000, False), (2, 70_000, True)]
)
def test_the_argmax_of_a_product_skips_its_truncation(n: int, k: int, truncated_first: bool):
    """An LM head's logits (a product still to be truncated) go into the argmax at their
    full scale: no truncation round and no truncation bytes, the same index as plaintext
    (argmin too); a vocabulary past 2^16 entries leaves the packing no room at that scale,
    so its logits are truncated first, and its argmax is still right."""
    parties, dealer = _group(n)
    gen = torch.Generator().manual_seed(n)
    h = torch.randn(1, 64, generator=gen)
    w = torch.randn(64, k, generator=gen) * 0.3
    hs, ws = (mpc.share(t, *parties, crypto_provider=dealer) for t in (h, w))
    with mpc.stats() as skipped:
        logits = hs @ ws
        idx = torch.argmax(logits, -1).get()
    assert torch.equal(idx, torch.argmax(h @ w, -1))
    logits = hs @ ws
    assert torch.equal(torch.argmin(logits, -1).get(), torch.argmin(h @ w, -1))
    with mpc.stats() as materialized:
        logits = hs @ ws
        logits.materialize()  # the truncation first, as any other op would
        assert torch.equal(torch.argmax(logits, -1).get(), idx)
    party = parties[0].id
    if truncated_first:
        assert skipped.rounds == materialized.rounds
    else:
        # the truncation's round saved, where the materialized value's argmax takes the
        # low bits' round too (from LOW_BITS_FROM elements); no more (the packed values'
        # tree may take fewer: 5,000 entries of 3 parties 12 where the materialized 13)
        assert skipped.rounds <= materialized.rounds - (k >= LOW_BITS_FROM)
        saved = materialized.bytes_per_party[party] - skipped.bytes_per_party[party]
        assert saved >= 8 * k  # (the truncation's opening: a word an element)
