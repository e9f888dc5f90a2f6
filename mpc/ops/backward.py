"""The aten ops of torch's backward pass, and of losses and optimizers, on shared values.

Training runs through torch's own autograd above ``__torch_dispatch__``: a shared
parameter or input with ``requires_grad`` records the graph like any tensor, and
``loss.backward()`` sends the backward formulas down as aten ops, which the registry
serves like forward ops (``mm``, ``t``, ``sum``, ``mul``, ...). This module adds the ops
that only backward passes, losses and optimizers emit:

- ``ones_like`` (the seed of ``loss.backward()``) is public: products with it stay local;
  ``zeros_like``, ``new_zeros`` and ``zero_`` give a zero sharing (made at the parties, no
  data moves), so that optimizer state accumulates in place.
- ``threshold_backward`` (ReLU's backward) multiplies the gradient by the bit [x >= 0]
  that ReLU's forward kept (:func:`relu_keeping_mask`: the comparison's opened d and
  daBit give it locally), so a training step pays one comparison per ReLU, not two; one
  Beaver product (1 round) applies it. Without a kept bit (an in-place ReLU) it compares.
- ``mse_loss`` and its backward; ``nll_loss`` with public labels (its gradient is public);
  ``_softmax_backward_data`` from the saved output (products only);
  ``_log_softmax_backward_data`` with ``exp`` of the saved output (issue 13's functions).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from mpc.errors import UnsupportedOpError
from mpc.ops.common import aten, check_public
from mpc.protocols.compare import relu_with_mask
from mpc.registry import OPS, register
from mpc.shared import SharedTensor

# ReLU output (by its first share's pointer, which detach and alias keep) -> its bit
_RELU_MASKS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def relu_keeping_mask(x: SharedTensor) -> SharedTensor:
    """relu(x) (a pending truncation fused, as in the plain ReLU) with the bit [x >= 0]
    kept for ``threshold_backward``: the same 8 rounds as a plain ReLU."""
    out_shares, mask = relu_with_mask(x.session, x.shares, x.pending)
    out = x.with_shares(out_shares, frac_bits=x.frac_bits - x.pending)
    _RELU_MASKS[out_shares[0]] = SharedTensor(mask, x.session, 0, torch.int64)
    return out


def _materialized(grad: Any) -> Any:
    """A leaf's gradient at the session's scale (one truncation, also of extra bits that
    e.g. a softmax's backward carries), so that parameters update in place."""
    if isinstance(grad, SharedTensor):
        f = grad.session.config.frac_bits
        if grad.dtype.is_floating_point and grad.frac_bits > f:
            grad.pending = max(grad.pending, grad.frac_bits - f)
        grad.materialize()
    return grad


def track_grad(t: SharedTensor) -> SharedTensor:
    """A shared leaf that requires grad: its gradient is truncated when it arrives (the
    round its update would pay anyway), so optimizers may update it and their state in
    place (views of a product with a truncation pending could not be)."""
    if t.requires_grad and not getattr(t, "_mpc_grad_hook", False):
        t.register_hook(_materialized)
        t._mpc_grad_hook = True
    return t


def kept_mask(out: Any) -> SharedTensor | None:
    if isinstance(out, SharedTensor):
        return _RELU_MASKS.get(out.shares[0])
    return None


def _op(op: Any, *args: Any, **kwargs: Any) -> Any:
    """A registered op called directly (below autograd, as in any handler)."""
    return OPS[op](op, args, kwargs)


def _dtype(kwargs: dict[str, Any], x: torch.Tensor) -> torch.dtype:
    return kwargs.get("dtype") or x.dtype


# -- creation ---------------------------------------------------------------------------


@register(aten.ones_like.default)
def ones_like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    return torch.ones(tuple(x.shape), dtype=_dtype(kwargs, x))  # public: nothing secret


def _zeros(x: SharedTensor, shape: list[int], dtype: torch.dtype) -> SharedTensor:
    f = x.session.config.frac_bits if dtype.is_floating_point else 0
    shares = [s.new_zeros(shape) for s in x.shares]
    return SharedTensor(shares, x.session, f, dtype)


@register(aten.zeros_like.default)
def zeros_like(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    return _zeros(x, list(x.shape), _dtype(kwargs, x))


@register(aten.new_zeros.default)
def new_zeros(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, size = args[0], list(args[1])
    return _zeros(x, size, _dtype(kwargs, x))


@register(aten.zero_.default)
def zero_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    for s in x.shares:
        s.zero_()
    x.pending = 0
    return x


# -- ReLU -------------------------------------------------------------------------------


@register(aten.threshold_backward.default)
def threshold_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    grad, out, threshold = args[0], args[1], args[2]
    mask = kept_mask(out) if threshold == 0 else None
    if mask is None:  # no bit kept (an in-place ReLU, or a threshold): compare again
        if not isinstance(out, SharedTensor):
            return _op(aten.mul.Tensor, grad, out > threshold)
        mask = _op(aten.gt.Scalar, out, threshold)
    return _op(aten.mul.Tensor, grad, mask)


# -- losses -----------------------------------------------------------------------------

_NONE, _MEAN, _SUM = 0, 1, 2


def _reduce(x: Any, reduction: int) -> Any:
    if reduction == _MEAN:
        return x.mean()
    if reduction == _SUM:
        return x.sum()
    return x


@register(aten.mse_loss.default)
def mse_loss(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, target = args[0], args[1]
    reduction = args[2] if len(args) > 2 else kwargs.get("reduction", _MEAN)
    d = x - target
    return _reduce(d * d, reduction)


@register(aten.mse_loss_backward.default)
def mse_loss_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    grad, x, target, reduction = args[:4]
    scale = 2.0 / x.numel() if reduction == _MEAN else 2.0
    d = (x - target) * scale
    return d * grad


def _nll_weights(target: Any, classes: int, ignore_index: int, func: Any) -> torch.Tensor:
    if isinstance(target, SharedTensor):
        raise UnsupportedOpError(str(func), "the class labels must be public")
    check_public(target, str(func))
    keep = target != ignore_index
    onehot = torch.nn.functional.one_hot(torch.where(keep, target, 0), classes)
    return onehot * keep.unsqueeze(-1)


@register(aten.nll_loss_forward.default)
def nll_loss_forward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, target, weight, reduction, ignore_index = args[:5]
    if weight is not None or x.dim() != 2:
        raise UnsupportedOpError(str(func), "only (N, C) inputs without class weights")
    onehot = _nll_weights(target, x.shape[1], ignore_index, func)
    picked = -(x * onehot.to(torch.int64)).sum(dim=1)  # public 0/1: local, exact
    count = float(onehot.sum())
    if reduction == _MEAN:
        return picked.sum() / max(count, 1.0), torch.tensor(count)
    return _reduce(picked, reduction), torch.tensor(count)


@register(aten.nll_loss_backward.default)
def nll_loss_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    grad, x, target, weight, reduction, ignore_index, total = args[:7]
    onehot = _nll_weights(target, x.shape[1], ignore_index, func).to(torch.float32)
    g = -onehot
    if reduction == _MEAN:
        g = g / max(float(total), 1.0)
    if reduction == _NONE:
        return grad.unsqueeze(1) * g if isinstance(grad, SharedTensor) else g * grad[:, None]
    return grad * g if isinstance(grad, SharedTensor) else g * grad  # public labels: public


# -- softmax ----------------------------------------------------------------------------


@register(aten._softmax_backward_data.default)
def softmax_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    grad, out, dim = args[0], args[1], args[2]
    inner = (grad * out).sum(dim, keepdim=True)
    return (grad - inner) * out


@register(aten._log_softmax_backward_data.default)
def log_softmax_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """grad - exp(out) * grad.sum(dim): the saved output's exp is the softmax."""
    grad, out, dim = args[0], args[1], args[2]
    exp = OPS.get(aten.exp.default)
    if exp is None:
        raise UnsupportedOpError(
            str(func), "log_softmax's backward needs exp on shared values, which is not there yet"
        )
    probs = exp(aten.exp.default, (out,), {})
    return grad - probs * grad.sum(dim, keepdim=True)
