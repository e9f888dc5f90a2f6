"""Property tests of every secure op: the reconstructed result against plaintext torch.

Each test shares random small tensors among 2 and 3 fresh parties (plus a crypto provider)
of either worker kind (in process, or network workers on loopback: see conftest.py), runs
the op on the ``SharedTensor`` and compares ``get()`` with the same op on the plaintext in
float64.

Tolerances are derived from the fixed-point encoding (``F`` = 16 fractional bits, one unit
``U = 2**-16``), never a loose constant:

* encoding a float rounds to the nearest unit: error ``ENC = U / 2`` per input value;
* one truncation after a product adds at most ``TRUNC = U`` (the documented bound);
* so a product of encoded ``x`` and ``y`` is off by at most
  ``ENC * (|x| + |y|) + ENC**2 + TRUNC``, a sum of ``K`` products (matmul, convolution)
  by ``ENC * (sum |x| + sum |y|) + K * ENC**2 + TRUNC``;
* a public divisor ``d`` is encoded as ``1 / d``, so ``x / d`` is off by
  ``ENC * (|x| + 1 / |d|) + TRUNC`` plus the input's own error divided by ``|d|``;
* selections (ReLU, max, max-pooling) pick an encoded input exactly: error ``ENC``;
* the float32 result of ``get()`` adds a relative ``2**-24`` (we allow ``2**-23``).

Integer tensors are shared exactly, so integer results must match exactly; comparisons
must be exact whenever the operands differ by more than ``2**-14``.
"""

from __future__ import annotations

import copy
import functools
import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mpc

U = 2.0**-16  # one unit of the fixed-point encoding
ENC = U / 2  # rounding error of encoding one float
TRUNC = U  # error of one truncation after a product
F32 = 2.0**-23  # relative rounding of a float32 result (half an ulp is 2**-24)
SEP = 2.0**-14  # comparisons must be exact when the operands are further apart
BOUND = 10.0  # float inputs lie in [-BOUND, BOUND]

SETTINGS = settings(
    max_examples=6,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
FEW = settings(SETTINGS, max_examples=4)


class Parties:
    """Fresh parties and a crypto provider; ``share`` secret-shares a tensor among them.

    In-process parties run one after the other with 2 parties, and concurrently (one thread
    each, see pointers.concurrently) with 3, whatever the size: both modes see every test.
    """

    def __init__(self, make_worker: Callable[[str], Any], n: int, kind: str) -> None:
        self.workers = [make_worker(f"party{i}") for i in range(n)]
        self.dealer = make_worker("dealer")
        self.kind = kind
        self.config = mpc.MPCConfig(concurrent_from=0 if n == 3 else None)

    def share(self, t: Any) -> mpc.SharedTensor:
        return mpc.share(t, *self.workers, crypto_provider=self.dealer, config=self.config)

    def share_model(self, m: nn.Module) -> nn.Module:
        return mpc.share(m, *self.workers, crypto_provider=self.dealer, config=self.config)


@pytest.fixture(params=[2, 3], ids=lambda n: f"{n}parties")
def mp(
    request: pytest.FixtureRequest, make_worker: Callable[[str], Any], worker_kind: str
) -> Parties:
    return Parties(make_worker, request.param, worker_kind)


def property_test(
    examples: settings,
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``@examples @given(data=st.data())`` on in-process parties; on network parties, where
    every op crosses loopback, half as many examples (rounded up) keep the suite's runtime in
    check. The same test, strategies and tolerances run on both kinds."""

    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        network = settings(examples, max_examples=-(-examples.max_examples // 2))
        by_kind = {
            "virtual": examples(given(data=st.data())(test)),
            "network": network(given(data=st.data())(test)),
        }

        @functools.wraps(test, updated=())
        def run(mp: Parties, **kwargs: Any) -> None:
            by_kind[mp.kind](mp=mp, **kwargs)

        run.__signature__ = inspect.signature(by_kind["virtual"])  # type: ignore[attr-defined]
        return run

    return decorate


# ------------------------------------------------------------------------------ helpers


def reveal(s: Any) -> torch.Tensor:
    """Reconstruct a result, checking that it really is secret-shared."""
    assert isinstance(s, mpc.SharedTensor), f"expected a SharedTensor, got {type(s).__name__}"
    out = s.get()
    assert type(out) is torch.Tensor
    return out


def check(got: Any, ref: torch.Tensor, tol: Any, dtype: torch.dtype | None = torch.float32) -> None:
    """|got - ref| <= tol (+ float32 rounding of the result), elementwise."""
    value = reveal(got)
    assert tuple(value.shape) == tuple(ref.shape), f"shape {tuple(value.shape)} != {ref.shape}"
    if dtype is not None:
        assert value.dtype == dtype, f"dtype {value.dtype} != {dtype}"
    ref64 = ref.detach().double()
    bound = torch.as_tensor(tol, dtype=torch.float64) + F32 * ref64.abs()
    err = (value.double() - ref64).abs()
    bad = err > bound
    if bad.any():
        worst = int((err - bound).argmax())
        raise AssertionError(
            f"{int(bad.sum())}/{err.numel()} elements off: worst error "
            f"{err.flatten()[worst].item() / U:.3f} units vs tolerance "
            f"{bound.broadcast_to(err.shape).flatten()[worst].item() / U:.3f} units"
        )


def check_exact(got: Any, ref: torch.Tensor) -> None:
    value = reveal(got)
    assert value.dtype == ref.dtype, f"dtype {value.dtype} != {ref.dtype}"
    assert tuple(value.shape) == tuple(ref.shape), f"shape {tuple(value.shape)} != {ref.shape}"
    assert torch.equal(value, ref), f"\n{value}\n!=\n{ref}"


def a64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().double().abs()


def draw_shape(data: st.DataObject, min_dims: int = 1, max_dims: int = 3) -> tuple[int, ...]:
    dims = data.draw(st.integers(min_dims, max_dims))
    return tuple(data.draw(st.integers(1, 5 if i == dims - 1 else 4)) for i in range(dims))


def draw_floats(data: st.DataObject, shape: tuple[int, ...], bound: float = BOUND) -> torch.Tensor:
    n = math.prod(shape)
    vals = data.draw(st.lists(st.floats(-bound, bound, width=32), min_size=n, max_size=n))
    return torch.tensor(vals, dtype=torch.float32).reshape(shape)


def draw_ints(data: st.DataObject, shape: tuple[int, ...], bound: int) -> torch.Tensor:
    n = math.prod(shape)
    vals = data.draw(st.lists(st.integers(-bound, bound), min_size=n, max_size=n))
    return torch.tensor(vals, dtype=torch.int64).reshape(shape)


def draw_distinct(data: st.DataObject, shape: tuple[int, ...]) -> torch.Tensor:
    """Floats in [-BOUND, BOUND], pairwise at least 0.01 apart (no ties for max/argmax)."""
    n = math.prod(shape)
    vals = data.draw(st.lists(st.integers(-1000, 1000), min_size=n, max_size=n, unique=True))
    return (torch.tensor(vals, dtype=torch.float64) * (BOUND / 1000)).float().reshape(shape)


def draw_mask(data: st.DataObject, shape: tuple[int, ...]) -> torch.Tensor:
    n = math.prod(shape)
    return torch.tensor(data.draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(shape)


def draw_scalar(data: st.DataObject, low: float = 0.0) -> float:
    """A float scalar with |c| in [low, BOUND] that is not an integer."""
    c = data.draw(st.floats(low, BOUND, width=32).filter(lambda v: v != int(v)))
    return c if data.draw(st.booleans()) else -c


def draw_broadcast_shape(data: st.DataObject, shape: tuple[int, ...]) -> tuple[int, ...]:
    """A shape that broadcasts with ``shape``: a suffix of it with some sides set to 1."""
    k = data.draw(st.integers(1, len(shape)))
    return tuple(1 if data.draw(st.booleans()) else s for s in shape[len(shape) - k :])


def separated(x: torch.Tensor, y: torch.Tensor | float) -> torch.Tensor:
    """y moved away from x where they are within SEP (comparisons must then be exact)."""
    y = torch.as_tensor(y, dtype=x.dtype).expand_as(x) if not isinstance(y, torch.Tensor) else y
    close = (x.double() - y.double()).abs() <= SEP
    return torch.where(close, x + 0.5, y)


def product_tol(x: Any, y: Any) -> torch.Tensor:
    """Error bound of an encoded elementwise product followed by one truncation."""
    ax = a64(x) if isinstance(x, torch.Tensor) else abs(x)
    ay = a64(y) if isinstance(y, torch.Tensor) else abs(y)
    return torch.as_tensor(ENC * (ax + ay) + ENC**2 + TRUNC, dtype=torch.float64)


def matmul_tol(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Error bound of a truncated ring matmul of encoded a and b: K products summed."""
    ones_a, ones_b = (
        torch.ones_like(a, dtype=torch.float64),
        torch.ones_like(b, dtype=torch.float64),
    )
    k = a.shape[-1]
    return ENC * (torch.matmul(a64(a), ones_b) + torch.matmul(ones_a, a64(b))) + k * ENC**2 + TRUNC


# ------------------------------------------------------------- addition and subtraction


@property_test(SETTINGS)
def test_add_sub_neg_shared_shared(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    y = draw_floats(data, draw_broadcast_shape(data, shape))
    if data.draw(st.booleans()):
        x, y = y, x  # the smaller operand on either side
    xs, ys = mp.share(x), mp.share(y)
    two_inputs = 2 * ENC  # each operand was rounded once
    check(xs + ys, x.double() + y.double(), two_inputs)
    check(xs - ys, x.double() - y.double(), two_inputs)
    check(ys - xs, y.double() - x.double(), two_inputs)
    check(torch.add(xs, ys, alpha=3), x.double() + 3 * y.double(), ENC + 3 * ENC)
    check(-xs, -x.double(), ENC)


@property_test(SETTINGS)
def test_add_sub_public(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    c = draw_scalar(data)
    k = data.draw(st.integers(-100, 100))
    p = draw_floats(data, draw_broadcast_shape(data, shape))
    q = draw_floats(data, (2, *shape))  # broadcasting grows the result
    xs = mp.share(x)
    x64, p64, q64 = x.double(), p.double(), q.double()
    c32 = float(torch.tensor(c, dtype=torch.float32))
    two = 2 * ENC
    check(xs + c, x64 + c32, two)
    check(c + xs, x64 + c32, two)
    check(xs - c, x64 - c32, two)
    check(c - xs, c32 - x64, two)
    check(xs + k, x64 + k, ENC)
    check(k - xs, k - x64, ENC)
    check(xs + p, x64 + p64, two)
    check(p - xs, p64 - x64, two)
    check(xs - q, x64 - q64, two)
    check(q + xs, q64 + x64, two)


# -------------------------------------------------------------------------- products


@property_test(SETTINGS)
def test_truncation_is_floor_or_one_less_over_the_whole_range(
    mp: Parties, data: st.DataObject
) -> None:
    """The ring-level truncation: for any |z| < 2^62 and any shift, z >> bits is exact up to
    one unit (floor(z / 2^bits) or one more), with no wrap-around failure near the ends."""
    from mpc.protocols.truncation.run import truncate

    bits = data.draw(st.integers(1, 40), label="bits")
    edge = st.sampled_from([-(2**62) + 1, -(2**62) + 2**bits, -1, 0, 1, 2**62 - 1])
    zs = data.draw(
        st.lists(st.one_of(st.integers(-(2**62) + 1, 2**62 - 1), edge), min_size=1, max_size=40),
        label="z",
    )
    z = torch.tensor(zs, dtype=torch.int64)
    shared = mp.share(z)  # integers: shared exactly, frac_bits = 0
    out = truncate(shared.session, shared.shares, bits)
    got = sum(s.get() for s in out)
    floor = torch.div(z, 2**bits, rounding_mode="floor")
    diff = floor - got
    assert bool(((diff == 0) | (diff == -1)).all()), (zs, bits, got.tolist())


@property_test(SETTINGS)
def test_mul_shared_shared(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    y = draw_floats(data, draw_broadcast_shape(data, shape))
    if data.draw(st.booleans()):
        x, y = y, x
    xs, ys = mp.share(x), mp.share(y)
    check(xs * ys, x.double() * y.double(), product_tol(x, y))
    check(xs * xs, x.double() ** 2, product_tol(x, x))


@property_test(SETTINGS)
def test_mul_shared_public_float(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    c = draw_scalar(data)
    p = draw_floats(data, draw_broadcast_shape(data, shape))
    xs = mp.share(x)
    x64 = x.double()
    check(xs * c, x64 * c, product_tol(x, c))
    check(c * xs, x64 * c, product_tol(x, c))
    check(xs * p, x64 * p.double(), product_tol(x, p))
    check(p * xs, x64 * p.double(), product_tol(x, p))


@property_test(SETTINGS)
def test_mul_shared_public_int(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    k = data.draw(st.integers(-1000, 1000))
    kt = draw_ints(data, draw_broadcast_shape(data, shape), 50)
    xs = mp.share(x)
    x64 = x.double()
    # an integer multiplies the encoded value exactly: only the input's rounding, scaled
    check(xs * k, x64 * k, ENC * abs(k))
    check(k * xs, x64 * k, ENC * abs(k))
    check(xs * kt, x64 * kt, ENC * kt.abs().double())
    check(xs * float(k), x64 * k, ENC * abs(k))  # an integral float is an integer too


@property_test(SETTINGS)
def test_div_by_public(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    d = draw_scalar(data, low=0.5)
    dt = draw_floats(data, draw_broadcast_shape(data, shape))
    dt = torch.where(dt.abs() < 0.5, dt.sign() + (dt == 0).float(), dt)  # |d| >= 0.5
    n = data.draw(st.integers(1, 12))
    xs = mp.share(x)
    x64 = x.double()

    def div_tol(d: Any) -> Any:
        # (x + e_x) * (1/d + e) truncated: |e_x| / |d| + |x| |e| + |e_x e| + TRUNC, where
        # 1/d is encoded with e extra bits, 2^e <= 1 / max|1/d| (at least f significant
        # bits): |e| <= ENC 2^-e <= ENC min(1, 2 max|1/d|)
        inv = 1 / (a64(d) if isinstance(d, torch.Tensor) else abs(d))
        enc_p = ENC * min(1.0, 2 * float(torch.as_tensor(inv).max()))
        return ENC * inv + enc_p * a64(x) + ENC * enc_p + TRUNC

    check(xs / d, x64 / d, div_tol(d))
    check(xs / n, x64 / n, div_tol(float(n)))
    check(xs / dt, x64 / dt.double(), div_tol(dt))


@property_test(FEW)
def test_in_place_arithmetic_matches_torch_and_reaches_views(
    mp: Parties, data: st.DataObject
) -> None:
    shape = draw_shape(data)
    x, y = draw_floats(data, shape), draw_floats(data, draw_broadcast_shape(data, shape))
    if tuple(torch.broadcast_shapes(x.shape, y.shape)) != tuple(x.shape):
        y = y.sum()  # in place, the result must keep x's shape
    c = data.draw(st.floats(0.5, 4.0), label="c")
    xs, ys = mp.share(x), mp.share(y)
    view = xs.view(-1)  # a view made before: it sees every update
    ref = x.double().clone()
    xs += ys
    ref += y.double()
    xs -= 1.5
    ref -= 1.5
    xs *= c
    ref *= c
    xs /= 3
    ref /= 3
    xs.neg_()
    ref.neg_()
    xs.relu_()
    ref.relu_()
    tol = (a64(x) + a64(y) + 1.5) * c / 3 * (2 * ENC) + 4 * TRUNC
    check(xs, ref, tol)
    check(view, ref.view(-1), tol.reshape(-1) if isinstance(tol, torch.Tensor) else tol)


def test_in_place_errors(mp: Parties) -> None:
    x = mp.share(torch.ones(2, 3))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        x += mp.share(torch.ones(4, 2, 3))
    n = mp.share(torch.arange(6).view(2, 3))
    with pytest.raises(RuntimeError, match="can't be cast"):
        n += 0.5
    with pytest.raises(mpc.UnsupportedOpError, match="public tensor cannot hold"):
        plain = torch.ones(2, 3)
        plain += x
    z = x * x  # its truncation is pending ...
    z_row = z[0]  # ... when this view is taken
    with pytest.raises(mpc.MPCError, match="materialize"):
        z += 1
    with pytest.raises(mpc.MPCError, match="materialize"):
        z_row *= 2
    z2 = (x * x).materialize()
    row = z2[0]
    z2 += 1  # fine once truncated: the view sees it
    check(row, torch.full((3,), 2.0), 2 * TRUNC)


def test_mean_of_many_values_keeps_its_relative_precision(mp: Parties) -> None:
    """1/count is encoded with extra bits: a mean over 3,000 values is not off by ~count
    units of the encoding of 1/count (it was 0.7% off with 1/count at 16 bits)."""
    g = torch.Generator().manual_seed(7)
    x = torch.rand(3000, generator=g, dtype=torch.float64) * 8 + 1  # mean about 5
    got = reveal(mp.share(x).mean()).double()
    assert abs(float(got) - float(x.mean())) <= 4 * U
    rows = reveal(mp.share(x.view(30, 100)).mean(dim=1)).double()
    assert torch.allclose(rows, x.view(30, 100).mean(dim=1), atol=4 * U, rtol=0)


# --------------------------------------------------------------------- matmul family


def test_vector_matmul_matrix(mp: Parties) -> None:
    v, w = torch.tensor([1.5, -2.0]), torch.tensor([[1.0, 2.0, 0.5], [3.0, -1.0, 0.25]])
    ref = v.double() @ w.double()
    check(mp.share(v) @ mp.share(w), ref, matmul_tol(v, w))
    check(v @ mp.share(w), ref, matmul_tol(v, w))  # public vector, shared matrix
    check(torch.matmul(mp.share(v), w), ref, matmul_tol(v, w))
    batch = torch.stack([w, -w])  # vector @ batch of matrices: (2, 3)
    check(mp.share(v) @ mp.share(batch), v.double() @ batch.double(), matmul_tol(v, w))


@pytest.mark.parametrize("weights", ["shared", "public"])
@property_test(SETTINGS)
def test_matmul_mm_bmm_addmm_linear(mp: Parties, weights: str, data: st.DataObject) -> None:
    m, k, n, b = (data.draw(st.integers(1, 4)) for _ in range(4))
    x = draw_floats(data, (m, k))
    w = draw_floats(data, (k, n))
    bias = draw_floats(data, (n,))
    v = draw_floats(data, (k,))
    xb = draw_floats(data, (b, m, k))
    wb = draw_floats(data, (b, k, n))

    def enc(t: torch.Tensor) -> Any:
        return mp.share(t) if weights == "shared" else t

    xs, xbs = mp.share(x), mp.share(xb)
    W, Wb, B, Wt = enc(w), enc(wb), enc(bias), enc(w.t().contiguous())
    x64, w64, b64 = x.double(), w.double(), bias.double()

    check(xs @ W, x64 @ w64, matmul_tol(x, w))
    check(torch.matmul(xs, W), x64 @ w64, matmul_tol(x, w))
    check(torch.mm(xs, W), x64 @ w64, matmul_tol(x, w))
    check(torch.bmm(xbs, Wb), xb.double() @ wb.double(), matmul_tol(xb, wb))
    check(xs @ enc(v), x64 @ v.double(), matmul_tol(x, v))  # matrix @ vector
    check(mp.share(v) @ enc(v), v.double() @ v.double(), matmul_tol(v, v))  # dot
    check(xbs @ W, xb.double() @ w64, matmul_tol(xb, w))  # batched @ 2-D
    check(torch.addmm(B, xs, W), b64 + x64 @ w64, matmul_tol(x, w) + ENC)
    check(F.linear(xs, Wt, B), x64 @ w64 + b64, matmul_tol(x, w) + ENC)
    check(F.linear(xbs, Wt), xb.double() @ w64, matmul_tol(xb, w))
    if weights == "shared":  # public data times shared weights
        check(x @ W, x64 @ w64, matmul_tol(x, w))
        check(F.linear(x, Wt, B), x64 @ w64 + b64, matmul_tol(x, w) + ENC)


@pytest.mark.parametrize("variant", ["shared_weights", "public_weights", "public_input"])
@property_test(SETTINGS)
def test_conv2d(mp: Parties, variant: str, data: st.DataObject) -> None:
    groups = data.draw(st.integers(1, 2))
    cin, cout = groups * data.draw(st.integers(1, 2)), groups * data.draw(st.integers(1, 2))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    stride = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    padding = (data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2)))
    dilation = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)))
    # the input is at least as large as the dilated kernel, so the output is non-empty
    h = max(data.draw(st.integers(2, 5)), dilation[0] * (kh - 1) + 1)
    wd = max(data.draw(st.integers(2, 5)), dilation[1] * (kw - 1) + 1)
    x = draw_floats(data, (data.draw(st.integers(1, 2)), cin, h, wd))
    w = draw_floats(data, (cout, cin // groups, kh, kw), bound=3.0)
    bias = draw_floats(data, (cout,)) if data.draw(st.booleans()) else None
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}

    ref = F.conv2d(x.double(), w.double(), None if bias is None else bias.double(), **params)
    ones_x, ones_w = (
        torch.ones_like(x, dtype=torch.float64),
        torch.ones_like(w, dtype=torch.float64),
    )
    taps = (cin // groups) * kh * kw
    tol = (
        ENC * (F.conv2d(a64(x), ones_w, **params) + F.conv2d(ones_x, a64(w), **params))
        + taps * ENC**2
        + TRUNC
        + (ENC if bias is not None else 0.0)
    )
    if variant == "shared_weights":
        X, W, B = mp.share(x), mp.share(w), None if bias is None else mp.share(bias)
    elif variant == "public_weights":
        X, W, B = mp.share(x), w, bias
    else:
        X, W, B = x, mp.share(w), None if bias is None else mp.share(bias)
    check(F.conv2d(X, W, B, **params), ref, tol)
    if variant == "shared_weights":  # through an nn.Module whose parameters are shared
        conv = nn.Conv2d(cin, cout, (kh, kw), bias=bias is not None, **params)
        with torch.no_grad():
            conv.weight.copy_(w)
            if bias is not None:
                conv.bias.copy_(bias)
        check(mp.share_model(conv)(X), ref, tol)


# ------------------------------------------------------------------------ reductions


@property_test(SETTINGS)
def test_sum_mean(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape)))
    dims = list(dict.fromkeys(d % len(shape) for d in dims))
    keepdim = data.draw(st.booleans())
    xs = mp.share(x)
    x64 = x.double()
    ones = torch.ones_like(x64)
    if dims:
        ref_sum, count = x64.sum(dims, keepdim=keepdim), ones.sum(dims, keepdim=keepdim)
        abs_sum = a64(x).sum(dims, keepdim=keepdim)
        got_sum, got_mean = xs.sum(dims, keepdim=keepdim), xs.mean(dims, keepdim=keepdim)
    else:
        ref_sum, count, abs_sum = x64.sum(), ones.sum(), a64(x).sum()
        got_sum, got_mean = xs.sum(), xs.mean()
    check(got_sum, ref_sum, ENC * count)
    # mean = (sum + e_s) * (1/count + e) truncated, |e_s| <= count ENC, |e| <= ENC
    mean_tol = ENC + ENC * (abs_sum + ENC * count) + TRUNC
    check(got_mean, ref_sum / count, mean_tol)


# ----------------------------------------------------------------------- comparisons

COMPARISONS: dict[str, Callable[[Any, Any], Any]] = {
    "lt": operator.lt,
    "gt": operator.gt,
    "le": operator.le,
    "ge": operator.ge,
    "eq": operator.eq,
    "ne": operator.ne,
}


@property_test(SETTINGS)
def test_compare_shared_shared(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data, max_dims=2)
    x = draw_floats(data, shape)
    y = separated(x, draw_floats(data, shape))
    y = torch.where(draw_mask(data, shape), x, y)  # some exact ties for eq/ne/le/ge
    xs, ys = mp.share(x), mp.share(y)
    for name, op in COMPARISONS.items():
        got = op(xs, ys)
        assert isinstance(got, mpc.SharedTensor), name
        check_exact(got, op(x, y))


@property_test(SETTINGS)
def test_compare_public(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data, max_dims=2)
    c = float(draw_scalar(data))
    k = math.floor(c) + 3  # an int scalar at least 2 away from c
    x = separated(torch.full(shape, c), draw_floats(data, shape))
    x = separated(torch.full(shape, float(k)), x)  # the nudge cannot bring x near c
    x = torch.where(draw_mask(data, shape), torch.tensor(c), x)  # some elements equal c
    p = separated(x, draw_floats(data, shape))
    xs = mp.share(x)
    for name, op in COMPARISONS.items():
        check_exact(op(xs, c), op(x, c))
        check_exact(op(c, xs), op(c, x))  # public on the left
        if name in ("lt", "ge"):
            check_exact(op(xs, p), op(x, p))
            check_exact(op(p, xs), op(p, x))
            check_exact(op(xs, k), op(x, k))


# ----------------------------------------------------------- relu, max, argmax, pooling


@property_test(SETTINGS)
def test_relu(mp: Parties, data: st.DataObject) -> None:
    x = draw_floats(data, draw_shape(data))
    ref = torch.relu(x.double())
    check(F.relu(mp.share(x)), ref, ENC)
    check(nn.ReLU()(mp.share(x)), ref, ENC)
    check(F.relu(mp.share(x), inplace=True), ref, ENC)
    xs = mp.share(x)
    check(F.relu(xs * 2.5), torch.relu(x.double() * 2.5), product_tol(x, 2.5))


@property_test(SETTINGS)
def test_max_min_dim(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_distinct(data, shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdim = data.draw(st.booleans())
    xs = mp.share(x)
    for fn in (torch.max, torch.min):
        ref = fn(x, dim=dim, keepdim=keepdim)
        got = fn(xs, dim=dim, keepdim=keepdim)
        check(got.values, ref.values, ENC)
        check_exact(got.indices, ref.indices)
    values, indices = xs.max(dim)
    check(values, x.max(dim).values, ENC)
    check_exact(indices, x.max(dim).indices)


@property_test(SETTINGS)
def test_argmax_argmin(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_distinct(data, shape)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    keepdim = data.draw(st.booleans())
    xs = mp.share(x)
    check_exact(torch.argmax(xs), torch.argmax(x))
    check_exact(torch.argmin(xs), torch.argmin(x))
    check_exact(torch.argmax(xs, keepdim=keepdim), torch.argmax(x, keepdim=keepdim))
    check_exact(xs.argmax(dim, keepdim=keepdim), x.argmax(dim, keepdim=keepdim))
    check_exact(xs.argmin(dim=dim, keepdim=keepdim), x.argmin(dim=dim, keepdim=keepdim))


@property_test(SETTINGS)
def test_max_min_full(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_floats(data, shape)  # ties allowed: only values are compared
    dim = data.draw(st.integers(0, len(shape) - 1))
    xs = mp.share(x)
    check(xs.max(), x.max(), ENC)
    check(torch.max(xs), x.max(), ENC)
    check(xs.min(), x.min(), ENC)
    check(torch.amax(xs, dim), torch.amax(x, dim), ENC)
    check(torch.amin(xs, dim, keepdim=True), torch.amin(x, dim, keepdim=True), ENC)


def draw_pool(data: st.DataObject) -> tuple[torch.Tensor, int, int, int]:
    kernel = data.draw(st.sampled_from([2, 3]))
    stride = data.draw(st.integers(1, 3))
    padding = data.draw(st.integers(0, kernel // 2))
    lo = max(1, kernel - 2 * padding)
    h, w = data.draw(st.integers(lo, 5)), data.draw(st.integers(lo, 5))
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), h, w)
    return draw_floats(data, shape), kernel, stride, padding


@property_test(SETTINGS)
def test_max_pool2d(mp: Parties, data: st.DataObject) -> None:
    x, kernel, stride, padding = draw_pool(data)
    ref = F.max_pool2d(x.double(), kernel, stride, padding)
    check(F.max_pool2d(mp.share(x), kernel, stride, padding), ref, ENC)
    check(nn.MaxPool2d(kernel, stride, padding)(mp.share(x)), ref, ENC)


def pool_tol(x: torch.Tensor, kernel: Any, stride: Any, padding: Any) -> torch.Tensor:
    """(window sum + e_s) * (1/d + e) truncated, with |e_s| <= d ENC (zero padding exact)."""
    k = (kernel, kernel) if isinstance(kernel, int) else kernel
    d = k[0] * k[1]
    abs_sum = F.avg_pool2d(a64(x), kernel, stride, padding, divisor_override=1)
    return ENC + ENC * (abs_sum + d * ENC) + TRUNC


@property_test(SETTINGS)
def test_avg_pool2d(mp: Parties, data: st.DataObject) -> None:
    x, kernel, stride, padding = draw_pool(data)
    ref = F.avg_pool2d(x.double(), kernel, stride, padding)
    tol = pool_tol(x, kernel, stride, padding)
    check(F.avg_pool2d(mp.share(x), kernel, stride, padding), ref, tol)
    check(nn.AvgPool2d(kernel, stride, padding)(mp.share(x)), ref, tol)


@property_test(SETTINGS)
def test_adaptive_avg_pool2d(mp: Parties, data: st.DataObject) -> None:
    oh, ow = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    kh, kw = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3))
    shape = (data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2)), oh * kh, ow * kw)
    x = draw_floats(data, shape)
    ref = F.adaptive_avg_pool2d(x.double(), (oh, ow))
    tol = pool_tol(x, (kh, kw), (kh, kw), 0)
    check(F.adaptive_avg_pool2d(mp.share(x), (oh, ow)), ref, tol)
    check(nn.AdaptiveAvgPool2d((oh, ow))(mp.share(x)), ref, tol)


# ------------------------------------------------------------------------ batch norm


def random_batch_norm(data: st.DataObject, c: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(c)
    with torch.no_grad():
        bn.running_mean.copy_(draw_floats(data, (c,), bound=3.0))
        bn.running_var.copy_(draw_floats(data, (c,), bound=2.0).abs() + 0.25)
        bn.weight.copy_(draw_floats(data, (c,), bound=2.0))
        bn.bias.copy_(draw_floats(data, (c,), bound=2.0))
    return bn.eval()


@pytest.mark.parametrize("model", ["shared", "public"])
@property_test(SETTINGS)
def test_batch_norm_eval(mp: Parties, model: str, data: st.DataObject) -> None:
    c = data.draw(st.integers(1, 3))
    shape = (
        data.draw(st.integers(1, 2)),
        c,
        data.draw(st.integers(1, 3)),
        data.draw(st.integers(1, 3)),
    )
    x = draw_floats(data, shape)
    bn = random_batch_norm(data, c)
    view = (1, c, 1, 1)
    mean, var = bn.running_mean.double().view(view), bn.running_var.double().view(view)
    w, b = bn.weight.detach().double().view(view), bn.bias.detach().double().view(view)
    inv = 1 / torch.sqrt(var + bn.eps)
    x64 = x.double()
    ref = (x64 - mean) * inv * w + b
    if model == "shared":
        # folded in float32 into scale s = w * inv and shift t = b - mean * s (a few ulps
        # each), then x * s (one product, both shared) + t (encoded)
        s = w * inv
        fold = 8 * 2.0**-24 * (a64(x64) * s.abs() + b.abs() + (mean * s).abs())
        tol = product_tol(x64, s) + ENC + fold
        got = mp.share_model(copy.deepcopy(bn))(mp.share(x))
    else:
        # x - mean (two roundings), * inv (public: encoded, truncated), * w (likewise), + b
        y = x64 - mean
        e1 = 2 * ENC
        e2 = (inv + ENC) * e1 + y.abs() * ENC + TRUNC
        e3 = (w.abs() + ENC) * e2 + (y * inv).abs() * ENC + TRUNC
        tol = e3 + ENC
        got = bn(mp.share(x))
    check(got, ref, tol)


# ------------------------------------------------------------------- local shape ops

SHAPE_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "view": lambda t, u: t.view(-1),
    "view_split": lambda t, u: t.view(*t.shape[:-1], 1, t.shape[-1]),
    "reshape": lambda t, u: t.reshape(t.shape[-1], -1),
    "flatten": lambda t, u: torch.flatten(t),
    "flatten_from_1": lambda t, u: torch.flatten(t.unsqueeze(0), 1),
    "permute": lambda t, u: t.permute(*reversed(range(t.dim()))),
    "transpose": lambda t, u: t.transpose(0, -1),
    "t": lambda t, u: t.reshape(t.shape[0], -1).t(),
    "cat": lambda t, u: torch.cat([t, u, t], dim=-1),
    "cat_dim0": lambda t, u: torch.cat([u, t], dim=0),
    "stack": lambda t, u: torch.stack([t, u], dim=-1),
    "stack_dim0": lambda t, u: torch.stack([u, t, u]),
    "select": lambda t, u: t[0],
    "select_last": lambda t, u: t[..., -1],
    "index_tensor": lambda t, u: t[torch.tensor([0, t.shape[0] - 1, 0])],
    "slice": lambda t, u: t[..., 1:],
    "slice_step": lambda t, u: t[..., ::2],
    "slice_first": lambda t, u: t[:1],
    "new_axes": lambda t, u: t[None, ..., None],
    "pad": lambda t, u: F.pad(t, (1, 2)),
    "pad_value": lambda t, u: F.pad(
        t.unsqueeze(0), (2, 0, 1, 1), value=-3.25 if t.is_floating_point() else -3
    ),
    "unsqueeze": lambda t, u: t.unsqueeze(0).unsqueeze(-1),
    "squeeze_dim": lambda t, u: t.unsqueeze(1).squeeze(1),
    "squeeze_all": lambda t, u: t.unsqueeze(0).squeeze(),
}


@pytest.mark.parametrize("name", list(SHAPE_OPS))
@property_test(FEW)
def test_shape_ops(mp: Parties, name: str, data: st.DataObject) -> None:
    op = SHAPE_OPS[name]
    shape = draw_shape(data)
    integer = data.draw(st.booleans())
    if integer:
        x, y = draw_ints(data, shape, 2**40), draw_ints(data, shape, 2**40)
    else:
        x, y = draw_floats(data, shape), draw_floats(data, shape)
    other = mp.share(y) if data.draw(st.booleans()) else y  # shared or public second operand
    got = op(mp.share(x), other)
    ref = op(x, y)
    if integer:
        check_exact(got, ref)
    else:
        check(got, ref.double(), ENC)


# ---------------------------------------------------------------- integer tensors: exact


@property_test(SETTINGS)
def test_int_arithmetic_exact(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data)
    x = draw_ints(data, shape, 2**30)
    y = draw_ints(data, draw_broadcast_shape(data, shape), 2**30)
    k = data.draw(st.integers(-(2**30), 2**30))
    big = data.draw(st.integers(2**53, 2**62))  # not exact in float64
    xs, ys = mp.share(x), mp.share(y)
    check_exact(xs + ys, x + y)
    check_exact(xs - ys, x - y)
    check_exact(ys - xs, y - x)
    check_exact(-xs, -x)
    check_exact(xs * ys, x * y)
    check_exact(xs + k, x + k)
    check_exact(k - xs, k - x)
    check_exact(xs * k, x * k)
    check_exact(xs * y, x * y)
    check_exact(xs + big, x + big)
    check_exact(big - xs, big - x)
    check_exact(xs == big - 1, x == big - 1)
    check_exact(xs < big, x < big)
    check_exact(xs.sum(0), x.sum(0))
    check_exact(xs.sum(), x.sum())


@property_test(SETTINGS)
def test_int_matmul_exact(mp: Parties, data: st.DataObject) -> None:
    m, k, n = (data.draw(st.integers(1, 4)) for _ in range(3))
    x, w = draw_ints(data, (m, k), 2**20), draw_ints(data, (k, n), 2**20)
    xs = mp.share(x)
    check_exact(xs @ mp.share(w), x @ w)
    check_exact(xs @ w, x @ w)


@property_test(SETTINGS)
def test_int_compare_max_exact(mp: Parties, data: st.DataObject) -> None:
    shape = draw_shape(data, max_dims=2)
    x = draw_ints(data, shape, 2**40)
    y = draw_ints(data, shape, 2**40)
    y = torch.where(draw_mask(data, shape), x, y)  # some ties
    c = data.draw(st.integers(-(2**40), 2**40))
    xs, ys = mp.share(x), mp.share(y)
    for op in COMPARISONS.values():
        check_exact(op(xs, ys), op(x, y))
        check_exact(op(xs, c), op(x, c))
    check_exact(F.relu(xs), F.relu(x))
    check_exact(xs.max(), x.max())
    check_exact(xs.max(-1).values, x.max(-1).values)


@property_test(SETTINGS)
def test_int_mixed_with_float(mp: Parties, data: st.DataObject) -> None:
    """An integer tensor times a float (shared or public) moves to fixed point."""
    shape = draw_shape(data)
    x = draw_ints(data, shape, 100)
    y = draw_floats(data, shape)
    c = draw_scalar(data)
    xs = mp.share(x)
    x64 = x.double()
    # only the float operand is rounded, the integer multiplies it exactly
    check(xs * mp.share(y), x64 * y.double(), ENC * x64.abs() + TRUNC)
    check(xs * c, x64 * c, ENC * x64.abs())
    check(xs + mp.share(y), x64 + y.double(), ENC)
    check(xs / 4, x64 / 4, TRUNC)
    check(xs / 3, x64 / 3, ENC * x64.abs() + TRUNC)


# ---------------------------------------------------------- seed-style end to end: CNN


def cnn_error_bound(model: nn.Sequential, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Plaintext logits (float64) and an elementwise error bound propagated layer by layer:
    conv (as in test_conv2d) -> ReLU and max-pooling (1-Lipschitz: the bound passes
    through, max-pooled) -> linear (the carried error times |W|, plus the product bound)."""
    conv, _, pool, _, lin = model
    x64 = x.double()
    w1, b1 = conv.weight.detach().double(), conv.bias.detach().double()
    w2, b2 = lin.weight.detach().double(), lin.bias.detach().double()
    p = {"stride": conv.stride, "padding": conv.padding}
    h = F.conv2d(x64, w1, b1, **p)
    taps = w1[0].numel()
    e = (
        ENC
        * (
            F.conv2d(a64(x), torch.ones_like(w1), **p)
            + F.conv2d(torch.ones_like(x64), w1.abs(), **p)
        )
        + taps * ENC**2
        + TRUNC
        + ENC
    )
    h = F.max_pool2d(F.relu(h), pool.kernel_size).flatten(1)
    e = F.max_pool2d(e, pool.kernel_size).flatten(1)
    logits = h @ w2.t() + b2
    # (h + e_h) (W + e_W)^T - h W^T = e_h (W + e_W)^T + h e_W^T
    e_out = e @ (w2.abs() + ENC).t() + ENC * (h.abs() + e).sum(1, keepdim=True) + TRUNC + ENC
    return logits, e_out


@pytest.mark.parametrize("seed", [0, 1])
def test_seed_style_cnn_inference(mp: Parties, seed: int) -> None:
    torch.manual_seed(seed)
    model = nn.Sequential(
        nn.Conv2d(1, 3, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(3 * 3 * 3, 4),
    )
    x = torch.rand(3, 1, 6, 6) * 4 - 2
    logits, bound = cnn_error_bound(model, x)
    top2 = logits.topk(2, dim=1).values
    assert bool(((top2[:, 0] - top2[:, 1]) > 2 * bound.max()).all()), "pick another seed"

    shared_model = mp.share_model(model)
    assert all(isinstance(p, mpc.SharedTensor) for p in shared_model.parameters())
    out = shared_model(mp.share(x))
    assert isinstance(out, mpc.SharedTensor)
    labels = out.argmax(dim=1)  # computed under MPC, before revealing the logits
    check(out, logits, bound)
    check_exact(labels, logits.argmax(dim=1))


def test_inputs_survive_reconstructing_results(mp: Parties) -> None:
    """get() deletes the result's shares, never those of the operands it came from."""
    x = torch.tensor([[1.5, -2.0], [0.25, 3.0]])
    xs = mp.share(x)
    results = {
        "add float": lambda t: t + 1.5,
        "radd": lambda t: 2.5 + t,
        "add int": lambda t: t + 3,
        "rsub": lambda t: 2 - t,
        "sub tensor": lambda t: t - torch.ones(2),
        "mul int": lambda t: t * 2,
        "mul float": lambda t: t * 0.5,
        "neg": lambda t: -t,
        "view": lambda t: t.view(4),
        "sum": lambda t: t.sum(0),
        "relu": F.relu,
    }
    for name, fn in results.items():
        reveal(fn(xs))
        check(xs + 0, x.double(), ENC)  # still all there
        assert all(not s._ref.gone for s in xs.shares), name
    check(xs, x.double(), ENC)
