"""The comparison's carry tree on packed words (pure bit math, one share)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc.math import bits

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
        x, yy = bits.level_operands(g, p, level)
        g, p = bits.level_update(g, x & yy, level)
    return bits.unpack_carries(g, n)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(I64, I64), min_size=1, max_size=200))
def test_carry_into_bit_63_of_c_plus_y_plus_1(pairs):
    c = torch.tensor([a for a, _ in pairs], dtype=torch.int64)
    y = torch.tensor([b for _, b in pairs], dtype=torch.int64)
    s = c + y + 1
    expected = ((s >> 63) ^ (c >> 63) ^ (y >> 63)) & 1
    assert torch.equal(_carry_tree(c, y), expected)


def test_element_order_is_a_permutation():
    for n_pad in (32, 64, 96, 320):
        order = bits.element_order(n_pad)
        assert sorted(order.reshape(-1).tolist()) == list(range(n_pad))


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, bits.LEVELS - 1))
def test_level_steps_are_linear_over_xor_shares(seed, level):
    """Every local step must commute with XOR sharing, garbage bits in shares included."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randint(-(2**63), 2**63 - 1, shape, generator=g, dtype=torch.int64)

    words = 64 >> level if level < bits.LEVELS - 1 else 2
    gg, pp, g0, p0 = rnd(words), rnd(words), rnd(words), rnd(words)
    g1, p1 = gg ^ g0, pp ^ p0
    x, y = bits.level_operands(gg, pp, level)
    x0, y0 = bits.level_operands(g0, p0, level)
    x1, y1 = bits.level_operands(g1, p1, level)
    assert torch.equal(x0 ^ x1, x) and torch.equal(y0 ^ y1, y)
    z = x & y
    z0 = rnd(*z.shape)
    new = bits.level_update(gg, z, level)
    new0 = bits.level_update(g0, z0, level)
    new1 = bits.level_update(g1, z ^ z0, level)
    for a, b, c in zip(new, new0, new1):
        if a is not None:
            assert torch.equal(b ^ c, a)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(I64, I64), min_size=1, max_size=200),
    st.integers(1, 4),
    st.integers(0, 2**32 - 1),
)
def test_local_first_level_on_xor_shares(pairs, n_parties, seed):
    """The first level computed locally from the dealer's pair products, on random XOR
    shares of ~r and of the packed products (garbage odd bits included), gives the carry
    into bit 63 of c + ~r + 1 once the other levels run: msb(c - r) exactly."""
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randint(-(2**63), 2**63 - 1, shape, generator=gen, dtype=torch.int64)

    c = torch.tensor([a for a, _ in pairs], dtype=torch.int64)
    r = torch.tensor([b for _, b in pairs], dtype=torch.int64)
    n = c.numel()
    words = bits.padded(n)
    q = bits.pair_products(torch.cat([~r, torch.zeros(words - n, dtype=torch.int64)]))
    packed = bits.pack_pairs(q)
    # XOR shares: party 0 holds r's bits complemented (as cmp_init does), the others random
    r_shares = [rnd(n) for _ in range(n_parties - 1)]
    q_shares = [rnd(words // 2) for _ in range(n_parties - 1)]
    r0, q0 = r, packed
    for s in r_shares:
        r0 = r0 ^ s
    for s in q_shares:
        q0 = q0 ^ s
    shares = [(~r0, q0)] + list(zip(r_shares, q_shares))
    cw = torch.cat([c, torch.zeros(words - n, dtype=torch.int64)])
    g = p = None
    for i, (y, qp) in enumerate(shares):
        yw = torch.cat([y, torch.zeros(words - n, dtype=torch.int64)])
        gi, pi = bits.local_first_level(cw, yw, bits.unpack_pairs(qp), i == 0)
        g, p = (gi, pi) if g is None else (g ^ gi, p ^ pi)
    for level in range(1, bits.LEVELS):
        x, yy = bits.level_operands(g, p, level)
        g, p = bits.level_update(g, x & yy, level)
    carry = bits.unpack_carries(g, n)
    msb = (((c - r) >> 63) & 1).to(torch.int64)
    assert torch.equal(carry ^ ((c >> 63) & 1) ^ (((~r) >> 63) & 1), msb)
