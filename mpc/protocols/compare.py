"""Comparison: the most significant bit of a shared ring element, for any number of parties.

msb([x]) with a dealer (8 rounds):
1. Dealer: r uniform, shared additively [r] and bitwise <r> (XOR shares of the 64-bit
   word), and a random bit t shared both ways (a daBit).
2. Open c = x + r (round 1). Then x = c - r = c + ~r + 1 over 64 bits, so
   msb(x) = msb(c) ^ msb(~r) ^ carry_63, where carry_63 is the carry into bit 63.
3. Generate g = c & ~r and propagate p = c ^ ~r are local XOR shares (c is public);
   a binary tree of (G, P) group combinations gives the carry into bit 63 in
   log2(64) = 6 levels, each one round of binary Beaver ANDs (rounds 2-7). After each
   level the surviving bits are compacted and two words packed into one
   (:mod:`mpc.bits`), so the levels AND n, n/2, n/4, ... words: about 4 words per
   element in all.
4. Convert the XOR-shared bit to an arithmetic one with the daBit: open d = msb(x) ^ t
   (round 8), [msb(x)] = d + (1 - 2d)[t].
Correct whenever x is in the signed range (-2^63, 2^63): x < y is msb(x - y).
Cf. CrypTen's A2B + carry-lookahead comparison; Damgard et al. TCC 2006 for daBits.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import bits
from ..material import TAG_T_ARITH
from ..session import Session
from .arith import I64, BeaverRun, Shares, TruncRun, call, deal, open_among


def msb(session: Session, x: Shares) -> Shares:
    """[msb(x)] as arithmetic shares of 0/1 (1 where x is negative). 8 rounds."""
    run = _MsbRun(session, x, [])
    return run.finish_bit()


def select_by_msb(
    session: Session, x: Shares, values: list[Shares], complement: bool = False
) -> list[Shares]:
    """[v * msb(x)] for each v (``complement``: [v * (1 - msb(x))]), in 8 rounds.

    The products ride on the daBit: with d = msb(x) ^ t opened in the last round,
    msb(x) = d + (1 - 2d) t, so v * msb(x) = d v + (1 - 2d) [v t]; the Beaver product
    [v t] is opened in round 1, together with c. ReLU is x * (1 - msb(x)), the max of a
    and b is b + (a - b) msb(b - a): both cost exactly one comparison's rounds.
    """
    run = _MsbRun(session, x, values)
    return run.finish_select(complement)


def relu_truncating(session: Session, z: Shares, bits: int) -> Shares:
    """[relu(z >> bits)] in 8 rounds, for a product z not yet truncated.

    The comparison runs on z itself (same sign as z >> bits, up to the one-unit rounding
    of the truncation); the truncation's opening shares the comparison's first round and
    the product (z >> bits) * t opens with the first carry-tree level. This saves the
    round a separate truncation would cost before every ReLU of a linear layer.
    """
    trunc = TruncRun(session, z, bits)
    run = _MsbRun(
        session,
        z,
        [],
        extra_open=[trunc.masked],
        late_values=lambda opened: [trunc.finish(opened[0])],
    )
    return run.finish_select(complement=True)[0]


class _MsbRun:
    def __init__(
        self,
        session: Session,
        x: Shares,
        values: list[Shares],
        extra_open: list[Shares] | None = None,
        late_values: Callable[[list[Shares]], list[Shares]] | None = None,
    ) -> None:
        self.session = session
        parties, n = session.parties, session.n
        last = n - 1
        shape = list(x[0].shape)
        self.shape = shape
        self.nonce = nonce = session.next_nonce()
        r_bits_last, self.t_arith_last, t_bin_last = deal(
            session,
            "comparison of secret values",
            "mpc.dealer_compare",
            [nonce, shape],
            out=[(shape, I64)] * 3,
        )
        self.values = list(values)
        beavers = []
        t_shares: Shares = []
        if values or late_values is not None:
            t_shares = [
                call(
                    p,
                    "mpc.derive",
                    [session.party_seeds[i], nonce, TAG_T_ARITH, shape],
                    [(shape, I64)],
                )[0]
                if i != last
                else self.t_arith_last
                for i, p in enumerate(parties)
            ]
            for v in values:
                vshape = tuple(v[0].shape)
                if vshape != tuple(shape):
                    raise ValueError(f"select_by_msb: value shape {vshape} != {tuple(shape)}")
                beavers.append(BeaverRun(session, v, t_shares, "mul", {}, vshape))
        masked = [
            call(p, "mpc.cmp_mask", [session.party_seeds[i], nonce, x[i]], [(shape, I64)])[0]
            for i, p in enumerate(parties)
        ]
        extra = extra_open or []
        to_open = [masked, *extra]
        for b in beavers:
            to_open += b.to_open()
        opened = open_among(session, to_open)
        c = opened[0]
        base = 1 + len(extra)
        self.vt = [
            b.finish(opened[base + 2 * k], opened[base + 1 + 2 * k]) for k, b in enumerate(beavers)
        ]
        late: list[BeaverRun] = []
        if late_values is not None:
            for v in late_values(opened[1:base]):
                self.values.append(v)
                late.append(BeaverRun(session, v, t_shares, "mul", {}, tuple(v[0].shape)))
        flat = [bits.padded(_numel(shape))]
        state = [
            call(
                p,
                "mpc.cmp_init",
                [session.party_seeds[i], nonce, i == 0, r_bits_last if i == last else None, c[i]],
                [(flat, I64), (flat, I64), (shape, I64)],
            )
            for i, p in enumerate(parties)
        ]
        g = [s[0] for s in state]
        pr = [s[1] for s in state]
        top = [s[2] for s in state]
        words = bits.padded(_numel(shape))
        for k in range(bits.LEVELS):
            piggyback = [o for b in late for o in b.to_open()] if k == 0 else []
            g, pr, got = _carry_level(session, g, pr, k, words, piggyback)
            words //= 1 if k == bits.LEVELS - 1 else 2
            if k == 0:
                self.vt += [b.finish(got[2 * j], got[2 * j + 1]) for j, b in enumerate(late)]
        d = [
            call(
                p,
                "mpc.cmp_bit_mask",
                [session.party_seeds[i], nonce, t_bin_last if i == last else None, g[i], top[i]],
                [(shape, I64)],
            )[0]
            for i, p in enumerate(parties)
        ]
        (self.d,) = open_among(session, [d], xor=True)

    def finish_bit(self) -> Shares:
        s = self.session
        last = s.n - 1
        return [
            call(
                p,
                "mpc.cmp_bit_finish",
                [
                    s.party_seeds[i],
                    self.nonce,
                    i == 0,
                    self.t_arith_last if i == last else None,
                    self.d[i],
                ],
                [(self.shape, I64)],
            )[0]
            for i, p in enumerate(s.parties)
        ]

    def finish_select(self, complement: bool) -> list[Shares]:
        s = self.session
        return [
            [
                call(
                    p,
                    "mpc.cmp_select_finish",
                    [complement, self.d[i], v[i], vt[i]],
                    [(self.shape, I64)],
                )[0]
                for i, p in enumerate(s.parties)
            ]
            for v, vt in zip(self.values, self.vt)
        ]


def _carry_level(
    session: Session,
    g: Shares,
    pr: Shares,
    level: int,
    words: int,
    piggyback: list[Shares],
) -> tuple[Shares, Shares, list[Shares]]:
    """One level of the carry tree (one round) on ``words`` packed words per party;
    ``piggyback`` values are opened (arithmetically) in the same round and returned."""
    parties = session.parties
    n_last = session.n - 1
    last = level == bits.LEVELS - 1
    nonce = session.next_nonce()
    and_shape = [words] if last else [2, words]
    (c_last,) = deal(
        session, "comparison", "mpc.dealer_and_triple", [nonce, and_shape], [(and_shape, I64)]
    )
    masks = [
        call(
            p,
            "mpc.carry_mask",
            [session.party_seeds[i], nonce, g[i], pr[i], level],
            [(and_shape, I64)] * 4,
        )
        for i, p in enumerate(parties)
    ]
    e, f = open_among(session, [[m[0] for m in masks], [m[1] for m in masks]], xor=True)
    got = open_among(session, piggyback, count=False) if piggyback else []
    out_words = words if last else words // 2
    outs = [
        call(
            p,
            "mpc.carry_combine",
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
                level,
            ],
            [([out_words], I64)] * (1 if last else 2),
        )
        for i, p in enumerate(parties)
    ]
    if last:
        return [o[0] for o in outs], pr, got
    return [o[0] for o in outs], [o[1] for o in outs], got


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
