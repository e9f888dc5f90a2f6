"""The authenticated FSS comparison, the client's side (the steps and why it is sound:
:mod:`mpc.protocols.auth_fss.steps`): the dealer's keys, each party's mask, one
authenticated opening, each party's evaluation. One round; 2 parties. The selection
(z msb(z): ReLU, the max of two) rides on the same round."""

from __future__ import annotations

import math

from mpc.protocols.auth_fss.steps import (
    auth_fss_eval,
    auth_fss_mask,
    correction_words,
    dealer_auth_fss,
    key_words,
)
from mpc.protocols.auth_opening.run import open_masked
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.parties import I64, Shares, at_parties
from mpc.session import Session


def auth_fss_ltz(session: Session, z: Shares) -> Shares:
    """Authenticated shares of [z < 0] (0 or 1, an integer) for every z (its low 64 bits
    read signed), 2 parties: one round."""
    (bit,) = _run(session, z, False)
    return bit


def auth_fss_select(session: Session, z: Shares) -> tuple[Shares, Shares]:
    """Authenticated shares of [z < 0] and of z [z < 0] (z's low 64 bits times the bit),
    2 parties: one round, no product after it."""
    bit, zbit = _run(session, z, True)
    return bit, zbit


def _run(session: Session, z: Shares, select: bool) -> list[Shares]:
    if session.n != 2:
        raise ValueError("the FSS comparison is for 2 parties")
    state = auth_state(session)
    nonce = session.next_nonce()
    shape = [int(d) for d in z[0].shape[2:]]
    n = math.prod(shape)
    seed, macs = session.party_seeds, state.keys
    kept = (3, 2, 2, *shape) if select else (2, 2, *shape)
    c, (cw,), (u,) = open_masked(
        session,
        "a comparison",
        dealer_auth_fss,
        [nonce, shape, select],
        [((key_words(n, select),), I64), ((correction_words(n, select),), I64)],
        auth_fss_mask,
        lambda i, corr: [seed[i], macs[i], nonce, i == 0, z[i], corr, select],
        [((2, *shape), I64), ((2, *shape), I64), (kept, I64)],
    )
    keys = [cw.copy_to(p, lend=True) for p in session.parties]  # (read only)
    return at_parties(
        session,
        auth_fss_eval,
        lambda i: [seed[i], macs[i], nonce, i == 0, keys[i], u[i], c[i], select],
        [((2, 2, *shape), I64)] * (2 if select else 1),
    )
