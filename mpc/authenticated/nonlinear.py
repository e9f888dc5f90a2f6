"""The non-linear ops on authenticated tensors, built on the authenticated comparison with
zero (:mod:`mpc.protocols.auth_comparison`): x < y is [x - y < 0]; ReLU is
x - x [x < 0]; the max of two is a - (a - b) [a - b < 0]; a max over a dim (and
max-pooling, over each window) is a tree of those, one comparison a level. Comparisons
are exact for |x - y| < 2^62 in the ring (2^46 at 16 fractional bits), as truncation.
With ``comparison="fss"`` (2 parties, :mod:`mpc.protocols.auth_fss`) they are exact on the
whole ring, and the product z [z < 0] of ReLU and the max rides on the comparison's one
round.
"""

from __future__ import annotations

from typing import Any, cast

import torch

from mpc.authenticated.deferred import DeferredRelu, relu_source
from mpc.authenticated.ops import (
    Auth,
    add_any,
    check_public,
    mul,
    neg_auth,
    ready,
    wrap,
)
from mpc.authenticated.tensor import register
from mpc.errors import MPCError, UnsupportedOpError
from mpc.protocols.auth_comparison.run import auth_ltz
from mpc.protocols.auth_fss.run import auth_fss_ltz, auth_fss_select
from mpc.protocols.auth_local.run import linear

aten = torch.ops.aten


def difference(a: Any, b: Any) -> Auth:
    """a - b, at least one authenticated."""
    if isinstance(a, Auth):
        return add_any(a, b, -1)
    check_public(a, "comparison")
    return add_any(neg_auth(b), a)


def negative(d: Auth) -> Auth:
    """[d < 0]: an authenticated bit (dtype bool, an integer)."""
    ready(d)
    fss = d.session.config.comparison == "fss"
    ltz = auth_fss_ltz if fss else auth_ltz
    return Auth(ltz(d.session, d.shares), d.session, 0, torch.bool)


def times_negative(d: Auth) -> Auth:
    """d [d < 0]: with FSS comparisons in the comparison's own round, else a comparison and
    a product."""
    ready(d)
    if d.session.config.comparison == "fss":
        _, zbit = auth_fss_select(d.session, d.shares)
        return Auth(zbit, d.session, d.frac_bits, d.dtype)
    return times(d, negative(d))


def one_minus(bit: Auth) -> Auth:
    return wrap(bit, linear(bit.session, [bit.shares], [-1], torch.ones((), dtype=torch.int64)))


@register(aten.lt.Tensor, aten.lt.Scalar)
def lt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return negative(difference(args[0], args[1]))


@register(aten.gt.Tensor, aten.gt.Scalar)
def gt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return negative(difference(args[1], args[0]))


@register(aten.ge.Tensor, aten.ge.Scalar)
def ge(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return one_minus(negative(difference(args[0], args[1])))


@register(aten.le.Tensor, aten.le.Scalar)
def le(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return one_minus(negative(difference(args[1], args[0])))


def times(x: Auth, bit: Auth) -> Auth:
    """x * bit (exact: the bit is an integer, no truncation)."""
    out = mul(aten.mul.Tensor, (x, bit), {})
    assert isinstance(out, Auth)
    return out


@register(aten.relu.default)
def relu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """x - x [x < 0], when its shares are first read (a max-pool of it pools first:
    :mod:`mpc.authenticated.deferred`)."""
    x = args[0]
    ready(x)
    return DeferredRelu(x, relu_now)


def relu_now(x: Auth) -> Auth:
    return difference(x, times_negative(x))  # x - x [x < 0]


def max_of_two(a: Auth, b: Auth) -> Auth:
    """max(a, b) = a - (a - b) [a - b < 0]: one comparison and one product (with FSS
    comparisons, the product in the comparison's round)."""
    d = difference(a, b)
    return difference(a, times_negative(d))


@register(aten.maximum.default, aten.minimum.default)
def maximum(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args
    if not (isinstance(a, Auth) and isinstance(b, Auth)):
        raise UnsupportedOpError(str(func), "both operands secret-shared")
    if func is aten.minimum.default:
        return neg_auth(max_of_two(neg_auth(a), neg_auth(b)))
    return max_of_two(a, b)


def max_last(x: Auth) -> Auth:
    """The max over x's last dim, kept (size 1): a tree of pairs."""
    ready(x)
    m = x.shape[-1]
    if m == 0:
        raise MPCError("max of an empty dim")
    while m > 1:
        h = m // 2
        top = max_of_two(x[..., 0 : 2 * h : 2], x[..., 1 : 2 * h : 2])
        x = cast(Auth, torch.cat([top, x[..., 2 * h :]], dim=-1)) if m % 2 else top
        m = h + m % 2
    return x


@register(aten.amax.default)
def amax(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dims = args[1] if len(args) > 1 else kwargs.get("dim", [])
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    if len(dims) != 1:
        raise UnsupportedOpError(str(func), "the max over one dim at a time")
    d = dims[0] % x.dim()
    v = max_last(x.transpose(d, -1)).transpose(d, -1)
    return v if keepdim else v.squeeze(d)


@register(aten.max.default)
def max_all(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return max_last(args[0].reshape(-1)).reshape(())


@register(aten.max_pool2d_with_indices.default)
def max_pool2d(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    source = relu_source(x)
    if source is not None:  # max(relu(a), ..) = relu(max(a, ..)): one ReLU a window
        pooled, indices = max_pool2d(func, (source, *args[1:]), kwargs)
        return relu_now(pooled), indices
    kernel = _pair(args[1])
    stride = _pair(args[2] if len(args) > 2 and args[2] else kwargs.get("stride") or kernel)
    padding = _pair(args[3] if len(args) > 3 else kwargs.get("padding", 0))
    dilation = _pair(args[4] if len(args) > 4 else kwargs.get("dilation", 1))
    ceil_mode = args[5] if len(args) > 5 else kwargs.get("ceil_mode", False)
    if any(padding) or dilation != [1, 1] or ceil_mode:
        raise UnsupportedOpError(str(func), "padding, dilation and ceil_mode are not supported")
    if x.dim() != 4:
        raise UnsupportedOpError(str(func), "expects (N, C, H, W) input")
    w = x.unfold(2, kernel[0], stride[0]).unfold(3, kernel[1], stride[1])
    w = w.reshape(*w.shape[:4], kernel[0] * kernel[1])
    v = max_last(w).squeeze(-1)
    # indices would cost an argmax; nn.MaxPool2d ignores them: a meta tensor fails loudly
    return v, torch.empty(tuple(v.shape), dtype=torch.int64, device="meta")


def _pair(v: Any) -> list[int]:
    v = list(v) if isinstance(v, list | tuple) else [v]
    return [int(d) for d in (v * 2 if len(v) == 1 else v)]


__all__ = ["max_last", "negative"]
