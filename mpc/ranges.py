"""The fixed-point range: how large each result can be, from magnitudes the client knows.

A shared float is the ring element round(x 2^f). A product of two such values is
x y 2^(2f) until its truncation, which is right while that stays below 2^62 (|x y| < 2^30
at f = 16); a sum or a comparison is right while the ring value stays below 2^63. Past
that the result comes back wrong without an error, and the parties cannot see it: the
value is secret.

The client can: what it shared itself, it knows the magnitude of (``max |x|``, taken at
:func:`mpc.share`), and it knows its public operands. Every op on shared values carries
that knowledge forward: each shared result has a :attr:`~mpc.SharedTensor.bound`, a
number its magnitude cannot exceed (the op's own rule below: a sum's bound is the sum of
the bounds, a product's their product, a matmul's times the contracted length, a
sigmoid's 1...; a function's, for inputs inside its domain). :class:`FixedPointRangeWarning` fires at an op exactly when those
bounds allow its result to leave the range, so the result *can* be wrong, and never
otherwise: the warning-free results of values with known bounds are right.

What it cannot cover: a value whose magnitude the client does not know (shared by an
owner at its worker, an output of an ``mpc.plan`` call, or of an op whose output the
engine does not bound: ``log``, ``reciprocal``, ``rsqrt``, a division by a shared value,
batch norm, the backward pass) has no bound, and nothing computed from it is checked.
:func:`mpc.debug` checks every op of such code against plaintext, at the price of
revealing everything to the client. The non-linear functions' own input ranges are in
:data:`DOMAINS` (their docstrings say the same); the debug mode checks those too.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch

from mpc.math.encoding import FixedPointRangeWarning, abs_sums
from mpc.ops.masking import MASK_BELOW, MASKED_VALUE
from mpc.registry import hook
from mpc.shared import SharedTensor

aten = torch.ops.aten

PRODUCT_BITS = 62  # a product's ring value before its truncation stays below 2^62
RING_BITS = 63  # any other ring value (a sum, a compared difference) below 2^63

Bound = float | None
EXP_TOP = 2.0**16  # exp saturates there (its domain ends at 11.09: e^11.09 < 2^16)
Rule = Callable[[tuple[Any, ...], dict[str, Any]], Bound]


def bound_of(a: Any) -> Bound:
    """max |a| as far as the client knows it: a shared float's :attr:`bound`, a public
    operand's ``abs().max()`` (None: not known). A public mask's entries (-inf, or at or
    below -1e30: an attention mask) count as what a masked position holds, 2^14
    (:mod:`mpc.ops.masking`)."""
    if isinstance(a, SharedTensor):
        return a.bound
    if isinstance(a, torch.Tensor):
        if a.numel() == 0:
            return 0.0
        if a.dtype == torch.bool:
            return 1.0
        t = a.detach()
        if t.is_floating_point():
            masked = t <= MASK_BELOW
            if bool(masked.any()):
                rest = t.masked_fill(masked, 0.0).abs().max()
                return max(float(rest), abs(MASKED_VALUE))
        return float(t.abs().max())
    if isinstance(a, bool | int | float):
        if isinstance(a, float) and a <= MASK_BELOW:
            return abs(MASKED_VALUE)
        return abs(float(a))
    return None


def _known(*bs: Bound) -> bool:
    return all(b is not None for b in bs)


# -- the rules: the bound of an op's result from its operands' -----------------------------


def same_entries(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    """A value's own entries, moved or selected (views, max, pooling, ReLU, |x|, GELU)."""
    for a in args:
        if isinstance(a, SharedTensor):
            return a.bound
    return None


def _largest(xs: Any) -> Bound:
    bs = [bound_of(x) for x in xs]
    if not _known(*bs):
        return None
    return max((b for b in bs if b is not None), default=0.0)


def _cat(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return _largest(args[0])


def _where(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return _largest(args[1:3])


def _add(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    a, b = bound_of(args[0]), bound_of(args[1])
    alpha = abs(float(kwargs.get("alpha", 1)))
    return None if a is None or b is None else a + alpha * b


def _mul(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    a, b = bound_of(args[0]), bound_of(args[1])
    return None if a is None or b is None else a * b


def _sums_of(t: Any) -> tuple[float, float] | None:
    if isinstance(t, SharedTensor):
        return t.abs_sums
    if isinstance(t, torch.Tensor):
        return abs_sums(t)
    return None


def _contracted(a: Any, b: Any) -> Bound:
    """max |a @ b|: one operand's bound times the other's largest sum of |entries| along
    the contraction where that is known (a public operand, a matrix the client shared),
    else the two bounds times the contracted length."""
    ba, bb = bound_of(a), bound_of(b)
    sa, sb = _sums_of(a), _sums_of(b)
    found: list[float] = []
    if ba is not None and sb is not None and b.dim() >= 2:
        found.append(ba * sb[0])  # (b contracted over its dim -2)
    if bb is not None and sa is not None:
        found.append(bb * sa[1])  # (a contracted over its dim -1)
    if ba is not None and bb is not None:
        found.append(ba * bb * int(a.shape[-1]))
    return min(found) if found else None


def _mm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return _contracted(args[0], args[1])


def _addmm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    prod, bias = _contracted(args[1], args[2]), bound_of(args[0])
    if prod is None or bias is None:
        return None
    beta, alpha = abs(float(kwargs.get("beta", 1))), abs(float(kwargs.get("alpha", 1)))
    return beta * bias + alpha * prod


def _conv(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    x, w, bias = args[0], args[1], args[2]
    b = 0.0 if bias is None else bound_of(bias)
    if b is None:
        return None
    if isinstance(w, SharedTensor):
        if not _known(bound_of(x), w.bound):
            return None
        k = int(w.shape[1] * w.shape[2] * w.shape[3])
        return float(bound_of(x)) * float(w.bound) * k + b  # type: ignore[arg-type]
    xb = bound_of(x)
    if xb is None or not isinstance(w, torch.Tensor):
        return None
    return xb * float(w.detach().abs().double().sum(dim=(1, 2, 3)).max()) + b


def _sum(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    x = args[0]
    if x.bound is None:
        return None
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    if dims is None or (isinstance(dims, list | tuple) and not dims):
        return float(x.bound) * x.numel()
    count = 1
    for d in [dims] if isinstance(dims, int) else dims:
        count *= int(x.shape[d])
    return float(x.bound) * count


def _div(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    a, d = args[0], args[1]
    if isinstance(d, SharedTensor) or bound_of(a) is None:
        return None  # (1 / a secret: not bounded)
    smallest = float(d.detach().abs().min()) if isinstance(d, torch.Tensor) else abs(float(d))
    return None if smallest == 0 else float(bound_of(a)) / smallest  # type: ignore[arg-type]


def _unit(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return 1.0  # sigmoid, tanh, softmax: in [-1, 1] whatever the input


def _exp(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b = bound_of(args[0])
    return None if b is None else min(math.exp(min(b, 700.0)), EXP_TOP)


def _sqrt(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b = bound_of(args[0])
    return None if b is None else math.sqrt(b)


def _pow(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b, n = bound_of(args[0]), args[1]
    if b is None or not isinstance(n, int | float) or n < 0:
        return None
    return b**n if n else 1.0


def _clamp(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b = bound_of(args[0])
    given = [bound_of(v) for v in args[1:3] if v is not None]
    limits = [v for v in given if v is not None]
    if len(limits) < len(given):
        return None
    if len(limits) == 2:
        return max(limits)  # (the result lies between the two)
    return None if b is None else max([b, *limits])


def _masked_fill(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b, v = bound_of(args[0]), bound_of(args[2])
    return None if b is None or v is None else max(b, v)


def _embedding(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return bound_of(args[0])


def _layer_norm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    shape, w, b = args[1], args[2] if len(args) > 2 else None, args[3] if len(args) > 3 else None
    n = math.prod(int(s) for s in shape)
    wb = 1.0 if w is None else bound_of(w)
    bb = 0.0 if b is None else bound_of(b)
    if wb is None or bb is None:
        return None
    return math.sqrt(n) * wb + bb  # (a normalised vector's entries are at most sqrt(n))


def _square(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    b = bound_of(args[0])
    return None if b is None else b * b


def _mse(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    a, b = bound_of(args[0]), bound_of(args[1])
    return None if a is None or b is None else (a + b) ** 2


def _attention(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Bound:
    return bound_of(args[2])  # a convex combination of the values


SAME = [
    aten.view.default,
    aten._unsafe_view.default,
    aten.reshape.default,
    aten.t.default,
    aten.transpose.int,
    aten.permute.default,
    aten.unsqueeze.default,
    aten.squeeze.dim,
    aten.squeeze.default,
    aten.squeeze.dims,
    aten.expand.default,
    aten.clone.default,
    aten.select.int,
    aten.slice.Tensor,
    aten.index.Tensor,
    aten.repeat.default,
    aten.flip.default,
    aten.roll.default,
    aten.split.Tensor,
    aten.split_with_sizes.default,
    aten.unbind.int,
    aten.alias.default,
    aten.detach.default,
    aten.movedim.int,
    aten.unfold.default,
    aten.constant_pad_nd.default,
    aten.neg.default,
    aten.abs.default,
    aten.relu.default,
    aten.gelu.default,
    aten.silu.default,
    aten.mean.default,
    aten.mean.dim,
    aten.max.default,
    aten.min.default,
    aten.amax.default,
    aten.amin.default,
    aten.max.dim,
    aten.min.dim,
    aten.max_pool2d_with_indices.default,
    aten.avg_pool2d.default,
    aten._adaptive_avg_pool2d.default,
    aten.gather.default,
    aten.index_select.default,
    aten._to_copy.default,
    aten.std.correction,
]

RULES: dict[Any, Rule] = {
    **{op: same_entries for op in SAME},
    aten.cat.default: _cat,
    aten.stack.default: _cat,
    aten.where.self: _where,
    aten.add.Tensor: _add,
    aten.add.Scalar: _add,
    aten.sub.Tensor: _add,
    aten.sub.Scalar: _add,
    aten.rsub.Tensor: _add,
    aten.rsub.Scalar: _add,
    aten.mul.Tensor: _mul,
    aten.mul.Scalar: _mul,
    aten.mm.default: _mm,
    aten.bmm.default: _mm,
    aten.mv.default: _mm,
    aten.dot.default: _mm,
    aten.addmm.default: _addmm,
    aten.baddbmm.default: _addmm,
    aten.convolution.default: _conv,
    aten.sum.default: _sum,
    aten.sum.dim_IntList: _sum,
    aten.div.Tensor: _div,
    aten.div.Scalar: _div,
    aten.sigmoid.default: _unit,
    aten.tanh.default: _unit,
    aten._softmax.default: _unit,
    aten._safe_softmax.default: _unit,
    aten.exp.default: _exp,
    aten.sqrt.default: _sqrt,
    aten.pow.Tensor_Scalar: _pow,
    aten.clamp.default: _clamp,
    aten.clamp.Tensor: _clamp,
    aten.hardtanh.default: _clamp,
    aten.masked_fill.Scalar: _masked_fill,
    aten.masked_fill.Tensor: _masked_fill,
    aten.embedding.default: _embedding,
    aten.native_layer_norm.default: _layer_norm,
    aten.var.correction: _square,
    aten.var_mean.correction: _square,
    aten.mse_loss.default: _mse,
    aten._scaled_dot_product_flash_attention_for_cpu.default: _attention,
}

# Ops whose result (or a product inside them) is a product of two fixed-point values
# before its truncation: its ring value must stay below 2^62. The value checked is the
# rule's bound, or (for an op that squares inside) the square of its input's bound.
PRODUCTS = {
    aten.mul.Tensor,
    aten.mul.Scalar,
    aten.mm.default,
    aten.bmm.default,
    aten.mv.default,
    aten.dot.default,
    aten.addmm.default,
    aten.baddbmm.default,
    aten.convolution.default,
    aten.pow.Tensor_Scalar,
    aten.mse_loss.default,
}
SQUARES_INSIDE = {
    aten.var.correction,
    aten.std.correction,
    aten.var_mean.correction,
    aten.native_layer_norm.default,
}
IN_PLACE = {
    aten.add_.Tensor: aten.add.Tensor,
    aten.add_.Scalar: aten.add.Scalar,
    aten.sub_.Tensor: aten.sub.Tensor,
    aten.sub_.Scalar: aten.sub.Scalar,
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor,
    aten.div_.Scalar: aten.div.Scalar,
    aten.neg_.default: aten.neg.default,
    aten.relu_.default: aten.relu.default,
}
COMPARISONS = {
    aten.lt.Tensor,
    aten.lt.Scalar,
    aten.gt.Tensor,
    aten.gt.Scalar,
    aten.le.Tensor,
    aten.le.Scalar,
    aten.ge.Tensor,
    aten.ge.Scalar,
    aten.eq.Tensor,
    aten.eq.Scalar,
    aten.ne.Tensor,
    aten.ne.Scalar,
}


def _fixed_point(args: tuple[Any, ...]) -> SharedTensor | None:
    """The first shared float operand (None: the op is on integers, which wrap as
    torch's do)."""
    for a in args:
        for t in a if isinstance(a, list | tuple) else (a,):
            if isinstance(t, SharedTensor) and t.dtype.is_floating_point:
                return t
    return None


def _product_scale(func: Any, args: tuple[Any, ...], x: SharedTensor) -> int:
    """The scale of a product's ring value before its truncation: the sum of the
    operands' scales (a public non-integer operand is encoded at the session's scale)."""
    f = x.session.config.frac_bits
    if func in (aten.addmm.default, aten.baddbmm.default):
        args = args[1:]
    scales = []
    for a in args[:2]:
        if isinstance(a, SharedTensor):
            scales.append(a.frac_bits - a.pending)
        elif isinstance(a, torch.Tensor | float) and not _integral(a):
            scales.append(f)
        else:
            scales.append(0)
    if func is aten.pow.Tensor_Scalar:
        return 2 * (x.frac_bits - x.pending)
    return sum(scales)


def _integral(p: Any) -> bool:
    if isinstance(p, torch.Tensor):
        return not p.dtype.is_floating_point or bool((p == p.round()).all())
    return float(p) == int(p)


def check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Bound:
    """The bound of ``func``'s result ``out`` from its operands' (None: not known), after
    warning (:class:`FixedPointRangeWarning`) if that bound lets the result leave the
    range. Called once the op ran (a scale is read as ``frac_bits - pending``, which
    running it does not change)."""
    base = IN_PLACE.get(func, func)
    x = _fixed_point(args)
    if x is None:
        return None
    if base in COMPARISONS:
        a, b = bound_of(args[0]), bound_of(args[1])
        if a is not None and b is not None:
            scale = max(t.frac_bits for t in args[:2] if isinstance(t, SharedTensor))
            _warn_if(func, a + b, scale, RING_BITS, "the compared difference")
        return 1.0
    rule = RULES.get(base)
    bound = rule(args, kwargs) if rule is not None else None
    if bound is None:
        return None
    if base in PRODUCTS:
        _warn_if(func, bound, _product_scale(base, args, x), PRODUCT_BITS, "the product")
    elif base in SQUARES_INSIDE:
        b = bound_of(args[0])
        if b is not None:
            scale = 2 * (x.frac_bits - x.pending)
            _warn_if(func, b * b, scale, PRODUCT_BITS, "a square inside it")
    else:
        first = out[0] if isinstance(out, list | tuple) and out else out
        if isinstance(first, SharedTensor):
            bits = PRODUCT_BITS if first.pending else RING_BITS  # (a product not truncated)
            _warn_if(func, bound, first.frac_bits, bits, "the result")
    return bound


def _warn_if(func: Any, value: float, scale: int, bits: int, what: str) -> None:
    if not math.isfinite(value) or value * 2.0**scale >= 2.0**bits:
        top = 2.0 ** (bits - scale)
        warnings.warn(
            f"{_name(func)}: {what} can reach {value:.4g} in magnitude (from what the client "
            f"knows: max |x| of the values it shared and its public operands), at or above "
            f"the fixed-point range 2**{bits - scale} = {top:.4g} of a ring value at scale "
            f"2**{scale}: the result can come back wrong without an error. Scale the values "
            "down, or share with fewer fractional bits (frac_bits=); mpc.debug() shows "
            "whether it does",
            FixedPointRangeWarning,
            stacklevel=_stacklevel(),
        )


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", func)).split(".")[0]


# the caller outside mpc, pointers and torch is the line a warning names
_MPC = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = tuple(
    os.path.join(d, "")
    for d in (
        _MPC,
        os.path.join(os.path.dirname(_MPC), "pointers"),
        os.path.dirname(torch.__file__),
    )
)


def _stacklevel() -> int:
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


# -- the non-linear functions' valid input ranges (their docstrings say the same) ------------


class Domain:
    """Where a non-linear function is accurate, what it returns outside, and the fix."""

    def __init__(self, lo: float, hi: float, on_abs: bool, outside: str, fix: str) -> None:
        self.lo, self.hi, self.on_abs, self.outside, self.fix = lo, hi, on_abs, outside, fix

    def text(self) -> str:
        x = "|x|" if self.on_abs else "x"
        return f"{self.lo:.4g} <= {x} < {self.hi:.4g}"

    def outside_of(self, x: torch.Tensor) -> torch.Tensor:
        v = x.abs() if self.on_abs else x
        return ~((v >= self.lo) & (v < self.hi))


DOMAINS: dict[Any, Domain] = {
    aten.exp.default: Domain(
        -16.6,
        11.09,
        False,
        "0 below, 2^16 above",
        "subtract a known upper bound first (as softmax does: exp(x - max))",
    ),
    aten.log.default: Domain(
        2.0**-16,
        2.0**16,
        False,
        "-16 ln 2 below (x <= 0 too), 16 ln 2 above",
        "keep inputs positive and scaled into the range (log(x) = log(s x) - log(s))",
    ),
    aten.reciprocal.default: Domain(
        2.0**-12,
        2.0**12,
        True,
        "+-2^12 below (x = 0 gives 2^12), +-2^-12 above",
        "scale the divisor into the range (1/x = s / (s x)) and keep it away from 0",
    ),
    aten.div.Tensor: Domain(
        2.0**-12,
        2.0**12,
        True,
        "a * (+-2^12) for a divisor below, a * (+-2^-12) above",
        "scale the divisor into the range (a/b = (s a)/(s b)) and keep it away from 0",
    ),
    aten.rsqrt.default: Domain(
        2.0**-14,
        2.0**16,
        False,
        "2^7 below (x <= 0 too), 2^-8 above",
        "keep inputs positive and scaled into the range (add an epsilon)",
    ),
    aten.sqrt.default: Domain(
        0.0,
        2.0**16,
        False,
        "x 2^7 for x < 0 (-512 at -4), wrong above",
        "keep inputs non-negative (x.relu(), or x * x + eps) and below 2^16",
    ),
}


_KEEPS_MATRIX = {aten.detach.default, aten.alias.default, aten.clone.default}


def _swaps_last_two(func: Any, args: tuple[Any, ...]) -> bool:
    x = args[0]
    if func is aten.t.default:
        return True
    if func is aten.transpose.int:
        dims = {d % x.dim() for d in args[1:3]}
        return dims == {x.dim() - 1, x.dim() - 2}
    return False


@hook("result")
def after_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """Every op on shared tensors: check its result's range and give it its bound."""
    propagate(out, check(func, args, kwargs, out), func, args)


def propagate(out: Any, bound: Bound, func: Any = None, args: tuple[Any, ...] = ()) -> None:
    """Give the shared results of an op their bound (and a shared matrix's transpose or
    copy its :func:`abs_sums`)."""
    sums = None
    src = args[0] if args else None
    if isinstance(src, SharedTensor) and src.abs_sums is not None:
        if func in _KEEPS_MATRIX:
            sums = src.abs_sums
        elif _swaps_last_two(func, args):
            sums = (src.abs_sums[1], src.abs_sums[0])
    for t in out if isinstance(out, list | tuple) else (out,):
        if isinstance(t, SharedTensor) and t.dtype.is_floating_point:
            t.bound = bound
            t.abs_sums = sums
