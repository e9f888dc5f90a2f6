"""Arithmetic protocols over additive shares in Z/2^64.

Notation: [x] is an additive sharing, x = sum_i x_i mod 2^64, party i holding x_i.
"""

from __future__ import annotations

from typing import Any

import torch

import pointers as pt

from .. import accounting
from ..session import Session

Shares = list[pt.PointerTensor]
I64 = torch.int64


def call(worker: Any, name: str, args: list[Any], out: list[tuple[Any, torch.dtype]]) -> Shares:
    return pt.call_function(worker, name, args, out=out)  # type: ignore[return-value]


def open_among(session: Session, values: list[Shares], xor: bool = False) -> list[Shares]:
    """Open each [v] among the parties in one round: party i sends v_i to every other
    party, then each party sums (``xor``: XORs) what it holds. Returns, per value, a
    pointer to the opened value at each party. The client never sees an opened value."""
    accounting.count_round()
    opened: list[Shares] = []
    parties = session.parties
    for shares in values:
        received: list[list[pt.PointerTensor]] = [[] for _ in parties]
        for i, s in enumerate(shares):
            for j, pj in enumerate(parties):
                if i != j:
                    received[j].append(s.copy_to(pj))
        out = []
        for j in range(len(parties)):
            acc = shares[j]
            for r in received[j]:
                acc = acc ^ r if xor else acc + r
            out.append(acc)
        opened.append(out)
    return opened


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
    [z] = [c] + op(e, [b]) + op([a], f) + op(e, f) (the last term at party 0).
    Beaver, "Efficient multiparty protocols using circuit randomization", CRYPTO 1991.
    """
    dealer = session.require_dealer(f"{op} of two secret values")
    nonce = session.next_nonce()
    x_shape, y_shape = list(x[0].shape), list(y[0].shape)
    (c_last,) = call(
        dealer,
        "mpc.dealer_triple",
        [session.dealer_seeds, nonce, x_shape, y_shape, op, params],
        out=[(out_shape, I64)],
    )
    c_last = c_last.move(session.parties[-1])
    masks = [
        call(
            p,
            "mpc.beaver_mask",
            [session.party_seeds[i], nonce, x[i], y[i]],
            out=[(x_shape, I64), (y_shape, I64), (x_shape, I64), (y_shape, I64)],
        )
        for i, p in enumerate(session.parties)
    ]
    e, f = open_among(session, [[m[0] for m in masks], [m[1] for m in masks]])
    last = session.n - 1
    z = []
    for i, p in enumerate(session.parties):
        (zi,) = call(
            p,
            "mpc.beaver_combine",
            [
                session.party_seeds[i],
                nonce,
                i == 0,
                c_last if i == last else None,
                masks[i][2],
                masks[i][3],
                e[i],
                f[i],
                op,
                params,
            ],
            out=[(out_shape, I64)],
        )
        z.append(zi)
    return z


def truncate(session: Session, z: Shares, bits: int) -> Shares:
    """[z >> bits] for |z| < 2^62, exact up to one unit in the last place, any n.

    Dealer: r uniform, with [r], [msb(r)] and [(r mod 2^63) >> bits]. Parties open
    c = z + 2^62 + r (one round). With b = msb(c) xor msb(r), the carry out of the low
    63 bits, z + 2^62 = (c mod 2^63) - (r mod 2^63) + 2^63 b, which is linear in the
    shared bits given public c. Rounding error: the result is floor(z / 2^bits) or one
    less; there is no wrap-around failure (unlike local truncation), because the mask's
    top bit is known in shared form ("truncation with known MSB", cf. Escudero et al.,
    CRYPTO 2020; Dalskov et al., PoPETs 2020).
    """
    if bits == 0:
        return z
    dealer = session.require_dealer("truncation of a fixed-point product")
    nonce = session.next_nonce()
    shape = list(z[0].shape)
    corr = call(
        dealer,
        "mpc.dealer_trunc",
        [session.dealer_seeds, nonce, shape, bits],
        out=[(shape, I64), (shape, I64)],
    )
    last_party = session.parties[-1]
    corr = [c.move(last_party) for c in corr]
    masked = [
        call(p, "mpc.trunc_mask", [session.party_seeds[i], nonce, i == 0, z[i]], [(shape, I64)])[0]
        for i, p in enumerate(session.parties)
    ]
    (c,) = open_among(session, [masked])
    last = session.n - 1
    return [
        call(
            p,
            "mpc.trunc_finish",
            [session.party_seeds[i], nonce, i == 0, corr if i == last else None, c[i], bits],
            [(shape, I64)],
        )[0]
        for i, p in enumerate(session.parties)
    ]
