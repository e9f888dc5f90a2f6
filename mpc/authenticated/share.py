"""Sharing in the malicious mode: a tensor, or every parameter and floating-point buffer
of a model (``mpc.share(..., security="malicious")``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.authenticated.tensor import AuthenticatedTensor, share_authenticated
from mpc.errors import MPCError
from mpc.protocols.auth_weights.run import mark_fixed
from mpc.session import Session


def share_authenticated_any(x: Any, session: Session, frac_bits: int | None = None) -> Any:
    """Authenticated shares of a tensor, or of a model's parameters and floating-point
    buffers (in place; a tied parameter is shared once). Eval-mode batch norm, training and
    held models are not in the malicious mode yet."""
    if isinstance(x, nn.Module):
        return _share_module(x, session, frac_bits)
    return share_authenticated(x, session, frac_bits)


def _share_module(model: nn.Module, session: Session, frac_bits: int | None) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            raise MPCError("batch norm is not in the malicious mode yet")
    done: dict[int, Any] = {}
    for m in model.modules():
        for name, p in list(m._parameters.items()):
            if p is None or isinstance(p, AuthenticatedTensor):
                continue
            if id(p) not in done:
                shared = share_authenticated(p.detach(), session, frac_bits)
                done[id(p)] = nn.Parameter(shared, requires_grad=False)
                mark_fixed(done[id(p)])  # (its products keep one mask: weight instances)
            m._parameters[name] = done[id(p)]
        for name, b in list(m._buffers.items()):
            if b is None or isinstance(b, AuthenticatedTensor) or not torch.is_floating_point(b):
                continue
            if id(b) not in done:
                done[id(b)] = share_authenticated(b, session, frac_bits)
            m._buffers[name] = done[id(b)]
    return model
