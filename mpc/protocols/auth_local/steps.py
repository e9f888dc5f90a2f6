"""The local ops on authenticated shares (the client side:
:mod:`mpc.protocols.auth_local.run`): linear combinations and public constants
(:func:`auth_linear`), products by public operands (:func:`auth_scale`,
:func:`auth_bilinear_public`), sums (:func:`auth_sum`) and layout ops (:func:`auth_view`),
each on the value and the MAC alike, at each party. Their inputs and outputs are
authenticated shares (:mod:`mpc.protocols.auth_shares.steps`), sealed at the party."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from mpc.math import ring128 as r128
from mpc.protocols.auth_shares.steps import (
    VM,
    W128,
    bilinear_vm,
    kept_share,
    key_of,
    public_of,
    share_elems,
    share_of,
    shares_of,
    vm_peak,
    with_public,
)
from mpc.protocols.rules import party_seed
from mpc.protocols.sizes import SLACK, bilinear, numel, shape_of
from mpc.protocols.step import step
from pointers.worker.sealing import ProtocolCall

# -- local ops -----------------------------------------------------------------------------


def _linear_rule(call: ProtocolCall) -> Any:
    party_seed(call)
    key = key_of(call)
    if shares_of(call, "xs") != key.nonce:
        raise call.refuse("the shares are authenticated under another key")
    coefs = call.value("coefs")
    xs = call.value("xs")
    if not (
        isinstance(coefs, list)
        and isinstance(xs, list)
        and len(coefs) == len(xs)
        and all(type(c) is int and -(1 << 63) <= c < 1 << 63 for c in coefs)
    ):
        raise call.refuse("'coefs' takes one int64 coefficient per share")
    public_of(call, "const", optional=True)
    return [kept_share(key.nonce)]


def _linear_size(p: dict[str, Any]) -> int:
    n = share_elems(p, "xs")
    c = p.get("const")
    return 3 * VM * n + (3 * W128 * c.numel() if isinstance(c, torch.Tensor) else 0) + SLACK


@step(rule=_linear_rule, size=_linear_size, makes_material=True)
def auth_linear(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    first: bool,
    xs: list[torch.Tensor],
    coefs: list[int],
    const: torch.Tensor | None,
) -> torch.Tensor:
    """sum_k coefs[k] xs[k] + const (public, int64: sign-extended), broadcasting."""
    nd = max([x.dim() - 2 for x in xs] + ([const.dim()] if const is not None else []))
    out: torch.Tensor | None = None
    for c, x in zip(coefs, [ranked(x, nd) for x in xs]):
        if c == 1:
            term = x
        elif c == -1:
            term = r128.neg(x)
        else:
            term = r128.mul(r128.const(c, x), x)
        out = term if out is None else r128.add(out, term)
    if out is None:
        raise ValueError("a linear combination of no shares")
    if const is not None:
        shape = torch.broadcast_shapes(out.shape[2:], const.shape)
        out = with_public(out.expand(2, 2, *shape), key, first, r128.lift(const.expand(shape)))
    return out.contiguous()


def _scale_rule(call: ProtocolCall) -> Any:
    key = share_of(call, "x").nonce
    public_of(call, "p")
    return [kept_share(key)]


@step(rule=_scale_rule, size=vm_peak(6, "x"), makes_material=True)
def auth_scale(ctx: Any, x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """x * p elementwise for a public int64 tensor p (sign-extended), broadcasting."""
    nd = max(x.dim() - 2, p.dim())
    lifted = r128.lift(p.reshape(*([1] * (nd - p.dim())), *p.shape))
    return r128.mul(lifted.unsqueeze(1), ranked(x, nd)).contiguous()


def ranked(x: torch.Tensor, nd: int) -> torch.Tensor:
    """A share ``(2, 2, *S)`` with its value's shape padded to ``nd`` dims on the left
    (as broadcasting pads it)."""
    extra = nd - (x.dim() - 2)
    return x if extra <= 0 else x.reshape(2, 2, *([1] * extra), *x.shape[2:])


def _bilinear_rule(call: ProtocolCall) -> Any:
    key = share_of(call, "x").nonce
    public_of(call, "public")
    if type(call.value("public_first")) is not bool:
        raise call.refuse("'public_first' is a bool")
    return [kept_share(key)]


def _bilinear_size(p: dict[str, Any]) -> int:
    x, public = p.get("x"), p.get("public")
    xs = shape_of(x)[2:] if isinstance(x, torch.Tensor) and x.dim() >= 2 else [1]
    ps = shape_of(public)
    first, second = (ps, xs) if p.get("public_first") is True else (xs, ps)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 40 * (out + temp) + 8 * VM * share_elems(p, "x") + SLACK


@step(rule=_bilinear_rule, size=_bilinear_size, makes_material=True)
def auth_bilinear_public(
    ctx: Any,
    x: torch.Tensor,
    public: torch.Tensor,
    public_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """op(public, x) or op(x, public) for a bilinear ``op`` and a public int64 operand
    (sign-extended), on the value and the MAC alike."""
    return bilinear_vm(op, params, r128.lift(public), x, public_first)


def _sum_rule(call: ProtocolCall) -> Any:
    key = share_of(call, "x").nonce
    dims = call.value("dims")
    if dims is not None and not (isinstance(dims, list) and all(type(d) is int for d in dims)):
        raise call.refuse("'dims' is a list of ints or None")
    if type(call.value("keepdim")) is not bool:
        raise call.refuse("'keepdim' is a bool")
    return [kept_share(key)]


@step(rule=_sum_rule, size=vm_peak(3, "x"), makes_material=True)
def auth_sum(ctx: Any, x: torch.Tensor, dims: list[int] | None, keepdim: bool) -> torch.Tensor:
    """The sum over ``dims`` of the value's dims (None: all of them)."""
    nd = x.dim() - 2
    if dims is None:
        inner: list[int] = [d + 1 for d in range(nd)]
    else:
        inner = [_dim(d, nd) + 1 for d in dims]
    if not inner:
        return x.clone()
    return r128.sum128(x, inner, keepdim)


def _dim(d: int, n: int) -> int:
    if not -max(n, 1) <= d < max(n, 1):
        raise IndexError(f"dimension {d} out of range for {n} dimensions")
    return d % max(n, 1)


#: the layout ops an authenticated share takes (applied to its value's dims)
VIEWS = (
    "view",
    "permute",
    "transpose",
    "select",
    "slice",
    "index",
    "unsqueeze",
    "squeeze",
    "expand",
    "cat",
    "stack",
    "clone",
    "flip",
    "pad",
    "unfold",
    "repeat",
)


def _view_rule(call: ProtocolCall) -> Any:
    key = shares_of(call, "x")
    op = call.value("op")
    if op not in VIEWS:
        raise call.refuse(f"'op' is one of {VIEWS}, not {op!r}")
    if not isinstance(call.value("args"), list):
        raise call.refuse("'args' is a list")
    many = isinstance(call.value("x"), list)
    if many != (op in ("cat", "stack")):
        raise call.refuse(
            f"{op} takes {'a list of shares' if op in ('cat', 'stack') else 'one share'}"
        )
    return [kept_share(key)]


def _view_size(p: dict[str, Any]) -> int:
    n = share_elems(p, "x")
    if p.get("op") in ("expand", "repeat"):
        sizes = (p.get("args") or [[]])[0]
        if isinstance(sizes, list) and all(type(d) is int for d in sizes):
            n = max(n, numel([max(d, 1) for d in sizes]) * max(share_elems(p, "x"), 1))
    return 2 * VM * n + SLACK


@step(rule=_view_rule, size=_view_size, makes_material=True)
def auth_view(ctx: Any, x: Any, op: str, args: list[Any]) -> torch.Tensor:
    """A layout op on the value's dims of a share (or a list of shares: cat, stack)."""
    return apply_view(x, op, args)


def apply_view(x: Any, op: str, args: list[Any]) -> torch.Tensor:
    """``op`` (one of :data:`VIEWS`) with ``args`` on shares laid out ``(2, 2, *S)``."""
    if op in ("cat", "stack"):
        if not (isinstance(x, list) and x and all(isinstance(t, torch.Tensor) for t in x)):
            raise ValueError(f"{op} takes a non-empty list of shares")
        nd = x[0].dim() - 2 + (1 if op == "stack" else 0)
        (dim,) = args
        d = _dim(dim, nd) + 2
        return torch.cat(x, d) if op == "cat" else torch.stack(x, d)
    if not isinstance(x, torch.Tensor) or x.dim() < 2:
        raise ValueError("a layout op takes an authenticated share")
    nd = x.dim() - 2
    if op == "view":
        (shape,) = args
        return x.reshape(2, 2, *shape)
    if op == "permute":
        (dims,) = args
        if sorted(_dim(d, nd) for d in dims) != list(range(nd)):
            raise ValueError(f"permute takes a permutation of {nd} dims, got {dims}")
        return x.permute(0, 1, *[_dim(d, nd) + 2 for d in dims])
    if op == "transpose":
        d0, d1 = args
        return x.transpose(_dim(d0, nd) + 2, _dim(d1, nd) + 2)
    if op == "select":
        dim, index = args
        return x.select(_dim(dim, nd) + 2, index)
    if op == "slice":
        dim, start, end, step_ = args
        return x[
            (slice(None), slice(None))
            + (slice(None),) * _dim(dim, nd)
            + (slice(start, end, step_),)
        ]
    if op == "index":
        (indices,) = args
        return _index(x, indices)
    if op == "unsqueeze":
        (dim,) = args
        return x.unsqueeze(_dim(dim, nd + 1) + 2)
    if op == "squeeze":
        (dims,) = args
        out = x
        for d in sorted((_dim(d, nd) for d in dims), reverse=True):
            if out.shape[d + 2] == 1:
                out = out.squeeze(d + 2)
        return out
    if op == "expand":
        (sizes,) = args
        return x.expand(2, 2, *sizes)
    if op == "clone":
        return x.clone()
    if op == "flip":
        (dims,) = args
        return x.flip([_dim(d, nd) + 2 for d in dims])
    if op == "pad":
        (pad,) = args
        if not (isinstance(pad, list) and len(pad) <= 2 * nd):
            raise ValueError("pad takes at most two sizes per dim")
        return F.pad(x, pad)  # (zeros: a sharing of zero, value and MAC)
    if op == "unfold":
        dim, size, step_ = args
        return x.unfold(_dim(dim, nd) + 2, size, step_)
    if op == "repeat":
        (sizes,) = args
        return x.repeat(1, 1, *sizes)
    raise ValueError(f"unknown layout op {op!r}")


def _index(x: torch.Tensor, indices: list[Any]) -> torch.Tensor:
    """x[indices] over the value's dims: tensors (int64 or bool) and None (a whole dim),
    the tensors adjacent (so the indexed dims stay where they are)."""
    if not isinstance(indices, list) or len(indices) > x.dim() - 2:
        raise ValueError("index takes at most one index per dim")
    where = [k for k, i in enumerate(indices) if i is not None]
    if where and where != list(range(where[0], where[-1] + 1)):
        raise ValueError("index takes adjacent index tensors only")
    for i in indices:
        if i is not None and not (
            isinstance(i, torch.Tensor) and i.dtype in (torch.int64, torch.bool)
        ):
            raise ValueError("an index is an int64 or bool tensor")
    key = tuple(slice(None) if i is None else i for i in indices)
    return x[(slice(None), slice(None)) + key]
