"""The fixed-point range: values inside it give right answers and no warning; an op whose
result can leave it, from the magnitudes the client knows (mpc.ranges: max |x| of what it
shared, its public operands, carried through each op), warns when it runs, exactly then:
never for a result that cannot be wrong (a sum of large values, the docs' first example),
always for one that comes back wrong. Values that cannot be encoded at all are refused
with the range in the message."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.math.encoding import (
    EncodingError,
    FixedPointRangeWarning,
    encode,
    max_safe_value,
    product_safe_value,
)

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def trio():
    return pt.VirtualWorker("alice"), pt.VirtualWorker("bob"), pt.VirtualWorker("carol")


def _no_range_warnings():
    ctx = warnings.catch_warnings()
    ctx.__enter__()
    warnings.simplefilter("error", FixedPointRangeWarning)
    return ctx


@st.composite
def inside(draw, n: int = 4):
    """frac_bits and two float64 vectors strictly inside the product range."""
    f = draw(st.integers(8, 20))
    r = product_safe_value(f)
    val = st.floats(-r, r, allow_nan=False, exclude_min=True, exclude_max=True)
    x = draw(st.lists(val, min_size=n, max_size=n))
    y = draw(st.lists(val, min_size=n, max_size=n))
    return f, torch.tensor(x, dtype=torch.float64), torch.tensor(y, dtype=torch.float64)


def test_the_documented_bounds():
    assert product_safe_value(16) == 2.0**15 == 32768
    assert max_safe_value(16) == 2.0**46
    assert product_safe_value(16) ** 2 == 2.0 ** (62 - 32)  # |x * y| < 2^30 at 16 bits


@SETTINGS
@given(inside())
def test_inside_the_range_no_warning_and_right_results(trio, case):
    f, x, y = case
    alice, bob, carol = trio
    unit = 2.0**-f
    ctx = _no_range_warnings()
    try:
        a = mpc.share(x, alice, bob, crypto_provider=carol, frac_bits=f)
        b = mpc.share(y, alice, bob, crypto_provider=carol, frac_bits=f)
        prod = (a * b).get()
        total = (a + b).get()
        less = (a < b).get()
        scaled = (a * 0.75).get()
    finally:
        ctx.__exit__(None, None, None)
    # the rounding of each input (half a unit, times the other operand) and one truncation
    tol = (x.abs() + y.abs() + 2) * unit
    assert torch.all((prod - x * y).abs() <= tol)
    assert torch.all((total - (x + y)).abs() <= 2 * unit)
    assert torch.all((scaled - 0.75 * x).abs() <= x.abs() * unit + 2 * unit)
    ex, ey = encode(x, f), encode(y, f)
    assert torch.equal(less.bool(), ex < ey)  # the protocol compares the encodings


@SETTINGS
@given(inside(n=3), st.floats(-4.0, 4.0, allow_nan=False))
def test_public_matmul_inside_the_range(trio, case, scale):
    f, x, _ = case
    alice, bob, carol = trio
    r = product_safe_value(f)
    # a public operand whose column sums of |p| stay below the range
    p = torch.linspace(-1.0, 1.0, 6, dtype=torch.float64).view(3, 2) * scale + 0.25
    p = p * (0.99 * r / max(float(p.abs().sum(0).max()), 1e-9) if scale else 1.0)
    p = p + 1e-3 * (p == p.round())  # not integral: the fixed-point path
    ctx = _no_range_warnings()
    try:
        a = mpc.share(x.view(1, 3), alice, bob, crypto_provider=carol, frac_bits=f)
        got = (a @ p).get()
    finally:
        ctx.__exit__(None, None, None)
    want = x.view(1, 3) @ p
    unit = 2.0**-f
    tol = (x.abs().sum() + p.abs().sum() + 4) * unit
    assert torch.all((got - want).abs() <= tol), (got, want)


@SETTINGS
@given(st.integers(0, 30), st.floats(1.0, 1e6), st.sampled_from([-1.0, 1.0]))
def test_values_that_cannot_be_encoded_are_refused_with_the_range(f, k, sign):
    v = sign * max_safe_value(f) * k
    with pytest.raises(ValueError, match=rf"allows only \|x\| < 2\*\*{62 - f}") as info:
        encode(torch.tensor([1.0, v], dtype=torch.float64), f)
    assert isinstance(info.value, EncodingError)  # (mpc.EncodingError, a ValueError)


def _warned(fn):
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        out = fn()
    hits = [w for w in rec if issubclass(w.category, FixedPointRangeWarning)]
    return out, hits


def test_the_docs_first_example_and_large_sums_do_not_warn(trio):
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([1.0, 2.0]), alice, bob, crypto_provider=carol)
    got, hits = _warned(lambda: (x * 3.5 + 1).get())
    assert not hits and torch.allclose(got, torch.tensor([4.5, 8.0]))
    # sharing, adding, comparing values past the product range: nothing can be wrong
    big = torch.tensor([3e6, -7e9, 2.0**40])
    got, hits = _warned(lambda: (mpc.share(big, alice, bob, crypto_provider=carol) * 2 + 1e9).get())
    assert not hits and torch.allclose(got.double(), big.double() * 2 + 1e9, rtol=1e-6)
    assert encode(torch.tensor([2.0**44]), 16)[0] == 2**60  # (encoding never warns)


@st.composite
def scalar_products(draw):
    """frac_bits, and two scalars whose product's magnitude is log-uniform around the
    range's edge 2^(62 - 2f)."""
    f = draw(st.integers(8, 20))
    edge = 62 - 2 * f
    t = draw(st.floats(edge - 6.0, edge + 6.0))
    share = draw(st.floats(0.2, 0.8))
    signs = draw(st.tuples(st.sampled_from([-1.0, 1.0]), st.sampled_from([-1.0, 1.0])))
    x = signs[0] * 2.0 ** (t * share)
    y = signs[1] * 2.0 ** (t * (1 - share))
    return f, x, y


@SETTINGS
@given(scalar_products())
def test_a_product_warns_exactly_when_it_can_be_wrong(trio, case):
    f, x, y = case
    alice, bob, carol = trio
    a = mpc.share(
        torch.tensor([x], dtype=torch.float64), alice, bob, crypto_provider=carol, frac_bits=f
    )
    b = mpc.share(
        torch.tensor([y], dtype=torch.float64), alice, bob, crypto_provider=carol, frac_bits=f
    )
    got, hits = _warned(lambda: (a * b).get())
    want = x * y
    can_be_wrong = abs(want) * 2.0 ** (2 * f) >= 2.0**62  # (|x| and |y| known exactly here)
    assert bool(hits) == can_be_wrong, (x, y, f)
    tol = (abs(x) + abs(y) + 2) * 2.0**-f
    if not hits:  # no warning: right
        assert abs(float(got) - want) <= tol
    if abs(float(got) - want) > tol:  # wrong: it warned, naming the caller's line
        assert hits and hits[0].filename == __file__


@SETTINGS
@given(scalar_products(), st.integers(1, 6))
def test_a_public_matmul_warns_exactly_when_it_can_be_wrong(trio, case, k):
    f, x, y = case
    alice, bob, carol = trio
    a = mpc.share(
        torch.full((1, k), x, dtype=torch.float64), alice, bob, crypto_provider=carol, frac_bits=f
    )
    p = torch.full((k, 2), y / k, dtype=torch.float64)
    p = p + 1e-3 * (p == p.round())  # (not integral: the fixed-point product)
    got, hits = _warned(lambda: (a @ p).get())
    want = (torch.full((1, k), x, dtype=torch.float64) @ p).abs().max().item()
    assert bool(hits) == (want * 2.0 ** (2 * f) >= 2.0**62), (x, y, k, f)
    if not hits:
        assert torch.allclose(
            got,
            torch.full((1, k), x, dtype=torch.float64) @ p,
            rtol=1e-3,
            atol=k * (abs(x) + abs(y) + 2) * 2.0**-f,
        )


def test_the_issue_examples_warn_at_the_product(trio):
    alice, bob, carol = trio
    a = mpc.share(torch.tensor([3e6]), alice, bob, crypto_provider=carol)  # (no warning)
    with pytest.warns(FixedPointRangeWarning, match=r"mul: the product can reach 9e\+12") as rec:
        wrong = (a * a).get()
    assert rec[0].filename == __file__  # the warning names the caller's line
    assert not torch.allclose(wrong, torch.tensor([9e12]))  # what the warning is about
    z = mpc.share(torch.tensor([1000.0]), alice, bob, crypto_provider=carol)
    square, hits = _warned(lambda: z * z)  # 1e6: inside the range
    assert not hits
    with pytest.warns(FixedPointRangeWarning, match="1e\\+12"):
        fourth = (square * square).get()  # (x*x)*(x*x) at x = 1000: 1e12
    assert fourth.item() != 1e12
    with pytest.raises(mpc.EncodingError, match=r"2\*\*46"):
        mpc.share(torch.tensor([2.0**47]), alice, bob, crypto_provider=carol)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="NaN or infinity"):
            mpc.share(torch.tensor([bad]), alice, bob, crypto_provider=carol)


def test_bounds_carry_through_layers(trio):
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([[3.0, -2.0]]), alice, bob, crypto_provider=carol)
    assert x.bound == 3.0
    assert (x * 0.5 + 1).bound == 2.5 and torch.sigmoid(x).bound == 1.0
    assert (x @ torch.tensor([[1.5], [-4.0]])).bound == 3.0 * 5.5
    w = mpc.share(torch.tensor([[0.5], [2.0]]), alice, bob, crypto_provider=carol)
    # a matrix the client shared: its largest sum of |w| down a column, as for a public one
    assert w.abs_sums == (2.5, 2.0) and (x @ w).bound == 3.0 * 2.5
    h = x * 1.0  # (a computed value: no sums known) times w: bounds times the length, 12
    assert (h @ w).bound == min(3.0 * 2.5, 3.0 * 2.0 * 2)
    assert (w.t() @ x.t()).bound == 3.0 * 2.5  # (a transpose keeps the sums, swapped)
    assert torch.relu(x).sum().bound == 6.0
    assert torch.reciprocal(x).bound is None  # not bounded: later products unchecked
    img = mpc.share(torch.ones(1, 2, 4, 4), alice, bob, crypto_provider=carol)
    with pytest.warns(FixedPointRangeWarning, match="convolution"):
        torch.nn.functional.conv2d(img * 20000.5, torch.full((1, 2, 3, 3), 20000.5))
    _, hits = _warned(lambda: torch.nn.functional.conv2d(img, torch.full((1, 2, 3, 3), 0.5)).get())
    assert not hits


@SETTINGS
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=4))
def test_integers_are_exact_and_never_warn(trio, values):
    alice, bob, carol = trio
    t = torch.tensor(values, dtype=torch.int64)
    (got, square), hits = _warned(
        lambda: (
            mpc.share(t, alice, bob, crypto_provider=carol).clone().get(),
            (lambda a: (a * a).get())(mpc.share(t, alice, bob, crypto_provider=carol)),
        )
    )
    assert not hits
    assert torch.equal(got, t) and torch.equal(square, t * t)  # mod 2^64, as torch's int64
