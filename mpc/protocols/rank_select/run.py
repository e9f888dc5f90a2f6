"""The selection of the entry of rank 0, the client's side: the dealer's tables, each
party's masks, one opening, each party's lookups (the steps:
:mod:`mpc.protocols.rank_select.steps`)."""

from __future__ import annotations

import math

from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.protocols.rank_select.steps import (
    MAX_RANK_BITS,
    dealer_rank_select,
    rank_finish,
    rank_mask,
)
from mpc.session import Session


def select_rank_zero(
    session: Session, ranks: Shares, x: Shares, bits: int
) -> tuple[Shares, Shares]:
    """([delta], [delta x]) with delta = [rank = 0], for shared ranks in [0, 2^bits) and
    shared ring values x of the same shape, in one round.

    Dealer: for the masks r (of the ranks) and u (of the values), the sums of the parties'
    derived words, it shares per entry the tables D[v] = [(v - r) mod 2^bits = 0] and
    U[v] = u D[v] over v in [0, 2^bits) (2 x 2^bits words an entry to the last party; the
    others derive theirs). The parties open c = rank + r and e = x - u (uniform: they say
    nothing of the ranks or the values) and each keeps D[c mod 2^bits], its share of
    delta (c - r = rank, and rank = 0 exactly when rank = 0 mod 2^bits), and
    e D[c mod 2^bits] + U[c mod 2^bits], its share of (e + u) delta = x delta."""
    if not 1 <= bits <= MAX_RANK_BITS:
        raise ValueError(f"select_rank_zero takes ranks of 1 to {MAX_RANK_BITS} bits, got {bits}")
    nonce = session.next_nonce()
    shape = list(ranks[0].shape)
    seed = session.party_seeds
    (tables,) = deal(
        session,
        "selection of the first maximum",
        dealer_rank_select,
        [nonce, shape, bits],
        out=[([2 * math.prod(shape) << bits], I64)],
    )
    c, e = at_parties(
        session,
        rank_mask,
        lambda i: [seed[i], nonce, ranks[i], x[i]],
        [(shape, I64), (shape, I64)],
    )
    one = Round(session)
    oc, oe = one.add(c), one.add(e)
    one.open()
    mine = last_only(session, tables)
    delta, selected = at_parties(
        session,
        rank_finish,
        lambda i: [seed[i], nonce, mine(i), oc.value[i], oe.value[i], bits],
        [(shape, I64), (shape, I64)],
    )
    return delta, selected


__all__ = ["select_rank_zero"]
