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

from mpc.protocols.compare import comparison_rounds, msb
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


def max_by_ranks(session: Session, x: Shares, with_index: bool) -> tuple[Shares, Shares | None]:
    """The max over the last dim of ``x`` (shape [..., k], ring elements), kept as [..., 1],
    and with ``with_index`` the first argmax (integers, [..., 1]); module docstring."""
    k = int(x[0].shape[-1])
    a, b, incidence = _pairs(k)
    diffs = cast(Shares, [torch.index_select(s, -1, a) - torch.index_select(s, -1, b) for s in x])
    lt = msb(session, diffs)  # [x_a < x_b] per pair
    # rank_i: the bits' part, plus the count of entries before i (each a pair (a, i) whose
    # term is 1 - l_ai), added by party 0
    ranks = cast(Shares, [torch.matmul(t, incidence) for t in lt])
    ranks[0] = ranks[0] + torch.arange(k, dtype=I64)
    delta, selected = select_rank_zero(session, ranks, list(x), max(k - 1, 1).bit_length())
    best = [s.sum(-1, keepdim=True) for s in selected]
    if not with_index:
        return best, None
    idx = torch.arange(k, dtype=I64)
    return best, [(d * idx).sum(-1, keepdim=True) for d in delta]
