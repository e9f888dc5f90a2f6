"""Comparison: the most significant bit of a shared ring element, for any number of parties.

msb([x]) with a dealer (8 rounds):
1. Dealer: r uniform, shared additively [r] and bitwise <r> (XOR shares of the 64-bit
   word), and a random bit t shared both ways (a daBit).
2. Open c = x + r (round 1). Then x = c - r = c + ~r + 1 over 64 bits, so
   msb(x) = msb(c) ^ msb(~r) ^ carry_63, where carry_63 is the carry into bit 63.
3. Generate g = c & ~r and propagate p = c ^ ~r are local XOR shares (c is public);
   a Kogge-Stone parallel-prefix network over the packed words gives every carry in
   log2(64) = 6 levels, each one round of binary Beaver ANDs (rounds 2-7).
4. Convert the XOR-shared bit to an arithmetic one with the daBit: open d = msb(x) ^ t
   (round 8), [msb(x)] = d + (1 - 2d)[t].
Correct whenever x is in the signed range (-2^63, 2^63): x < y is msb(x - y).
Cf. CrypTen's A2B + carry-lookahead comparison; Damgard et al. TCC 2006 for daBits.
"""

from __future__ import annotations

from ..session import Session
from .arith import I64, Shares, call, open_among

SHIFTS = (1, 2, 4, 8, 16, 32)


def msb(session: Session, x: Shares) -> Shares:
    """[msb(x)] as arithmetic shares of 0/1 (1 where x is negative)."""
    dealer = session.require_dealer("comparison of secret values")
    parties, n = session.parties, session.n
    last = n - 1
    shape = list(x[0].shape)
    nonce = session.next_nonce()
    corr = call(
        dealer,
        "mpc.dealer_compare",
        [session.dealer_seeds, nonce, shape],
        out=[(shape, I64)] * 3,
    )
    r_bits_last, t_arith_last, t_bin_last = (c.move(parties[last]) for c in corr)

    masked = [
        call(p, "mpc.cmp_mask", [session.party_seeds[i], nonce, x[i]], [(shape, I64)])[0]
        for i, p in enumerate(parties)
    ]
    (c,) = open_among(session, [masked])
    state = [
        call(
            p,
            "mpc.cmp_init",
            [session.party_seeds[i], nonce, i == 0, r_bits_last if i == last else None, c[i]],
            [(shape, I64)] * 3,
        )
        for i, p in enumerate(parties)
    ]
    g = [s[0] for s in state]
    pr = [s[1] for s in state]
    top = [s[2] for s in state]
    for shift in SHIFTS:
        is_last = shift == SHIFTS[-1]
        g, pr = _ks_level(session, g, pr, shift, is_last, shape)
    d = [
        call(
            p,
            "mpc.cmp_bit_mask",
            [session.party_seeds[i], nonce, t_bin_last if i == last else None, g[i], top[i]],
            [(shape, I64)],
        )[0]
        for i, p in enumerate(parties)
    ]
    (d_open,) = open_among(session, [d], xor=True)
    return [
        call(
            p,
            "mpc.cmp_bit_finish",
            [session.party_seeds[i], nonce, i == 0, t_arith_last if i == last else None, d_open[i]],
            [(shape, I64)],
        )[0]
        for i, p in enumerate(parties)
    ]


def _ks_level(
    session: Session, g: Shares, pr: Shares, shift: int, last: bool, shape: list[int]
) -> tuple[Shares, Shares]:
    parties = session.parties
    n_last = session.n - 1
    nonce = session.next_nonce()
    and_shape = shape if last else [2, *shape]
    (c_last,) = call(
        session.require_dealer("comparison"),
        "mpc.dealer_and_triple",
        [session.dealer_seeds, nonce, and_shape],
        out=[(and_shape, I64)],
    )
    c_last = c_last.move(parties[n_last])
    masks = [
        call(
            p,
            "mpc.ks_mask",
            [session.party_seeds[i], nonce, g[i], pr[i], shift, last],
            [(and_shape, I64)] * 4,
        )
        for i, p in enumerate(parties)
    ]
    e, f = open_among(session, [[m[0] for m in masks], [m[1] for m in masks]], xor=True)
    outs = [
        call(
            p,
            "mpc.ks_combine",
            [
                session.party_seeds[i],
                nonce,
                i == 0,
                c_last if i == n_last else None,
                masks[i][2],
                masks[i][3],
                e[i],
                f[i],
                g[i],
                last,
            ],
            [(shape, I64)] * (1 if last else 2),
        )
        for i, p in enumerate(parties)
    ]
    if last:
        return [o[0] for o in outs], pr
    return [o[0] for o in outs], [o[1] for o in outs]
