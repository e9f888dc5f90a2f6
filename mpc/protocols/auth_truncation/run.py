"""An authenticated truncation, the client's side (the steps and the protocol:
:mod:`mpc.protocols.auth_truncation.steps`): the dealer's pair, each party's mask, one
authenticated opening, each party's finish."""

from __future__ import annotations

import math

from mpc.protocols.auth_opening.run import open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.auth_truncation.steps import (
    auth_trunc_finish,
    auth_trunc_mask,
    correction_words,
    dealer_auth_trunc,
)
from mpc.protocols.parties import I64, Shares, at_parties, call
from mpc.protocols.step import name_of
from mpc.session import Session


def auth_truncate(session: Session, z: Shares, bits: int) -> Shares:
    """[z >> bits] for |z| < 2^62 (mod 2^64), exact up to one unit in the last place, on
    authenticated shares: one round."""
    if bits == 0:
        return z
    state = auth_state(session)
    dealer = session.require_dealer("truncation of a fixed-point product")
    nonce = session.next_nonce()
    shape = [int(d) for d in z[0].shape[2:]]
    (corr,) = call(
        dealer,
        name_of(dealer_auth_trunc),
        [session.dealer_seeds, state.alpha, nonce, shape, bits],
        [((correction_words(math.prod(shape)),), I64)],
    )
    last = session.n - 1
    corr_last = corr.move(session.parties[last])
    seed, keys = session.party_seeds, state.keys
    piece, mac, uh = at_parties(
        session,
        auth_trunc_mask,
        lambda i: [seed[i], keys[i], nonce, i == 0, z[i], bits, corr_last if i == last else None],
        [((2, *shape), I64), ((2, *shape), I64), ((2, 2, 2, *shape), I64)],
    )
    (c,) = open_auth(session, [(piece, mac)])
    (out,) = at_parties(
        session,
        auth_trunc_finish,
        lambda i: [seed[i], keys[i], nonce, i == 0, c[i], uh[i], bits],
        [((2, 2, *shape), I64)],
    )
    return out
