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
"""

from __future__ import annotations

from itertools import combinations

import torch

PAIRS = ((0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3))  # comparison c: b_c = [a_i < a_j]


def _factors(i: int) -> tuple[tuple[int, bool], ...]:
    """Value i's three factors: (comparison, whether it enters as b (True) or 1 - b)."""
    return tuple((c, pair[1] == i) for c, pair in enumerate(PAIRS) if i in pair)


FACTORS = tuple(_factors(i) for i in range(4))


def _subsets(items: tuple[int, ...], smallest: int) -> list[tuple[int, ...]]:
    return [t for k in range(smallest, len(items) + 1) for t in combinations(items, k)]


# per value i: the products of two or three of its comparisons' daBits (the dealer's), and
# every non-empty subset T of its comparisons (the dealer's alpha_i t_T)
T_MONOMIALS = tuple(
    (i, t) for i in range(4) for t in _subsets(tuple(c for c, _ in FACTORS[i]), 2)
)  # 16
AT_MONOMIALS = tuple(
    (i, t) for i in range(4) for t in _subsets(tuple(c for c, _ in FACTORS[i]), 1)
)  # 28


def dealer_monomials(t: torch.Tensor, alpha: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The dealer's values: t_T for :data:`T_MONOMIALS` ([G, 16]) and alpha_i t_T for
    :data:`AT_MONOMIALS` ([G, 28]), from the daBits t ([G, 6], 0/1) and the masks alpha
    ([G, 4], ring elements)."""
    tt = torch.stack([_prod(t, cs) for _, cs in T_MONOMIALS], dim=-1)
    at = torch.stack([alpha[:, i] * _prod(t, cs) for i, cs in AT_MONOMIALS], dim=-1)
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
    for c, is_b in FACTORS[i]:
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
    of the values a ([G, 4])."""
    t_index = {m: k for k, m in enumerate(T_MONOMIALS)}
    at_index = {m: k for k, m in enumerate(AT_MONOMIALS)}
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
