"""Errors a user meets while writing the code say what was expected, what was found and
how to fix it, raised before anything moves (not torch's meta errors, frames deep)."""

from __future__ import annotations

import traceback

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
import pointers as pt


@pytest.fixture(scope="module")
def trio():
    return tuple(pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))


def _share(t, trio):
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


def _messages(trio) -> int:
    return sum(w.stats.messages_received for w in trio)


def _raises_early(trio, fn, error, match):
    before = _messages(trio)
    with pytest.raises(error, match=match) as info:
        fn()
    assert _messages(trio) == before  # (nothing moved)
    frames = traceback.extract_tb(info.value.__traceback__)
    inside = [f.name for f in frames if "/mpc/" in f.filename or "/pointers/" in f.filename]
    # raised by the shape check at the op, not by torch's meta kernels below it
    assert inside[-1] in ("check_product_shapes", "_out_shape", "_long_indices"), inside
    return str(info.value)


def test_a_shared_matmul_of_shapes_that_do_not_fit(trio):
    a, b = _share(torch.randn(2, 3), trio), _share(torch.randn(4, 5), trio)
    msg = _raises_early(trio, lambda: a @ b, mpc.ShapeError, r"shape \(2, 3\) .* shape \(4, 5\)")
    assert "found 3 and 4" in msg and "Fix: transpose" in msg
    msg = _raises_early(trio, lambda: torch.randn(4, 5) @ a, mpc.ShapeError, "public tensor")
    assert "found 5 and 2" in msg
    batched = _share(torch.randn(2, 3, 4), trio)
    c = _share(torch.randn(5, 6), trio)
    msg = _raises_early(trio, lambda: batched @ c, mpc.ShapeError, r"\(2, 3, 4\) .* \(5, 6\)")
    assert "found 4 and 5" in msg
    assert isinstance(mpc.ShapeError("x"), ValueError)


def test_a_linear_layer_on_inputs_of_the_wrong_width(trio):
    layer = nn.Linear(4, 5)
    x = _share(torch.randn(2, 3), trio)
    msg = _raises_early(trio, lambda: layer(x), mpc.ShapeError, "in_features, 4; found 3")
    assert "nn.Linear(3, 5)" in msg


def test_elementwise_products_and_convolutions_that_do_not_fit(trio):
    a, b = _share(torch.randn(2, 3), trio), _share(torch.randn(4, 5), trio)
    _raises_early(trio, lambda: a * b, mpc.ShapeError, "broadcast.*found a shared operand")
    x = _share(torch.randn(1, 3, 8, 8), trio)
    w = torch.randn(4, 2, 3, 3)
    _raises_early(trio, lambda: F.conv2d(x, w), mpc.ShapeError, "in-channels")


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.booleans(), min_size=24, max_size=24), st.integers(0, 2))
def test_a_public_boolean_mask_indexes_as_torch(trio, bits, where):
    x = torch.randn(2, 3, 4)
    sx = _share(x, trio)
    full = torch.tensor(bits).view(2, 3, 4)
    index = [(full,), (full[:, :, 0],), (slice(None), full[0, :, 0])][where]
    got = sx[index].get()
    assert got.shape == x[index].shape
    assert torch.allclose(got, x[index], atol=2**-15)


def test_a_mask_of_the_wrong_shape(trio):
    sx = _share(torch.randn(2, 3, 4), trio)
    mask = torch.tensor([True, False, True])
    msg = _raises_early(trio, lambda: sx[mask], mpc.ShapeError, r"mask of shape \(3,\)")
    assert "expected a mask of the shape of the dimensions it indexes, (2,)" in msg


def test_send_to_two_workers(trio):
    alice, bob, _ = trio
    pt.hook(torch)
    x = torch.tensor([1.0, 2.0])
    with pytest.raises(pt.SendError, match=r"takes one worker, got 2 \('bob', 'alice'\)") as e:
        x.send(bob, alice)
    assert "x.share(bob, alice, crypto_provider=carol)" in str(e.value)
    assert isinstance(e.value, TypeError)
    with pytest.raises(pt.SendError, match="got 0"):
        pt.send(x)
    with pytest.raises(pt.SendError, match="got 2"):
        nn.Linear(2, 2).send(bob, alice)
    assert torch.equal(x.send(bob).get(), x)  # (one worker: as before)
