"""The comparison's carry tree on packed words (pure bit math, one share)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc import bits

I64 = st.integers(-(2**63), 2**63 - 1)


def _carry_tree(c: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    g, p = c & y, c ^ y
    g ^= p & 1  # carry-in 1
    g &= 0x7FFFFFFFFFFFFFFF
    p = (p & 0x7FFFFFFFFFFFFFFF) | -(1 << 63)
    n = c.numel()
    pad = bits.padded(n) - n
    g = torch.cat([g, g.new_zeros(pad)])
    p = torch.cat([p, p.new_zeros(pad)])
    for level in range(bits.LEVELS):
        last = level == bits.LEVELS - 1
        x, yy = bits.level_operands(g, p, last)
        g, p = bits.level_update(g, x & yy, last)
    return bits.unpack_carries(g, n)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(I64, I64), min_size=1, max_size=200))
def test_carry_into_bit_63_of_c_plus_y_plus_1(pairs):
    c = torch.tensor([a for a, _ in pairs], dtype=torch.int64)
    y = torch.tensor([b for _, b in pairs], dtype=torch.int64)
    s = c + y + 1
    expected = ((s >> 63) ^ (c >> 63) ^ (y >> 63)) & 1
    assert torch.equal(_carry_tree(c, y), expected)


@settings(max_examples=30, deadline=None)
@given(st.lists(I64, min_size=1, max_size=64))
def test_compact_even_gathers_even_bits(values):
    x = torch.tensor(values, dtype=torch.int64)
    out = bits.compact_even(x.clone())
    for v, o in zip(values, out.tolist()):
        u = v & (2**64 - 1)
        expected = sum(((u >> (2 * i)) & 1) << i for i in range(32))
        assert o == expected


def test_element_order_is_a_permutation():
    for n_pad in (32, 64, 96, 320):
        order = bits.element_order(n_pad)
        assert sorted(order.reshape(-1).tolist()) == list(range(n_pad))
