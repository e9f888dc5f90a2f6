"""Property tests: op(pointers).get() equals op(local) exactly, for many ops and shapes."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import pointers as pt

FLOAT_DTYPES = [torch.float32, torch.float64]
INT_DTYPES = [torch.int64, torch.int32]

shapes = st.lists(st.integers(1, 5), min_size=1, max_size=3).map(tuple)


@st.composite
def tensors(draw, dtypes=FLOAT_DTYPES + INT_DTYPES, shape=None):
    dtype = draw(st.sampled_from(dtypes))
    shape = draw(shapes) if shape is None else shape
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if dtype.is_floating_point:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


def _same(a, b):
    if isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _same(x, y)
        return
    assert type(a) is torch.Tensor, type(a)
    assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(a, b) or (
        a.is_floating_point() and torch.equal(torch.isnan(a), torch.isnan(b))
    ), (a, b)


def _get(x):
    if isinstance(x, tuple | list):
        return type(x)(_get(v) for v in x)
    return x.get()


UNARY = {
    "abs": torch.abs,
    "neg": torch.neg,
    "relu": F.relu,
    "add_self": lambda x: x + x,
    "mul_scalar": lambda x: x * 3,
    "sub_scalar": lambda x: x - 2,
    "sum": torch.sum,
    "sum_dim": lambda x: x.sum(dim=0),
    "amax": lambda x: x.amax(dim=-1),
    "max_dim": lambda x: x.max(dim=0),
    "cumsum": lambda x: torch.cumsum(x, dim=-1),
    "flatten": torch.flatten,
    "reshape": lambda x: x.reshape(-1),
    "view": lambda x: x.view(-1, 1),
    "transpose": lambda x: x.transpose(0, -1),
    "permute": lambda x: x.permute(*reversed(range(x.dim()))),
    "index0": lambda x: x[0],
    "slice": lambda x: x[..., ::2],
    "neg_index": lambda x: x[-1:],
    "clone": torch.clone,
    "unsqueeze": lambda x: x.unsqueeze(0),
    "expand": lambda x: x.unsqueeze(0).expand(2, *x.shape),
    "cat": lambda x: torch.cat([x, x], dim=0),
    "stack": lambda x: torch.stack([x, x]),
    "split": lambda x: torch.split(x, 1, dim=0),
    "sort": lambda x: torch.sort(x, dim=-1),
    "gt_zero": lambda x: x > 0,
    "where": lambda x: torch.where(x > 0, x, x * 2),
    "square": lambda x: x * x,
    "pad": lambda x: F.pad(x, (1, 1)),
    "to_double": lambda x: x.to(torch.float64),
    "contiguous_t": lambda x: x.t().contiguous() if x.dim() <= 2 else x.contiguous(),
}


@settings(max_examples=25, deadline=None)
@given(x=tensors(), name=st.sampled_from(sorted(UNARY)))
def test_unary_ops_match_local(x, name):
    alice = pt.VirtualWorker("alice")
    fn = UNARY[name]
    expected = fn(x)
    got = _get(fn(pt.send(x, alice)))
    _same(got, expected)


@settings(max_examples=30, deadline=None)
@given(data=st.data(), op=st.sampled_from(["add", "sub", "mul", "max", "min", "eq", "lt"]))
def test_binary_ops_match_local(data, op):
    shape = data.draw(shapes)
    dtype = data.draw(st.sampled_from(FLOAT_DTYPES + INT_DTYPES))
    x = data.draw(tensors(dtypes=[dtype], shape=shape))
    y = data.draw(tensors(dtypes=[dtype], shape=shape))
    fn = {
        "add": torch.add,
        "sub": torch.sub,
        "mul": torch.mul,
        "max": torch.maximum,
        "min": torch.minimum,
        "eq": torch.eq,
        "lt": torch.lt,
    }[op]
    alice = pt.VirtualWorker("alice")
    _same(fn(pt.send(x, alice), pt.send(y, alice)).get(), fn(x, y))
    # a local operand travels with the command as a constant
    _same(fn(pt.send(x, alice), y).get(), fn(x, y))


@settings(max_examples=25, deadline=None)
@given(
    m=st.integers(1, 6),
    k=st.integers(1, 6),
    n=st.integers(1, 6),
    b=st.integers(1, 3),
    dtype=st.sampled_from(FLOAT_DTYPES + [torch.int64]),
)
def test_matmul_family(m, k, n, b, dtype):
    g = torch.Generator().manual_seed(m * 100 + k * 10 + n)
    a = torch.randint(-9, 9, (b, m, k), generator=g).to(dtype)
    w = torch.randint(-9, 9, (b, k, n), generator=g).to(dtype)
    alice = pt.VirtualWorker("alice")
    pa, pw = pt.send(a, alice), pt.send(w, alice)
    _same((pa @ pw).get(), a @ w)
    _same(torch.bmm(pa, pw).get(), torch.bmm(a, w))
    _same(torch.mm(pa[0], pw[0]).get(), torch.mm(a[0], w[0]))
    if dtype.is_floating_point:
        bias = torch.ones(n, dtype=dtype)
        lin_w = w[0].t().contiguous()
        _same(
            F.linear(pa[0], pt.send(lin_w, alice), pt.send(bias, alice)).get(),
            F.linear(a[0], lin_w, bias),
        )


@settings(max_examples=25, deadline=None)
@given(
    x=tensors(dtypes=FLOAT_DTYPES + INT_DTYPES),
    op=st.sampled_from(["add_", "mul_", "zero_", "clamp_", "index_put", "neg_"]),
)
def test_inplace_ops_update_the_remote_object(x, op):
    alice = pt.VirtualWorker("alice")
    p = pt.send(x, alice)
    local = x.clone()
    for t in (p, local):
        if op == "add_":
            r = t.add_(2)
        elif op == "mul_":
            r = t.mul_(3)
        elif op == "zero_":
            r = t.zero_()
        elif op == "clamp_":
            r = t.clamp_(min=0)
        elif op == "neg_":
            r = t.neg_()
        else:
            t[0] = 7
            r = t
        assert r is t
    _same(p.get(), local)


def test_views_share_storage_at_the_worker(alice):
    x = torch.arange(6.0)
    p = pt.send(x, alice)
    v = p.view(2, 3)
    v[0, 0] = 100.0  # writes through the view into p's storage at the worker
    local = x.clone()
    local.view(2, 3)[0, 0] = 100.0
    _same(p.get(), local)


def test_conv_and_pool(alice):
    x = torch.randn(2, 3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    px, pw = pt.send(x, alice), pt.send(w, alice)
    _same(F.conv2d(px, pw, padding=1).get(), F.conv2d(x, w, padding=1))
    _same(F.max_pool2d(px, 2).get(), F.max_pool2d(x, 2))
    _same(F.avg_pool2d(px, 2).get(), F.avg_pool2d(x, 2))


def test_ops_unknown_to_meta_raise_clear_error(alice):
    p = pt.send(torch.tensor([0.0, 1.0, 2.0]), alice)
    with pytest.raises(pt.PointerError, match="nonzero"):
        torch.nonzero(p)
