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
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten, check_public
from mpc.protocols.compare import relu_with_mask
from mpc.protocols.weights.run import written
from mpc.registry import OPS, register
from mpc.shared import SharedTensor

# ReLU output (by its first share's pointer, which detach and alias keep) -> its bit
_RELU_MASKS: WeakIdKeyDictionary = WeakIdKeyDictionary()


def relu_keeping_mask(x: SharedTensor) -> SharedTensor:
    """relu(x) (a pending truncation fused, as in the plain ReLU) with the bit [x >= 0]
    kept for ``threshold_backward``: the same 7 rounds as a plain ReLU."""
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


# max-pool's indices output (by its first share's pointer) -> its windows' one-hot argmax
_POOL_ARGMAX: WeakIdKeyDictionary = WeakIdKeyDictionary()


def keep_pool_argmax(
    onehot: SharedTensor, x: SharedTensor, kernel: list[int], stride: list[int]
) -> SharedTensor:
    """The indices output of a max-pool whose input requires grad: torch's flat index
    into each (H, W) plane, shared (sum_k onehot_k * position_k: local), with the one-hot
    argmax kept for :func:`max_pool2d_backward` (no second comparison)."""
    w = x.shape[-1]
    ho, wo = onehot.shape[2], onehot.shape[3]
    kh, kw = kernel
    rows = torch.arange(ho).view(ho, 1, 1, 1) * stride[0] + torch.arange(kh).view(1, 1, kh, 1)
    cols = torch.arange(wo).view(1, wo, 1, 1) * stride[1] + torch.arange(kw).view(1, 1, 1, kw)
    pos = (rows * w + cols).reshape(ho, wo, kh * kw)
    idx = onehot.with_shares([(s * pos).sum(-1) for s in onehot.shares])
    _POOL_ARGMAX[idx.shares[0]] = (onehot, list(kernel), list(stride))
    return idx


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
    written(x)
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


# -- max-pooling ------------------------------------------------------------------------


@register(aten.max_pool2d_with_indices_backward.default)
def max_pool2d_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The gradient goes to each window's maximum: grad x one-hot argmax kept by the
    forward (one Beaver product of the gradient with 0/1 integers: 1 round, no
    truncation), the windows laid back onto the input (non-overlapping windows: a
    reshape; rows and columns no window covers get 0)."""
    grad, x, padding = args[0], args[1], args[4]
    indices = args[7] if len(args) > 7 else kwargs["indices"]
    kept = _POOL_ARGMAX.get(indices.shares[0]) if isinstance(indices, SharedTensor) else None
    if kept is None:
        raise UnsupportedOpError(
            str(func),
            "max-pooling's backward needs the argmax its forward keeps when the input "
            "requires grad (and grad mode is on)",
        )
    onehot, kh_kw, st = kept
    if st != kh_kw or any(padding):
        raise UnsupportedOpError(
            str(func),
            "max-pooling's backward supports non-overlapping windows "
            "(stride == kernel_size) without padding",
        )
    kh, kw = kh_kw
    n, c, ho, wo = onehot.shape[:4]
    contrib = _op(aten.mul.Tensor, grad.unsqueeze(-1), onehot)  # (N, C, Ho, Wo, kh*kw)
    g = contrib.reshape(n, c, ho, wo, kh, kw).permute(0, 1, 2, 4, 3, 5)
    g = g.reshape(n, c, ho * kh, wo * kw)
    h, w = x.shape[-2], x.shape[-1]
    if (h, w) != (ho * kh, wo * kw):
        g = _op(aten.constant_pad_nd.default, g, [0, w - wo * kw, 0, h - ho * kh], 0.0)
    return g


# -- convolution ------------------------------------------------------------------------


@register(aten.convolution_backward.default)
def convolution_backward(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """2-D convolution's backward as two more convolutions (Beaver products, 1 round each
    plus a truncation), groups 1 and dilation 1: the weight's gradient correlates the
    input with the output gradient (a conv of the transposed input by the transposed
    gradient, dilated by the stride); the input's gradient convolves the gradient with
    the flipped, transposed weight (stride 1 only); the bias's is a sum (local)."""
    grad, x, w = args[0], args[1], args[2]
    stride, padding, dilation = list(args[4]), list(args[5]), list(args[6])
    transposed, groups, mask = args[7], args[9], args[10]
    if transposed or groups != 1 or any(d != 1 for d in dilation) or len(w.shape) != 4:
        raise UnsupportedOpError(
            str(func), "only a 2-D convolution with groups=1 and dilation=1 has a backward"
        )
    kh, kw = w.shape[2], w.shape[3]
    grad_input = grad_weight = grad_bias = None
    if mask[0]:
        if any(s != 1 for s in stride):
            raise UnsupportedOpError(
                str(func), "the input's gradient of a strided convolution is not supported yet"
            )
        flipped = w.flip([2, 3]).transpose(0, 1).clone(memory_format=torch.contiguous_format)
        params = {
            "stride": [1, 1],
            "padding": [kh - 1 - padding[0], kw - 1 - padding[1]],
            "dilation": [1, 1],
            "groups": 1,
        }
        grad_input = bilinear_op(grad, flipped, "conv2d", params)
    if mask[1]:
        params = {"stride": [1, 1], "padding": padding, "dilation": stride, "groups": 1}
        gw = bilinear_op(
            x.transpose(0, 1).clone(memory_format=torch.contiguous_format),
            grad.transpose(0, 1).clone(memory_format=torch.contiguous_format),
            "conv2d",
            params,
        )
        grad_weight = gw.transpose(0, 1)[:, :, :kh, :kw].clone(
            memory_format=torch.contiguous_format
        )
    if mask[2]:
        grad_bias = grad.sum([0, 2, 3])
    return grad_input, grad_weight, grad_bias


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


# -- optimizer updates: lerp, addcmul, addcdiv (Adam, RMSprop, ...) -----------------------


def _lerp(x: Any, end: Any, weight: Any) -> Any:
    """x + w (end - x)."""
    return _op(aten.add.Tensor, x, _op(aten.mul.Tensor, _op(aten.sub.Tensor, end, x), weight))


def _addcmul(x: Any, a: Any, b: Any, value: Any = 1) -> Any:
    """x + value a b: one Beaver product (a public value scales the result locally)."""
    return _op(aten.add.Tensor, x, _op(aten.mul.Tensor, _op(aten.mul.Tensor, a, b), value))


def _addcdiv(x: Any, a: Any, b: Any, value: Any = 1) -> Any:
    """x + value a / b: a shared b costs a reciprocal (25 rounds, domain 2^-12 <= |b| <
    2^12: a smaller |b| saturates, see :func:`mpc.protocols.approx.reciprocal`)."""
    return _op(aten.add.Tensor, x, _op(aten.mul.Tensor, _op(aten.div.Tensor, a, b), value))


def _write(func: Any, x: Any, out: Any) -> Any:
    """``out`` brought to ``x``'s scale and written into ``x``'s shares at the parties (as
    :mod:`mpc.ops.inplace` does), so views of ``x`` (optimizer state) see it."""
    if not isinstance(x, SharedTensor) or not isinstance(out, SharedTensor):
        raise UnsupportedOpError(
            str(func),
            "a public tensor cannot hold a secret result in place; use the out-of-place op",
        )
    if out.frac_bits > x.frac_bits and out.dtype.is_floating_point:
        out.pending = max(out.pending, out.frac_bits - x.frac_bits)  # one truncation
    out.materialize()
    if tuple(out.shape) != tuple(x.shape):
        raise RuntimeError(
            f"{func}: output with shape {list(x.shape)} doesn't match the broadcast shape "
            f"{list(out.shape)}"
        )
    if out.frac_bits != x.frac_bits:
        raise UnsupportedOpError(str(func), f"internal: scale {out.frac_bits} != {x.frac_bits}")
    written(x)
    for s, o in zip(x.shares, out.shares):
        s.copy_(o)
    return x


@register(aten.lerp.Scalar, aten.lerp.Tensor)
def lerp(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _lerp(args[0], args[1], args[2] if len(args) > 2 else kwargs["weight"])


@register(aten.lerp_.Scalar, aten.lerp_.Tensor)
def lerp_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    weight = args[2] if len(args) > 2 else kwargs["weight"]
    return _write(func, args[0], _lerp(args[0], args[1], weight))


@register(aten.addcmul.default)
def addcmul(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _addcmul(args[0], args[1], args[2], kwargs.get("value", args[3] if len(args) > 3 else 1))


@register(aten.addcmul_.default)
def addcmul_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    value = kwargs.get("value", args[3] if len(args) > 3 else 1)
    return _write(func, args[0], _addcmul(args[0], args[1], args[2], value))


@register(aten.addcdiv.default)
def addcdiv(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _addcdiv(args[0], args[1], args[2], kwargs.get("value", args[3] if len(args) > 3 else 1))


@register(aten.addcdiv_.default)
def addcdiv_(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    value = kwargs.get("value", args[3] if len(args) > 3 else 1)
    return _write(func, args[0], _addcdiv(args[0], args[1], args[2], value))
