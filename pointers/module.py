"""Function forms of send/get/tag for tensors and ``nn.Module``s.

Sending a module keeps its Parameter objects: each one is swapped in place
(``torch.utils.swap_tensors``) for a pointer, so an optimizer built before ``send`` keeps
working on the remote parameters, and ``get`` swaps the values back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from pointers.errors import PointerError
from pointers.pointer_tensor import PointerTensor, send_tensor

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient

T = TypeVar("T", torch.Tensor, nn.Module)


def send(obj: T, worker: WorkerClient) -> Any:
    """Send a tensor (returns a PointerTensor) or a module (its parameters move) to ``worker``."""
    if isinstance(obj, nn.Module):
        return _send_module(obj, worker)
    return send_tensor(obj, worker)


def get(obj: Any) -> Any:
    """Bring back a pointer's value, or a sent module's parameters and gradients."""
    if isinstance(obj, nn.Module):
        return _get_module(obj)
    if isinstance(obj, PointerTensor):
        return obj.get()
    raise TypeError(f"get() expects a PointerTensor or a sent nn.Module, got {type(obj).__name__}")


def tag(obj: torch.Tensor, *tags: str, description: str = "") -> torch.Tensor:
    """Attach search tags (``worker.search(tag)``) to a tensor or a pointer; returns it."""
    if not tags or not all(isinstance(t, str) for t in tags):
        raise TypeError("tag() takes one or more tag strings")
    if isinstance(obj, PointerTensor):
        return obj.tag(*tags, description=description)
    if not isinstance(obj, torch.Tensor):
        raise TypeError(f"tag() expects a tensor, got {type(obj).__name__}")
    existing = getattr(obj, "tags", None) or set()
    obj.tags = set(existing) | set(tags)  # type: ignore[attr-defined]
    if description:
        obj.description = description  # type: ignore[attr-defined]
    return obj


def _module_location(module: nn.Module) -> WorkerClient | None:
    locations = {p.location.id: p.location for p in _pointers_of(module)}
    if len(locations) > 1:
        raise PointerError(f"the module's parameters are spread over {sorted(locations)}")
    return next(iter(locations.values()), None)


def _pointers_of(module: nn.Module) -> list[PointerTensor]:
    out: list[PointerTensor] = [p for p in module.parameters() if isinstance(p, PointerTensor)]
    out += [b for b in module.buffers() if isinstance(b, PointerTensor)]
    return out


def _send_module(module: nn.Module, worker: WorkerClient) -> nn.Module:
    current = _module_location(module)
    if current is not None:
        if current is worker:
            return module
        _move_module(module, worker)
        return module
    for sub in module.modules():
        for p in list(sub._parameters.values()):
            if p is None:
                continue
            ptr = send_tensor(p.detach(), worker)
            new = nn.Parameter(ptr, requires_grad=p.requires_grad)
            if p.grad is not None:
                new.grad = send_tensor(p.grad, worker)
            torch.utils.swap_tensors(p, new)
        for name, b in list(sub._buffers.items()):
            if b is not None:
                sub._buffers[name] = send_tensor(b, worker)
    return module


def _move_module(module: nn.Module, worker: WorkerClient) -> None:
    for sub in module.modules():
        for p in sub._parameters.values():
            if isinstance(p, PointerTensor):
                # swap a local placeholder in first, while p still points somewhere
                # (after a backward, swap_tensors runs an op on p); then move and swap in
                grad, alias = p.grad, p.detach()  # the alias shares the remote object
                p.grad = None
                placeholder = nn.Parameter(torch.empty(p.shape, dtype=p.dtype), p.requires_grad)
                torch.utils.swap_tensors(p, placeholder)
                new = nn.Parameter(alias.move(worker), requires_grad=p.requires_grad)
                torch.utils.swap_tensors(p, new)
                if isinstance(grad, PointerTensor):
                    p.grad = grad.move(worker)
        for name, b in list(sub._buffers.items()):
            if isinstance(b, PointerTensor):
                sub._buffers[name] = b.move(worker)


def _get_module(module: nn.Module) -> nn.Module:
    for sub in module.modules():
        for p in sub._parameters.values():
            if isinstance(p, PointerTensor):
                grad, alias = p.grad, p.detach()  # the alias shares the remote object
                p.grad = None
                placeholder = torch.empty(p.shape, dtype=p.dtype)
                torch.utils.swap_tensors(p, nn.Parameter(placeholder, p.requires_grad))
                p.data = alias.get().detach()
                if isinstance(grad, PointerTensor):
                    p.grad = grad.get().detach()
        for name, b in list(sub._buffers.items()):
            if isinstance(b, PointerTensor):
                sub._buffers[name] = b.get()
    return module
