"""Failure cases of the mpc layer: each one raises a clear, specific error.

Runs on both worker kinds (see conftest.py): the workers come from ``make_worker`` (on the
network kind ``dan`` is the cluster's ``dave``). Tests that only check arguments, before
any worker is used, build in-process workers and run once.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpc
import pointers as pt
from pointers.errors import NotAllowedError, RemoteError


@pytest.fixture
def workers(make_worker: Callable[[str], Any]) -> tuple[Any, ...]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol", "dan"))


@pytest.fixture
def shared(workers: tuple[Any, ...]) -> mpc.SharedTensor:
    alice, bob, carol, _ = workers
    return mpc.share(torch.tensor([1.5, -2.0, 3.0]), alice, bob, crypto_provider=carol)


def party_messages(*ws: Any) -> int:
    return sum(w.stats.messages_received for w in ws)


# ------------------------------------------------------------------- crypto provider


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda x: x * x, id="mul"),
        pytest.param(lambda x: x @ x, id="matmul"),
        pytest.param(lambda x: x.view(1, 3) @ x.view(3, 1), id="mm"),
        pytest.param(lambda x: x < 0, id="lt_public"),
        pytest.param(lambda x: x > x, id="gt_shared"),
        pytest.param(lambda x: x == 1.5, id="eq"),
        pytest.param(F.relu, id="relu"),
        pytest.param(lambda x: x.max(), id="max"),
        pytest.param(lambda x: x.argmax(), id="argmax"),
        pytest.param(lambda x: F.max_pool2d(x.view(1, 1, 1, 3), (1, 2)), id="max_pool2d"),
        pytest.param(lambda x: (x * 0.5) * x, id="truncation_then_mul"),
    ],
)
def test_products_and_comparisons_need_a_crypto_provider(
    workers: tuple[Any, ...], op: Callable[[Any], Any]
) -> None:
    alice, bob, _, _ = workers
    x = mpc.share(torch.tensor([1.5, -2.0, 3.0]), alice, bob)  # no dealer
    with pytest.raises(mpc.CryptoProviderRequired, match="needs a crypto provider") as info:
        op(x)
    assert "crypto_provider=" in str(info.value)  # says how to fix it
    assert isinstance(info.value, mpc.MPCError)


def test_linear_ops_work_without_a_crypto_provider(
    workers: tuple[Any, ...],
) -> None:
    alice, bob, _, _ = workers
    v = torch.tensor([1.5, -2.0, 3.0])
    x = mpc.share(v, alice, bob)
    got = (x + x - 2 * x + x.sum() + 1.25 - x.view(3, 1).t().reshape(3) * 3).get()
    assert torch.allclose(got, v.sum() + 1.25 - 3 * v, atol=1e-4)


# --------------------------------------------------------------------- party sets


@pytest.mark.parametrize("n", [0, 1, 6, 7])
def test_party_count_must_be_2_to_5(n: int) -> None:
    # refused before any worker is used; 7 parties and a dealer are more than the network
    # cluster has, so this runs on in-process workers only
    parties = [pt.VirtualWorker(f"w{i}") for i in range(n)]
    dealer = pt.VirtualWorker("dealer")
    with pytest.raises(ValueError, match=f"2 to 5 parties, got {n}"):
        mpc.share(torch.ones(2), *parties, crypto_provider=dealer)


@pytest.mark.parametrize("n", [2, 5])
def test_party_count_bounds_are_inclusive(make_worker: Callable[[str], Any], n: int) -> None:
    parties = [make_worker(f"w{i}") for i in range(n)]
    x = mpc.share(torch.tensor([2.0]), *parties, crypto_provider=make_worker("dealer"))
    assert (x * x).get().item() == 4.0


def test_crypto_provider_must_not_be_a_party(workers: tuple[Any, ...]) -> None:
    alice, bob, _, _ = workers
    with pytest.raises(ValueError, match="crypto provider 'bob' must not be one of the parties"):
        mpc.share(torch.ones(2), alice, bob, crypto_provider=bob)
    # a different worker object with the same id is the same party
    with pytest.raises(ValueError, match="must not be one of the parties"):
        mpc.share(torch.ones(2), alice, bob, crypto_provider=pt.VirtualWorker("alice"))


def test_parties_must_be_distinct_workers(workers: tuple[Any, ...]) -> None:
    alice, _, carol, _ = workers
    with pytest.raises(ValueError, match="distinct"):
        mpc.share(torch.ones(2), alice, alice, crypto_provider=carol)
    with pytest.raises(TypeError, match="workers"):
        mpc.share(torch.ones(2), "alice", "bob", crypto_provider=carol)


@pytest.mark.parametrize(
    "op",
    [
        pytest.param(lambda a, b: a + b, id="add"),
        pytest.param(lambda a, b: a - b, id="sub"),
        pytest.param(lambda a, b: a * b, id="mul"),
        pytest.param(lambda a, b: a.view(1, 3) @ b.view(3, 1), id="matmul"),
        pytest.param(lambda a, b: a < b, id="lt"),
        pytest.param(lambda a, b: a == b, id="eq"),
        pytest.param(lambda a, b: torch.cat([a, b]), id="cat"),
        pytest.param(lambda a, b: torch.stack([a, b]), id="stack"),
    ],
)
@pytest.mark.parametrize("other", ["other_parties", "other_dealer", "other_order"])
def test_mixing_party_sets_raises(
    workers: tuple[Any, ...], op: Callable[[Any, Any], Any], other: str
) -> None:
    alice, bob, carol, dan = workers
    v = torch.tensor([1.0, 2.0, 3.0])
    a = mpc.share(v, alice, bob, crypto_provider=carol)
    if other == "other_parties":
        b = mpc.share(v, alice, dan, crypto_provider=carol)
    elif other == "other_dealer":
        b = mpc.share(v, alice, bob, crypto_provider=dan)
    else:  # share i must meet share i: the order of the parties matters
        b = mpc.share(v, bob, alice, crypto_provider=carol)
    with pytest.raises(mpc.PartyMismatchError, match="different parties"):
        op(a, b)


# ----------------------------------------------------------------------- encoding


@pytest.mark.parametrize("value", [2.0**46, -(2.0**46), 1e20, -3e38])
def test_float_outside_safe_range_raises(workers: tuple[Any, ...], value: float) -> None:
    alice, bob, carol, _ = workers
    with pytest.raises(mpc.EncodingError, match="safe range") as info:
        mpc.share(
            torch.tensor([0.0, value], dtype=torch.float64), alice, bob, crypto_provider=carol
        )
    assert "2**46" in str(info.value)  # names the bound for the default 16 fractional bits
    assert isinstance(info.value, ValueError)


def test_largest_safe_float_encodes(workers: tuple[Any, ...]) -> None:
    alice, bob, carol, _ = workers
    x = mpc.share(torch.tensor([2.0**45, -(2.0**45)]), alice, bob, crypto_provider=carol)
    assert x.get().tolist() == [2.0**45, -(2.0**45)]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_floats_raise(workers: tuple[Any, ...], bad: float) -> None:
    alice, bob, carol, _ = workers
    with pytest.raises(mpc.EncodingError, match="NaN or infinity"):
        mpc.share(torch.tensor([1.0, bad]), alice, bob, crypto_provider=carol)


def test_public_operand_outside_safe_range_raises(shared: mpc.SharedTensor) -> None:
    with pytest.raises(mpc.EncodingError, match="safe range"):
        shared + 1e20
    with pytest.raises(mpc.EncodingError, match="safe range"):
        _ = shared < torch.tensor([1e30, 0.0, 0.0])


def test_unsupported_dtype_raises(workers: tuple[Any, ...]) -> None:
    alice, bob, carol, _ = workers
    with pytest.raises(TypeError, match="complex64"):
        mpc.share(torch.ones(2, dtype=torch.complex64), alice, bob, crypto_provider=carol)


def test_bad_frac_bits_raise(workers: tuple[Any, ...]) -> None:
    alice, bob, carol, _ = workers
    with pytest.raises(ValueError, match="frac_bits must be in"):
        mpc.share(torch.ones(2), alice, bob, crypto_provider=carol, frac_bits=40)


# ------------------------------------------------------------------ unsupported ops


@pytest.mark.parametrize(
    ("fn", "name"),
    [
        (torch.sin, "aten.sin"),
        (torch.cos, "aten.cos"),
        (torch.erf, "aten.erf"),
        (torch.log2, "aten.log2"),
        (torch.floor, "aten.floor"),
        (lambda x: torch.cumsum(x, 0), "aten.cumsum"),
        (lambda x: x**1.3, "aten.pow"),
        (lambda x: torch.atan2(x, x), "aten.atan2"),
        (lambda x: x // 2, "aten.floor_divide"),
    ],
)
def test_unsupported_op_names_the_op(
    shared: mpc.SharedTensor, fn: Callable[[Any], Any], name: str
) -> None:
    with pytest.raises(mpc.UnsupportedOpError, match=f"{name}.* is not supported") as info:
        fn(shared)
    assert info.value.op.startswith(name)
    assert isinstance(info.value, NotImplementedError)  # torch's convention for missing ops


def test_unsupported_variants_say_why(workers: tuple[Any, ...], shared: mpc.SharedTensor) -> None:
    alice, bob, carol, _ = workers

    def img() -> mpc.SharedTensor:
        return mpc.share(torch.randn(1, 1, 5, 5), alice, bob, crypto_provider=carol)

    with pytest.raises(mpc.UnsupportedOpError, match="dilation and ceil_mode"):
        F.max_pool2d(img(), 2, dilation=2)
    with pytest.raises(mpc.UnsupportedOpError, match="dilation and ceil_mode"):
        F.max_pool2d(img(), 2, ceil_mode=True)
    with pytest.raises(mpc.UnsupportedOpError, match="transposed convolution"):
        F.conv_transpose2d(img(), torch.randn(1, 1, 2, 2))
    with pytest.raises(mpc.UnsupportedOpError, match="training mode"):
        nn.BatchNorm2d(1).train()(img())
    with pytest.raises(mpc.UnsupportedOpError, match="aten.div.Tensor_mode|rounding modes"):
        torch.div(shared, 2, rounding_mode="floor")
    # (addmm with beta and alpha other than 1 is supported since issue 23: test_hf_ops.py)


def test_secret_indices_are_refused(workers: tuple[Any, ...], shared: mpc.SharedTensor) -> None:
    alice, bob, carol, _ = workers
    index = mpc.share(torch.tensor([0, 2]), alice, bob, crypto_provider=carol)
    with pytest.raises(mpc.UnsupportedOpError, match="indices must be public"):
        shared[index]
    with pytest.raises(mpc.UnsupportedOpError, match="indices must be public"):
        torch.tensor([5.0, 6.0, 7.0])[index]


# ---------------------------------------------------------------- reading a secret


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda x: bool(x[0]), id="bool"),
        pytest.param(lambda x: x[0].item(), id="item"),
        pytest.param(lambda x: float(x[0]), id="float"),
        pytest.param(lambda x: int(x[0]), id="int"),
        pytest.param(lambda x: x.tolist(), id="tolist"),
        pytest.param(lambda x: x.numpy(), id="numpy"),
        pytest.param(lambda x: 1 if x[0] > 0 else 0, id="if"),
        pytest.param(lambda x: torch.equal(x, x), id="equal"),
    ],
)
def test_reading_a_secret_value_raises(
    shared: mpc.SharedTensor, read: Callable[[Any], Any]
) -> None:
    with pytest.raises(mpc.MPCError, match=r"needs? the secret value.*\.get\(\)"):
        read(shared)
    # the shares are untouched: the value is still there to get()
    assert shared.get().tolist() == [1.5, -2.0, 3.0]


def test_repr_and_pickle_do_not_reveal(shared: mpc.SharedTensor) -> None:
    text = repr(shared) + str(shared) + f"{shared}"
    assert "1.5" not in text and "SharedTensor" in text and "alice" in text
    with pytest.raises(mpc.MPCError, match="cannot be pickled"):
        pickle.dumps(shared)


# ------------------------------------------------------------------------ division


def test_division_by_a_shared_value_with_rounding_is_unsupported(
    shared: mpc.SharedTensor,
) -> None:
    # true division by a shared value works (issue 13: tests/test_mpc_functions.py)
    with pytest.raises(mpc.UnsupportedOpError, match="aten.div.Tensor_mode"):
        torch.div(shared, shared, rounding_mode="floor")


def test_division_by_public_zero_raises(shared: mpc.SharedTensor) -> None:
    with pytest.raises(ZeroDivisionError):
        shared / 0
    with pytest.raises(ZeroDivisionError):
        shared / torch.tensor([1.0, 0.0, 2.0])


# -------------------------------------------------------------- sharing twice, remote


def test_sharing_a_shared_tensor_raises(workers: tuple[Any, ...], shared: mpc.SharedTensor) -> None:
    alice, bob, carol, dan = workers
    with pytest.raises(mpc.MPCError, match="already secret-shared"):
        mpc.share(shared, alice, bob, crypto_provider=carol)
    with pytest.raises(mpc.MPCError, match="already secret-shared"):
        mpc.share(shared, alice, dan, crypto_provider=carol)


def test_sharing_a_pointer_is_split_at_its_worker(workers: tuple[Any, ...]) -> None:
    # issue 16: the worker holding it splits it (floats); integers are refused clearly
    alice, bob, carol, _ = workers
    ptr = pt.send(torch.ones(2), alice)
    owned = mpc.share(ptr, alice, bob, crypto_provider=carol)
    with pytest.raises(mpc.ReleaseRuleError, match="opens only a sum"):  # alice's value
        owned.get().get()  # (the first get() is PySyft's fetch: the value stays shared)
    other = mpc.share(pt.send(torch.ones(2), bob), alice, bob, crypto_provider=carol)
    assert torch.equal((owned + other).get(), 2 * torch.ones(2))
    with pytest.raises(mpc.MPCError, match="remote tensor shares floats"):
        mpc.share(pt.send(torch.ones(2, dtype=torch.int64), alice), alice, bob)


def test_pointer_operands_are_refused(workers: tuple[Any, ...], shared: mpc.SharedTensor) -> None:
    alice = workers[0]
    ptr = pt.send(torch.ones(3), alice)
    for op in (lambda: shared + ptr, lambda: shared * ptr):
        with pytest.raises(mpc.MPCError, match="PointerTensor at 'alice'"):
            op()


def test_errors_come_before_data_moves(workers: tuple[Any, ...]) -> None:
    """A product without a dealer fails before any party is sent anything."""
    alice, bob, _, _ = workers
    x = mpc.share(torch.tensor([1.5, -2.0]), alice, bob)
    before = party_messages(alice, bob)
    with pytest.raises(mpc.CryptoProviderRequired):
        x * x
    with pytest.raises(mpc.CryptoProviderRequired):
        x @ x
    assert party_messages(alice, bob) == before


def test_a_model_at_its_owners_worker_is_refused_clearly(workers: tuple[Any, ...]) -> None:
    """Issue 23, point 3: a model at a worker whose owner approved no computation on it
    (mpc.approve, mpc.offer) is refused by that worker, with the reason, before any share
    of it leaves (tests/test_held_models.py has the approved deployment)."""
    alice, bob, carol, dan = workers
    model = nn.Linear(3, 2)
    pt.send(model, dan)  # the client's own model at dan: not an owner's
    with pytest.raises(mpc.MPCError, match="shared by its owner"):
        mpc.share(model, alice, bob, crypto_provider=carol)
    offered = mpc.offered(nn.Linear(3, 2), dan)  # as if dan's owner offered it: it did not
    with pytest.raises(
        (RemoteError, NotAllowedError, mpc.MPCError),
        match="approves no computation|offers the model there first",
    ):
        mpc.share(offered, alice, bob, crypto_provider=carol)
    for w in (alice, bob):  # no share of the weight (2, 3) reached a party (in process)
        if isinstance(w, pt.VirtualWorker):
            assert not any(
                isinstance(v, torch.Tensor) and tuple(v.shape) == (2, 3)
                for v in w.store.view().values()
            )
