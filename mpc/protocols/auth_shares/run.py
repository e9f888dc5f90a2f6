"""Authenticated shares, the client's side (the steps: :mod:`mpc.protocols.auth_shares.steps`).

- :func:`share_input`: the input's owner (the client) gets r's low 64 bits of an
  authenticated random r from the dealer, sends d = x - r (mod 2^64) to every party, and
  each party keeps [x] = d + [r], value and MAC (SPDZ's input with a dealt mask).
- :func:`reveal`: the parties open y = x + r among themselves for an authenticated r whose
  low bits only the client knows (one round), run the MAC check over every opening since
  the last one (four rounds), and only then release y; the client takes y from every party,
  checks they agree, and subtracts r. So no party learns the output, and no output reaches
  the client before the check, whatever a party does.
"""

from __future__ import annotations

import torch

import pointers as pt
from mpc.errors import MACCheckError
from mpc.protocols.auth_opening.run import open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.auth_shares.steps import (
    auth_input,
    auth_output_mask,
    auth_release,
    dealer_input_mask,
    dealer_output_mask,
)
from mpc.protocols.mac_check.run import checked_error, mac_check
from mpc.protocols.parties import I64, Shares, at_parties, call, run_step
from mpc.protocols.step import name_of
from mpc.session import Session


def share_input(session: Session, ring: torch.Tensor) -> Shares:
    """Authenticated shares of the int64 ring elements ``ring`` (the client's input)."""
    state = auth_state(session)
    dealer = session.require_dealer("an authenticated input")
    shape = [int(d) for d in ring.shape]
    nonce = session.next_nonce()
    corr, r_lo = call(
        dealer,
        name_of(dealer_input_mask),
        [session.dealer_seeds, state.alpha, nonce, shape],
        [((2, *shape), I64), (tuple(shape), I64)],
    )
    last = session.n - 1
    corr_last = corr.move(session.parties[last])
    d = torch.sub(ring, r_lo.get())
    sent = [pt.send(d, p) for p in session.parties]
    seed = session.party_seeds
    (x,) = at_parties(
        session,
        auth_input,
        lambda i: [
            seed[i],
            state.keys[i],
            nonce,
            i == 0,
            sent[i],
            corr_last if i == last else None,
        ],
        [((2, 2, *shape), I64)],
    )
    return x


def reveal(session: Session, x: Shares) -> torch.Tensor:
    """The int64 ring elements of ``x``, for the client, after the MAC check (see the
    module docstring); :class:`~mpc.errors.MACCheckError` if a check fails or the parties'
    outputs disagree."""
    try:
        ys, mask = _reveal(session, x)
    except pt.RemoteError as e:
        raise checked_error(e) from e
    for i, v in enumerate(ys[1:], start=1):
        if not torch.equal(v, ys[0]):
            raise MACCheckError(
                f"the output check failed: parties {session.parties[0].id!r} and "
                f"{session.parties[i].id!r} released different outputs; nothing is returned"
            )
    return ys[0] - mask


def _reveal(session: Session, x: Shares) -> tuple[list[torch.Tensor], torch.Tensor]:
    state = auth_state(session)
    dealer = session.require_dealer("an authenticated output")
    shape = [int(d) for d in x[0].shape[2:]]
    nonce = session.next_nonce()
    corr, r_lo = call(
        dealer,
        name_of(dealer_output_mask),
        [session.dealer_seeds, state.alpha, nonce, shape],
        [((2, *shape), I64), (tuple(shape), I64)],
    )
    last = session.n - 1
    corr_last = corr.move(session.parties[last])
    seed = session.party_seeds
    piece, mac = at_parties(
        session,
        auth_output_mask,
        lambda i: [seed[i], nonce, x[i], corr_last if i == last else None],
        [((2, *shape), I64), ((2, *shape), I64)],
    )
    (y,) = open_auth(session, [(piece, mac)])
    mac_check(session)
    released = [
        run_step(p, auth_release, [y[i]], [(tuple(shape), I64)])[0]
        for i, p in enumerate(session.parties)
    ]
    *ys, mask = pt.get_all([*released, r_lo])
    return ys, mask
