"""A Beaver product, the client's side: the dealer's triple, each party's masking, one
opening, each party's combination (the steps: :mod:`mpc.protocols.beaver.steps`)."""

from __future__ import annotations

import math
from typing import Any

from mpc.protocols.beaver.steps import beaver_combine, beaver_mask, dealer_triple
from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.session import Session


class BeaverRun:
    """A Beaver product split in phases so its opening can share a round with others."""

    def __init__(
        self,
        session: Session,
        x: Shares,
        y: Shares,
        op: str,
        params: dict[str, Any],
        out_shape: tuple[int, ...],
    ) -> None:
        self.session, self.op, self.params, self.out_shape = session, op, params, out_shape
        self.y = y
        self.nonce = nonce = session.next_nonce()
        x_shape, y_shape = list(x[0].shape), list(y[0].shape)
        seed = session.party_seeds
        # offline: the dealer's correction c to the last party
        (self.c_last,) = deal(
            session,
            f"{op} of two secret values",
            dealer_triple,
            [nonce, x_shape, y_shape, op, params],
            out=[(out_shape, I64)],
        )
        # [e | f] = [x] - [a] | [y] - [b] packed flat (opened as one value), and [a]
        self.ef, self.a = at_parties(
            session,
            beaver_mask,
            lambda i: [seed[i], nonce, x[i], y[i]],
            out=[((math.prod(x_shape) + math.prod(y_shape),), I64), (x_shape, I64)],
        )

    def open_in(self, round: Round) -> Opened:
        """Schedule the opening of e and f (one packed value) in ``round``."""
        return round.add(self.ef)

    def finish_opened(self, opened: Opened) -> Shares:
        return self.finish(opened.value)

    def finish(self, ef: Shares) -> Shares:
        """[z] = [c] + op(e, [y]) + op([a], f), from the opened [e | f]."""
        seed, nonce, y, a = self.session.party_seeds, self.nonce, self.y, self.a
        c = last_only(self.session, self.c_last)
        (z,) = at_parties(
            self.session,
            beaver_combine,
            lambda i: [seed[i], nonce, c(i), y[i], a[i], ef[i], self.op, self.params],
            out=[(self.out_shape, I64)],
        )
        self.ef, self.a, self.y = [], [], []
        return z


def beaver(
    session: Session,
    x: Shares,
    y: Shares,
    op: str,
    params: dict[str, Any],
    out_shape: tuple[int, ...],
) -> Shares:
    """[op(x, y)] for a bilinear ``op`` (mul, matmul, conv2d) with a Beaver triple.

    Offline: the dealer expands every party's seed to a = sum a_i, b = sum b_i, computes
    c = op(a, b) and ships c_{n-1} = c - sum_{i<n-1} c_i to the last party only.
    Online (one round): open e = x - a and f = y - b together; then
    [z] = [c] + op(e, [y]) + op([a], f), which sums to op(a + e, b + f).
    Beaver, "Efficient multiparty protocols using circuit randomization", CRYPTO 1991.
    """
    run = BeaverRun(session, x, y, op, params, out_shape)
    one = Round(session)
    opened = run.open_in(one)
    one.open()
    return run.finish_opened(opened)


__all__ = ["BeaverRun", "beaver"]
