"""The distributed comparison function (mpc/math/dcf.py) against plaintext: the two
parties' outputs sum to beta * [x < alpha] for every domain width from 1 to 64 bits,
at the edges (x = alpha - 1, alpha, alpha + 1, 0, 2^bits - 1) and at random points; the
key's size; a key alone (one party's root and the correction words) gives outputs that
do not depend on alpha where the other root is unknown."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc.math import dcf
from mpc.math.prg import PRG

BITS = st.integers(1, 64)


def _roots(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = PRG(os.urandom(16))
    return g.int64((n, 2)), g.int64((n, 2))


def _unsigned_lt(x: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    ux, ua = x.numpy().view(np.uint64), alpha.numpy().view(np.uint64)
    return torch.from_numpy((ux < ua).astype(np.int64))


def _wrap(v: int, bits: int) -> int:
    """v mod 2^bits as an int64 value (two's complement for 64 bits)."""
    v %= 1 << bits
    return v - (1 << 64) if v >= 1 << 63 else v


def _check(alpha: list[int], x: list[int], beta: list[int], bits: int) -> None:
    a = torch.tensor([_wrap(v, bits) for v in alpha], dtype=torch.int64)
    xs = torch.tensor([_wrap(v, bits) for v in x], dtype=torch.int64)
    b = torch.tensor([_wrap(v, 64) for v in beta], dtype=torch.int64)
    roots = _roots(len(alpha))
    cw = dcf.gen(a, b, bits, roots)
    assert list(cw.shape) == [dcf.key_words(bits), len(alpha)]
    y0 = dcf.evaluate(0, roots[0], cw, xs, bits)
    y1 = dcf.evaluate(1, roots[1], cw, xs, bits)
    assert torch.equal(y0 + y1, _unsigned_lt(xs, a) * b)


@settings(max_examples=60, deadline=None)
@given(bits=BITS, data=st.data())
def test_dcf_at_the_edges(bits: int, data: st.DataObject) -> None:
    top = (1 << bits) - 1
    alpha = data.draw(st.sampled_from([0, 1, 2, top - 1, top, top // 2, top // 2 + 1]))
    alpha = data.draw(st.one_of(st.just(alpha & top), st.integers(0, top)))
    xs = [alpha - 1, alpha, alpha + 1, 0, top, top // 2, top // 2 + 1]
    xs = [v for v in xs if 0 <= v <= top]
    beta = data.draw(st.integers(-(2**63), 2**63 - 1))
    _check([alpha] * len(xs), xs, [beta] * len(xs), bits)


@settings(max_examples=30, deadline=None)
@given(
    bits=BITS,
    pairs=st.lists(
        st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1), st.integers()),
        min_size=1,
        max_size=40,
    ),
)
def test_dcf_random_points(bits: int, pairs: list[tuple[int, int, int]]) -> None:
    alpha, x, beta = (list(col) for col in zip(*pairs))
    _check(alpha, x, beta, bits)


@settings(max_examples=20, deadline=None)
@given(alpha=st.integers(0, 2**64 - 1), delta=st.integers(-3, 3))
def test_dcf_full_64_bit_domain(alpha: int, delta: int) -> None:
    """Unsigned 64-bit inputs: x < alpha exactly, across 2^63 and at 0 and 2^64 - 1."""
    xs = [(alpha + delta) % 2**64, 0, 2**64 - 1, 2**63, 2**63 - 1]
    _check([alpha] * len(xs), xs, [1] * len(xs), 64)


def test_many_elements_across_chunks() -> None:
    """More elements than one chunk of the level loop, and a batch that is not a multiple."""
    n = dcf.CHUNK * 2 + 37
    g = PRG(os.urandom(16))
    alpha = g.int64((n,)) & ((1 << 63) - 1)
    x = g.int64((n,)) & ((1 << 63) - 1)
    x[::3] = alpha[::3]
    x[1::3] = alpha[1::3] - 1
    x &= (1 << 63) - 1
    beta = g.int64((n,))
    roots = _roots(n)
    cw = dcf.gen(alpha, beta, 63, roots)
    y = dcf.evaluate(0, roots[0], cw, x, 63) + dcf.evaluate(1, roots[1], cw, x, 63)
    assert torch.equal(y, _unsigned_lt(x, alpha) * beta)


def test_key_size() -> None:
    """1,520 bytes an element for the 63-bit domain of a 64-bit comparison (the goal: at
    most 1.6 KB), 24 bytes a bit of domain plus 8."""
    assert dcf.key_bytes(63) == 1520
    assert dcf.key_bytes(31) == 24 * 31 + 8


def test_one_key_alone_does_not_depend_on_alpha() -> None:
    """Party 0's view (its root, the correction words) for two different alphas with the
    same roots differs, but each looks uniform: the words of a key for alpha = 0 and for
    alpha = 2^63 - 1 have the same bit balance (a smoke test of pseudorandomness; the
    proof is the paper's)."""
    n = 4096
    roots = _roots(n)
    beta = torch.ones(n, dtype=torch.int64)
    for a in (0, (1 << 63) - 1):
        cw = dcf.gen(torch.full((n,), a, dtype=torch.int64), beta, 63, roots)
        words = cw[:-1].reshape(63, 3, n)[:, 1]  # the seed corrections' high words
        bits = np.unpackbits(words.numpy().view(np.uint8)).mean()
        assert abs(bits - 0.5) < 0.01


def test_bad_arguments() -> None:
    roots = _roots(2)
    one = torch.ones(2, dtype=torch.int64)
    with pytest.raises(ValueError, match="1 to 64 bits"):
        dcf.gen(one, one, 0, roots)
    with pytest.raises(ValueError, match=r"\[0, 2\^8\)"):
        dcf.gen(torch.tensor([256, 1]), one, 8, roots)
    with pytest.raises(TypeError, match="int64"):
        dcf.gen(one.float(), one, 8, roots)
    cw = dcf.gen(one, one, 8, roots)
    with pytest.raises(ValueError, match="parties 0 and 1"):
        dcf.evaluate(2, roots[0], cw, one, 8)
    with pytest.raises(ValueError, match="shape"):
        dcf.evaluate(0, roots[0], cw[:-1], one, 8)


# -- the DCF with a payload of two Z/2^128 elements (the authenticated comparison) -----------


def _words128(v: int) -> list[int]:
    v %= 1 << 128
    return [_wrap(v & ((1 << 64) - 1), 64), _wrap(v >> 64, 64)]


def _ints128(t: torch.Tensor) -> list[tuple[int, ...]]:
    w = [[x % (1 << 64) for x in row] for row in t.tolist()]
    q = len(w) // 2
    return [tuple(w[2 * e][i] | w[2 * e + 1][i] << 64 for e in range(q)) for i in range(len(w[0]))]


@settings(max_examples=40, deadline=None)
@given(bits=BITS, elements=st.sampled_from([2, 4]), data=st.data())
def test_dcf128_sums_to_beta_below_alpha(bits: int, elements: int, data: st.DataObject) -> None:
    from mpc.math import dcf128

    top = (1 << bits) - 1
    n = data.draw(st.integers(1, 6))
    alpha = [data.draw(st.integers(0, top)) for _ in range(n)]
    x = [data.draw(st.sampled_from([a - 1, a, a + 1, 0, top])) % (1 << bits) for a in alpha]
    beta = [tuple(data.draw(st.integers(0, 2**128 - 1)) for _ in range(elements)) for _ in alpha]
    a = torch.tensor([_wrap(v, bits) for v in alpha], dtype=torch.int64)
    xs = torch.tensor([_wrap(v, bits) for v in x], dtype=torch.int64)
    b = torch.tensor([[w for v in p for w in _words128(v)] for p in beta], dtype=torch.int64).T
    roots = _roots(n)
    cw = dcf128.gen(a, b.contiguous(), bits, roots)
    assert list(cw.shape) == [dcf128.key_words(bits, elements), n]
    y0 = _ints128(dcf128.evaluate(0, roots[0], cw, xs, bits))
    y1 = _ints128(dcf128.evaluate(1, roots[1], cw, xs, bits))
    for i in range(n):
        want = tuple(v * (x[i] < alpha[i]) for v in beta[i])
        got = tuple((p + q) % (1 << 128) for p, q in zip(y0[i], y1[i]))
        assert got == want, (bits, alpha[i], x[i])
