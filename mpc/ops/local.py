"""Ops that are local on shares: shape ops, additions, sums, products with integer publics.

Additive sharing is linear, so each party applies the op to its own share (DTensor's
``Partial("sum")`` placement says the same). A public operand stays public: it is added
by party 0 only, or multiplies every share.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from mpc.errors import MPCError, ShapeError, UnsupportedOpError
from mpc.ops import row_scaled
from mpc.ops.common import (
    aten,
    check_public,
    encode_public,
    first_shared,
    is_integral,
    public_int,
    rescale,
    result_dtype,
    wrap,
)
from mpc.ops.masking import add_mask, mask_of
from mpc.protocols.truncation.run import truncate
from mpc.protocols.weights.run import view_of
from mpc.registry import register
from mpc.shared import SharedTensor, public_to_shares

# Shape ops: the same op on every share, the scale unchanged.
SHAPE_OPS = [
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
]
SHAPE_OPS = list(dict.fromkeys(SHAPE_OPS))


def _per_share(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], i: int) -> Any:
    def sub(a: Any) -> Any:
        if isinstance(a, SharedTensor):
            return a.shares[i]
        if isinstance(a, list | tuple):
            return type(a)(sub(b) for b in a)
        return a

    return func(*[sub(a) for a in args], **{k: sub(v) for k, v in kwargs.items()})


def _has_shared(a: Any) -> bool:
    if isinstance(a, list | tuple):
        return any(_has_shared(b) for b in a)
    return isinstance(a, SharedTensor)


@register(*SHAPE_OPS, lazy=True)
def shape_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = first_shared(args)
    deferred = row_scaled.view(x, func, args)  # (a layer norm's result, not formed yet)
    if deferred is not None:
        return deferred
    if func in (aten.detach.default, aten.alias.default):
        out = x.with_shares(list(x.shares))
        out.fixed = x.fixed
        return out
    for a in list(args[1:]) + list(kwargs.values()):
        check_public(a, str(func))
        if not isinstance(args[0], SharedTensor) or _has_shared(a):  # e.g. x[shared_index]
            raise UnsupportedOpError(str(func), "indices must be public")
    if func is aten.index.Tensor:
        args = (args[0], _long_indices(x, args[1]), *args[2:])
    per = [_per_share(func, args, kwargs, i) for i in range(x.session.n)]
    if isinstance(per[0], list | tuple):
        outs = [x.with_shares([p[k] for p in per]) for k in range(len(per[0]))]
    else:
        outs = [x.with_shares(per)]
    if x.pending or x.views_of_pending:  # see mpc.ops.inplace
        for t in [x, *outs]:
            t.views_of_pending = True
    if x.pending:
        _join_siblings(x, outs)
    view_of(x, outs, func, args[1:], kwargs)  # a view of a model's weight
    return type(per[0])(outs) if isinstance(per[0], list | tuple) else outs[0]


def _long_indices(x: SharedTensor, indices: list[Any]) -> list[Any]:
    """x[mask] for a public boolean mask: the mask's positions as integer indices (public,
    as the mask is), the one form whose result's shape is known before the op runs."""
    out: list[Any] = []
    dim = 0
    for idx in indices:
        if isinstance(idx, torch.Tensor) and idx.dtype in (torch.bool, torch.uint8):
            expect = tuple(x.shape[dim : dim + idx.dim()])
            if tuple(idx.shape) != expect:
                raise ShapeError(
                    f"boolean mask of shape {tuple(idx.shape)} on a shared tensor of shape "
                    f"{tuple(x.shape)}: expected a mask of the shape of the dimensions it "
                    f"indexes, {expect} (from dimension {dim}). Fix: build the mask from "
                    "those dimensions (as the same index of a plain tensor needs)"
                )
            out.extend(idx.bool().nonzero(as_tuple=True))
            dim += idx.dim()
        else:
            out.append(idx)
            dim += 1
    return out


def _join_siblings(x: SharedTensor, outs: list[SharedTensor]) -> None:
    """The pieces of a pending value (a split's outputs, and the views of those) are
    siblings: materialising one truncates every piece still pending, in one round
    (:meth:`mpc.shared.SharedTensor.materialize`; the query, key and value of one
    projection: one round, not three)."""
    group = x.siblings
    if group is None:
        if len(outs) < 2:
            return
        group = []
    if len(group) >= 64:  # (drop the pieces gone)
        group[:] = [r for r in group if r() is not None]
    for t in outs:
        group.append(weakref.ref(t))
        t.siblings = group


def _as_shared_list(xs: list[Any]) -> tuple[SharedTensor, list[list[Any]], int]:
    ref = first_shared(xs)
    f = max(x.frac_bits for x in xs if isinstance(x, SharedTensor))
    for x in xs:
        if not isinstance(x, SharedTensor):
            check_public(x, "cat/stack")
    per_party: list[list[Any]] = [[] for _ in ref.session.parties]
    for x in xs:
        if isinstance(x, SharedTensor):
            ref.session.check_compatible(x.session)
            shares = rescale(x, f)
        else:
            shares = public_to_shares(encode_public(x, f), ref)
        for i, s in enumerate(shares):
            per_party[i].append(s)
    return ref, per_party, f


@register(aten.cat.default, aten.stack.default)
def cat_like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    ref, per_party, f = _as_shared_list(list(args[0]))
    rest = args[1:]
    shares = [func(parts, *rest, **kwargs) for parts in per_party]
    return wrap(ref, shares, f, result_dtype(*args[0]))


@register(aten.constant_pad_nd.default)
def pad(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, padding = args[0], args[1]
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    shares = [func(s, padding, 0) for s in x.shares]
    if value:
        mask = func(torch.zeros(x.shape, dtype=torch.int64), padding, 1)
        fill = mask * encode_public(float(value), x.frac_bits)
        shares[0] = shares[0] + fill
    return x.with_shares(shares)


# -- addition and subtraction -------------------------------------------------------------


def add_shared(a: Any, b: Any, sign: int) -> SharedTensor:
    """a + sign * b with at least one shared operand."""
    for t in (a, b):  # a pending product by a small public (e.g. x / d) carries extra bits:
        if isinstance(t, SharedTensor) and t.frac_bits > 2 * t.session.config.frac_bits:
            t.materialize()  # truncate it rather than scale the other operand up as far
    if isinstance(a, SharedTensor) and isinstance(b, SharedTensor):
        a.session.check_compatible(b.session)
        f = max(a.frac_bits, b.frac_bits)
        precision = max(a.frac_bits - a.pending, b.frac_bits - b.pending)
        sa, sb = rescale(a, f), rescale(b, f)
        shares = [x + y if sign > 0 else x - y for x, y in zip(sa, sb)]
        return SharedTensor(shares, a.session, f, result_dtype(a, b), pending=f - precision)
    if isinstance(a, SharedTensor):
        check_public(b, "add")
        masked = mask_of(b)  # finfo.min / -inf entries: a public selection (mpc.ops.masking)
        if masked is not None:
            return add_mask(a, torch.as_tensor(b), masked, sign)
        f = a.frac_bits if a.frac_bits or is_integral(b) else a.session.config.frac_bits
        shares = rescale(a, f)
        enc = encode_public(b, f) * sign
        shares[0] = shares[0] + enc
        if tuple(shares[0].shape) != tuple(a.shape):  # broadcasting grew the result
            shares[1:] = [s.expand(shares[0].shape).clone() for s in shares[1:]]
        pending = a.pending if f == a.frac_bits else 0
        return SharedTensor(shares, a.session, f, result_dtype(a, b), pending=pending)
    # public - shared
    neg = neg_shared(b) if sign < 0 else b
    return add_shared(neg, a, 1)


def neg_shared(x: SharedTensor) -> SharedTensor:
    return x.with_shares([-s for s in x.shares])


def _scaled(b: Any, alpha: Any) -> Any:
    if alpha == 1:
        return b
    if isinstance(b, SharedTensor):
        return _mul_public(b, alpha)
    return b * alpha


@register(aten.add.Tensor, aten.add.Scalar, lazy=True)
def add(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    return add_shared(a, _scaled(b, kwargs.get("alpha", 1)), 1)


@register(aten.sub.Tensor, aten.sub.Scalar, lazy=True)
def sub(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    return add_shared(a, _scaled(b, kwargs.get("alpha", 1)), -1)


@register(aten.rsub.Tensor, aten.rsub.Scalar, lazy=True)
def rsub(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    return add_shared(b, _scaled(a, kwargs.get("alpha", 1)), -1)


@register(aten.neg.default, lazy=True)
def neg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return neg_shared(args[0])


# -- products with a public operand ------------------------------------------------------


def _mul_public(x: SharedTensor, p: Any) -> SharedTensor:
    """x * p for public p: exact for integral p; otherwise encode p and truncate."""
    check_public(p, "mul")
    x.materialize()
    if is_integral(p):
        k = public_int(p)
        is_mask = isinstance(p, torch.Tensor) and p.dtype == torch.bool
        dtype = x.dtype if is_mask else result_dtype(x, p)
        return wrap(x, [s * k for s in x.shares], x.frac_bits, dtype)
    f = x.session.config.frac_bits
    g = f + _extra_bits(p, x.frac_bits + f)
    enc = encode_public(p, g)
    shares = [s * enc for s in x.shares]
    final = x.frac_bits or f  # the result's precision once the truncation is applied
    pending = x.frac_bits + g - final
    return SharedTensor(shares, x.session, x.frac_bits + g, result_dtype(x, p), pending=pending)


_MAX_EXTRA_BITS = 24


def _extra_bits(p: Any, scale: int) -> int:
    """Extra fractional bits for encoding a public multiplier below 1 in magnitude (such as
    1/d): e = floor(log2(1 / max|p|)), so that p * 2^e <= 1 and the product of a share
    with p encoded at f + e bits needs no more room than a product with a value near 1,
    while p keeps f significant bits (relative error <= 2^-(f+1), instead of d * 2^-(f+1)
    for 1/d at f bits). Capped so that the scale stays well inside the ring."""
    top = float(p.detach().abs().max()) if isinstance(p, torch.Tensor) else abs(float(p))
    if not math.isfinite(top) or top == 0.0 or top >= 1.0:
        return 0
    e = math.floor(-math.log2(top))
    return max(0, min(e, _MAX_EXTRA_BITS, 60 - scale))


def mul_public(x: SharedTensor, p: Any) -> SharedTensor:
    return _mul_public(x, p)


def div_public(x: SharedTensor, p: Any) -> SharedTensor:
    check_public(p, "div")
    if isinstance(p, torch.Tensor):
        if (p == 0).any():
            raise ZeroDivisionError("division of a shared tensor by a public zero")
        return _mul_public(x, 1.0 / p.to(torch.float64))
    if p == 0:
        raise ZeroDivisionError("division of a shared tensor by zero")
    return _mul_public(x, 1.0 / float(p))


# -- reductions ----------------------------------------------------------------------


@register(aten.sum.default, aten.sum.dim_IntList)
def sum_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Local. Called directly (by ``mean``) on an operand with a pending truncation, the
    sum keeps it: the sum of untruncated products is truncated once, as a matmul's is."""
    x = args[0]
    if kwargs.get("dtype") is not None:
        kwargs = {k: v for k, v in kwargs.items() if k != "dtype"}
    out = x.with_shares([func(s, *args[1:], **kwargs) for s in x.shares])
    if not x.dtype.is_floating_point and x.dtype != torch.int64:
        # as torch: a sum of bools (shared as 0/1) is a count, of smaller integers an int64
        # (exact: the ring holds the unreduced sum, which the narrow dtype's would wrap)
        return wrap(out, list(out.shares), 0, torch.int64)
    return out


@register(aten.mean.default, aten.mean.dim, lazy=True)  # (the sum's truncation, as sum_)
def mean(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if func is aten.mean.default:
        total, count = sum_(aten.sum.default, (x,), {}), x.numel()
    else:
        dims = args[1] if len(args) > 1 else kwargs.get("dim")
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        dims = list(range(x.dim())) if dims is None else [d % max(x.dim(), 1) for d in dims]
        count = 1
        for d in dims:
            count *= x.shape[d]
        total = sum_(aten.sum.dim_IntList, (x, dims, keepdim), {})
    if x.frac_bits == 0:
        f = x.session.config.frac_bits
        total = wrap(total, rescale(total, f), f, torch.float32)
    precise = _mean_of_products(total, count)
    if precise is not None:
        return precise
    return div_public(total, count)


def _mean_of_products(total: SharedTensor, count: int) -> SharedTensor | None:
    """The mean of a sum whose truncation is pending (a sum of products, such as RMSNorm's
    mean of squares), for a power-of-two count 2^k: the sum truncated once to scale
    2f - k and read at scale 2f (the division is exact), with f bits still pending. The
    same one round as truncating first, but an op that takes pending operands (rsqrt)
    reads it with up to 2f bits: a mean of squares of values near 0.02 (4e-4, 26 units
    at 2^-16) keeps its precision. None where this does not apply."""
    f = total.session.config.frac_bits
    if not total.pending or count & (count - 1) or not total.dtype.is_floating_point:
        return None
    k = count.bit_length() - 1
    target = 2 * f - k
    if target <= f or total.frac_bits - total.pending > target:
        return None
    if total.frac_bits > target:
        shares = truncate(total.session, total.shares, total.frac_bits - target)
    else:  # exact: a smaller scale lifted
        shares = [sh * (1 << (target - total.frac_bits)) for sh in total.shares]
    return SharedTensor(shares, total.session, 2 * f, total.dtype, pending=f)


@register(aten._local_scalar_dense.default, aten.equal.default)
def reveal_value(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    raise UnsupportedOpError(
        str(func),
        "bool(), .item(), float(), int() and torch.equal need the secret value; "
        "reconstruct it with .get() first",
    )


@register(aten._to_copy.default)
def to_copy(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dtype = kwargs.get("dtype", x.dtype)
    if dtype == x.dtype or dtype is None:
        return x.with_shares(list(x.shares))
    if dtype.is_floating_point:
        f = x.session.config.frac_bits
        if x.frac_bits == 0:
            return wrap(x, rescale(x, f), f, dtype)
        return wrap(x, list(x.shares), x.frac_bits, dtype)
    if not x.dtype.is_floating_point and not dtype.is_floating_point:
        if x.dtype == torch.bool or dtype.itemsize <= x.dtype.itemsize:
            # bools are 0/1 integers already; a narrower integer dtype is the same ring
            # value, reduced to it at reconstruction (as torch's cast wraps it)
            return wrap(x, list(x.shares), 0, dtype)
        raise MPCError(
            f"cannot widen a shared {x.dtype} tensor to {dtype}: its ring value is not "
            f"reduced to {x.dtype} until reconstruction, and the reduction needs a "
            f"protocol; share it as {dtype} in the first place"
        )
    raise MPCError(f"cannot convert a shared {x.dtype} tensor to {dtype} without a protocol")
