"""The fixed-point range (issue 12): values inside it give right answers and no warning;
values whose products can leave it warn where the magnitude is known for free (at
encoding: share time and public operands; a public matmul or conv2d operand's sums);
values that cannot be encoded at all are refused with the range in the message."""

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
    ex, ey = encode(x, f, check_range=False), encode(y, f, check_range=False)
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
@given(
    st.integers(8, 20),
    st.floats(0.0, 0.99),
    st.sampled_from([-1.0, 1.0]),
)
def test_encodable_values_past_the_product_range_warn(f, t, sign):
    # a magnitude in [2^(31-f), 2^(62-f)), log-uniform
    lo, hi = math.log2(product_safe_value(f)), math.log2(max_safe_value(f))
    v = sign * 2.0 ** (lo + t * (hi - lo))
    with pytest.warns(FixedPointRangeWarning, match=rf"2\*\*{31 - f} = ") as rec:
        enc = encode(torch.tensor([v, 0.5], dtype=torch.float64), f)
    assert rec[0].filename == __file__  # the warning names the caller's line
    assert enc[0] == round(v * 2.0**f)  # still encoded, exactly
    with warnings.catch_warnings():
        warnings.simplefilter("error", FixedPointRangeWarning)
        encode(torch.tensor([v]), f, check_range=False)  # the opt-out


@SETTINGS
@given(st.integers(0, 30), st.floats(1.0, 1e6), st.sampled_from([-1.0, 1.0]))
def test_values_that_cannot_be_encoded_are_refused_with_the_range(f, k, sign):
    v = sign * max_safe_value(f) * k
    with pytest.raises(ValueError, match=rf"allows only \|x\| < 2\*\*{62 - f}") as info:
        encode(torch.tensor([1.0, v], dtype=torch.float64), f)
    assert isinstance(info.value, EncodingError)  # (mpc.EncodingError, a ValueError)


def test_the_issue_examples_warn_and_would_be_wrong(trio):
    alice, bob, carol = trio
    with pytest.warns(FixedPointRangeWarning, match="357.9"):  # 2^30 / 3e6
        a = mpc.share(torch.tensor([3e6]), alice, bob, crypto_provider=carol)
    wrong = (a * a).get()
    assert not torch.allclose(wrong, torch.tensor([9e12]))  # what the warning is about
    with pytest.warns(FixedPointRangeWarning):
        b = mpc.share(torch.tensor([2.0**40]), alice, bob, crypto_provider=carol)
    assert (b * b).get().item() != 2.0**80
    # sums and comparisons of such values are still right
    assert (a + a).get().item() == 6e6
    assert bool((a < b).get().item())
    with pytest.raises(mpc.EncodingError, match=r"2\*\*46"):
        mpc.share(torch.tensor([2.0**47]), alice, bob, crypto_provider=carol)
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="NaN or infinity"):
            mpc.share(torch.tensor([bad]), alice, bob, crypto_provider=carol)


def test_public_operands_warn_when_results_can_leave_the_range(trio):
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([[3.0, -2.0]]), alice, bob, crypto_provider=carol)
    with pytest.warns(FixedPointRangeWarning, match="encoding a value"):
        x * 40000.5  # a public multiplier past the range
    big = torch.full((2, 3), 20000.5)  # each below 2^15, each column sum above it
    with pytest.warns(FixedPointRangeWarning, match="public operand of matmul") as rec:
        got = (x @ big).get()
    assert rec[0].filename == __file__
    assert torch.allclose(got, torch.tensor([[3.0, -2.0]]) @ big)  # small x: still right
    with pytest.warns(FixedPointRangeWarning, match="public operand of matmul"):
        big.t() @ x.t()
    img = mpc.share(torch.ones(1, 2, 4, 4), alice, bob, crypto_provider=carol)
    with pytest.warns(FixedPointRangeWarning, match="public operand of conv2d"):
        torch.nn.functional.conv2d(img, torch.full((1, 2, 3, 3), 2000.5))
    ctx = _no_range_warnings()
    try:  # integral public operands multiply exactly: their range is 2^46, no warning
        assert torch.equal((x * 1e6).get(), torch.tensor([[3e6, -2e6]]))
        (x @ torch.full((2, 3), 30000.0)).get()
        torch.nn.functional.conv2d(img, torch.full((1, 2, 3, 3), 0.5)).get()
    finally:
        ctx.__exit__(None, None, None)


@SETTINGS
@given(st.lists(st.integers(-(2**62), 2**62), min_size=1, max_size=4))
def test_integers_are_exact_and_never_warn(trio, values):
    alice, bob, carol = trio
    t = torch.tensor(values, dtype=torch.int64)
    ctx = _no_range_warnings()
    try:
        a = mpc.share(t, alice, bob, crypto_provider=carol)
        assert torch.equal(a.clone().get(), t)
        assert torch.equal((a * a).get(), t * t)  # mod 2^64, as torch's int64
    finally:
        ctx.__exit__(None, None, None)
