"""The radix-4 carry tree of the comparison (mpc/math/carry_tree.py) on XOR shares, against
plaintext: the carry into bit 63 of c + ~r + 1, for 2 and 3 parties, whatever the values
(edges included) and the shares; the packing and interleaving are linear over XOR and
their element order is a permutation."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc.math import carry_tree as C

I64 = st.integers(-(2**63), 2**63 - 1)
EDGES = st.sampled_from([0, 1, -1, 2**62, -(2**62), 2**63 - 1, -(2**63), 2**31, -(2**31)])


def _random(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, shape, dtype=torch.int64, generator=gen)


def _xor_shares(v: torch.Tensor, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    shares = [_random(gen, tuple(v.shape)) for _ in range(n - 1)]
    last = v.clone()
    for s in shares:
        last ^= s
    return [*shares, last]


def _carry(c: torch.Tensor, r: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """The protocol's steps, with the dealer's monomials and the masks in the clear here."""
    gen = torch.Generator().manual_seed(seed)
    count, n_pad = c.numel(), C.padded(c.numel())
    pad = torch.zeros(n_pad - count, dtype=torch.int64)
    cw, y = torch.cat([c, pad]), torch.cat([~r, pad])
    ys = _xor_shares(y, n, gen)
    mono = [_xor_shares(m, n, gen) for m in C.bit_monomials(y)]
    state = [C.level0(cw, ys[i], [m[i] for m in mono], i == 0) for i in range(n)]
    for level in range(1, C.LEVELS):
        w = C.words(n_pad, level)
        ops = [C.operands(g, p, level) for g, p in state]
        masks = [C.unpack(_random(gen, (2, w)), len(C.VARS), level) for _ in range(n)]
        total = [torch.zeros(w, dtype=torch.int64) for _ in C.VARS]
        for m in masks:
            total = [t ^ a for t, a in zip(total, m)]
        prods = [_xor_shares(m, n, gen) for m in C.mask_monomials(total)]
        e = None
        for i in range(n):
            packed = C.pack([x ^ a for x, a in zip(ops[i], masks[i])], level)
            e = packed if e is None else e ^ packed
        assert e is not None
        opened = C.unpack(e, len(C.VARS), level)
        state = [
            C.combine(state[i][0], masks[i], opened, [p[i] for p in prods], level, i == 0)
            for i in range(n)
        ]
    g = state[0][0]
    for s in state[1:]:
        g = g ^ s[0]
    return C.unpack_carries(g, count)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(I64, EDGES), st.one_of(I64, EDGES)), min_size=1, max_size=70),
    st.sampled_from([2, 3]),
    st.integers(0, 2**32 - 1),
)
def test_the_carry_into_bit_63_on_xor_shares(pairs, n_parties, seed):
    c = torch.tensor([a for a, _ in pairs], dtype=torch.int64)
    r = torch.tensor([b for _, b in pairs], dtype=torch.int64)
    low = (1 << 63) - 1
    want = (((c & low) + ((~r) & low) + 1) >> 63) & 1  # < 2^64: no wrap past bit 63
    assert torch.equal(_carry(c, r, n_parties, seed), want)


def test_the_element_order_is_a_permutation():
    for n_pad in (32, 64, 4096):
        order = C.element_of(n_pad).reshape(-1)
        assert torch.equal(order.sort().values, torch.arange(n_pad))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, C.LEVELS - 1))
def test_pack_and_interleave_are_linear_over_xor(seed, level):
    gen = torch.Generator().manual_seed(seed)
    w = 16
    level = max(level, 1)  # (level 0 works on bit planes: nothing is packed)
    a = C.unpack(_random(gen, (3, w)), 11, level)
    b = C.unpack(_random(gen, (3, w)), 11, level)
    assert torch.equal(
        C.pack([x ^ y for x, y in zip(a, b)], level), C.pack(a, level) ^ C.pack(b, level)
    )
    assert torch.equal(C.unpack(C.pack(a, level), 11, level)[5], a[5])
    x, y = _random(gen, (4 * w,)), _random(gen, (4 * w,))
    assert torch.equal(C.interleave(x ^ y, level), C.interleave(x, level) ^ C.interleave(y, level))
