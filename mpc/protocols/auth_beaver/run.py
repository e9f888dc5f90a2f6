"""An authenticated Beaver product, the client's side (the steps and the protocol:
:mod:`mpc.protocols.auth_beaver.steps`): the dealer's authenticated triple, each party's
masking, one authenticated opening of [e | f], each party's combination."""

from __future__ import annotations

from typing import Any

from mpc.protocols.auth_beaver.steps import (
    auth_beaver_combine,
    auth_beaver_mask,
    correction_words,
    dealer_auth_triple,
)
from mpc.protocols.auth_opening.run import open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.parties import I64, Shares, at_parties, call
from mpc.protocols.step import name_of
from mpc.session import Session


def auth_beaver(
    session: Session,
    x: Shares,
    y: Shares,
    op: str,
    params: dict[str, Any],
    out_shape: tuple[int, ...],
) -> Shares:
    """[op(x, y)] for a bilinear ``op`` (mul, matmul, conv2d) on authenticated shares:
    one round (the opening of [e | f], 128 bits an element of each)."""
    state = auth_state(session)
    dealer = session.require_dealer(f"{op} of two secret values")
    nonce = session.next_nonce()
    a_shape, b_shape = [int(d) for d in x[0].shape[2:]], [int(d) for d in y[0].shape[2:]]
    c_shape = [int(d) for d in out_shape]
    (corr,) = call(
        dealer,
        name_of(dealer_auth_triple),
        [session.dealer_seeds, state.alpha, nonce, a_shape, b_shape, op, params],
        [((correction_words(a_shape, b_shape, c_shape),), I64)],
    )
    last = session.n - 1
    corr_last = corr.move(session.parties[last])
    seed = session.party_seeds
    n_ef = _numel(a_shape) + _numel(b_shape)
    piece, mac, a, c = at_parties(
        session,
        auth_beaver_mask,
        lambda i: [seed[i], nonce, x[i], y[i], c_shape, corr_last if i == last else None],
        [((2, n_ef), I64), ((2, n_ef), I64), ((2, 2, *a_shape), I64), ((2, 2, *c_shape), I64)],
    )
    (ef,) = open_auth(session, [(piece, mac)])
    (z,) = at_parties(
        session,
        auth_beaver_combine,
        lambda i: [nonce, y[i], a[i], c[i], ef[i], op, params],
        [((2, 2, *c_shape), I64)],
    )
    return z


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
