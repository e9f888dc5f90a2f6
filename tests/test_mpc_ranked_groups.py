"""The max by ranked groups (mpc/ops/max_tree.py): groups of g entries, each ranked by one
comparison run of its pairs and one round, where that takes fewer rounds than the tree of
pairs and groups of four within the ranks' pairs budget. Against torch (hypothesis, both
comparison modes, 2 and 3 parties), the rounds it saves, and the plans it picks."""

from __future__ import annotations

from functools import cache

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.ops import max_tree
from mpc.ops.max_tree import ranked_plan, tree_rounds
from mpc.protocols.ranks import max_pairs
from mpc.session import Session


def _session_args(n: int, comparison: str) -> tuple[list[pt.VirtualWorker], pt.VirtualWorker]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("dealer")


def _run(session: Session, elements: int, grouped: bool = False) -> int:
    """A comparison run's rounds by default: 3 up to the session's ``three_round_up_to``
    elements (its last carry level's output is arithmetic), 4 past it or for groups of four."""
    limit = session.config.three_round_up_to
    return 3 if not grouped and limit is not None and elements <= limit else 4


def _ranks(session: Session, pairs: int) -> int:
    """Ranks: the pairs' comparison run (1 round with FSS; the bit alone, so 2 by digit
    look-ups up to the session's ``two_round_up_to`` pairs) and the selection's round."""
    if session.config.comparison == "fss":
        return 2
    digits = session.config.two_round_up_to
    return (2 if digits is not None and pairs <= digits else _run(session, pairs)) + 1


def _tree(session: Session, rows: int, k: int) -> int:
    """The fewest rounds of any tree: levels of pairs (a comparison run of rows k / 2
    elements), of groups of four (4 rounds; 2 a level with FSS), with or without padding,
    in any order, finished by ranks over the entries left at any point where their pairs
    fit the budget (an exhaustive search, not the code's)."""
    fss = session.config.comparison == "fss"

    @cache
    def least(k: int) -> int:
        if k <= 1:
            return 0
        pair = 2 if fss else _run(session, rows * (k // 2))
        group = 2 if fss else 4
        options = [pair + least(k // 2 + k % 2)]
        if k >= 4:
            options.append(group + least(k // 4 + k % 4))
        if k >= 3:
            options.append(group + least(-(-k // 4)))
        pairs = rows * k * (k - 1) // 2
        if k >= 3 and pairs <= max_pairs(session):
            options.append(_ranks(session, pairs))
        return min(options)

    return least(k)


def _ranked(session: Session, rows: int, k: int, sizes: tuple[int, ...]) -> int:
    """The ranked groups' rounds: each level's ranks over its rows k (g - 1) / 2 pairs."""
    total = 0
    for g in sizes:
        left = -(-k // g)
        total += _ranks(session, rows * left * g * (g - 1) // 2)
        k = left
    return total


@settings(max_examples=10, deadline=None)
@given(
    st.sampled_from([(2, "default"), (3, "default"), (2, "fss")]),
    st.integers(1, 4),
    st.integers(100, 1200),
    st.integers(0, 2**16),
)
def test_max_by_ranked_groups_against_torch(mode, rows, k, seed) -> None:
    """torch.amax over rows of 100 to 1,200 entries (ties and a copy of the max in the
    padding included): exact up to the encoding, in the rounds the plan says (the ranked
    levels of the fewest rounds: never more than the fewest levels')."""
    n, comparison = mode
    parties, dealer = _session_args(n, comparison)
    config = MPCConfig(comparison=comparison)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, k, generator=g) * 4
    x[:, 0] = x.amax(dim=-1) + 1.0  # the max first: the padding copies it
    x[:, -1] = x[:, 0]  # and a tie
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    session = xs.session
    sizes = max_tree._ranked_sizes(session, rows, k)  # (the fewest rounds)
    levels = ranked_plan(rows, k, max_pairs(session))  # (the fewest levels)
    assert (sizes is None) == (levels is None)
    expect = _tree(session, rows, k)
    if sizes and levels:  # (whichever takes fewer rounds)
        assert _ranked(session, rows, k, sizes) <= _ranked(session, rows, k, levels)
        expect = min(expect, _ranked(session, rows, k, sizes))
    with mpc.stats() as s:
        m = torch.amax(xs, dim=-1)
        m.materialize()
    assert s.rounds == expect
    enc = torch.round(x * 2**16) / 2**16
    assert torch.equal(m.get(), enc.amax(dim=-1))


@pytest.mark.parametrize(
    ("comparison", "rows", "k", "rounds", "tree"),
    # (by default, 2 rows of 20,000: four levels of ranked groups, 3 + 1 rounds each, where
    # the tree of the fewest rounds takes a level of pairs, 3, three of groups of four, 12,
    # and ranks over 157 entries, 4)
    [("fss", 1, 1000, 4, 6), ("default", 2, 20000, 16, 19)],
)
def test_ranked_groups_save_rounds(
    comparison: str, rows: int, k: int, rounds: int, tree: int
) -> None:
    parties, dealer = _session_args(2, comparison)
    config = MPCConfig(comparison=comparison)
    xs = mpc.share(torch.randn(rows, k), *parties, crypto_provider=dealer, config=config)
    assert _tree(xs.session, rows, k) == tree
    assert tree_rounds(xs.session, rows, k) == tree  # (the tree's rounds as the code counts them)
    with mpc.stats() as s:
        torch.amax(xs, dim=-1).materialize()
    assert s.rounds == rounds


@pytest.mark.parametrize(
    ("rows", "k", "rounds", "measured"),
    # 5,000 rows of 32: groups, pairs of 20,000 elements (3), groups: 11, where pairs
    # first (80,000 elements: 4) took 12; a vocabulary of 50,257: groups of four four
    # times (16) to 197 entries, then ranks over 19,306 pairs (3 + 1): 20, where ranks
    # after five levels took 24. The max takes ranked groups where they take fewer, in
    # the fewest rounds: groups of 2, 3 and 6 (3 + 1 rounds each), then of 12 and of 117
    # (whose 7,920 and 6,786 pairs compare by digit look-ups in 2 rounds, mpc.protocols.
    # digit_compare, and the lookup round): 18, where the fewest levels' groups took 19
    [(5000, 32, 11, 11), (1, 50257, 20, 18)],
)
def test_the_tree_of_fewest_rounds(rows: int, k: int, rounds: int, measured: int) -> None:
    parties, dealer = _session_args(2, "default")
    x = torch.randn(rows, k)
    xs = mpc.share(x, *parties, crypto_provider=dealer)
    assert tree_rounds(xs.session, rows, k) == _tree(xs.session, rows, k) == rounds
    with mpc.stats() as s:
        m = torch.amax(xs, dim=-1)
        m.materialize()
    assert s.rounds == measured
    assert torch.equal(m.get(), (torch.round(x * 2**16) / 2**16).amax(dim=-1))


def test_ranked_plans() -> None:
    """The fewest levels, then the fewest pairs; whole ranks where they fit; none where a
    level's pairs pass the budget."""
    assert ranked_plan(12, 56, 32768) == (56,)  # 18,480 pairs: ranks at once
    assert ranked_plan(12, 56, 8192) == (4, 14)  # 1,008 + 1,092 pairs (8 then 7: 2,604)
    assert ranked_plan(1, 1000, 8192) is not None and len(ranked_plan(1, 1000, 8192)) == 2
    assert ranked_plan(1, 50257, 8192) is None
