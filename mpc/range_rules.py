"""The per-op rules of :mod:`mpc.ranges`: the bound of each op's result from its
operands' (:data:`RULES`), and the sets of ops it checks as products (:data:`PRODUCTS`,
:data:`SQUARES_INSIDE`), as comparisons (:data:`COMPARISONS`) and in place
(:data:`IN_PLACE`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mpc.math.encoding import abs_sums
from mpc.ops.inplace import OUT_OF_PLACE
from mpc.ops.local import SHAPE_OPS
from mpc.ops.masking import MASK_BELOW, MASKED_VALUE
from mpc.shared import SharedTensor

aten = torch.ops.aten

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


# the shape ops (mpc.ops.local: the same op on every share), then the ops whose bound is
# their input's
SAME = [
    *SHAPE_OPS,
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
IN_PLACE = OUT_OF_PLACE  # (an in-place op's rule is its out-of-place twin's: mpc.ops.inplace)
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
