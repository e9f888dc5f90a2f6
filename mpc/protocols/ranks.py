"""The max (and argmax) of a few values in two comparison runs, whatever their number: by
ranks instead of a tree.

For the k entries x_0..x_(k-1) of a row, one comparison run gives every pair's bit
l_ab = [x_a < x_b] (a < b): k (k - 1) / 2 comparisons. Entry b *beats* entry a when
x_b > x_a, or x_b = x_a and b < a (the first maximum wins, as torch's). So the rank of
entry i, the number of entries that beat it,

    rank_i = sum over pairs (i, b), b > i, of l_ib  +  sum over pairs (a, i), a < i, of 1 - l_ai,

is linear in the bits (a product with a public incidence matrix, local), and exactly one
entry, the first maximum, has rank 0. One round of dealt lookup tables
(:func:`mpc.protocols.rank_select.run.select_rank_zero`: the ranks and the values opened
masked, each entry's table of 2^m words, m the bits of k - 1) gives delta_i = [rank_i = 0]
and delta_i x_i, so the max is sum_i delta_i x_i and the argmax sum_i delta_i i (local).
A value each entry carries (its index in a tree's later level, :func:`max_carrying`) is
selected beside x in the same round: the ranks stacked twice, a second table an entry.

Rounds: one comparison run and one round (:func:`rank_rounds`): 4 by default within
``MPCConfig.three_round_up_to`` compared pairs (5 past it) and 2 with ``comparison="fss"``,
where a tree takes one run per level (3 or 4 rounds by default, 2 with FSS): for k = 33,
4 where the tree of groups of four takes 12, and 2 with FSS where it takes 6. The price is
the comparisons: k (k - 1) / 2 a row where the tree needs about 1.5 k, so
:func:`worth_it` takes this path only for few rows of few entries (a decoding step's
softmax: 12 heads, 33 keys).

Nothing is opened but masked values (the comparisons', and the ranks and values masked
by the dealer's uniform words); the order of the entries stays secret (the ranks are
shares).
"""

from __future__ import annotations

from functools import cache
from typing import cast

import torch

from mpc.protocols.compare import comparison_rounds, msb, msb_thresholds
from mpc.protocols.parties import I64, Shares
from mpc.protocols.rank_select.run import select_rank_zero
from mpc.session import Session

#: the most pairwise comparisons one call runs (rows times k (k - 1) / 2), by comparison
#: mode: 2^15 cost a party about 690 KB by default (21 bytes a comparison) and the dealer
#: about 2 MB; 2^13 cost the dealer about 25 MB of keys with FSS (3 KB a comparison). A
#: decoding step's softmax over 12 heads and 56 keys takes 18,480 (by ranks by default,
#: by the tree with FSS)
MAX_PAIRS = {"default": 1 << 15, "fss": 1 << 13}


def max_pairs(session: Session) -> int:
    """:data:`MAX_PAIRS` for the session's comparison mode."""
    return MAX_PAIRS.get(session.config.comparison, MAX_PAIRS["fss"])


@cache
def _pairs(k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(a, b) for every pair a < b, and the incidence matrix (pairs x k) that turns the
    pairs' bits l_ab into the ranks: +1 at (p, a), -1 at (p, b)."""
    a, b = torch.triu_indices(k, k, 1)
    m = torch.zeros(a.numel(), k, dtype=I64)
    p = torch.arange(a.numel())
    m[p, a] = 1
    m[p, b] = -1
    return a, b, m


def rank_rounds(session: Session, pairs: int) -> int:
    """The rounds of :func:`max_by_ranks` over ``pairs`` pairwise comparisons in all (rows
    times k (k - 1) / 2): the pairs' comparison run and the selection's round."""
    return comparison_rounds(session, pairs) + 1


def worth_it(session: Session, rows: int, k: int, other_rounds: int) -> bool:
    """Whether ranks take fewer rounds than ``other_rounds`` (a tree's) for ``rows`` rows
    of k entries, within :func:`max_pairs` comparisons."""
    pairs = rows * k * (k - 1) // 2
    return k >= 3 and pairs <= max_pairs(session) and rank_rounds(session, pairs) < other_rounds


def near_rounds(session: Session, pairs: int) -> int:
    """The rounds of :func:`max_and_near` over ``pairs`` pairs: one comparison run of three
    thresholds a pair and the selection's round."""
    return comparison_rounds(session, 3 * pairs) + 1


def max_and_near(session: Session, x: Shares, width: int) -> tuple[Shares, Shares]:
    """The max over the last dim of ``x`` ([..., k] ring elements), kept as [..., 1], and
    near_j = [x_j >= max - width] per entry (``width``: ring units, positive), in the
    rounds of :func:`max_by_ranks`: each pair's difference x_a - x_b (a < b) is compared
    with 0, -width and width + 1 in the same run (one opening of it: the thresholds share
    its mask), so that besides l_ab = [x_a < x_b] it gives [x_a < x_b - width] (a is far
    below b) and [x_a - x_b <= width] (else b is far below a). The count of entries far
    above x_j is linear in those bits, and x_j is near the max exactly when that count is
    0: the same lookup round as the ranks' (the count's tables beside the ranks' ones), so
    near costs no round."""
    k = int(x[0].shape[-1])
    if not 0 < width < 1 << 61:
        raise ValueError(f"internal: a width of {width} ring units")
    a, b, incidence = _pairs(k)
    diffs = cast(Shares, [torch.index_select(s, -1, a) - torch.index_select(s, -1, b) for s in x])
    bits = msb_thresholds(session, diffs, [0, -width, width + 1])  # [3, ..., pairs]
    lt, below, within = (cast(Shares, [s[t] for s in bits]) for t in range(3))
    ranks = cast(Shares, [torch.matmul(t, incidence) for t in lt])
    ranks[0] = ranks[0] + torch.arange(k, dtype=I64)
    # far_j: pairs (j, b) with x_j < x_b - width, and pairs (a, j) with x_a - x_j > width
    # (1 - within: party 0 adds the count of pairs (a, j), j of them)
    first, second = incidence.clamp(min=0), (-incidence).clamp(min=0)
    far = cast(
        Shares, [torch.matmul(u, first) - torch.matmul(w, second) for u, w in zip(below, within)]
    )
    far[0] = far[0] + torch.arange(k, dtype=I64)
    both = cast(Shares, [torch.cat([r, f], -1) for r, f in zip(ranks, far)])
    values = cast(Shares, [torch.cat([s, s], -1) for s in x])
    delta, selected = select_rank_zero(session, both, values, max(k - 1, 1).bit_length())
    best = [s[..., :k].sum(-1, keepdim=True) for s in selected]
    return best, cast(Shares, [d[..., k:] for d in delta])


def max_by_ranks(session: Session, x: Shares, with_index: bool) -> tuple[Shares, Shares | None]:
    """The max over the last dim of ``x`` (shape [..., k], ring elements), kept as [..., 1],
    and with ``with_index`` the first argmax (integers, [..., 1]); module docstring."""
    k = int(x[0].shape[-1])
    delta, selected = select_rank_zero(session, _ranks(session, x), list(x), _bits(k))
    best = [s.sum(-1, keepdim=True) for s in selected]
    if not with_index:
        return best, None
    idx = torch.arange(k, dtype=I64)
    return best, [(d * idx).sum(-1, keepdim=True) for d in delta]


def max_carrying(session: Session, x: Shares, carried: Shares) -> tuple[Shares, Shares]:
    """The max over the last dim of ``x`` ([..., k]) and the ``carried`` value (shared, of
    x's shape: an entry's index in a tree's level) of its first maximum, each kept as
    [..., 1], in the rounds of :func:`max_by_ranks`: the ranks and the selection as there,
    the carried values selected beside x in the same round (the ranks stacked twice: a
    second table an entry, its own masks)."""
    k = int(x[0].shape[-1])
    if list(carried[0].shape) != list(x[0].shape):
        raise ValueError(f"internal: carried {list(carried[0].shape)} for {list(x[0].shape)}")
    ranks = _ranks(session, x)
    both = cast(Shares, [torch.stack([r, r]) for r in ranks])
    values = cast(Shares, [torch.stack([v, c]) for v, c in zip(x, carried)])
    _, selected = select_rank_zero(session, both, values, _bits(k))
    return (
        cast(Shares, [s[0].sum(-1, keepdim=True) for s in selected]),
        cast(Shares, [s[1].sum(-1, keepdim=True) for s in selected]),
    )


def _bits(k: int) -> int:
    return max(k - 1, 1).bit_length()


def _ranks(session: Session, x: Shares) -> Shares:
    """Each entry's rank over the last dim of ``x``: the count of entries above it, ties
    to the earlier (one comparison run of every pair)."""
    k = int(x[0].shape[-1])
    a, b, incidence = _pairs(k)
    diffs = cast(Shares, [torch.index_select(s, -1, a) - torch.index_select(s, -1, b) for s in x])
    lt = msb(session, diffs)  # [x_a < x_b] per pair
    # rank_i: the bits' part, plus the count of entries before i (each a pair (a, i) whose
    # term is 1 - l_ai), added by party 0
    ranks = cast(Shares, [torch.matmul(t, incidence) for t in lt])
    ranks[0] = ranks[0] + torch.arange(k, dtype=I64)
    return ranks
