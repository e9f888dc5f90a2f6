"""Every op in the mpc registry has a differential test against plaintext torch.

The samples below run on shared values and on plaintext; the registry's handlers are
wrapped so that the test sees which aten overloads each sample really reached. An op
added to the registry without a sample here fails ``test_every_registered_op_is_covered``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import mpc
import pointers as pt
from mpc.registry import OPS

Sample = tuple[str, Callable[..., Any], list[tuple[int, ...]]]
aten = torch.ops.aten


def _value(out: Any) -> Any:
    if isinstance(out, mpc.SharedTensor):
        return out.get()
    if isinstance(out, tuple | list):
        return type(out)(_value(o) for o in out)
    return out


SAMPLES: list[Sample] = [
    (
        "add sub neg rsub",
        lambda a, b: (a + b) - (-a) + (1.5 - b) + (a - 2.0) + (a + 1),
        [(3, 4)] * 2,
    ),
    (
        "in place arith",
        lambda a, b: a.add_(b).sub_(b).mul_(2.0).div_(4.0).add_(1.0).sub_(0.5).neg_(),
        [(3, 4)] * 2,
    ),
    ("in place products", lambda a, b: a.mul_(b), [(3, 4)] * 2),
    ("in place div by shared count", lambda a: a.div_(torch.tensor(2.0)), [(3, 4)]),
    ("mul div", lambda a, b: a * b * 0.5 / 2.0 + a / torch.tensor(4.0), [(3, 4)] * 2),
    (
        "matmul family",
        lambda a, b: (a @ b.t()).sum() + (a[0] @ b[1]) + (a @ b[0]).sum(),
        [(3, 4)] * 2,
    ),
    (
        "addmm bmm",
        lambda a, b: (
            torch.addmm(a[:, :3], a, b.t())
            + torch.bmm(a.unsqueeze(0), b.t().unsqueeze(0)).squeeze(0)
        ),
        [(3, 4)] * 2,
    ),
    ("linear", lambda a, b: F.linear(a, b, b[:, 0]), [(3, 4), (2, 4)]),
    ("conv", lambda a, w: F.conv2d(a, w, padding=1), [(1, 2, 5, 5), (3, 2, 3, 3)]),
    (
        "comparisons",
        lambda a, b: sum(
            c * 1.0
            for c in (
                a < b,
                a > b,
                a <= b,
                a >= b,
                a == a,
                a != b,
                a < 0.1,
                a > 0.1,
                a <= 0.0,
                a >= 0.0,
                a == 0.5,
                a != 0.5,
            )
        ),
        [(3, 4)] * 2,
    ),
    ("relu", lambda a: F.relu(a) + torch.relu_(a.clone()), [(3, 4)]),
    ("max min", lambda a: a.max() + a.min() + a.amax(dim=1).sum() + a.amin(dim=0).sum(), [(3, 4)]),
    ("max min dim", lambda a: a.max(dim=1).values + a.min(dim=1).values, [(3, 4)]),
    ("argmax argmin", lambda a: a.argmax(dim=1) + a.argmin(dim=0).sum(), [(3, 4)]),
    (
        "pooling",
        lambda a: (
            F.max_pool2d(a, 2).sum()
            + F.avg_pool2d(a, 2).sum()
            + F.adaptive_avg_pool2d(a, 1).sum()
            + F.max_pool2d(a, 2, return_indices=True)[0].sum()
        ),
        [(1, 2, 4, 4)],
    ),
    (
        "means sums",
        lambda a: a.mean() + a.mean(dim=1).sum() + a.sum() + a.sum(dim=0).sum(),
        [(3, 4)],
    ),
    (
        "shapes",
        lambda a: a.view(4, 3).t().reshape(12).unsqueeze(0).squeeze(0).flatten().contiguous(),
        [(3, 4)],
    ),
    (
        "shapes 2",
        lambda a: a.permute(1, 0).transpose(0, 1).expand(2, 3, 4).movedim(0, 2).squeeze(),
        [(3, 4)],
    ),
    ("squeeze dims", lambda a: a.unsqueeze(0).unsqueeze(0).squeeze((0, 1)).squeeze(0), [(1, 4)]),
    (
        "indexing",
        lambda a: (
            a[1]
            + a[:, 2].sum()
            + a[0, 1:3].sum()
            + a.narrow(1, 0, 2).sum()
            + a[torch.tensor([0, 2])].sum()
        ),
        [(3, 4)],
    ),
    (
        "joins and splits",
        lambda a, b: (
            torch.cat([a, b]).sum()
            + torch.stack([a, b]).sum()
            + sum(t.sum() for t in a.split(2, dim=1))
            + sum(t.sum() for t in a.chunk(2, dim=1))
            + sum(t.sum() for t in torch.unbind(a))
            + sum(t.sum() for t in a.split([1, 3], dim=1))
        ),
        [(3, 4)] * 2,
    ),
    ("moves", lambda a: a.flip(0).roll(1, 1).repeat(2, 1)[:3], [(3, 4)]),
    ("pad unfold", lambda a: F.pad(a, (1, 1)).unfold(1, 2, 2).sum(-1), [(3, 4)]),
    ("copies", lambda a: a.clone().detach().to(torch.float32).view_as(a), [(3, 4)]),
    (
        "batch norm eval",
        lambda a: F.batch_norm(
            a, torch.zeros(2), torch.ones(2), torch.ones(2), torch.zeros(2), training=False
        ),
        [(3, 2, 2, 2)],
    ),
    ("batch norm module eval", None, [(3, 2, 2, 2)]),  # filled in below (needs sharing a module)
    ("scalars", lambda a: a.sum().reshape(1), [(3, 4)]),
    # overloads that torch's Python layer does not emit for these calls, called directly
    # (composite ones such as aten.chunk or aten.max_pool2d decompose before dispatch: the
    # registry holds none of those)
    (
        "scalar overloads",
        lambda a, b: (
            aten.add.Scalar(a, 1.5)
            + aten.sub.Scalar(a, 0.5)
            + aten.mul.Scalar(a, 3)
            + aten.div.Scalar(a, 4.0)
            + aten.rsub.Tensor(a, b)
        ),
        [(3, 4)] * 2,
    ),
    (
        "in place scalar overloads",
        lambda a: aten.div_.Scalar(
            aten.mul_.Scalar(aten.sub_.Scalar(aten.add_.Scalar(a, 1.5), 0.5), 3), 4.0
        ),
        [(3, 4)],
    ),
    (
        "view overloads",
        lambda a: (
            aten.alias(a)
            + aten.contiguous(a)
            + aten.flatten.using_ints(a.unsqueeze(0), 0, 1)
            + aten.narrow(a, 0, 0, 3)
            + sum(aten.chunk(a, 1))
            + aten._to_copy(a)
        ),
        [(3, 4)],
    ),
    (
        "pool overloads",
        lambda a: (
            aten.max_pool2d(a, [2, 2]).sum()
            + aten.adaptive_avg_pool2d(a, [1, 1]).sum()
            + aten._adaptive_avg_pool2d(a, [2, 2]).sum()
        ),
        [(1, 2, 4, 4)],
    ),
    # training (mpc.ops.backward): creation, ReLU's backward with and without a kept bit,
    # losses and their backward ops
    (
        "creation",
        lambda a: (
            torch.ones_like(a) + torch.zeros_like(a) + a.new_zeros((3, 4)) + a.clone().zero_()
        ),
        [(3, 4)],
    ),
    (
        "threshold backward",
        lambda g, b: (
            aten.threshold_backward(g, F.relu(b.detach().requires_grad_()), 0)
            + aten.threshold_backward(g, b, 0.25)
        ).detach(),
        [(3, 4)] * 2,
    ),
    (
        "losses",
        lambda a, b: (
            F.mse_loss(a, b)
            + F.mse_loss(a, b, reduction="sum")
            + aten.mse_loss_backward(torch.tensor(2.0), a, b, 1).sum()
            + F.nll_loss(a, torch.tensor([0, 3, 1]))
            + F.nll_loss(a, torch.tensor([0, 3, 1]), reduction="sum", ignore_index=3)
            + aten.nll_loss_backward(
                torch.tensor(1.5), a, torch.tensor([0, 3, 1]), None, 1, -100, torch.tensor(3.0)
            ).sum()
        ),
        [(3, 4)] * 2,
    ),
    (
        "softmax backward",
        lambda g, o: (
            aten._softmax_backward_data(g, o, 1, torch.float32)
            + aten._log_softmax_backward_data(g, o - 2.0, 1, torch.float32)
        ),
        [(3, 4)] * 2,
    ),
    # optimizer updates (Adam: lerp_, addcmul_, addcdiv_) and max-pool's backward with the
    # argmax its forward kept
    (
        "optimizer updates",
        lambda a, b, c: (
            torch.lerp(a, b, 0.3)
            + torch.lerp(a, b, torch.full((3, 4), 0.25))
            + torch.addcmul(a, b, c, value=0.5)
            + torch.addcdiv(a, b, c * c + 1, value=0.5)
            + a.clone().lerp_(b, 0.3)
            + a.clone().lerp_(b, torch.full((3, 4), 0.75))
            + a.clone().addcmul_(b, c, value=2.0)
            + a.clone().addcdiv_(b, c * c + 1, value=-0.5)
        ),
        [(3, 4)] * 3,
    ),
    (
        "max pool backward",
        lambda g, x: aten.max_pool2d_with_indices_backward(
            g,
            x,
            [2, 2],
            [2, 2],
            [0, 0],
            [1, 1],
            False,
            F.max_pool2d(x.detach().requires_grad_(), 2, return_indices=True)[1],
        ).detach(),
        [(1, 2, 2, 3), (1, 2, 4, 6)],
    ),
    (
        "convolution backward",
        lambda g, x, w: sum(
            t.sum()
            for t in aten.convolution_backward(
                g, x, w, [3], [1, 1], [1, 1], [1, 1], False, [0, 0], 1, [True, True, True]
            )
        ),
        [(2, 3, 4, 4), (2, 2, 4, 4), (3, 2, 3, 3)],
    ),
    (
        "batch norm overload",
        lambda a: aten._native_batch_norm_legit_no_training(
            a,
            torch.full((2,), 2.0),
            torch.full((2,), 0.5),
            torch.zeros(2),
            torch.ones(2),
            0.1,
            1e-5,
        )[0],
        [(3, 2, 2, 2)],
    ),
    # issue 13: non-linear functions (mpc.ops.functions)
    (
        "pow abs sign clamp",
        lambda a, b: (
            a**2
            + a**3
            + (a * a + 1) ** -1
            + (a * a + 1) ** 0.5
            + (a * a + 1) ** -0.5
            + a**0
            + a**1
            + 2.0**a
            + a.abs()
            + a.sign()
            + a.clamp(-0.5, 0.5)
            + torch.clamp(a, min=b)
            + a.clamp(max=0.3)
            + a.clamp_min(0.1)
            + a.clamp_max(0.1)
            + aten.clamp_min.Tensor(a, b)
            + aten.clamp_max.Tensor(a, b)
            + F.hardtanh(a)
        ),
        [(3, 4)] * 2,
    ),
    ("where", lambda a, b: torch.where(a > b, a, b) + torch.where(a > 0, 1.0, -1.0), [(3, 4)] * 2),
    (
        "exp log reciprocal sqrt div",
        lambda a, b: (
            a.exp()
            + (a * a + 0.5).log()
            + (b * b + 0.5).reciprocal()
            + (a * a + 0.5).sqrt()
            + (a * a + 0.5).rsqrt()
            + a / (b * b + 0.5)
            + 2.0 / (b * b + 0.5)
        ),
        [(3, 4)] * 2,
    ),
    (
        "sigmoid tanh gelu silu",
        lambda a: (
            torch.sigmoid(a) + torch.tanh(a) + F.gelu(a) + F.gelu(a, approximate="tanh") + F.silu(a)
        ),
        [(3, 4)],
    ),
    (
        "softmax log_softmax",
        lambda a: F.softmax(a, dim=1) + F.log_softmax(a, dim=0).t().t() + aten._safe_softmax(a, 1),
        [(3, 4)],
    ),
    (
        "var std layer norm",
        lambda a: (
            a.var(dim=1).sum()
            + a.std(dim=0).sum()
            + torch.var_mean(a, dim=1)[0].sum()
            + F.layer_norm(a, (4,))
        ),
        [(3, 4)],
    ),
    (
        "attention",
        lambda q, k: F.scaled_dot_product_attention(q, k, k),
        [(1, 2, 3, 4)] * 2,
    ),
    (
        "embedding gather index_select (public indices)",
        lambda a: (
            F.embedding(torch.tensor([2, 0]), a)
            + torch.gather(a, 0, torch.tensor([[1, 0, 2, 1], [0, 0, 1, 2]]))
            + torch.index_select(a, 0, torch.tensor([1, 2]))
        ),
        [(3, 4)],
    ),
    (
        "masked_fill baddbmm (public masks)",
        lambda a, b: (
            a.masked_fill(torch.tensor([True, False, False, True]), -1.5)
            + a.masked_fill(torch.tensor([False, True, False, False]), torch.tensor(0.5))
            + torch.baddbmm(a.unsqueeze(0), a.unsqueeze(0), b.unsqueeze(0), beta=0.5).squeeze(0)
        ),
        [(3, 4), (4, 4)],
    ),
]


def _batch_norm_module(a: Any, parties: list[Any], dealer: Any) -> Any:
    bn = torch.nn.BatchNorm2d(2).eval()
    with torch.no_grad():
        bn.running_mean.copy_(torch.tensor([0.5, -0.5]))
        bn.running_var.copy_(torch.tensor([2.0, 0.5]))
    return bn


@pytest.fixture(scope="module")
def group() -> tuple[list[Any], Any]:
    return [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")], pt.VirtualWorker("carol")


class _Seen:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ops: set[Any] = set()
        for op, handler in list(OPS.items()):
            monkeypatch.setitem(OPS, op, self._wrap(op, handler))

    def _wrap(self, op: Any, handler: Any) -> Any:
        def spy(func: Any, args: Any, kwargs: Any) -> Any:
            self.ops.add(op)
            return handler(func, args, kwargs)

        return spy


def _run_sample(name: str, fn: Any, shapes: list[tuple[int, ...]], group: Any) -> None:
    parties, dealer = group
    gen = torch.Generator().manual_seed(hash(name) % 1000)
    plain = [torch.randn(s, generator=gen) for s in shapes]
    if fn is None:  # a shared batch-norm module in eval mode (folded, see mpc.api)
        bn_plain = _batch_norm_module(None, parties, dealer)
        bn_shared = _batch_norm_module(None, parties, dealer)
        mpc.share(bn_shared, *parties, crypto_provider=dealer)
        expected = bn_plain(plain[0])
        got = bn_shared(mpc.share(plain[0], *parties, crypto_provider=dealer)).get()
        assert torch.allclose(got, expected.detach(), atol=1e-3)
        return
    shared = [mpc.share(t, *parties, crypto_provider=dealer) for t in plain]
    expected = fn(*[t.clone() for t in plain])
    got = _value(fn(*shared))
    if isinstance(expected, torch.Tensor) and expected.dtype == torch.bool:
        expected = expected.to(torch.int64)
    expected_t = torch.as_tensor(expected, dtype=torch.float64)
    got_t = torch.as_tensor(got, dtype=torch.float64)
    assert got_t.shape == expected_t.shape, name
    assert torch.allclose(got_t, expected_t, atol=5e-3), (name, got_t, expected_t)


@pytest.mark.parametrize("sample", SAMPLES, ids=[s[0] for s in SAMPLES])
def test_sample_matches_plaintext(sample: Sample, group: Any) -> None:
    _run_sample(*sample, group)


def test_every_registered_op_is_covered(monkeypatch: pytest.MonkeyPatch, group: Any) -> None:
    seen = _Seen(monkeypatch)
    for sample in SAMPLES:
        _run_sample(*sample, group)
    x = mpc.share(torch.tensor([0.5]), *group[0], crypto_provider=group[1])
    refusing = (
        lambda: bool(x),
        lambda: float(x),
        lambda: torch.equal(x, x),
        lambda: aten.is_nonzero(x),
    )
    for probe in refusing:
        with pytest.raises(mpc.MPCError):  # the ops that would reveal a value refuse
            probe()
    missing = sorted(str(op) for op in set(OPS) - seen.ops)
    assert not missing, f"registered ops without a differential sample: {missing}"
