"""The low bits of a shared value, the client's side: the dealer's table, each party's
mask, one opening, each party's lookup (the steps: :mod:`mpc.protocols.low_bits.steps`).
"""

from __future__ import annotations

import math

from mpc.protocols.low_bits.steps import MAX_LOW_BITS, dealer_low_bits, low_finish, low_mask
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.session import Session


def low_bits(session: Session, z: Shares, bits: int) -> Shares:
    """[z mod 2^bits] exactly (an integer in [0, 2^bits)), for any shared z, in one round.

    Dealer: for the mask r (the sum of the parties' derived words) it shares the table
    T[v] = (v - r) mod 2^bits over v in [0, 2^bits), one table an element: 2^bits words an
    element to the last party (the others derive theirs). The parties open c = z + r
    (uniform: it says nothing of z) and each keeps its share of T[c mod 2^bits], which is
    (c - r) mod 2^bits = z mod 2^bits because 2^bits divides 2^64. No carry or wrap-around
    is lost, whatever z, unlike a truncation's low bits (cf. the lookup tables of
    function secret sharing, here dealt whole for a small domain)."""
    if not 1 <= bits <= MAX_LOW_BITS:
        raise ValueError(f"low_bits takes 1 to {MAX_LOW_BITS} bits, got {bits}")
    nonce = session.next_nonce()
    shape = list(z[0].shape)
    seed = session.party_seeds
    (table,) = deal(
        session,
        "low bits of a secret value",
        dealer_low_bits,
        [nonce, shape, bits],
        out=[([math.prod(shape) << bits], I64)],
    )
    (masked,) = at_parties(session, low_mask, lambda i: [seed[i], nonce, z[i]], [(shape, I64)])
    one = Round(session)
    c = one.add(masked)
    one.open()
    mine = last_only(session, table)
    (out,) = at_parties(
        session,
        low_finish,
        lambda i: [seed[i], nonce, mine(i), c.value[i], bits],
        [(shape, I64)],
    )
    return out


__all__ = ["low_bits"]
