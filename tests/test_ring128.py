"""The ring Z/2^128 on int64 limb pairs (mpc.math.ring128) against Python integers:
sums, products, matrix products and convolutions, exact mod 2^128, edge words included."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc.math import ring128 as r128

M128 = 1 << 128
EDGES = [0, 1, 2, (1 << 64) - 1, 1 << 63, (1 << 64) + 1, M128 - 1, (1 << 127), (1 << 22) - 1]
ELEMENT = st.one_of(st.sampled_from(EDGES), st.integers(0, M128 - 1))


def _tensor(values: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    pairs = [r128.from_int(v) for v in values]
    lo = torch.tensor([p[0] for p in pairs], dtype=torch.int64).view(shape)
    hi = torch.tensor([p[1] for p in pairs], dtype=torch.int64).view(shape)
    return torch.stack([lo, hi])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(ELEMENT, ELEMENT), min_size=1, max_size=12))
def test_elementwise_ops_are_exact(pairs: list[tuple[int, int]]) -> None:
    a = _tensor([p for p, _ in pairs], (len(pairs),))
    b = _tensor([q for _, q in pairs], (len(pairs),))
    assert r128.to_ints(r128.add(a, b)) == [(p + q) % M128 for p, q in pairs]
    assert r128.to_ints(r128.sub(a, b)) == [(p - q) % M128 for p, q in pairs]
    assert r128.to_ints(r128.neg(a)) == [-p % M128 for p, _ in pairs]
    assert r128.to_ints(r128.mul(a, b)) == [p * q % M128 for p, q in pairs]
    low = b[0]  # (unsigned 64-bit words)
    assert r128.to_ints(r128.mul64(a, low)) == [p * (q % (1 << 64)) % M128 for p, q in pairs]


@settings(max_examples=40, deadline=None)
@given(
    m=st.integers(1, 4),
    k=st.integers(1, 6),
    n=st.integers(1, 4),
    data=st.data(),
)
def test_matmul_is_exact(m: int, k: int, n: int, data: st.DataObject) -> None:
    xs = [data.draw(ELEMENT) for _ in range(m * k)]
    ys = [data.draw(ELEMENT) for _ in range(k * n)]
    out = r128.to_ints(r128.bilinear("matmul", {}, _tensor(xs, (m, k)), _tensor(ys, (k, n))))
    want = [
        sum(xs[i * k + t] * ys[t * n + j] for t in range(k)) % M128
        for i in range(m)
        for j in range(n)
    ]
    assert out == want


def test_matmul_at_the_limbs_bound_and_past_it() -> None:
    # every limb at its largest: each of the six limb products' sums at its bound (2^17
    # terms), then one term more (cut into two pieces)
    for k in (1 << 17, (1 << 17) + 1):
        a = _tensor([M128 - 1], (1, 1)).expand(2, 1, k).contiguous()
        b = _tensor([(1 << 64) - 1], (1, 1)).expand(2, k, 1).contiguous()
        (got,) = r128.to_ints(r128.bilinear("matmul", {}, a, b))
        assert got == k * (M128 - 1) * ((1 << 64) - 1) % M128


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_conv2d_is_exact(data: st.DataObject) -> None:
    c, o, h, w, kh = 2, 2, 4, 4, 2
    xs = [data.draw(ELEMENT) for _ in range(c * h * w)]
    ws = [data.draw(ELEMENT) for _ in range(o * c * kh * kh)]
    out = r128.to_ints(
        r128.bilinear(
            "conv2d",
            {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1},
            _tensor(xs, (1, c, h, w)),
            _tensor(ws, (o, c, kh, kh)),
        )
    )
    want = []
    for oc in range(o):
        for i in range(h - kh + 1):
            for j in range(w - kh + 1):
                total = 0
                for ic in range(c):
                    for di in range(kh):
                        for dj in range(kh):
                            x = xs[(ic * h + i + di) * w + j + dj]
                            total += x * ws[((oc * c + ic) * kh + di) * kh + dj]
                want.append(total % M128)
    assert out == want
