"""Truncate values and multiply the results in the same round (the steps: :mod:`mpc.protocols.truncated_products.steps`).

A truncation opens c = z + r, after which each party's share of x = z >> f is the public
c >> f plus a mask the dealer knows up to the public msb(c); products of such values then
need no Beaver opening of their own (:mod:`mpc.protocols.truncated_products.steps`). So "truncate, then
multiply the truncated values" costs one round instead of two, at the price of three
dealt words per product element instead of one (U U, D U and U D for a Beaver triple's c).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mpc.protocols.approx import Fx
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, at_parties, deal
from mpc.protocols.truncated_products.steps import (
    dealer_trunc_products,
    material_words,
    out_shape,
    plain_mask,
    trunc_products,
)
from mpc.protocols.truncation.run import TruncRun


def truncate_and_multiply(
    values: Sequence[Fx],
    scales: Sequence[int],
    offsets: Sequence[float],
    pairs: Sequence[tuple[int, int]],
    plain: Fx | None = None,
    plain_pairs: Sequence[int] = (),
) -> tuple[list[Fx], list[Fx]]:
    """([x_k], [x_i x_j]): each value truncated to its scale (each must lose bits) plus
    the public ``offsets[k]`` (at that scale), and the untruncated product of each pair of
    those results (index pairs into ``values``, broadcast, at the sum of their scales), all
    in one round. With ``plain`` (a shared value with nothing pending) the products
    x_k y for k in ``plain_pairs`` follow the pairs' (broadcast, at the sum of the
    scales), in the same round: y's masked opening travels with the truncations'."""
    session = values[0].session
    if any(v.scale <= s for v, s in zip(values, scales)):
        raise ValueError("internal: every value of the batch loses bits")
    runs = [TruncRun(session, v.shares, v.scale - s) for v, s in zip(values, scales)]
    nonce = session.next_nonce()
    shapes = [list(r.shape) for r in runs]
    bits = [r.bits for r in runs]
    tn = [r.nonce for r in runs]
    pair_list = [[int(i), int(j)] for i, j in pairs]
    seed, last = session.party_seeds, session.n - 1
    plain_list = [int(k) for k in plain_pairs] if plain is not None else None
    plain_shape = list(plain.shape) if plain is not None else None
    words = material_words(shapes, bits, pair_list, plain_shape, plain_list)
    (products,) = deal(
        session,
        "products of truncated values",
        dealer_trunc_products,
        [nonce, tn, shapes, bits, pair_list, plain_shape, plain_list],
        out=[([words], I64)],
    )
    one = Round(session)
    opened = [r.open_in(one) for r in runs]
    e: list[Any] = [None] * session.n
    b: list[Any] = [None] * session.n
    if plain is not None:
        assert plain_shape is not None
        e_shares, b = at_parties(
            session,
            plain_mask,
            lambda i: [seed[i], nonce, plain.shares[i]],
            [(tuple(plain_shape), I64), (tuple(plain_shape), I64)],
        )
        e_opened = one.add(e_shares)
    one.open()
    if plain is not None:
        e = list(e_opened.value)
    enc = [int(round(o * 2**s)) for o, s in zip(offsets, scales)]
    metas = [(tuple(s), I64) for s in shapes]
    metas += [(tuple(out_shape(shapes[i], shapes[j])), I64) for i, j in pair_list]
    if plain_shape is not None:
        metas += [(tuple(out_shape(shapes[k], plain_shape)), I64) for k in plain_list or []]
    outs = at_parties(
        session,
        trunc_products,
        lambda i: [
            seed[i],
            nonce,
            i == 0,
            [r.corr for r in runs] if i == last else None,
            products if i == last else None,
            [o.value[i] for o in opened],
            tn,
            bits,
            enc,
            pair_list,
            e[i],
            b[i],
            plain_list,
        ],  # fmt: skip
        out=metas,
    )
    k = len(runs)
    xs = [Fx(session, outs[m], s) for m, s in enumerate(scales)]
    prods = [Fx(session, outs[k + m], scales[i] + scales[j]) for m, (i, j) in enumerate(pair_list)]
    if plain is not None:
        at = k + len(pair_list)
        prods += [
            Fx(session, outs[at + m], scales[i] + plain.scale)
            for m, i in enumerate(plain_list or [])
        ]
    return xs, prods
