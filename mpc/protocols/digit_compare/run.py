"""The comparison by digit look-ups, the client's side (the steps:
:mod:`mpc.protocols.digit_compare.steps`; the math: :mod:`mpc.math.digit_compare`):
msb(x) and msb(x - theta_k) for public thresholds in 2 rounds, for any number of
parties, where the carry tree (:mod:`mpc.protocols.comparison.run`) takes 3.

Round 1 opens c = x + r, with whatever rides in it (:mod:`mpc.protocols.riders`); round 2
opens, for each compared value, 8 uniform bytes (the zero tests' masked operands); the
bit is then local. It costs the dealer about 1 KB an element and 1 KB a compared value
(the carry tree's last level: about 0.6 KB), so the default mode takes it for runs of
at most the session's ``two_round_up_to`` compared values (elements times thresholds)
and for the bit alone: a comparison that selects values, or groups of four, keeps the
carry tree. Correct whenever x - theta is in the signed range (-2^63, 2^63), as the
carry tree is.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from mpc.math import digit_compare as dm
from mpc.protocols import pieces
from mpc.protocols.digit_compare.steps import (
    SELECT_WORDS,
    TEST_WORDS,
    dealer_digit_compare,
    digit_finish,
    digit_mask,
    digit_select_mask,
    digit_test,
)
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.protocols.riders.run import take
from mpc.session import Session


def digits_fit(session: Session, compared: int) -> bool:
    """Whether a comparison of ``compared`` values (elements times thresholds) that
    selects nothing runs by digit look-ups: default mode, semi-honest, at most the
    session's ``two_round_up_to``, and its dealer's step within one piece (counted as if
    each compared value were an element: the larger declaration; else the carry tree
    runs in pieces, :mod:`mpc.protocols.pieces`)."""
    config = session.config
    limit = config.two_round_up_to
    return (
        config.comparison == "default"
        and config.security == "semi-honest"
        and limit is not None
        and compared <= limit
        and pieces.count(dealer_digit_compare, {"shape": [compared]}, compared) == 1
    )


def selects_fit(session: Session, shape: list[int], count: int, selected: int) -> bool:
    """Whether a comparison of x (``shape``) with ``count`` thresholds that selects
    ``selected`` values (:func:`digit_select`) runs by digit look-ups: as
    :func:`digits_fit` for its compared values, its dealer's step within one piece."""
    n = math.prod(shape)
    params = {"shape": list(shape), "thresholds": [0] * count, "picks": [0] * selected}
    return (
        selected >= 1
        and digits_fit(session, n * count)
        and pieces.count(dealer_digit_compare, params, n * count) == 1
    )


def digit_msb(session: Session, x: Shares, thresholds: list[int] | None = None) -> Shares:
    """[msb(x)] ([*x]), or [msb(x - theta_k)] for public ring values theta_k
    ([T, *x]), as arithmetic shares of 0/1, in 2 rounds (the module docstring). The
    truncations riding on the session's next round (:func:`mpc.protocols.riders.run.
    riding`) ride in the first."""
    shape = list(x[0].shape)
    nonce, c, u_shares, tests = _first_round(session, x, thresholds, None)
    two = Round(session)
    u = two.add(u_shares)
    two.open()
    out_shape = [len(thresholds), *shape] if thresholds is not None else shape
    seed = session.party_seeds
    (bits,) = at_parties(
        session,
        digit_finish,
        lambda i: [seed[i], nonce, i == 0, tests(i), c.value[i], u.value[i], thresholds],
        [(out_shape, I64)],
    )
    return bits


def _first_round(
    session: Session, x: Shares, thresholds: list[int] | None, picks: list[int] | None
) -> tuple[int, Any, Shares, Callable[[int], Any]]:
    """The dealer's material, x's masked c opened in the first round (the riders with it)
    and each party's zero tests to open in the second: (the nonce, c's opening, the
    tests' shares, the dealer's tests for party i)."""
    shape = list(x[0].shape)
    n = math.prod(shape)
    count = len(thresholds) if thresholds is not None else 1
    selected = len(picks) if picks is not None else 0
    nonce = session.next_nonce()
    seed = session.party_seeds
    args: list[Any] = [nonce, shape, thresholds if picks is None else list(thresholds or [])]
    tables_last, tests_last = deal(
        session,
        "a comparison",
        dealer_digit_compare,
        args if picks is None else [*args, list(picks)],
        out=[
            ([n, dm.PACKED_WORDS], I64),
            ([n + count * n * TEST_WORDS + selected * n * SELECT_WORDS], I64),
        ],
    )
    (masked,) = at_parties(session, digit_mask, lambda i: [seed[i], nonce, x[i]], [(shape, I64)])
    one = Round(session)
    c = one.add(masked)
    riders = take()
    if riders is not None:
        riders.open_in(one)
    one.open()
    if riders is not None:
        riders.finish()
    tables = last_only(session, tables_last)
    (u_shares,) = at_parties(
        session,
        digit_test,
        lambda i: [seed[i], nonce, i == 0, tables(i), c.value[i], thresholds],
        [([count, n, dm.DIGITS], torch.uint8)],
    )
    return nonce, c, u_shares, last_only(session, tests_last)


class Opening(Protocol):
    """Something whose masked opening joins a round (a product's run)."""

    def open_in(self, round: Round) -> Any: ...


def digit_select(
    session: Session,
    x: Shares,
    thresholds: list[int],
    picks: list[int],
    values: Callable[[], tuple[list[Shares], Sequence[Opening]]],
) -> tuple[Shares, Shares]:
    """([msb(x - theta_k)] stacked [T, *x], [msb(x - theta_{picks[s]}) v_s] stacked
    [S, *x]) in the 2 rounds of :func:`digit_msb`: ``values()`` gives the v_s, in groups
    (each [S_j, *x], one after the other: S in all), and runs to open once the first
    round opened (what rode in it finished); the v_s's masked openings e_s = v_s + m_s
    and the runs' ride in the second, and
    the products are local after it: msb v_s = msb e_s - m_s msb, where the dealer's
    [y m_s] for the picked compared value's y = h + its zero tests (86 words an element
    and selected value, :data:`~mpc.protocols.digit_compare.steps.SELECT_WORDS` with h m_s)
    gives [m_s msb] = b m_s + (1 - 2b) [y m_s] (b public). For runs :func:`digits_fit`
    counts (the caller checks); the values' material is the caller's price."""
    shape = list(x[0].shape)
    count, selected = len(thresholds), len(picks)
    seed = session.party_seeds
    nonce, c, u_shares, tests = _first_round(session, x, thresholds, picks)
    groups, extra = values()
    if sum(int(g[0].shape[0]) for g in groups) != selected:
        raise ValueError(f"internal: the selected values are not {selected}, one a pick")
    stacked = [
        groups[0][i] if len(groups) == 1 else torch.cat([g[i] for g in groups])
        for i in range(session.n)
    ]
    e_shares, m = at_parties(
        session,
        digit_select_mask,
        lambda i: [seed[i], nonce, stacked[i]],
        [([selected, *shape], I64), ([selected, *shape], I64)],
    )
    two = Round(session)
    u = two.add(u_shares)
    e = two.add(e_shares)
    for run in extra:
        run.open_in(two)
    two.open()
    bits, got = at_parties(
        session,
        digit_finish,
        lambda i: [
            seed[i],
            nonce,
            i == 0,
            tests(i),
            c.value[i],
            u.value[i],
            thresholds,
            picks,
            e.value[i],
            m[i],
        ],
        [([count, *shape], I64), ([selected, *shape], I64)],
    )
    return bits, got


__all__ = ["digit_msb", "digit_select", "digits_fit", "selects_fit"]
