"""The batched MAC check, the client's side (the steps and the protocol's description:
:mod:`mpc.protocols.mac_check.steps`): four rounds among the parties, whatever was opened
since the last check. The client sees no value: only, at the end, each party's word that
its check passed (or the error that names the check that failed)."""

from __future__ import annotations

import torch

import pointers as pt
from mpc.errors import MACCheckError
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.mac_check.steps import (
    mac_check_combine,
    mac_check_commit,
    mac_check_open,
    mac_check_reveal,
    mac_check_verify,
)
from mpc.protocols.opening.run import exchange
from mpc.protocols.parties import I64, Shares, at_parties
from mpc.session import Session

U8 = torch.uint8


def mac_check(session: Session) -> None:
    """Check every opening since the last check (at every party); raises
    :class:`~mpc.errors.MACCheckError` naming the failed check if a party deviated."""
    state = auth_state(session)
    residuals, total = state.pending, state.pending_elements
    state.pending, state.pending_elements = [], 0
    try:
        _run(session, residuals, total)
    except pt.RemoteError as e:
        raise checked_error(e) from e


def _run(session: Session, residuals: list[Shares], total: int) -> None:
    nonce = session.next_nonce()
    seed = session.party_seeds  # (each party's step runs on its seed: its place)
    (commits,) = at_parties(session, mac_check_commit, lambda i: [seed[i], nonce], [((32,), U8)])
    c = exchange(session, commits)
    seeds, frozen = at_parties(
        session,
        mac_check_reveal,
        lambda i: [seed[i], nonce, c[i], [r[i] for r in residuals]],
        [((32,), U8), ((2, total), I64)],
    )
    s = exchange(session, seeds)
    (zc,) = at_parties(
        session, mac_check_combine, lambda i: [seed[i], nonce, s[i], frozen[i]], [((32,), U8)]
    )
    zcs = exchange(session, zc)
    (z,) = at_parties(session, mac_check_open, lambda i: [seed[i], nonce, zcs[i]], [((32,), U8)])
    zs = exchange(session, z)
    (ok,) = at_parties(session, mac_check_verify, lambda i: [seed[i], nonce, zs[i]], [((1,), I64)])
    pt.get_all(ok)


def checked_error(e: pt.RemoteError) -> Exception:
    """A party's failed check as :class:`~mpc.errors.MACCheckError` (naming the party and
    the check); any other remote error as it is."""
    if e.kind == "MACCheckError" or "MAC check failed" in e.remote_message:
        return MACCheckError(f"party {e.worker!r}: {e.remote_message}")
    return e
