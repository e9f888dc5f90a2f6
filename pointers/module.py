"""Function forms of send/get/tag for tensors and ``nn.Module``s.

Sending a module keeps its Parameter objects: each one is swapped in place
(``torch.utils.swap_tensors``) for a pointer, so an optimizer built before ``send`` keeps
working on the remote parameters, and ``get`` swaps the values back.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from pointers.errors import PointerError, SendError
from pointers.pointer_tensor import PointerTensor, send_tensor
from pointers.wire.messages import Fetch

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient

T = TypeVar("T", torch.Tensor, nn.Module)


def send(obj: T, *workers: WorkerClient) -> Any:
    """Send a tensor (returns a PointerTensor) or a module (its parameters move) to one
    worker: ``send(x, bob)``."""
    if len(workers) != 1:
        raise SendError(
            f"send() takes one worker, got {len(workers)}"
            + (f" ({', '.join(repr(getattr(w, 'id', w)) for w in workers)})" if workers else "")
            + ": send(x, bob) sends x to bob. To split x among several workers so that no "
            "one of them learns it, secret-share it: x.share(bob, alice, "
            "crypto_provider=carol) (mpc.share); to give each worker its own copy, send "
            "it to each: x.send(bob), x.send(alice)"
        )
    (worker,) = workers
    if isinstance(obj, nn.Module):
        return _send_module(obj, worker)
    return send_tensor(obj, worker)


def get(obj: Any) -> Any:
    """Bring back a pointer's value, or a sent module's parameters and gradients.

    A module whose tensors are of a type that brings its values back itself (a tensor
    type with a ``__module_get__(module)`` static method, as a secret-shared parameter
    has: its values are reconstructed for the client that shared them) is handed to it."""
    if isinstance(obj, nn.Module):
        return _get_module(obj)
    if isinstance(obj, PointerTensor):
        return obj.get()
    raise TypeError(f"get() expects a PointerTensor or a sent nn.Module, got {type(obj).__name__}")


def get_all(pointers: Sequence[PointerTensor], delete: bool = True) -> list[torch.Tensor]:
    """The values of ``pointers`` (as ``p.get(delete)`` each), fetched side by side: every
    request to a network worker leaves before the first reply is awaited, so fetching
    from n workers costs one round trip, not n. In-process workers answer one by one."""
    waits: list[Callable[[], torch.Tensor]] = []
    for p in pointers:
        if not isinstance(p, PointerTensor):
            raise TypeError(f"get_all() expects PointerTensors, got {type(p).__name__}")
        ref = p._ref
        start = getattr(ref.location, "request_async", None)
        if start is None or ref.chain is not None or p.requires_grad:
            waits.append(functools.partial(p.get, delete))  # (in order, when collected)
            continue
        ref.check()
        waits.append(_Fetched(p, start(Fetch(ref.obj_id, delete)), delete))
    values: list[Any] = []
    failed: list[tuple[float, int, PointerError]] = []
    for k, wait in enumerate(waits):
        try:
            values.append(wait())
        except PointerError as e:  # every request is answered first
            failed.append((getattr(wait, "origin", math.inf), k, e))
    if failed:  # the earliest cause: a request's error may come from an earlier post
        raise min(failed)[2]
    return values


class _Fetched:
    """Waits for one fetch sent ahead (see :func:`get_all`)."""

    def __init__(self, p: PointerTensor, pending: Any, delete: bool) -> None:
        self.p, self.pending, self.delete = p, pending, delete

    @property
    def origin(self) -> float:
        return float(getattr(self.pending, "origin", math.inf))

    def __call__(self) -> torch.Tensor:
        value = self.pending()
        if self.delete:
            self.p._ref.release()
        return value


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
    sent: dict[int, PointerTensor] = {}  # a buffer shared by modules is sent once
    for sub in module.modules():
        for p in list(sub._parameters.values()):
            if p is None or isinstance(p, PointerTensor):  # (a tied parameter, sent already)
                continue
            ptr = send_tensor(p.detach(), worker)
            new = nn.Parameter(ptr, requires_grad=p.requires_grad)
            if p.grad is not None:
                new.grad = send_tensor(p.grad, worker)
            torch.utils.swap_tensors(p, new)
        for name, b in list(sub._buffers.items()):
            if b is not None and not isinstance(b, PointerTensor):
                if id(b) not in sent:
                    sent[id(b)] = send_tensor(b, worker)
                sub._buffers[name] = sent[id(b)]
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
    for t in [*module.parameters(), *module.buffers()]:
        opener = getattr(type(t), "__module_get__", None)
        if opener is not None and not isinstance(t, PointerTensor):
            return opener(module)  # type: ignore[no-any-return]
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
