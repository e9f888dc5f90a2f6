"""The max over the last dim by levels (values only; the argmax's packing and the
index-carrying trees are in :mod:`mpc.ops.nonlinear`).

A level is a comparison run: pairs (:func:`pair_level`, k / 2 comparisons, halves k),
groups of four (:func:`group_level`, all six pairs of a group at once, quarters k), or
ranked groups (:func:`ranked_level`: groups of g entries each ranked by one comparison run
of its g (g - 1) / 2 pairs and one round of lookup tables, :mod:`mpc.protocols.ranks`,
divides k by g). :func:`plan` gives the tree of pairs and groups of the fewest levels;
:func:`tree_plan` the tree of the fewest rounds (a level of pairs takes 3 rounds by
default within the session's ``three_round_up_to`` elements, one of groups of four 4, both
2 with FSS), finished by ranks once its levels have left few entries where that saves
rounds (a vocabulary of 50,257: five levels to 50 entries, then ranks).
:func:`values_max` takes ranked groups instead where they cost fewer rounds within the
ranks' pairs budget (with FSS comparisons, a decoding step's softmax over 12 heads x 56
keys: groups of 8, then the 7 maxima, 4 rounds where the tree took 6).
"""

from __future__ import annotations

from functools import cache, lru_cache
from typing import cast

import torch

from mpc.ops.local import add_shared, neg_shared
from mpc.protocols import ranks
from mpc.protocols.compare import comparison_rounds, select_by_msb
from mpc.protocols.max_of_four.run import max_of_four
from mpc.protocols.parties import Shares
from mpc.session import Session
from mpc.shared import SharedTensor

# one level of a max tree: (kind, k) with kind PAIR (halves paired, an odd last entry
# joins the next level), GROUP (the i-th entries of four quarters, a remainder of one to
# three entries joins the next level) or PADDED (GROUP after copies of the first entries
# fill the last quarter)
PAIR, GROUP, PADDED = "pair", "group", "padded"
#: the last step of a tree (:func:`tree_plan`): ranks over the entries left
RANKS = "ranks"


@cache
def plan(k: int) -> tuple[tuple[str, int], ...]:
    """The levels that reduce k entries to one: the fewest levels (each level is one
    comparison run), then the fewest comparisons (:func:`tree_plan` counts rounds
    instead: a level of pairs can take fewer than one of groups). A level of pairs costs k / 2
    comparisons and halves k; one of groups of four costs 6 k / 4 (all pairs of a group:
    :func:`mpc.protocols.max_of_four.run.max_of_four`) and quarters it. So pairs go first, where
    k is largest, as long as they cost no level: over 128 entries one level of pairs and
    three of groups (190 comparisons a row) where four levels of groups and the last pair
    took 253."""
    if k <= 1:
        return ()
    options = [(PAIR, k // 2 + k % 2, k // 2)]
    if k >= 4:
        options.append((GROUP, k // 4 + k % 4, 6 * (k // 4)))
    if k >= 3:
        options.append((PADDED, -(-k // 4), 6 * -(-k // 4)))
    best: tuple[int, int, tuple[tuple[str, int], ...]] | None = None
    for kind, rest, cost in options:
        tail = plan(rest)
        cand = (1 + len(tail), cost + plan_cost(tail), ((kind, k), *tail))
        if best is None or cand[:2] < best[:2]:
            best = cand
    assert best is not None
    return best[2]


def plan_cost(levels: tuple[tuple[str, int], ...]) -> int:
    per = {PAIR: lambda k: k // 2, GROUP: lambda k: 6 * (k // 4), PADDED: lambda k: 6 * -(-k // 4)}
    return sum(per[kind](k) for kind, k in levels)


def levels(k: int) -> tuple[int, bool]:
    """(comparison levels to reduce k entries to one, whether the first level pads k up to
    a multiple of four): see :func:`plan`."""
    tree = plan(k)
    return len(tree), bool(tree) and tree[0][0] == PADDED


def pair_level(x: SharedTensor) -> SharedTensor:
    """max(a, b) = b + (a - b) msb(b - a) of the two halves of the last dim (an odd last
    entry joins the result), the product riding on the comparison."""
    k = x.shape[-1]
    h = k // 2
    a, b = x[..., :h], x[..., h : 2 * h]
    d = add_shared(b, a, -1)
    (sel,) = select_by_msb(x.session, d.shares, [neg_shared(d).shares])
    out = add_shared(b, x.with_shares(sel), 1)
    if k % 2:
        # (a cat of shared tensors is shared; torch's stubs say Tensor)
        out = cast(SharedTensor, torch.cat([out, x[..., 2 * h :]], dim=-1))
    return out


def group_level(x: SharedTensor, padded: bool) -> SharedTensor:
    """The max of each group of four: the i-th entries of the last dim's four quarters
    (:func:`mpc.protocols.max_of_four.run.max_of_four`: 4 rounds where two pairwise levels take
    8); ``padded``: copies of the first entries fill the last quarter first (the max is
    unchanged), else a remainder of one to three entries joins the result."""
    k = x.shape[-1]
    if padded:
        pad = -k % 4
        x = cast(SharedTensor, torch.cat([x, x[..., :pad]], dim=-1)) if pad else x
        k += pad
    h = k // 4
    whole = x if k == 4 * h else x[..., : 4 * h]
    # the i-th entries of the four quarters as rows of four (views and one copy at each
    # party: three messages a party, where four slices and a stack took five)
    rows = whole.reshape(*x.shape[:-1], 4, h)
    flat = cast(SharedTensor, rows.transpose(-1, -2).reshape(-1, 4))
    flat.materialize()
    best, _ = max_of_four(x.session, flat.shares)
    out = flat.with_shares(best).reshape(*x.shape[:-1], h)
    if k % 4:
        out = cast(SharedTensor, torch.cat([out, x[..., 4 * h :]], dim=-1))
    return out


# -- ranked groups ---------------------------------------------------------------------------


def _groups(x: SharedTensor, g: int) -> SharedTensor:
    """The last dim of x as groups of g consecutive entries ([..., k / g, g]), copies of
    the first entries filling the last group, materialized for a comparison."""
    pad = -x.shape[-1] % g
    if pad:
        x = cast(SharedTensor, torch.cat([x, x[..., :pad]], dim=-1))
    groups = cast(SharedTensor, x.reshape(*x.shape[:-1], x.shape[-1] // g, g))
    groups.materialize()
    return groups


def ranked_level(x: SharedTensor, g: int) -> SharedTensor:
    """The max of each group of g consecutive entries of the last dim (copies of the first
    entries fill the last group: the max is unchanged), each group ranked
    (:func:`mpc.protocols.ranks.max_by_ranks`: one comparison run of its pairs, one round)."""
    groups = _groups(x, g)
    best, _ = ranks.max_by_ranks(x.session, groups.shares, False)
    return groups.with_shares(best).squeeze(-1)


def ranked_level_carrying(x: SharedTensor, carried: Shares, g: int) -> tuple[SharedTensor, Shares]:
    """:func:`ranked_level`, each group's max with the ``carried`` value (shared, of x's
    shape: an entry's index) of its first maximum, selected in the same round
    (:func:`mpc.protocols.ranks.max_carrying`). A padded entry is a copy of the first
    ones, its carried value too."""
    pad = -x.shape[-1] % g
    if pad:
        carried = cast(Shares, [torch.cat([c, c[..., :pad]], dim=-1) for c in carried])
    groups = _groups(x, g)
    shape = list(groups.shape)
    best, which = ranks.max_carrying(x.session, groups.shares, [c.reshape(shape) for c in carried])
    return groups.with_shares(best).squeeze(-1), cast(Shares, [c.squeeze(-1) for c in which])


def indexed_sizes(session: Session, rows: int, k: int) -> tuple[int, ...] | None:
    """The ranked groups' sizes of :func:`indexed_max` for ``rows`` rows of k entries (as
    :func:`values_max` takes them), or None where the tree of pairs and groups takes no
    more rounds than they do."""
    sizes = _ranked_sizes(session, rows, k)
    if not sizes or ranked_rounds(session, rows, k, sizes) >= tree_rounds(session, rows, k):
        return None
    return sizes


def indexed_max(x: SharedTensor, sizes: tuple[int, ...]) -> tuple[SharedTensor, Shares]:
    """The max over the last dim ([..., 1]) and the first argmax (shared integers,
    [..., 1]) by levels of ranked groups of ``sizes`` (:func:`indexed_sizes`). The first
    level's index is local: group t's g entries are t g + j, and the selection's one-hot
    delta gives sum_j delta_j j (:func:`mpc.protocols.ranks.max_by_ranks`); from the
    second level on, each entry carries its index, selected beside its value in the
    level's selection round (a second table an entry: :func:`ranked_level_carrying`). The
    packed tree's index needs the values packed with it, so at most 2^(62 - f - m) in
    magnitude: a pending product's truncation round first, and a round for the packed
    max's low bits after; these levels take neither.

    A padded entry (a copy of one of the first g) gets an index past k in the first
    level, but never wins: group 0 holds its original, which ranks first on a tie."""
    g = sizes[0]
    groups = _groups(x, g)
    best, within = ranks.max_by_ranks(x.session, groups.shares, True)
    assert within is not None
    start = torch.arange(0, groups.shape[-2] * g, g, dtype=torch.int64).unsqueeze(-1)  # t g
    index = cast(Shares, [(w + start if i == 0 else w).squeeze(-1) for i, w in enumerate(within)])
    top = groups.with_shares(best).squeeze(-1)
    for g in sizes[1:]:
        top, index = ranked_level_carrying(top, index, g)
    return top, index


@lru_cache(maxsize=256)
def ranked_plan(rows: int, k: int, budget: int) -> tuple[int, ...] | None:
    """Group sizes of the fewest levels of ranked groups that reduce k entries to one
    within ``budget`` pairs a level over ``rows`` rows (the last level ranks all that is
    left), the fewest pairs among those; None if none fits."""
    best: tuple[int, int, tuple[int, ...]] | None = None
    if k <= 1:
        return ()
    if rows * k * (k - 1) // 2 <= budget:
        return (k,)
    # a level of groups of g has about rows k (g - 1) / 2 pairs
    for g in range(2, min(k - 1, 2 * budget // (rows * k) + 1) + 1):
        left = -(-k // g)
        pairs = rows * left * g * (g - 1) // 2
        if pairs > budget:
            continue
        tail = ranked_plan(rows, left, budget)
        if tail is None:
            continue
        cost = pairs + _pairs_of(rows, left, tail)
        cand = (1 + len(tail), cost, (g, *tail))
        if best is None or cand[:2] < best[:2]:
            best = cand
    return None if best is None else best[2]


def _pairs_of(rows: int, k: int, sizes: tuple[int, ...]) -> int:
    total = 0
    for g in sizes:
        left = -(-k // g)
        total += rows * left * g * (g - 1) // 2
        k = left
    return total


def level_rounds(session: Session, kind: str, rows: int, k: int) -> int:
    """The rounds of one level over ``rows`` rows of k entries: a comparison run of its
    pairs (:func:`mpc.protocols.compare.comparison_rounds`: 3 by default within the
    session's ``three_round_up_to`` elements, groups of four 4, FSS 2), or ranks
    (:data:`RANKS`: their run and the selection's round)."""
    if kind == RANKS:
        return ranks.rank_rounds(session, rows * k * (k - 1) // 2)
    if kind == PAIR:
        return comparison_rounds(session, rows * (k // 2), selected=True)
    return comparison_rounds(session, rows * -(-k // 4), grouped=True)


def tree_plan(session: Session, rows: int, k: int) -> tuple[tuple[str, int], ...]:
    """The levels of pairs and groups of four (:func:`plan`'s kinds) that reduce ``rows``
    rows of k entries to one in the fewest rounds in the session's mode, then the fewest
    comparisons, finished by ranks (:data:`RANKS`, the entries left) where that costs
    fewer rounds within the ranks' pairs budget."""
    budget = ranks.max_pairs(session)
    memo: dict[int, tuple[int, int, tuple[tuple[str, int], ...]]] = {}

    def best(k: int) -> tuple[int, int, tuple[tuple[str, int], ...]]:
        if k <= 1:
            return 0, 0, ()
        if k in memo:
            return memo[k]
        options = [(PAIR, k // 2 + k % 2, rows * (k // 2))]
        if k >= 4:
            options.append((GROUP, k // 4 + k % 4, rows * 6 * (k // 4)))
        if k >= 3:
            options.append((PADDED, -(-k // 4), rows * 6 * -(-k // 4)))
        cands = []
        for kind, rest, cost in options:
            r, c, tail = best(rest)
            cands.append((level_rounds(session, kind, rows, k) + r, cost + c, ((kind, k), *tail)))
        pairs = rows * k * (k - 1) // 2
        if k >= 3 and pairs <= budget:
            cands.append((level_rounds(session, RANKS, rows, k), pairs, ((RANKS, k),)))
        memo[k] = min(cands, key=lambda c: c[:2])
        return memo[k]

    return best(k)[2]


def tree_rounds(session: Session, rows: int, k: int) -> int:
    """The rounds of :func:`tree_plan`'s levels."""
    return sum(level_rounds(session, kind, rows, n) for kind, n in tree_plan(session, rows, k))


def values_max_rounds(session: Session, rows: int, k: int) -> int:
    """The rounds :func:`values_max` takes for ``rows`` rows of k entries."""
    tree = tree_rounds(session, rows, k)
    sizes = _ranked_sizes(session, rows, k)
    return min(tree, ranked_rounds(session, rows, k, sizes)) if sizes else tree


def ranked_rounds(session: Session, rows: int, k: int, sizes: tuple[int, ...]) -> int:
    """The rounds of ranked groups of ``sizes`` (:func:`indexed_max`'s, and the ranked
    levels of :func:`values_max`): each level's ranks over its pairs."""
    total = 0
    for g in sizes:
        left = -(-k // g)
        total += ranks.rank_rounds(session, rows * left * g * (g - 1) // 2)
        k = left
    return total


def _ranked_sizes(session: Session, rows: int, k: int) -> tuple[int, ...] | None:
    budget = ranks.max_pairs(session)
    if rows * k > 2 * budget:
        return None
    return _round_plan(session.config, rows, k, budget, _level_rounds(session, budget))


def _level_rounds(session: Session, budget: int) -> tuple[tuple[int, int], ...]:
    """The rounds of a ranked level by its pairs, as (most pairs, rounds) steps up to
    ``budget``: ranks' rounds change only where the comparison run's does (the digit
    look-ups' and the three-round run's bounds)."""
    steps: list[tuple[int, int]] = []
    for bound in sorted(
        {session.config.two_round_up_to or 0, session.config.three_round_up_to or 0}
    ):
        if 0 < bound < budget:
            steps.append((bound, ranks.rank_rounds(session, bound)))
    steps.append((budget, ranks.rank_rounds(session, budget)))
    return tuple(steps)


@lru_cache(maxsize=256)
def _round_plan(
    config: object, rows: int, k: int, budget: int, steps: tuple[tuple[int, int], ...]
) -> tuple[int, ...] | None:
    """Group sizes of the levels of ranked groups that reduce k entries to one in the
    fewest rounds (each level's by its pairs: ``steps``, :func:`_level_rounds`), then the
    fewest pairs, within ``budget`` pairs a level (``config``: the session's, which the
    steps come from); None if none fits. Where a level's rounds do not depend on its
    pairs this is :func:`ranked_plan`'s fewest levels; where the digit look-ups' bound
    lets smaller levels take a round fewer, more of them may take fewer rounds (an
    argmax over 50,257: 18 rounds in groups of 2, 3, 6, 11 and 127, where the fewest
    levels' groups took 19)."""

    def rounds_of(pairs: int) -> int:
        return next(r for most, r in steps if pairs <= most)

    memo: dict[int, tuple[int, int, tuple[int, ...]] | None] = {}

    def best(k: int) -> tuple[int, int, tuple[int, ...]] | None:
        if k <= 1:
            return 0, 0, ()
        if k in memo:
            return memo[k]
        out: tuple[int, int, tuple[int, ...]] | None = None
        every = rows * k * (k - 1) // 2
        if every <= budget:
            out = (rounds_of(every), every, (k,))
        for g in range(2, min(k - 1, 2 * budget // (rows * k) + 1) + 1):
            left = -(-k // g)
            pairs = rows * left * g * (g - 1) // 2
            if pairs > budget:
                continue
            tail = best(left)
            if tail is None:
                continue
            cand = (rounds_of(pairs) + tail[0], pairs + tail[1], (g, *tail[2]))
            if out is None or cand[:2] < out[:2]:
                out = cand
        memo[k] = out
        return out

    found = best(k)
    return None if found is None else found[2]


def values_max(x: SharedTensor) -> SharedTensor:
    """The max over the last dim, kept as [..., 1]: the levels of the module docstring."""
    session, k = x.session, x.shape[-1]
    rows = x.numel() // max(k, 1)
    sizes = _ranked_sizes(session, rows, k)
    if sizes and ranked_rounds(session, rows, k, sizes) < tree_rounds(session, rows, k):
        for g in sizes:
            x = ranked_level(x, g)
        return x
    for kind, _ in tree_plan(session, rows, k):
        if kind == RANKS:  # (the entries left are few: ranks finish in fewer rounds)
            x.materialize()
            v, _ = ranks.max_by_ranks(session, x.shares, False)
            return x.with_shares(v)
        x = pair_level(x) if kind == PAIR else group_level(x, kind == PADDED)
    return x
