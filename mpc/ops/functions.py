"""Non-linear functions on shared values: the registered aten handlers.

The protocols are in :mod:`mpc.protocols.approx` (methods, rounds and domains in their
docstrings; the error table in docs/secret-sharing.md). Outputs whose relative precision
needs more than 16 fractional bits (exp, reciprocal: e^-8 = 3.4e-4 is 22 units at 2^-16)
come back at :func:`hi_scale` bits (24 at the default 16); the others at the session's
scale. A later op truncates as usual.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, cast

import torch

import pointers as pt
from mpc.errors import UnsupportedOpError
from mpc.ops import max_tree
from mpc.ops.common import aten, check_public, encode_public, rescale, wrap
from mpc.ops.local import add_shared, div_public, mul_public
from mpc.ops.masking import keep_in_softmax, select_public
from mpc.ops.nonlinear import difference, lt_gt, max_reduce
from mpc.protocols import approx, ranks
from mpc.protocols.approx import Fx
from mpc.protocols.compare import comparison_rounds, select_by_msb
from mpc.protocols.fourier import run as trig
from mpc.protocols.fourier.run import EXP_SERIES
from mpc.protocols.inverse import times_inverse_power
from mpc.protocols.series_product import run as series_product
from mpc.protocols.series_product.run import exp_near
from mpc.registry import register
from mpc.shared import SharedTensor, public_to_shares


def hi_scale(x: SharedTensor) -> int:
    return max(x.session.config.frac_bits, 24)


def as_fx(x: SharedTensor) -> Fx:
    """x as an :class:`~mpc.protocols.approx.Fx` at its scale (a pending truncation
    applied; integers read as fixed point at the session's scale)."""
    x.materialize()
    if x.frac_bits == 0:  # integers: as fixed point
        f = x.session.config.frac_bits
        return Fx(x.session, rescale(x, f), f)
    return Fx(x.session, list(x.shares), x.frac_bits)


def from_fx(x: SharedTensor, v: Fx) -> SharedTensor:
    """The shared tensor of ``v``, of x's dtype (float32 for an integer x)."""
    dtype = x.dtype if x.dtype.is_floating_point else torch.float32
    return SharedTensor(v.shares, x.session, v.scale, dtype)


def session_frac(x: SharedTensor) -> int:
    """The session's fractional bits (the scale a function's result comes down to)."""
    return x.session.config.frac_bits


def _shared(func: Any, x: Any) -> SharedTensor:
    if not isinstance(x, SharedTensor):
        raise UnsupportedOpError(str(func), "expects a secret-shared operand")
    return x


# -- pow, abs, sign, clamp, where ----------------------------------------------------------


def _int_pow(x: SharedTensor, n: int) -> SharedTensor:
    """x^n, n >= 1, by square and multiply: ceil(log2 n) + popcount(n) - 1 products."""
    result: SharedTensor | None = None
    base = x
    while n:
        if n & 1:
            result = base if result is None else result * base
        n >>= 1
        if n:
            base = base * base
    assert result is not None
    return result


@register(aten.pow.Tensor_Scalar)
def pow_scalar(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """x ** n. Integer n >= 1: products (x^2 one Beaver product, x^3 two, 2 rounds each
    level); n = 0: public ones; negative n: reciprocal(x) ** -n; n = 0.5 / -0.5: sqrt /
    rsqrt. Other exponents raise UnsupportedOpError."""
    x, n = args[0], args[1]
    if isinstance(n, float) and n == int(n):
        n = int(n)
    if isinstance(n, int):
        if n == 0:
            ones = torch.ones(x.shape, dtype=torch.float64)
            f = session_frac(x)
            return SharedTensor(public_to_shares(encode_public(ones, f), x), x.session, f, x.dtype)
        if n < 0:
            return _int_pow(reciprocal(aten.reciprocal.default, (x,), {}), -n)
        return _int_pow(x, n) if n > 1 else x.with_shares(list(x.shares))
    if n == 0.5:
        return sqrt(aten.sqrt.default, (x,), {})
    if n == -0.5:
        return rsqrt(aten.rsqrt.default, (x,), {})
    raise UnsupportedOpError(str(func), f"exponent {n!r}: only integers and +-0.5")


@register(aten.pow.Scalar)
def pow_base(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """b ** x for a public base b > 0: exp(x ln b)."""
    b, x = args[0], args[1]
    if not isinstance(b, int | float) or b <= 0:
        raise UnsupportedOpError(str(func), "the base must be a positive public number")
    return exp(aten.exp.default, (x * math.log(b),), {})


@register(aten.abs.default)
def abs_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """|x| = x - 2 x msb(x): one comparison with the product riding on it (7 rounds)."""
    x = args[0]
    (xm,) = select_by_msb(x.session, x.shares, [x.shares])
    return x.with_shares([s - 2 * t for s, t in zip(x.shares, xm)])


@register(aten.sign.default)
def sign(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """sign(x) = [x > 0] - [x < 0]: both comparisons in one run (7 rounds); sign(0) = 0."""
    x = args[0]
    lo, hi = lt_gt(x, 0)
    k = 1 << x.frac_bits
    return x.with_shares([(h - low) * k for h, low in zip(hi.shares, lo.shares)])


def _clamp(x: SharedTensor, lo: Any, hi: Any) -> SharedTensor:
    """lo + relu(x - lo) - relu(x - hi) (lo <= hi): both ReLUs in one comparison (7 rounds)."""
    parts = []
    if lo is not None:
        parts.append(difference(x, lo))
    if hi is not None:
        parts.append(difference(x, hi))
    if not parts:
        return x.with_shares(list(x.shares))
    shape = list(torch.broadcast_shapes(*[tuple(p.shape) for p in parts]))
    parts = [p if list(p.shape) == shape else p.expand(shape).clone() for p in parts]
    f = max(p.frac_bits for p in parts)
    # (stacks of pointers are pointers; torch's stubs say Tensor)
    stacked = cast(
        list[pt.PointerTensor], [torch.stack(s) for s in zip(*[rescale(p, f) for p in parts])]
    )
    (r,) = select_by_msb(x.session, stacked, [stacked], complement=True)
    relu = [SharedTensor([s[i] for s in r], x.session, f, x.dtype) for i in range(len(parts))]
    if lo is not None and hi is not None:
        return add_shared(add_shared(relu[0], lo, 1), relu[1], -1)
    if lo is not None:
        return add_shared(relu[0], lo, 1)
    return add_shared(x, relu[0], -1)


def _bound(func: Any, v: Any) -> Any:
    if v is None or isinstance(v, SharedTensor):
        return v
    check_public(v, str(func))
    return v


@register(aten.clamp.default, aten.clamp.Tensor)
def clamp(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """clamp(x, min, max): 7 rounds (one comparison run for both bounds)."""
    x = args[0]
    lo = args[1] if len(args) > 1 else kwargs.get("min")
    hi = args[2] if len(args) > 2 else kwargs.get("max")
    return _clamp(x, _bound(func, lo), _bound(func, hi))


@register(aten.clamp_min.default, aten.clamp_min.Tensor)
def clamp_min(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _clamp(args[0], _bound(func, args[1]), None)


@register(aten.clamp_max.default, aten.clamp_max.Tensor)
def clamp_max(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _clamp(args[0], None, _bound(func, args[1]))


@register(aten.hardtanh.default)
def hardtanh(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """hardtanh = clamp(x, min_val, max_val): 7 rounds."""
    lo = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
    hi = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
    return _clamp(args[0], lo, hi)


@register(aten.where.self)
def where(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """where(c, a, b) = b + c (a - b). A shared condition: one Beaver product of a 0/1
    integer (no truncation): 1 round. A public condition: a public selection, local; a
    public branch may hold masks (finfo.min, -inf: see :mod:`mpc.ops.masking`)."""
    c, a, b = args[0], args[1], args[2]
    if not isinstance(c, SharedTensor):
        check_public(c, "where")
        c = torch.as_tensor(c).to(torch.bool)
        if isinstance(a, SharedTensor) and not isinstance(b, SharedTensor):
            return select_public(c, a, b)
        if isinstance(b, SharedTensor) and not isinstance(a, SharedTensor):
            return select_public(~c, b, a)
    if not isinstance(a, SharedTensor) and not isinstance(b, SharedTensor):
        # shared condition, public branches: a - b is public
        d = (a - b) if isinstance(a, torch.Tensor) else torch.as_tensor(a - b)
        check_public(d, "where")
        f = session_frac(c)
        enc = encode_public(d.to(torch.float64), f)
        shape = list(torch.broadcast_shapes(tuple(c.shape), tuple(enc.shape)))
        prod = SharedTensor([s * enc for s in c.shares], c.session, f, torch.float32)
        if list(prod.shape) != shape:
            prod = prod.expand(shape).clone()
    else:
        d = difference(a, b)
        if isinstance(c, SharedTensor):
            prod = c * d
        else:
            prod = mul_public(d, c)
    return add_shared(prod, b, 1)


# -- exp, log, reciprocal, division, square roots -------------------------------------------


@register(aten.exp.default)
def exp(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """e^x by range reduction (see :func:`mpc.protocols.approx.exp`): 17 rounds, relative
    error 1e-4 (result at 24 fractional bits). Valid range: -16.6 <= x < 11.09; outside
    it returns 0 below and 2^16 above, without an error (exp(20) gives 65536): subtract a
    known upper bound first (as softmax does). ``mpc.debug()`` catches it
    (:data:`mpc.ranges.DOMAINS`)."""
    x = _shared(func, args[0])
    return from_fx(x, approx.exp(as_fx(x), hi_scale(x)))


@register(aten.log.default)
def log(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """ln x by normalisation (see :func:`mpc.protocols.approx.log`): 16 rounds, absolute
    error 1e-4. Valid range: 2^-16 <= x < 2^16; outside it returns -16 ln 2 below (x <= 0
    too: log(0) gives -11.09, not -inf) and 16 ln 2 above, without an error.
    ``mpc.debug()`` catches it."""
    x = _shared(func, args[0])
    return from_fx(x, approx.log(as_fx(x), session_frac(x)))


@register(aten.reciprocal.default)
def reciprocal(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """1/x by normalisation and Goldschmidt (see :func:`mpc.protocols.approx.reciprocal`):
    25 rounds (sign, then |x|), relative error 1e-5 (result at 24 bits). Valid range:
    2^-12 <= |x| < 2^12; outside it returns +-2^12 below (1/0 and 1/1e-5 give 4096, not
    inf and 1e5) and +-2^-12 above, without an error. ``mpc.debug()`` catches it."""
    x = _shared(func, args[0])
    return from_fx(x, approx.reciprocal(as_fx(x), hi_scale(x)))


def divide_shared(a: Any, b: SharedTensor) -> SharedTensor:
    """a / [b] = a * (1/[b]): 27 + 2 rounds (a public: 27 + 1)."""
    r = approx.reciprocal(as_fx(b), hi_scale(b))
    if isinstance(a, SharedTensor):
        fa = as_fx(a)
        (q,) = approx.mul_many([(fa, r)], [max(fa.scale, session_frac(b))])
        return from_fx(a, q)
    rb = from_fx(b, r)
    return mul_public(rb, a)


@register(aten.div.Tensor, aten.div.Scalar)
def div(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """a / b. A public b: a product with 1/b (a public zero raises ZeroDivisionError). A
    shared b: a times the reciprocal of b, valid for 2^-12 <= |b| < 2^12; outside it
    a * (+-2^12) below (a / 0 is 4096 a) and a * (+-2^-12) above, without an error.
    ``mpc.debug()`` catches it."""
    a, b = args[0], args[1]
    if kwargs.get("rounding_mode") is not None:
        raise UnsupportedOpError(str(func), "rounding modes are not supported")
    if isinstance(b, SharedTensor):  # a / [b] = a * (1 / [b]) (issue 13)
        return divide_shared(a, b)
    x = a
    if x.frac_bits == 0:  # true division of integers gives floats: move to fixed point
        f = x.session.config.frac_bits
        x = wrap(x, rescale(x, f), f, torch.float32)
    return div_public(x, b)


@register(aten.rsqrt.default, lazy=True)
def rsqrt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """1/sqrt(x) by normalisation and Newton-Raphson (see
    :func:`mpc.protocols.approx.rsqrt`): 22 rounds. Valid range: 2^-14 <= x < 2^16;
    outside it returns 2^7 below (x <= 0 too, not nan or inf) and 2^-8 above, without an
    error (``mpc.debug()`` catches it). An operand
    with a truncation pending is read with up to 24 fractional bits instead of 16 (the
    truncation it pays anyway stops there): a small variance such as RMSNorm's mean of
    squares keeps its relative precision."""
    x = _shared(func, args[0])
    return from_fx(x, approx.rsqrt(_fx_wide(x), session_frac(x) + 4))


def _fx_wide(x: SharedTensor) -> Fx:
    """x as an Fx, a pending truncation applied only down to approx.WORK bits."""
    if not x.pending or not x.dtype.is_floating_point:
        return as_fx(x)
    v = Fx(x.session, list(x.shares), x.frac_bits)
    if x.frac_bits <= approx.WORK:
        return v
    (v,) = approx.truncate_many([v], [max(approx.WORK, x.frac_bits - x.pending)])
    return v


@register(aten.sqrt.default)
def sqrt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """sqrt(x) = x / sqrt(x): rsqrt and one product, 24 rounds; sqrt(0) = 0. Valid range:
    0 <= x < 2^16; outside it x < 0 gives x 2^7 (sqrt(-4) gives -512, not nan), without
    an error. ``mpc.debug()`` catches it."""
    x = _shared(func, args[0])
    fx = as_fx(x)
    r = approx.rsqrt(fx, approx.WORK)
    return from_fx(x, approx.mul(fx, r, session_frac(x)))


# -- sigmoid, tanh, gelu, silu: Fourier series and piecewise polynomials --------------------


def _wide(
    f: Callable[[torch.Tensor], torch.Tensor],
    edges: list[float],
    shift: int,
    deg: int,
    zero_at_zero: bool = False,
) -> list[list[float]]:
    """Per inner bin of ``edges``: the degree-``deg`` fit of f in v = x / 2^shift
    (``zero_at_zero``: no constant term on the bins that end at 0, so p(0) = 0 exactly)."""
    k = 2.0**shift
    return [
        approx.fit(lambda v: f(v * k), a / k, b / k, deg, zero_at_zero=zero_at_zero and 0 in (a, b))
        for a, b in zip(edges[:-1], edges[1:])
    ]


# name: (edges, shift, inner-bin polynomials in x / 2^shift, below, above, 24-bit output);
# see approx.piecewise_wide. The error bounds (fit on a fine grid; saturation at the
# edges) are in the handlers' docstrings and docs/secret-sharing.md.
_WIDE: dict[str, tuple[list[float], int, list[list[float]], list[float], list[float], bool]] = {
    "tanh": (
        [-4.5, -2.25, 0.0, 2.25, 4.5],
        2,
        _wide(torch.tanh, [-4.5, -2.25, 0.0, 2.25, 4.5], 2, 7, zero_at_zero=True),
        [-1.0],
        [1.0],
        True,
    ),
}


def _apply_wide(name: str, x: Any) -> SharedTensor:
    x = _shared(name, x)
    edges, shift, inner, below, above, hi = _WIDE[name]
    out = hi_scale(x) if hi else session_frac(x)
    return from_fx(x, approx.piecewise_wide(as_fx(x), edges, shift, inner, below, above, out))


@register(aten.sigmoid.default)
def sigmoid(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A masked Fourier series (12 sines of period 32, fitted on [-10, 10]) of x clamped
    to [-10, 10], the series riding in the clamp's comparison: 5 rounds (3 with FSS), 2
    comparisons and no products per element; max error 1.6e-4 (fit 1.1e-4, saturation
    4.5e-5) (:func:`mpc.protocols.fourier.run.sigmoid`)."""
    x = _shared("sigmoid", args[0])
    return from_fx(x, trig.sigmoid(as_fx(x), session_frac(x)))


@register(aten.tanh.default)
def tanh(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Degree-7 polynomials on the 4 bins of width 2.25 in [-4.5, 4.5], -1 below and 1
    above (fit error 9.7e-5, 2.5e-4 at the saturation edges), p(0) = 0 exactly and a
    24-bit output (tiny outputs keep their sign): 15 rounds, 5 comparisons per element."""
    return _apply_wide("tanh", args[0])


def _fx_pending(x: SharedTensor) -> Fx:
    """x as an Fx at its full scale, a pending truncation not applied (for a function that
    reads its input as it is and truncates it in a round it pays anyway), up to 40 bits."""
    if not x.pending or not x.dtype.is_floating_point or x.frac_bits > 40:
        return as_fx(x)
    return Fx(x.session, list(x.shares), x.frac_bits)


@register(aten.gelu.default, lazy=True)
def gelu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """GELU, erf or tanh form: a masked Fourier series (10 harmonics of period 16, fitted
    on [-5, 5]) of x clamped to [-5, 5], plus relu(x - 5)
    (:func:`mpc.protocols.fourier.run.relu_like`): 3 rounds (2 with FSS; 5 past
    ``three_round_up_to`` elements), 2 comparisons and no products per element; max error
    2.5e-5 measured (fit 3.7e-6, saturation 1.5e-6, fixed point)."""
    approximate = args[1] if len(args) > 1 else kwargs.get("approximate", "none")
    x = _shared("gelu", args[0])
    series = trig.GELU_TANH_SERIES if approximate == "tanh" else trig.GELU_SERIES
    return from_fx(x, trig.relu_like(_fx_pending(x), series, session_frac(x)))


@register(aten.silu.default, lazy=True)
def silu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """SiLU x sigmoid(x): a masked Fourier series (16 harmonics of period 32, fitted on
    [-12, 12]) of x clamped to [-12, 12], plus relu(x - 12)
    (:func:`mpc.protocols.fourier.run.relu_like`): 3 rounds (2 with FSS; 5 past
    ``three_round_up_to`` elements), 2 comparisons and no products per element; max error
    about 1.1e-4 (fit 3.5e-5, saturation 7.4e-5, fixed point)."""
    x = _shared("silu", args[0])
    return from_fx(x, trig.relu_like(_fx_pending(x), trig.SILU_SERIES, session_frac(x)))


# -- softmax ------------------------------------------------------------------------------


def softmax_parts(
    x: SharedTensor, dim: int, wide: bool = False
) -> tuple[SharedTensor, Fx, Fx, int]:
    """x - max(x) over dim (last), e^(x - max), and the sum of the e's (``wide``: before
    the exponential's truncation, at :data:`~mpc.protocols.fourier.run.SERIES_SCALE`)."""
    k = x.shape[dim]
    if x.pending and x.frac_bits <= 40:
        # the max, the clamp and the series read x at its full scale (no products: no
        # overflow below 2^22), so the pending truncation is never needed (one round less)
        x = SharedTensor(list(x.shares), x.session, x.frac_bits, x.dtype)
    else:
        x.materialize()
    out = None if wide else hi_scale(x)
    near = _max_and_near(x, dim)
    if near is not None:  # (the clamp's bits from the max's own comparison run)
        mx, bits = near
        d = add_shared(x, mx, -1)  # <= 0
        e = exp_near(as_fx(d), bits, out)
    else:
        mx, _ = max_reduce(x, dim, True, False)
        d = add_shared(x, mx, -1)  # <= 0
        e = trig.exp_nonpositive(as_fx(d), out)
    factors = keep_in_softmax(x, dim)
    if factors is not None:  # public masks weigh exactly 0 (mpc.ops.masking): local
        e = e.with_shares([s * factors[0] for s in e.shares])
    total = e.with_shares([s.sum(dim, keepdim=True) for s in e.shares])
    jtop = 2 * math.ceil((math.log2(k) + 1) / 2)
    return d, e, total, jtop


def _max_and_near(x: SharedTensor, dim: int) -> tuple[SharedTensor, Any] | None:
    """The max over the last dim and the exponential's clamp bits [x - max >= -16] by
    ranks (:func:`mpc.protocols.ranks.max_and_near`: every pair compared with 0 and
    +-16 in one run, then one lookup round), where that and the series' product with
    the bits (:func:`mpc.protocols.series_product.run.exp_near`, one round) take fewer
    rounds than the max and the clamp's comparison run: few rows of few entries (a
    decoding step's 12 heads over 33 keys: 5 rounds where 7 took); None elsewhere."""
    k = x.shape[dim]
    session = x.session
    if dim != x.dim() - 1 or k < 2 or not series_product.fits(session, list(x.shape), EXP_SERIES):
        return None
    rows = x.numel() // k
    pairs = rows * k * (k - 1) // 2
    if pairs > ranks.max_pairs(session):
        return None
    apart = max_tree.values_max_rounds(session, rows, k)
    apart += comparison_rounds(session, x.numel(), selected=True)
    if ranks.near_rounds(session, pairs) + 1 >= apart:
        return None
    width = round(-trig.EXP_LO * 2**x.frac_bits)
    mx, near = ranks.max_and_near(session, list(x.shares), width)
    return x.with_shares(mx), near


@register(aten._softmax.default, aten._safe_softmax.default, lazy=True)
def softmax(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """softmax(x) = e^(x - max) / sum e^(x - max): the max by groups of four (4 rounds a
    level: 16 for k = 100; few rows, such as a decoding step's, by ranks in 8 rounds
    whatever k, :mod:`mpc.protocols.ranks`), exp on (-inf, 0] as a masked Fourier series
    riding in the clamp's comparison (4, :func:`mpc.protocols.fourier.run.
    exp_nonpositive`), and e / sum by fine bins on the sum in [1, k] and a polynomial (8,
    7 for few rows: :func:`mpc.protocols.inverse.times_inverse_power`, relative error
    8e-6), the e's truncation riding in its comparison: 28 rounds for k = 100, 19 for a
    decoding step's 12 heads over 33 keys (15 and 10 with FSS comparisons).
    An input still to be truncated (attention's scores) is read at its full scale: the
    max, the clamp and the series have no products, so its truncation is never paid. Per
    element: about 2.5 comparisons (the max's groups and the clamp) and three products
    with a per-row operand; per row, 4 log2 k + 5 comparisons (more by ranks and fine
    bins, for few rows)."""
    x, dim = args[0], args[1] % max(args[0].dim(), 1)
    # the sum is in [1, k]: e / sum by fine bins and a cubic (mpc.protocols.inverse). For
    # k < 256 the bins compare the sum at the series' own scale, and the truncations of
    # the e's and of their sum ride in that comparison's first round (one round fewer)
    hi = math.floor(math.log2(x.shape[dim])) + 1
    wide = hi + trig.SERIES_SCALE <= 62
    d, e, total, jtop = softmax_parts(x, dim, wide)
    bits = e.scale - hi_scale(x)
    pending = (bits, bits) if wide else (0, 0)
    out = from_fx(x, times_inverse_power(e, total, 1.0, -1, hi, session_frac(x), pending=pending))
    factors = keep_in_softmax(x, dim)
    if func is aten._safe_softmax.default and factors is not None and not factors[1].all():
        out = out.with_shares([s * factors[1] for s in out.shares])  # rows all -inf: 0
    return out


@register(aten._log_softmax.default)
def log_softmax(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """log_softmax(x) = (x - max) - ln(sum e^(x - max)): max, exp on (-inf, 0], log on
    [1, k]: 7 ceil(log2 k) + 9 + 16 rounds."""
    x, dim = args[0], args[1] % max(args[0].dim(), 1)
    d, e, total, jtop = softmax_parts(x, dim)
    lg = approx.log(total, session_frac(x), jmin=-2, jtop=jtop)
    return add_shared(d, from_fx(x, lg), -1)


# -- mean / var / std / layer norm ----------------------------------------------------------


def _dims(x: SharedTensor, dim: Any) -> list[int]:
    if dim is None:
        return list(range(x.dim()))
    if isinstance(dim, int):
        dim = [dim]
    return [d % max(x.dim(), 1) for d in dim]


def _var(x: SharedTensor, dims: list[int], correction: float, keepdim: bool) -> tuple[Any, Any]:
    n = 1
    for d in dims:
        n *= x.shape[d]
    mu = x.mean(dims, keepdim=True)
    dev = x - mu
    v = (dev * dev).sum(dims, keepdim=keepdim) / max(n - correction, 1)
    return v, (mu if keepdim else mu.squeeze(dims) if dims else mu)


def _correction(args: tuple[Any, ...], kwargs: dict[str, Any]) -> float:
    c = kwargs.get("correction")
    return 1.0 if c is None else float(c)


@register(aten.var.correction)
def var(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Variance: mean (local + 1 truncation), squared deviations (2), their mean (1)."""
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    v, _ = _var(x, _dims(x, dim), _correction(args, kwargs), kwargs.get("keepdim", False))
    return v


@register(aten.std.correction)
def std(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """sqrt of the variance (27 more rounds; domain of sqrt: variance below 2^16)."""
    return sqrt(aten.sqrt.default, (var(aten.var.correction, args, kwargs),), {})


@register(aten.var_mean.correction)
def var_mean(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return _var(x, _dims(x, dim), _correction(args, kwargs), kwargs.get("keepdim", False))
