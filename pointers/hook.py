"""``pointers.hook(torch)``: opt-in seed-style methods, added only where torch lacks them.

Adds ``Tensor.send/get/move/tag/copy``-style conveniences, ``nn.Module.send/get`` and
``torch.utils.data.Dataset.federate``.
Higher layers add their own methods (``mpc`` adds ``share``) through the entry-point group
``pointers.tensor_methods``, so this package never imports them. Nothing torch already
defines is replaced, and calling ``hook`` twice is harmless.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from types import ModuleType
from typing import Any

from torch import nn

from pointers import compat
from pointers.compat import Hooked
from pointers.errors import PointerError
from pointers.module import get, send, tag

_MARK = "__pointers_hook__"
ENTRY_POINT_GROUP = "pointers.tensor_methods"


def _tensor_send(self: Any, *workers: Any) -> Any:
    return send(self, *workers)


def _tensor_get(self: Any) -> Any:
    raise PointerError("this tensor is local, not a pointer: there is nothing to get()")


def _tensor_move(self: Any, worker: Any) -> Any:
    return send(self, worker)


def _tensor_tag(self: Any, *tags: str, description: str = "") -> Any:
    return tag(self, *tags, description=description)


def _module_send(self: nn.Module, *workers: Any) -> nn.Module:
    return send(self, *workers)  # type: ignore[no-any-return]


def _module_get(self: nn.Module) -> nn.Module:
    return get(self)


def _dataset_federate(self: Any, workers: Any, fractions: Any = None) -> Any:
    from pointers.federated.datasets import FederatedDataset  # (loaded on first use)

    return FederatedDataset.federate(self, workers, fractions)


def _add(cls: type, name: str, fn: Any, added: list[str]) -> None:
    existing = cls.__dict__.get(name)
    if existing is not None and getattr(existing, _MARK, False):
        return  # ours already: hook() called twice
    if hasattr(cls, name):
        return  # torch has it: never replace
    setattr(fn, _MARK, True)
    setattr(cls, name, fn)
    added.append(f"{cls.__name__}.{name}")


def _hook(torch_module: ModuleType) -> Hooked:
    """Add the seed-style methods to ``torch.Tensor`` and ``nn.Module``; returns what was added."""
    if getattr(torch_module, "Tensor", None) is None:
        raise TypeError("hook() expects the torch module: pointers.hook(torch)")
    tensor_cls = torch_module.Tensor
    added = Hooked()
    _add_pysyft_names(torch_module, added)
    _add(tensor_cls, "send", _tensor_send, added)
    _add(tensor_cls, "get", _tensor_get, added)
    _add(tensor_cls, "move", _tensor_move, added)
    _add(tensor_cls, "tag", _tensor_tag, added)
    _add(torch_module.nn.Module, "send", _module_send, added)
    _add(torch_module.nn.Module, "get", _module_get, added)
    _add(torch_module.utils.data.Dataset, "federate", _dataset_federate, added)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        fn = ep.load()
        target = torch_module.nn.Module if ep.name.startswith("module.") else tensor_cls
        _add(target, ep.name.removeprefix("module."), _plain(fn), added)
    return added


class _HookFunction:
    """``pointers.hook(torch)`` (see :func:`_hook`). As PySyft's ``sy.hook`` (the hook the
    last ``sy.TorchHook(torch)`` made), it also has ``local_worker``, the client."""

    def __call__(self, torch_module: ModuleType) -> Hooked:
        """Add the seed-style methods to ``torch.Tensor`` and ``nn.Module``; returns what
        was added."""
        return _hook(torch_module)

    @property
    def local_worker(self) -> Any:
        return compat.local_worker()

    def __repr__(self) -> str:
        return "<function pointers.hook(torch)>"


hook = _HookFunction()
hook.__doc__ = _hook.__doc__


def TorchHook(torch_module: ModuleType) -> Hooked:  # noqa: N802 - PySyft's name
    """PySyft's ``sy.TorchHook(torch)``: :func:`hook` under PySyft's name."""
    return hook(torch_module)


def _add_pysyft_names(torch_module: ModuleType, added: list[str]) -> None:
    """PySyft 0.2 compatible methods (see :mod:`pointers.compat`)."""

    def module_copy(self: nn.Module) -> nn.Module:
        return compat.module_copy(self)

    def module_move(self: nn.Module, worker: Any) -> nn.Module:
        return compat.module_move(self, worker)

    def fix_precision(self: Any, *args: Any, **kwargs: Any) -> Any:
        return compat.fix_precision(self, *args, **kwargs)

    def float_precision(self: Any) -> Any:
        return compat.float_precision(self)

    def describe(self: Any, description: str) -> Any:
        return compat.describe(self, description)

    _add(torch_module.Tensor, "describe", describe, added)
    module_cls, tensor_cls = torch_module.nn.Module, torch_module.Tensor
    _add(module_cls, "copy", module_copy, added)
    _add(module_cls, "move", module_move, added)
    for cls in (tensor_cls, module_cls, torch_module.optim.Optimizer):
        _add(cls, "fix_precision", _plain(fix_precision), added)
    for cls in (tensor_cls, module_cls):
        _add(cls, "float_precision", _plain(float_precision), added)


def _plain(fn: Any) -> Any:
    """A fresh function object wrapping ``fn`` so the hook mark never touches ``fn``."""

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(self, *args, **kwargs)

    method.__name__ = getattr(fn, "__name__", "method")
    method.__doc__ = getattr(fn, "__doc__", None)
    return method
