"""The max of four values from one comparison run (no I/O): all six pairwise comparisons
at once, then a one-hot selection that rides on the comparisons' daBits.

For a group a_0..a_3, comparison c = (i, j), i < j, gives the bit b_c = [a_i < a_j]. Value i
is the max, first index on ties (as torch), iff a_i > a_j for every j < i and a_i >= a_j for
every j > i:

    w_i = prod_{j < i} b_(j,i) * prod_{j > i} (1 - b_(i,j)).

Each comparison ends with the public d_c = b_c ^ t_c for the dealer's random bit t_c, so
b_c = d_c + (1 - 2 d_c) t_c and 1 - b_c = (1 - d_c) - (1 - 2 d_c) t_c: affine in t_c with
public coefficients. A product of such factors expands into monomials t_T of the daBits
with public coefficients, and

    max = sum_i w_i a_i = sum_i sum_{T} coef_(i,T) [a_i t_T],

where [a_i t_T] = e_i [t_T] + [alpha_i t_T] from the opened e_i = a_i - alpha_i (a mask each
party derives) and the dealer's shares of t_T (|T| >= 2; a single t_c is the daBit's share)
and of alpha_i t_T. All local once d is open: the max of four costs one comparison's rounds
(the pairwise tree costs two). Cf. the daBit products of :func:`mpc.protocols.compare.
select_by_msb`, here with monomials of several daBits.

The max of four after a ReLU, max(0, a_0, .., a_3) = sum_i w_i s_i a_i with
s_i = [a_i >= 0] = 1 - msb(a_i), runs in the same comparison: four more comparisons (of the
values themselves, columns 6-9) and a fourth factor per value, so (``RELU`` layout, 10
comparisons a group) 11 products of daBits and 15 masked products per value, where the
plain layout (6 comparisons) takes 4 and 7. The zero candidate needs no term.
"""

from __future__ import annotations

from itertools import combinations
from typing import Any

import torch

PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # comparison c: b_c = [a_i < a_j]


def _factors(i: int) -> tuple[tuple[int, bool], ...]:
    """Value i's three factors: (comparison, whether it enters as b (True) or 1 - b)."""
    return tuple((c, pair[1] == i) for c, pair in enumerate(PAIRS) if i in pair)


FACTORS = tuple(_factors(i) for i in range(4))
# after a ReLU: comparison 6 + i is msb(a_i), value i's factor 1 - b
RELU_FACTORS = tuple(f + ((len(PAIRS) + i, False),) for i, f in enumerate(FACTORS))
PLAIN, RELU = len(PAIRS), len(PAIRS) + 4  # comparisons per group of each layout


def _subsets(items: tuple[int, ...], smallest: int) -> list[tuple[int, ...]]:
    return [t for k in range(smallest, len(items) + 1) for t in combinations(items, k)]


# per value i: the products of two or three of its comparisons' daBits (the dealer's), and
# every non-empty subset T of its comparisons (the dealer's alpha_i t_T)
def _monomials(factors: Any, smallest: int) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """(value i, T) for every subset T of at least ``smallest`` of value i's comparisons."""
    return tuple(
        (i, t) for i in range(4) for t in _subsets(tuple(c for c, _ in factors[i]), smallest)
    )


T_MONOMIALS = _monomials(FACTORS, 2)  # 16
AT_MONOMIALS = _monomials(FACTORS, 1)  # 28
RELU_T_MONOMIALS = _monomials(RELU_FACTORS, 2)  # 44
RELU_AT_MONOMIALS = _monomials(RELU_FACTORS, 1)  # 60


def layout(comparisons: int) -> tuple[Any, Any, Any]:
    """(factors, T monomials, AT monomials) of groups of ``comparisons`` comparisons:
    :data:`PLAIN` (the max of four) or :data:`RELU` (the max of four after a ReLU)."""
    if comparisons == PLAIN:
        return FACTORS, T_MONOMIALS, AT_MONOMIALS
    if comparisons == RELU:
        return RELU_FACTORS, RELU_T_MONOMIALS, RELU_AT_MONOMIALS
    raise ValueError(f"a group of four takes {PLAIN} or {RELU} comparisons, got {comparisons}")


def terms(comparisons: int) -> int:
    """The dealer's selection words per group (T and AT monomials)."""
    _, tm, atm = layout(comparisons)
    return len(tm) + len(atm)


def dealer_monomials(t: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dealer's values: t_T for :data:`T_MONOMIALS` ([G, 16]) and alpha_i t_T for
    :data:`AT_MONOMIALS` ([G, 28]), from the daBits t ([G, 6], 0/1) and the masks alpha
    ([G, 4], ring elements); the RELU layout's ([G, 44] and [G, 60]) for t [G, 10]."""
    _, t_monomials, at_monomials = layout(t.shape[1])
    tt = torch.stack([_prod(t, cs) for _, cs in t_monomials], dim=-1)
    at = torch.stack([alpha[:, i] * _prod(t, cs) for i, cs in at_monomials], dim=-1)
    return tt, at


def _prod(t: torch.Tensor, cs: tuple[int, ...]) -> torch.Tensor:
    out = t[:, cs[0]].clone()
    for c in cs[1:]:
        out *= t[:, c]
    return out


def _coefficients(d: torch.Tensor, i: int) -> dict[tuple[int, ...], torch.Tensor]:
    """w_i's expansion in its daBits: subset T (sorted comparisons) -> public coefficient
    ([G] int64), from the opened d ([G, 6], 0/1)."""
    poly: dict[tuple[int, ...], torch.Tensor] = {(): torch.ones_like(d[:, 0])}
    for c, is_b in layout(d.shape[1])[0][i]:
        dc = d[:, c]
        slope = 1 - 2 * dc
        const, lin = (dc, slope) if is_b else (1 - dc, -slope)
        out: dict[tuple[int, ...], torch.Tensor] = {}
        for t, coef in poly.items():
            out[t] = coef * const
            out[tuple(sorted((*t, c)))] = coef * lin
        poly = out
    return poly


def select(
    d: torch.Tensor,
    t: torch.Tensor,
    tt: torch.Tensor,
    at: torch.Tensor,
    e: torch.Tensor,
    a: torch.Tensor,
    first: bool,
    onehot: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """This party's share of the max of each group ([G]) and, with ``onehot``, of the
    one-hot w ([G, 4], integers), from the opened d ([G, 6]) and e ([G, 4]), its shares of
    the daBits t ([G, 6]), of :data:`T_MONOMIALS` (tt) and :data:`AT_MONOMIALS` (at), and
    of the values a ([G, 4]). With d [G, 10] (the RELU layout) the max of 0 and the four
    (``onehot`` then selects the one-hot argmax times [a_i >= 0])."""
    _, t_monomials, at_monomials = layout(d.shape[1])
    t_index = {m: k for k, m in enumerate(t_monomials)}
    at_index = {m: k for k, m in enumerate(at_monomials)}
    out = torch.zeros_like(a[:, 0])
    w = torch.zeros_like(a) if onehot else None
    for i in range(4):
        for ts, coef in _coefficients(d, i).items():
            if not ts:
                out += coef * a[:, i]
                if w is not None and first:
                    w[:, i] += coef
                continue
            share_t = t[:, ts[0]] if len(ts) == 1 else tt[:, t_index[(i, ts)]]
            out += coef * (e[:, i] * share_t + at[:, at_index[(i, ts)]])
            if w is not None:
                w[:, i] += coef * share_t
    return out, w
