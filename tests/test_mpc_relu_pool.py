"""A ReLU then a 2x2 max-pool in one comparison run (issue 25; mpc/ops/relu_pool.py):
max(relu(a_0), .., relu(a_3)) = max(0, a_0, .., a_3), against plaintext torch (ties,
all-negative windows, zeros; both comparison modes; 2 and 3 parties), and every other use
of a ReLU's result still as torch's: its comparison then runs when its shares are first
read, in the rounds it took before, and not at all if they never are."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig

FSS = MPCConfig(comparison="fss")


def _share(v: torch.Tensor, n: int = 2, config: MPCConfig | None = None) -> Any:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    return mpc.share(v, *parties, crypto_provider=pt.VirtualWorker("dealer"), config=config)


def _close(got: torch.Tensor, want: torch.Tensor, scale: float = 1.0) -> bool:
    return torch.allclose(got, want, atol=4e-5 * scale + 1e-4, rtol=0)


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.integers(-3, 3), min_size=2 * 4 * 4 * 6, max_size=2 * 4 * 4 * 6),
    st.sampled_from([(2, "default"), (3, "default"), (2, "fss")]),
    st.floats(0.01, 100.0),
    st.booleans(),
)
def test_max_pool_of_relu_equals_torch(values, parties_mode, scale, product):
    """Small integers (many ties, all-negative windows, zeros), a shared value or a product
    whose truncation is still pending: one comparison run (4 rounds; 2 with FSS)."""
    n, mode = parties_mode
    v = torch.tensor(values, dtype=torch.float32).reshape(2, 4, 4, 6) * scale
    x = _share(v, n, FSS if mode == "fss" else None)
    w = torch.full_like(v, 0.5)
    if product:
        x = x * mpc.share(w, session=x.session)  # (truncation pending)
    with mpc.stats() as s:
        out = F.max_pool2d(F.relu(x), 2)
    assert s.rounds == (2 if mode == "fss" else 4)
    want = F.max_pool2d(F.relu(v * w if product else v), 2)
    assert _close(out.get(), want, scale)


@pytest.mark.parametrize("mode", ["default", "fss"])
def test_lenet_blocks_as_torch_in_fewer_rounds(mode):
    """conv, ReLU, 2x2 max-pool twice: 3 rounds a block fewer (default: the ReLU's own
    run took 3, within MPCConfig.three_round_up_to, 4 while it opened d, and the max's
    groups of four take 4, as the fused run does; FSS 1: the ReLU of a product took one
    round, the max two; now both take the max's two)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 4, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(4, 4, 3),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
    ).eval()
    img = torch.randn(1, 1, 14, 14)
    with torch.no_grad():
        want = model(img)
    x = _share(img, 2, FSS if mode == "fss" else None)
    shared = mpc.share(model, session=x.session)
    with mpc.stats() as s, torch.no_grad():
        out = shared(x)
    # conv (1) and ReLU + pool (4; FSS 2), twice
    assert s.rounds == (6 if mode == "fss" else 10)
    assert _close(out.get(), want)


@pytest.mark.parametrize("n", [2, 3])
def test_other_uses_of_a_relu_equal_torch(n):
    torch.manual_seed(1)
    v = torch.randn(2, 3, 4, 4)
    x = _share(v, n)
    r = F.relu(v)
    checks: list[tuple[Any, torch.Tensor]] = [
        (F.relu(x), r),
        (F.relu(x) + 1.5, r + 1.5),
        (F.relu(x).view(2, -1) @ torch.ones(48, 3), r.view(2, -1) @ torch.ones(48, 3)),
        (F.relu(x)[:, 1], r[:, 1]),
        (F.relu(F.relu(x)), r),
        (F.relu(x - 0.25) * 2, F.relu(v - 0.25) * 2),
        (F.max_pool2d(F.relu(x), 3, 1), F.max_pool2d(r, 3, 1)),  # not 2x2: as before
        (F.max_pool2d(F.relu(x), 2, padding=1), F.max_pool2d(r, 2, padding=1)),
        (F.avg_pool2d(F.relu(x), 2), F.avg_pool2d(r, 2)),
    ]
    for got, want in checks:
        assert _close(got.get(), want)
    # the ReLU of a ReLU read twice, and pooled: each equals torch
    once = F.relu(x)
    twice = F.relu(once)
    assert _close(F.max_pool2d(twice, 2).get(), F.max_pool2d(r, 2))
    assert _close(once.get(), r) and _close(twice.get(), r)


def test_in_place_ops_around_a_deferred_relu():
    """An in-place write to the ReLU's input (or a view of it) after the ReLU does not
    reach the ReLU's result; an in-place op on the result acts on it as on a tensor."""
    torch.manual_seed(2)
    v = torch.randn(1, 2, 4, 4)
    x = _share(v)
    y = F.relu(x)
    pooled_later = F.relu(x)
    x += 10.0
    corner = x[0, 0]
    corner -= 30.0  # (a view: the write reaches x)
    assert _close(y.get(), F.relu(v))
    assert _close(F.max_pool2d(pooled_later, 2).get(), F.max_pool2d(F.relu(v), 2))
    z = F.relu(x)
    z *= 2.0
    want_x = v + 10.0
    want_x[0, 0] -= 30.0
    assert _close(z.get(), F.relu(want_x) * 2)
    w = _share(v)
    w.relu_()
    assert _close(F.max_pool2d(w, 2).get(), F.max_pool2d(F.relu(v), 2))


def test_a_relu_never_read_costs_nothing_and_reads_cost_what_they_did():
    x = _share(torch.randn(64))
    with mpc.stats() as s:
        y = F.relu(x)
        del y
    assert s.rounds == 0 and s.dealer_bytes == 0
    y = F.relu(x)
    with mpc.stats() as s:
        y.get()
    # the ReLU's comparison, run by the read: 3 rounds (64 elements, within
    # MPCConfig.three_round_up_to: no d round; 4 with it)
    assert s.rounds == 3
    prod = x * x
    with mpc.stats() as s:
        F.relu(prod).materialize()
    assert s.rounds == 3  # the pending truncation fused into the comparison, as before


def test_autograd_relu_and_pool_stay_as_they_were():
    """A tensor that requires grad: the ReLU keeps its mask and the pool its one-hot argmax
    for the backward (not fused), and the gradients equal torch's."""
    torch.manual_seed(3)
    v = torch.randn(1, 1, 4, 4)
    x = _share(v)
    x.requires_grad_(True)
    out = F.max_pool2d(F.relu(x), 2).sum()
    out.backward()
    vv = v.clone().requires_grad_(True)
    F.max_pool2d(F.relu(vv), 2).sum().backward()
    assert x.grad is not None and _close(x.grad.get(), vv.grad)


def test_a_plan_of_relu_then_pool_records_the_fused_run():
    x = _share(torch.randn(1, 2, 6, 6))
    plan = mpc.plan(lambda t: F.max_pool2d(F.relu(t), 2), x)
    relu_plan = mpc.plan(torch.relu, x)
    for _ in range(2):
        v = torch.randn(1, 2, 6, 6)
        y = mpc.share(v, session=x.session)
        assert _close(plan(y).get(), F.max_pool2d(F.relu(v), 2))
        assert _close(relu_plan(y).get(), F.relu(v))
