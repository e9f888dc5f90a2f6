"""An authenticated truncation, the client's side (the steps and the protocol:
:mod:`mpc.protocols.auth_truncation.steps`): the dealer's pair, each party's mask, one
authenticated opening, each party's finish."""

from __future__ import annotations

import math

from mpc.protocols.auth_opening.run import masked, open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.auth_truncation.steps import (
    auth_trunc_finish,
    auth_trunc_mask,
    correction_words,
    dealer_auth_trunc,
)
from mpc.protocols.parties import I64, Shares, at_parties
from mpc.session import Session


def auth_truncate(session: Session, z: Shares, bits: int) -> Shares:
    """[z >> bits] for |z| < 2^62 (mod 2^64), exact up to one unit in the last place, on
    authenticated shares: one round."""
    if bits == 0:
        return z
    state = auth_state(session)
    nonce = session.next_nonce()
    shape = [int(d) for d in z[0].shape[2:]]
    seed, keys = session.party_seeds, state.keys
    to_open, _, (uh,) = masked(
        session,
        "truncation of a fixed-point product",
        dealer_auth_trunc,
        [nonce, shape, bits],
        [((correction_words(math.prod(shape)),), I64)],
        auth_trunc_mask,
        lambda i, corr: [seed[i], keys[i], nonce, i == 0, z[i], bits, corr],
        [((2, *shape), I64), ((2, *shape), I64), ((2, 2, 2, *shape), I64)],
    )
    (c,) = open_auth(session, [to_open])
    (out,) = at_parties(
        session,
        auth_trunc_finish,
        lambda i: [seed[i], keys[i], nonce, i == 0, c[i], uh[i], bits],
        [((2, 2, *shape), I64)],
    )
    return out
