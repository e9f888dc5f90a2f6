"""The ops on authenticated tensors (:class:`~mpc.authenticated.tensor.AuthenticatedTensor`),
keyed by aten overload, in three groups as for shared tensors: local on the shares (sums,
public operands, layout: one step at each party, :mod:`mpc.protocols.auth_local`),
bilinear (authenticated Beaver products: mul, matmul, conv2d), and non-linear
(:mod:`mpc.authenticated.nonlinear`). A public operand stays public and the op stays local.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.authenticated.tensor import AuthenticatedTensor, register
from mpc.errors import MPCError, PartyMismatchError, UnsupportedOpError
from mpc.math.encoding import encode
from mpc.protocols.auth_beaver.run import auth_beaver
from mpc.protocols.auth_local.run import bilinear_public, linear, scale, sum_shares, view
from mpc.protocols.auth_weights.run import fixed_product, view_of
from mpc.protocols.parties import Shares

aten = torch.ops.aten
Auth = AuthenticatedTensor


# -- helpers -------------------------------------------------------------------------------


def first_auth(args: Any) -> Auth:
    for a in args:
        if isinstance(a, Auth):
            return a
        if isinstance(a, list | tuple):
            for b in a:
                if isinstance(b, Auth):
                    return b
    raise MPCError("no authenticated operand")


def same_session(a: Auth, b: Auth) -> None:
    if a.session is not b.session:
        raise PartyMismatchError(
            f"operands are shared in different sessions: {a.session!r} and {b.session!r}"
        )


def result_dtype(*xs: Any) -> torch.dtype:
    for x in xs:
        if isinstance(x, torch.Tensor) and x.dtype.is_floating_point:
            return x.dtype
        if isinstance(x, float):
            return torch.float32
    return torch.int64


def check_public(p: Any, op: str) -> torch.Tensor:
    """A public operand as a CPU tensor (a pointer or a GPU tensor is refused)."""
    import pointers as pt

    if isinstance(p, pt.PointerTensor):
        raise MPCError(f"{op}: an operand is a pointer; secret-share it or get() it first")
    t = p.detach() if isinstance(p, torch.Tensor) else torch.tensor(p)
    if t.device.type != "cpu":
        raise MPCError(f"{op}: public operands must be CPU tensors")
    return t


def integral(p: torch.Tensor) -> bool:
    if not p.dtype.is_floating_point:
        return True
    return bool(torch.isfinite(p).all() and (p == p.round()).all() and p.abs().max() < 2**31)


def encoded(p: torch.Tensor, frac_bits: int) -> torch.Tensor:
    """A public operand in the ring at ``frac_bits``."""
    if not p.dtype.is_floating_point:
        return p.to(torch.int64) << frac_bits if frac_bits else p.to(torch.int64)
    return encode(p.to(torch.float64), frac_bits)


def ready(*xs: Any) -> None:
    """Apply the operands' pending truncations (every op but ``get`` takes them at one
    scale)."""
    for x in xs:
        if isinstance(x, Auth):
            x.materialize()


def aligned(a: Auth, b: Auth) -> tuple[Shares, Shares, int]:
    """The shares of a and b at one scale (the larger: exact, local)."""
    f = max(a.frac_bits, b.frac_bits)
    return rescaled(a, f), rescaled(b, f), f


def rescaled(x: Auth, f: int) -> Shares:
    if f == x.frac_bits:
        return x.shares
    return scale(x.session, x.shares, torch.tensor(1 << (f - x.frac_bits)))


def meta_of(x: Any) -> Any:
    if isinstance(x, torch.Tensor):
        dtype = torch.float32 if x.dtype.is_floating_point else x.dtype
        return torch.empty(x.shape, dtype=dtype, device="meta")
    if isinstance(x, list | tuple):
        return type(x)(meta_of(t) for t in x)
    return x


def out_shape(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[int, ...]:
    """The shape ``func`` gives the value (run on the meta device)."""
    out = func(*(meta_of(a) for a in args), **{k: meta_of(v) for k, v in kwargs.items()})
    return tuple(out.shape)


def wrap(x: Auth, shares: Shares, frac_bits: int | None = None, dtype: Any = None) -> Auth:
    return Auth(
        shares,
        x.session,
        x.frac_bits if frac_bits is None else frac_bits,
        x.dtype if dtype is None else dtype,
    )


# -- linear --------------------------------------------------------------------------------


def add_any(a: Any, b: Any, alpha: Any = 1) -> Auth:
    """a + alpha b, at least one authenticated."""
    ready(a, b)
    if isinstance(a, Auth) and isinstance(b, Auth):
        same_session(a, b)
        if not isinstance(alpha, int):
            b = mul_public(b, alpha)
            alpha = 1
        sa, sb, f = aligned(a, b)
        return wrap(a, linear(a.session, [sa, sb], [1, alpha]), f, result_dtype(a, b))
    if not isinstance(a, Auth):
        return add_any(b, a * alpha if not isinstance(alpha, int) or alpha != 1 else a)
    p = check_public(b, "add") * alpha
    return wrap(
        a, linear(a.session, [a.shares], [1], encoded(p, a.frac_bits)), dtype=result_dtype(a, b)
    )


@register(aten.add.Tensor, aten.add.Scalar)
def add(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return add_any(args[0], args[1], kwargs.get("alpha", args[2] if len(args) > 2 else 1))


@register(aten.sub.Tensor, aten.sub.Scalar)
def sub(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    return add_any(args[0], args[1], -alpha)


@register(aten.rsub.Tensor, aten.rsub.Scalar)
def rsub(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    alpha = kwargs.get("alpha", args[2] if len(args) > 2 else 1)
    x, other = args[0], args[1]
    return add_any(neg_auth(x) if alpha == 1 else mul_public(x, -alpha), other)


def neg_auth(x: Auth) -> Auth:
    ready(x)
    return wrap(x, linear(x.session, [x.shares], [-1]))


@register(aten.neg.default)
def neg(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return neg_auth(args[0])


def mul_public(x: Auth, p: Any) -> Auth:
    """x * p for a public p: exact for integers, else p in fixed point and a pending
    truncation."""
    ready(x)
    t = check_public(p, "mul")
    if integral(t):
        return wrap(x, scale(x.session, x.shares, t.to(torch.int64)), dtype=result_dtype(x, p))
    f = x.session.config.frac_bits
    out = Auth(
        scale(x.session, x.shares, encoded(t, f)),
        x.session,
        x.frac_bits + f,
        result_dtype(x, p),
        pending=f if x.frac_bits else 0,
    )
    return out


def expand_to(x: Auth, shape: tuple[int, ...]) -> Auth:
    if tuple(x.shape) == shape:
        return x
    return wrap(x, view(x.session, x.shares, "expand", [list(shape)], shape))


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    if not isinstance(a, Auth):
        a, b = b, a
    if not isinstance(b, Auth):
        return mul_public(a, b)
    same_session(a, b)
    ready(a, b)
    shape = tuple(torch.broadcast_shapes(a.shape, b.shape))
    a, b = expand_to(a, shape), expand_to(b, shape)
    z = auth_beaver(a.session, a.shares, b.shares, "mul", {}, shape)
    return product(a, b, z)


def product(a: Auth, b: Auth, z: Shares) -> Auth:
    """The product of a and b at the sum of their scales, its truncation pending."""
    return Auth(
        z,
        a.session,
        a.frac_bits + b.frac_bits,
        result_dtype(a, b),
        pending=min(a.frac_bits, b.frac_bits),
    )


@register(aten.div.Tensor, aten.div.Scalar)
def div(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, d = args[0], args[1]
    if not isinstance(x, Auth) or isinstance(d, Auth) or kwargs.get("rounding_mode"):
        raise UnsupportedOpError(str(func), "only division by a public number is supported")
    t = check_public(d, "div").to(torch.float64)
    return mul_public(x, 1.0 / t)


# -- bilinear ------------------------------------------------------------------------------


def bilinear_op(a: Any, b: Any, op: str, params: dict[str, Any], shape: tuple[int, ...]) -> Auth:
    """op(a, b) (matmul or conv2d), at least one operand authenticated."""
    ready(a, b)
    if isinstance(a, Auth) and isinstance(b, Auth):
        same_session(a, b)
        z = fixed_product(a.session, a, b, op, params, shape)  # (a model's weight: its instance)
        if z is None:
            z = auth_beaver(a.session, a.shares, b.shares, op, params, shape)
        return product(a, b, z)
    x, p, public_first = (a, b, False) if isinstance(a, Auth) else (b, a, True)
    t = check_public(p, op)
    f = 0 if integral(t) else x.session.config.frac_bits
    z = bilinear_public(x.session, x.shares, encoded(t, f), public_first, op, params, shape)
    dtype = result_dtype(a, b)
    return Auth(z, x.session, x.frac_bits + f, dtype, pending=f if x.frac_bits else 0)


@register(aten.mm.default, aten.bmm.default)
def mm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return bilinear_op(args[0], args[1], "matmul", {}, out_shape(func, args, {}))


@register(aten.mv.default)
def mv(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    m, v = args
    col = v.unsqueeze(-1)
    return bilinear_op(m, col, "matmul", {}, (m.shape[0], 1)).squeeze(-1)


@register(aten.dot.default)
def dot(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args
    return bilinear_op(a.unsqueeze(0), b.unsqueeze(-1), "matmul", {}, (1, 1)).reshape(())


@register(aten.addmm.default)
def addmm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    prod = bilinear_op(a, b, "matmul", {}, (a.shape[0], b.shape[1]))
    if alpha != 1:
        prod = mul_public(prod, alpha)
    if beta == 0:
        return prod
    if beta != 1:
        bias = mul_public(bias, beta) if isinstance(bias, Auth) else bias * beta
    return add_any(prod, bias)


def _pair(v: Any) -> list[int]:
    v = list(v) if isinstance(v, list | tuple) else [v]
    return v * 2 if len(v) == 1 else v


@register(aten.convolution.default)
def convolution(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, w, bias, stride, padding, dilation, transposed, _output_padding, groups = args[:9]
    if transposed or len(x.shape) != 4 or len(w.shape) != 4:
        raise UnsupportedOpError(str(func), "2-D convolution (N, C, H, W) only, not transposed")
    params = {
        "stride": _pair(stride),
        "padding": _pair(padding),
        "dilation": _pair(dilation),
        "groups": int(groups),
    }
    shape = out_shape(func, (x, w, None, *args[3:9]), {})
    out = bilinear_op(x, w, "conv2d", params, shape)
    if bias is not None:
        out = add_any(out, bias.reshape(1, -1, 1, 1))
    return out


# -- sums ----------------------------------------------------------------------------------


@register(aten.sum.default, aten.sum.dim_IntList)
def sum_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    ready(x)
    dims = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = bool(args[2] if len(args) > 2 else kwargs.get("keepdim", False))
    dims = None if dims is None or (isinstance(dims, list | tuple) and not dims) else list(dims)
    shape = out_shape(func, (x, *args[1:]), {k: v for k, v in kwargs.items() if k != "dtype"})
    return wrap(x, sum_shares(x.session, x.shares, dims, keepdim, shape))


@register(aten.mean.default, aten.mean.dim)
def mean(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    total = sum_(func, args, kwargs)
    count = max(math.prod(x.shape) // max(math.prod(total.shape), 1), 1)
    return mul_public(total, 1.0 / count)


# -- layout --------------------------------------------------------------------------------


def layout(func: Any, args: tuple[Any, ...], op: str, op_args: list[Any]) -> Auth:
    x = first_auth(args)
    shape = out_shape(func, args, {})
    if op in ("cat", "stack"):
        for t in args[0]:
            if not isinstance(t, Auth):
                raise UnsupportedOpError(str(func), "every tensor must be authenticated")
            same_session(x, t)
        ready(*args[0])
        if len({t.frac_bits for t in args[0]}) != 1:
            raise UnsupportedOpError(str(func), "the tensors must have one scale")
        src: Any = [t.shares for t in args[0]]
    else:
        ready(x)
        src = x.shares
    out = wrap(x, view(x.session, src, op, op_args, shape))
    if op not in ("cat", "stack"):
        view_of(x, out, op, op_args)  # (a view of a model's weight: a fixed weight)
    return out


@register(aten.view.default, aten._unsafe_view.default, aten.reshape.default)
def view_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    shape = out_shape(func, args, {})
    return layout(func, args, "view", [list(shape)])


@register(aten.permute.default)
def permute(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "permute", [list(args[1])])


@register(aten.transpose.int)
def transpose(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "transpose", [args[1], args[2]])


@register(aten.t.default)
def t(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if args[0].dim() < 2:
        return args[0]
    return layout(func, args, "transpose", [0, 1])


@register(aten.select.int)
def select(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "select", [args[1], args[2]])


@register(aten.slice.Tensor)
def slice_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dim = args[1] if len(args) > 1 else 0
    start = args[2] if len(args) > 2 else None
    end = args[3] if len(args) > 3 else None
    step = args[4] if len(args) > 4 else 1
    return layout(func, args, "slice", [dim, start, end, step])


@register(aten.index.Tensor)
def index(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    indices: list[Any] = []
    for i in args[1]:
        if i is None:
            indices.append(None)
            continue
        t = check_public(i, "index")
        if t.dtype == torch.bool:  # (a mask: the indices of its true elements)
            indices.extend(t.nonzero(as_tuple=True))
        else:
            indices.append(t.to(torch.int64))
    return layout(func, (args[0], indices), "index", [indices])


@register(aten.unsqueeze.default)
def unsqueeze(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "unsqueeze", [args[1]])


@register(aten.squeeze.dim, aten.squeeze.dims, aten.squeeze.default)
def squeeze(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if len(args) == 1:
        dims = list(range(x.dim()))
    else:
        dims = list(args[1]) if isinstance(args[1], list | tuple) else [args[1]]
    return layout(func, args, "squeeze", [dims])


@register(aten.expand.default)
def expand(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args[:2], "expand", [list(args[1])])


@register(aten.cat.default)
def cat(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return layout(func, (list(args[0]), dim), "cat", [dim])


@register(aten.stack.default)
def stack(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
    return layout(func, (list(args[0]), dim), "stack", [dim])


@register(aten.clone.default, aten.detach.default, aten.alias.default)
def clone(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    # (authenticated shares are never changed in place: the same shares serve)
    return Auth(x.shares, x.session, x.frac_bits, x.dtype, x.pending)


@register(aten.flip.default)
def flip(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "flip", [list(args[1])])


@register(aten.constant_pad_nd.default)
def pad(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    value = args[2] if len(args) > 2 else kwargs.get("value", 0)
    if value != 0:
        raise UnsupportedOpError(str(func), "padding with a value other than 0")
    return layout(func, args[:2], "pad", [list(args[1])])


@register(aten.unfold.default)
def unfold(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "unfold", [args[1], args[2], args[3]])


@register(aten.repeat.default)
def repeat(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return layout(func, args, "repeat", [list(args[1])])
