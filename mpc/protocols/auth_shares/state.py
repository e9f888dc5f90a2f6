"""The authenticated mode's state of a session, at the client: the MAC key's pointers (the
dealer's alpha, each party's share of it) and the residuals of the openings not yet
checked (:mod:`mpc.protocols.mac_check`). Made on a session's first authenticated op."""

from __future__ import annotations

from mpc.protocols.auth_shares.steps import auth_key, dealer_auth_key
from mpc.protocols.parties import I64, Shares, at_parties, call
from mpc.protocols.step import name_of
from mpc.session import Session


class AuthState:
    """The MAC key of a session (dealt when this is made) and its pending residuals."""

    def __init__(self, session: Session) -> None:
        dealer = session.require_dealer("the authenticated mode (security='malicious')")
        self.session = session
        self.key_nonce = nonce = session.next_nonce()
        self.alpha, corr = call(
            dealer,
            name_of(dealer_auth_key),
            [session.dealer_seeds, nonce],
            [((1,), I64), ((2,), I64)],
        )
        last = session.n - 1
        corr_last = corr.move(session.parties[last])
        seed = session.party_seeds
        (self.keys,) = at_parties(
            session,
            auth_key,
            lambda i: [seed[i], nonce, corr_last if i == last else None],
            [((2,), I64)],
        )
        # the residuals of every opening since the last check, per opening one per party
        self.pending: list[Shares] = []
        self.pending_elements = 0

    def note_opening(self, residual: Shares) -> None:
        self.pending.append(residual)
        self.pending_elements += residual[0].numel() // 2


def auth_state(session: Session) -> AuthState:
    """The authenticated mode's state of ``session`` (the MAC key dealt on first use)."""
    state = session.authenticated
    if state is None:
        state = session.authenticated = AuthState(session)
    assert isinstance(state, AuthState)
    return state
