"""``mpc.share``: secret-share a tensor or every parameter and buffer of a model."""

from __future__ import annotations

from typing import Any, cast, overload

import torch
from torch import nn

from mpc.compat import check_protocol, share_remote, unwrap_fixed_precision
from mpc.config import MPCConfig
from mpc.errors import MPCError
from mpc.ops.backward import track_grad
from mpc.session import Session, session_for
from mpc.shared import SharedTensor, share_tensor
from pointers.pointer_tensor import PointerTensor


@overload
def share(
    x: torch.Tensor,
    *parties: Any,
    crypto_provider: Any | None = ...,
    frac_bits: int | None = ...,
    config: MPCConfig | None = ...,
    session: Session | None = ...,
    requires_grad: bool = ...,
    protocol: str | None = ...,
) -> SharedTensor: ...
@overload
def share(
    x: nn.Module,
    *parties: Any,
    crypto_provider: Any | None = ...,
    frac_bits: int | None = ...,
    config: MPCConfig | None = ...,
    session: Session | None = ...,
    requires_grad: bool = ...,
    protocol: str | None = ...,
) -> nn.Module: ...


def share(
    x: Any,
    *parties: Any,
    crypto_provider: Any | None = None,
    frac_bits: int | None = None,
    config: MPCConfig | None = None,
    session: Session | None = None,
    requires_grad: bool = False,
    protocol: str | None = None,
) -> Any:
    """Secret-share ``x`` (a tensor, or a model's parameters and buffers) among ``parties``.

    Floats are encoded in fixed point (``frac_bits``, default 16), integers exactly.
    Products and comparisons need a ``crypto_provider`` (a worker that deals correlated
    randomness and colludes with no party); without one only linear ops are available.
    Every call with the same parties, crypto provider and config shares one
    :class:`Session` (one set of seeds); ``session=`` names one explicitly.

    A shared model's parameters keep their ``requires_grad``, and ``requires_grad=True``
    makes a shared tensor a leaf that autograd fills ``.grad`` of: ``loss.backward()`` and
    ``torch.optim`` then train on shared values (see docs/encrypted-training.md).

    PySyft-compatible (:mod:`mpc.compat`): ``protocol="fss"`` or ``"snn"`` (both run our
    comparison), and ``x.fix_precision()`` tensors or models (shared with their precision).
    """
    check_protocol(protocol)
    x, frac_bits = unwrap_fixed_precision(x, frac_bits)
    if session is None:
        if len(parties) == 1 and isinstance(parties[0], list | tuple):
            parties = tuple(parties[0])
        if config is None:
            config = MPCConfig() if frac_bits is None else MPCConfig(frac_bits=frac_bits)
        session = session_for(list(parties), crypto_provider, config)
    elif parties:
        raise TypeError("pass either parties or session, not both")
    else:
        gone = session.restarted()
        if gone:
            raise MPCError(
                f"worker(s) {gone} of {session!r} restarted since its seeds were dealt, and "
                "their shares and seeds died with the old process: share without session= "
                "(the group then gets a new session), or make a new mpc.Session"
            )
    if isinstance(x, nn.Module):
        return _share_module(x, session)
    if isinstance(x, PointerTensor):  # the worker holding it splits it (mpc.compat)
        return share_remote(x, session, frac_bits, requires_grad)
    shared = share_tensor(x, session, frac_bits)
    if requires_grad:
        track_grad(shared.requires_grad_(True))
    return shared


def get(x: Any) -> Any:
    """Reconstruct a shared tensor, or every shared parameter and buffer of a model (in
    place: each becomes a plain ``nn.Parameter`` with the same ``requires_grad``; a shared
    ``.grad`` comes back too). Returns the tensor's value, or the model.

    ``pointers.get(model)`` / ``model.get()`` bring back *pointer* parameters; for a model
    trained on shared parameters use this (or ``p.get()`` per parameter). An optimizer
    built on the shared parameters still holds those: build a new one to go on in the clear.
    """
    if isinstance(x, SharedTensor):
        return x.get()
    if not isinstance(x, nn.Module):
        raise TypeError(f"mpc.get expects a SharedTensor or an nn.Module, got {type(x).__name__}")
    for m in x.modules():
        for name, p in list(m._parameters.items()):
            if isinstance(p, SharedTensor):
                new = nn.Parameter(p.get(), requires_grad=p.requires_grad)
                if isinstance(p.grad, SharedTensor):
                    new.grad = p.grad.get()
                m._parameters[name] = new
        for name, b in list(m._buffers.items()):
            if isinstance(b, SharedTensor):
                m._buffers[name] = b.get()
    return x


def share_method(self: Any, *parties: Any, **kwargs: Any) -> Any:
    """``x.share(alice, bob, crypto_provider=carol)`` after ``pointers.hook(torch)``."""
    return share(self, *parties, **kwargs)


def _share_module(model: nn.Module, session: Session) -> nn.Module:
    """Replace every parameter and buffer by its sharing (in place); eval-mode batch norm
    is folded into a per-channel scale and shift first (the model owner knows them)."""
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm) and not m.training:
            _fold_batch_norm(m)
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is not None:
                m._parameters[name] = nn.Parameter(
                    share_tensor(p.detach(), session), requires_grad=p.requires_grad
                )
                # (nn.Parameter of a tensor subclass is that subclass's own instance)
                track_grad(cast(SharedTensor, m._parameters[name]))
        for name, b in list(m._buffers.items()):
            if b is not None and name not in ("running_mean", "running_var", "num_batches_tracked"):
                m._buffers[name] = share_tensor(b, session)
    return model


def _fold_batch_norm(bn: nn.modules.batchnorm._BatchNorm) -> None:
    # (running statistics: what an eval-mode batch norm normalises with)
    mean, var = cast(torch.Tensor, bn.running_mean), cast(torch.Tensor, bn.running_var)
    with torch.no_grad():
        inv = torch.rsqrt(var + bn.eps)
        w = bn.weight if bn.weight is not None else torch.ones_like(inv)
        b = bn.bias if bn.bias is not None else torch.zeros_like(inv)
        scale = w * inv
        shift = b - mean * scale
        bn.weight = nn.Parameter(scale.clone(), requires_grad=False)
        bn.bias = nn.Parameter(shift.clone(), requires_grad=False)
        mean.zero_()
        var.fill_(1.0 - bn.eps)
