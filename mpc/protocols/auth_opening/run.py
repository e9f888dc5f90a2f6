"""Authenticated openings, the client's side: each party sends its piece of a masked value
to every peer, then opens it and keeps its residual for the MAC check
(:func:`mpc.protocols.auth_opening.steps.auth_open`). The client never sees an opened
value, and notes each opening's residuals for the next check."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpc import accounting
from mpc.protocols.auth_opening.steps import auth_open
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.opening.run import exchange
from mpc.protocols.parties import I64, Out, Shares, at_parties, run_step
from mpc.session import Session


def open_auth(session: Session, values: list[tuple[Shares, Shares]]) -> list[Shares]:
    """Open each (pieces, MAC shares) pair among the parties, all in one round; per value,
    a pointer to the opened value (128 bits, ``(2, *S)``) at each party."""
    if not values:
        return []
    accounting.count_round()
    state = auth_state(session)
    out = []
    for pieces, macs in values:
        shape = tuple(pieces[0].shape)
        ex = exchange(session, pieces, count=False)
        opened, residual = at_parties(
            session, auth_open, _args(state.keys, ex, macs), [(shape, I64), (shape, I64)]
        )
        state.note_opening(residual)
        out.append(opened)
    return out


def _args(keys: Shares, ex: list[Shares], macs: Shares) -> Callable[[int], list[Any]]:
    return lambda i: [keys[i], ex[i], macs[i]]


def masked(
    session: Session,
    what: str,
    dealer_step: Callable[..., Any],
    dealer_args: list[Any],
    dealer_out: Out,
    mask_step: Callable[..., Any],
    mask_args: Callable[[int, Any], list[Any]],
    mask_out: Out,
) -> tuple[tuple[Shares, Shares], list[Any], list[Shares]]:
    """The first round of a protocol that opens z + r for the dealer's authenticated r
    (truncation, the comparisons), up to the opening: the dealer's step (``what`` names the
    operation for the error where the session has no dealer; its seeds and alpha come
    first, then ``dealer_args``; its last output, the last party's corrections, goes
    there) and each party's mask step (``mask_args(i, the corrections at the last party,
    else None)``; its outputs ``mask_out``: its piece of z + r, the piece's MAC share, then
    what it keeps). Returns (pieces, MAC shares) to open, the dealer's other outputs, and
    per kept output its pointers (one per party)."""
    state = auth_state(session)
    dealer = session.require_dealer(what)
    *others, corr = run_step(
        dealer, dealer_step, [session.dealer_seeds, state.alpha, *dealer_args], dealer_out
    )
    last = session.n - 1
    corr_last = corr.move(session.parties[last])
    piece, mac, *kept = at_parties(
        session, mask_step, lambda i: mask_args(i, corr_last if i == last else None), mask_out
    )
    return (piece, mac), others, kept
