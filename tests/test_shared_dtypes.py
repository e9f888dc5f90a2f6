"""Shared integer and bool tensors come back in torch's result dtype, with torch's
wrap-around: the opened ring value is reduced to the dtype at reconstruction (exact for
sums and products, which commute with the reduction mod 2^bits)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
DTYPES = [torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool]


@pytest.fixture(scope="module")
def trio():
    return tuple(pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))


def _share(t, trio):
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


def _same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert type(got) is torch.Tensor
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert torch.equal(got, want), (got, want)


@st.composite
def operands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    info = None if dtype == torch.bool else torch.iinfo(dtype)
    lo, hi = (0, 1) if info is None else (info.min, info.max)
    n = draw(st.integers(1, 5))
    a = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    b = draw(st.lists(st.integers(lo, hi), min_size=n, max_size=n))
    k = draw(st.integers(-300, 300))
    return dtype, torch.tensor(a).to(dtype), torch.tensor(b).to(dtype), k


def test_the_issue_example(trio):
    u = _share(torch.tensor([200], dtype=torch.uint8), trio)
    _same((u * 2).get(), torch.tensor([200], dtype=torch.uint8) * 2)  # 144, not 400
    for dtype in DTYPES:
        x = torch.tensor([1, 0, 1]).to(dtype)
        _same(_share(x, trio).get(), x)


@SETTINGS
@given(operands())
def test_sums_products_and_reductions_wrap_as_torch(trio, case):
    dtype, a, b, k = case
    sa, sb = _share(a, trio), _share(b, trio)
    _same((sa * sb).get(), a * b)
    _same((sa + sb).get(), a + b)
    _same(sa.sum().get(), a.sum())  # (an int64 count or sum, as torch)
    if dtype != torch.bool:
        _same((sa - sb).get(), a - b)
        _same((sa * k).get(), a * k)
        _same((k + sa).get(), k + a)
        _same((-sa).get(), -a)
        _same(sa.to(torch.int8).get(), a.to(torch.int8))  # (narrowing: a relabel)
    else:
        _same((sa * True).get(), a * True)


@SETTINGS
@given(operands())
def test_comparisons_of_values_inside_the_dtype(trio, case):
    _, a, b, _ = case
    sa, sb = _share(a, trio), _share(b, trio)
    _same((sa < sb).get(), a < b)
    _same((sa >= sb).get(), a >= b)
    if a.dtype != torch.bool:
        _same(torch.stack([sa, sb]).amax(0).get(), torch.stack([a, b]).amax(0))


def test_matmul_of_int32(trio):
    a = torch.tensor([[70000, -3], [2, 5]], dtype=torch.int32)
    b = torch.tensor([[40000, 1], [7, -9]], dtype=torch.int32)
    _same((_share(a, trio) @ _share(b, trio)).get(), a @ b)  # (wraps past 2^31)


def test_widening_an_unreduced_integer_is_refused(trio):
    u = _share(torch.tensor([200], dtype=torch.uint8), trio) * 2
    with pytest.raises(mpc.MPCError, match="cannot widen a shared torch.uint8 .* share it as"):
        u.to(torch.int64)
