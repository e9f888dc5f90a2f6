"""Truncation with known MSB, the client's side: the dealer's correction, each party's
mask, one opening, each party's finish (the steps: :mod:`mpc.protocols.truncation.steps`).

Notation: [x] is an additive sharing, x = sum_i x_i mod 2^64, party i holding x_i.
"""

from __future__ import annotations

import math

from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only
from mpc.protocols.truncation.steps import (
    dealer_trunc,
    trunc_correction_words,
    trunc_finish,
    trunc_mask,
)
from mpc.session import Session


class TruncRun:
    """Truncation with known MSB, split in phases (see :func:`truncate`)."""

    def __init__(self, session: Session, z: Shares, bits: int) -> None:
        self.session, self.bits = session, bits
        self.nonce = nonce = session.next_nonce()
        self.shape = shape = list(z[0].shape)
        seed = session.party_seeds
        # offline: the last party's [U] (int64) and its share of s, [D] = 2^(64-bits) [s]
        # (``bits`` bits, in the narrowest dtype that holds them: int16 at 16 bits)
        (self.corr,) = deal(
            session,
            "truncation of a fixed-point product",
            dealer_trunc,
            [nonce, shape, bits],
            out=[([trunc_correction_words(math.prod(shape), bits)], I64)],
        )
        # [c] = [z] + [r]
        (self.masked,) = at_parties(
            session, trunc_mask, lambda i: [seed[i], nonce, z[i]], [(shape, I64)]
        )

    def open_in(self, round: Round) -> Opened:
        return round.add(self.masked)

    def finish(self, c: Shares) -> Shares:
        """[z >> bits] = [U] + ([D] & (c >> 63)) (+ c >> bits at party 0)."""
        seed, nonce, bits = self.session.party_seeds, self.nonce, self.bits
        corr = last_only(self.session, self.corr)
        (out,) = at_parties(
            self.session,
            trunc_finish,
            lambda i: [seed[i], nonce, i == 0, corr(i), c[i], bits],
            [(self.shape, I64)],
        )
        return out


def truncate(session: Session, z: Shares, bits: int) -> Shares:
    """[z >> bits] for |z| < 2^62, exact up to one unit in the last place, any n.

    Dealer: r uniform, shared; with r' = r - 2^62 and h = msb(r') it deals
    [U] = [-(r' >> bits) - 2^(62-bits)] and [D] = [2^(64-bits) (1 - h)], D shared as
    2^(64-bits) [s] with s = 1 - h in Z/2^bits, so the last party's correction for it is
    ``bits`` bits (2 bytes an element at 16 bits, not 8; see ``dealer_trunc``). Parties open
    c = z + r = (z + 2^62) + r' (one round). With b = msb(c) xor h, the carry out of the
    low 63 bits, z + 2^62 = (c mod 2^63) - (r' mod 2^63) + 2^63 b; given the public msb(c)
    this is linear in h: each party keeps [U] + [D] where msb(c) = 1 and [U] elsewhere,
    and party 0 adds c >> bits (three local passes). Rounding error: the result is
    floor(z / 2^bits) or one more; there is no wrap-around failure (unlike local
    truncation), because the mask's top bit is known in shared form ("truncation with
    known MSB", cf. Escudero et al., CRYPTO 2020; Dalskov et al., PoPETs 2020).
    """
    if bits == 0:
        return z
    run = TruncRun(session, z, bits)
    one = Round(session)
    c = run.open_in(one)
    one.open()
    return run.finish(c.value)


def truncate_together(session: Session, values: list[tuple[Shares, int]]) -> list[Shares]:
    """[z >> bits] for each (z, bits) of ``values``, all opened in one round (``bits`` 0:
    z itself)."""
    runs = [(z, TruncRun(session, z, bits) if bits else None) for z, bits in values]
    one = Round(session)
    opened = [run.open_in(one) if run is not None else None for _, run in runs]
    if any(o is not None for o in opened):
        one.open()
    return [
        run.finish(o.value) if run is not None and o is not None else z
        for (z, run), o in zip(runs, opened)
    ]


__all__ = ["TruncRun", "truncate", "truncate_together"]
