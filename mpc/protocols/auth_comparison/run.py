"""An authenticated comparison with zero, the client's side (the steps and the protocol:
:mod:`mpc.protocols.auth_comparison.steps`): the dealer's bits, each party's mask, one
authenticated opening, each party's leaves, then the borrow tree (one authenticated
product a level, 6 levels for 62 leaves) and the last bit's xor (one product): 8 rounds."""

from __future__ import annotations

import math

import torch

from mpc.protocols.auth_beaver.run import auth_beaver
from mpc.protocols.auth_comparison.steps import (
    LEAVES,
    auth_cmp_leaves,
    auth_cmp_mask,
    correction_words,
    dealer_auth_cmp,
)
from mpc.protocols.auth_local.run import linear, view
from mpc.protocols.auth_opening.run import masked, open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.parties import I64, Shares, at_parties
from mpc.session import Session


def auth_ltz(session: Session, z: Shares) -> Shares:
    """Authenticated shares of [z < 0] (0 or 1, an integer) for |z| < 2^62 (z's low 64
    bits read signed): 8 rounds."""
    state = auth_state(session)
    nonce = session.next_nonce()
    shape = [int(d) for d in z[0].shape[2:]]
    seed, keys = session.party_seeds, state.keys
    to_open, _, (bits,) = masked(
        session,
        "a comparison",
        dealer_auth_cmp,
        [nonce, shape],
        [((correction_words(math.prod(shape)),), I64)],
        auth_cmp_mask,
        lambda i, corr: [seed[i], keys[i], nonce, i == 0, z[i], corr],
        [((2, *shape), I64), ((2, *shape), I64), ((2, 2, *shape, LEAVES + 1), I64)],
    )
    (c,) = open_auth(session, [to_open])
    tree, top = at_parties(
        session,
        auth_cmp_leaves,
        lambda i: [seed[i], keys[i], nonce, i == 0, c[i], bits[i]],
        [((2, 2, *shape, 2, LEAVES), I64), ((2, 2, *shape), I64)],
    )
    u = _borrow(session, tree, shape)
    # bit 62 of z + 2^62 is top xor u = top + u - 2 top u; z < 0 when it is 0
    tu = auth_beaver(session, top, u, "mul", {}, tuple(shape))
    return linear(session, [top, u, tu], [-1, -1, 2], torch.ones((), dtype=torch.int64))


def _borrow(session: Session, tree: Shares, shape: list[int]) -> Shares:
    """The root's g of the ``[g | p]`` leaves ``(*shape, 2, m)``: one product a level,
    pairing leaf 2k (low) with 2k + 1 (high); an odd leaf out goes up as it is."""
    m = LEAVES
    while m > 1:
        h = m // 2
        lo = view(session, tree, "slice", [-1, 0, 2 * h, 2], (*shape, 2, h))
        hi = view(session, tree, "slice", [-1, 1, 2 * h, 2], (*shape, 2, h))
        p_hi = view(session, hi, "slice", [-2, 1, 2, 1], (*shape, 1, h))
        prod = auth_beaver(session, p_hi, lo, "mul", {}, (*shape, 2, h))  # [p g' | p p']
        g_hi = view(session, hi, "slice", [-2, 0, 1, 1], (*shape, 1, h))
        g_hi = view(session, g_hi, "pad", [[0, 0, 0, 1]], (*shape, 2, h))  # [g_hi | 0]
        nxt = linear(session, [prod, g_hi], [1, 1])
        if m % 2:
            odd = view(session, tree, "slice", [-1, m - 1, m, 1], (*shape, 2, 1))
            nxt = view(session, [nxt, odd], "cat", [-1], (*shape, 2, h + 1))
        tree, m = nxt, h + m % 2
    g = view(session, tree, "select", [-2, 0], (*shape, 1))
    return view(session, g, "select", [-1, 0], tuple(shape))
