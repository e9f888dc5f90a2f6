"""The authenticated FSS comparison, the client's side (the steps and why it is sound:
:mod:`mpc.protocols.auth_fss.steps`): the dealer's keys, each party's mask, one
authenticated opening, each party's evaluation. One round; 2 parties. The selection
(z msb(z): ReLU, the max of two) rides on the same round."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from mpc.config import PIECE_BYTES
from mpc.protocols.auth_fss.steps import (
    auth_fss_eval,
    auth_fss_mask,
    correction_words,
    dealer_auth_fss,
    key_words,
)
from mpc.protocols.auth_local.run import view
from mpc.protocols.auth_opening.run import masked, open_auth
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
    shape = tuple(int(d) for d in z[0].shape[2:])
    n = math.prod(shape)
    per = max(PIECE_BYTES // (8 * key_words(1, select)), 1)
    if n <= per:
        return _pieces(session, [z], [list(shape)], select)[0]
    # keys of more than PIECE_BYTES (a network message is at most 256 MiB by default): in
    # pieces of the flattened value, each with its own keys, all opened in one round
    flat = view(session, z, "view", [[n]], (n,))
    bounds = [(k, min(k + per, n)) for k in range(0, n, per)]
    parts = [view(session, flat, "slice", [0, a, b, 1], (b - a,)) for a, b in bounds]
    outs = _pieces(session, parts, [[b - a] for a, b in bounds], select)
    return [
        view(session, view(session, list(col), "cat", [0], (n,)), "view", [list(shape)], shape)
        for col in zip(*outs)
    ]


def _pieces(
    session: Session, zs: list[Shares], shapes: list[list[int]], select: bool
) -> list[list[Shares]]:
    """Each of ``zs``'s comparison (and selection), their openings in one round."""
    state = auth_state(session)
    seed, macs = session.party_seeds, state.keys
    runs = []
    for z, shape in zip(zs, shapes):
        nonce = session.next_nonce()
        n = math.prod(shape)
        kept = (3, 2, 2, *shape) if select else (2, 2, *shape)
        to_open, (cw,), (u,) = masked(
            session,
            "a comparison",
            dealer_auth_fss,
            [nonce, shape, select],
            [((key_words(n, select),), I64), ((correction_words(n, select),), I64)],
            auth_fss_mask,
            _mask_args(seed, macs, nonce, z, select),
            [((2, *shape), I64), ((2, *shape), I64), (kept, I64)],
        )
        runs.append((nonce, shape, cw, u, to_open))
    opened = open_auth(session, [run[4] for run in runs])
    out = []
    for (nonce, shape, cw, u, _), c in zip(runs, opened):
        keys = [cw.copy_to(p, lend=True) for p in session.parties]  # (read only)
        args = _eval_args(seed, macs, nonce, keys, u, c, select)
        out.append(
            at_parties(session, auth_fss_eval, args, [((2, 2, *shape), I64)] * (2 if select else 1))
        )
    return out


def _mask_args(
    seed: list[Any], macs: Shares, nonce: int, z: Shares, select: bool
) -> Callable[[int, Any], list[Any]]:
    return lambda i, corr: [seed[i], macs[i], nonce, i == 0, z[i], corr, select]


def _eval_args(
    seed: list[Any], macs: Shares, nonce: int, keys: list[Any], u: Shares, c: Shares, select: bool
) -> Callable[[int], list[Any]]:
    return lambda i: [seed[i], macs[i], nonce, i == 0, keys[i], u[i], c[i], select]
