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
from mpc.protocols.parties import I64, Shares, at_parties
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
