"""CrypTen's ``crypten.nn.Module`` and ``crypten.nn.from_pytorch``.

A ``crypten.nn.Module`` is a ``torch.nn.Module`` with CrypTen's methods: ``encrypt(src=0)``
shares its parameters (and floating-point buffers) among the world's parties with
:func:`mpc.share`, ``decrypt()`` reconstructs them, ``update_parameters(lr)`` takes an SGD
step. Its forward is torch's, on the shares: torch's autograd gives ``.grad`` of the shared
parameters. ``from_pytorch(model, dummy_input)`` wraps a copy of an unmodified torch model
(no ONNX export; ``dummy_input`` is accepted and not needed).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

import mpc
from mpc.crypten import _world
from mpc.crypten.cryptensor import unwrap_shared, wrap_shared
from mpc.shared import SharedTensor


class Module(nn.Module):
    """CrypTen's module: a torch module whose parameters ``encrypt()`` shares."""

    _crypten_encrypted = False

    @property
    def encrypted(self) -> bool:
        return self._crypten_encrypted

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        def compute(_: Any) -> Any:
            return wrap_shared(nn.Module.__call__(self, *args, **kwargs))

        return _world.collective(f"{type(self).__name__}.forward", compute)

    def encrypt(self, mode: bool = True, src: int = 0) -> Module:
        """Share the parameters and floating-point buffers of rank ``src``'s module among
        the world's parties (``mode=False``: :meth:`decrypt`)."""
        if not mode:
            return self.decrypt()
        if self.encrypted:
            return self
        _world.check_src(src)

        def compute(modules: list[Module]) -> None:
            source = modules[src]._source(src)
            session = _world.setup().session(_world.world_size())
            mpc.share(source, session=session)
            for m in _distinct(modules):
                m._take(source)

        _world.collective("Module.encrypt", compute, self)
        return self

    def decrypt(self) -> Module:
        """Reconstruct the parameters (plain ``nn.Parameter``s again)."""
        if not self.encrypted:
            return self

        def compute(modules: list[Module]) -> None:
            mpc.get(modules[0])
            for m in _distinct(modules):
                m._take(modules[0], encrypted=False)

        _world.collective("Module.decrypt", compute, self)
        return self

    def update_parameters(self, learning_rate: float, grad_threshold: float | None = 100) -> None:
        """``p -= learning_rate * p.grad`` for every parameter with a gradient, as
        CrypTen's: on an encrypted module a gradient element of magnitude at least
        ``grad_threshold`` is zeroed first (one comparison per parameter; ``None``: off)."""
        if not self.training:
            raise RuntimeError("update_parameters needs the module in training mode (.train())")

        def compute(_: Any) -> None:
            with torch.no_grad():
                for p in self.parameters():
                    g = p.grad
                    if g is None:
                        continue
                    if self.encrypted and grad_threshold is not None:
                        g = g * (g * g < grad_threshold * grad_threshold)
                    p.sub_(g * learning_rate)

        _world.collective("Module.update_parameters", compute)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _world.collective("Module.zero_grad", lambda _: nn.Module.zero_grad(self, set_to_none))

    # -- what encrypt and decrypt move between the ranks' modules ----------------------------
    def _source(self, src: int) -> nn.Module:
        """The module whose values rank ``src`` encrypts."""
        return self

    def _take(self, source: nn.Module, encrypted: bool = True) -> None:
        """Use ``source``'s (shared or plain) parameters and buffers, by name."""
        if source is not self:
            for name, p in source.named_parameters():
                _set(self, name, p, parameter=True)
            for name, b in source.named_buffers():
                _set(self, name, b, parameter=False)
        for m in self.modules():
            if isinstance(m, Module):
                m._crypten_encrypted = encrypted


def _distinct(modules: list[Any]) -> list[Any]:
    seen: dict[int, Any] = {}
    for m in modules:
        seen.setdefault(id(m), m)
    return list(seen.values())


def _set(root: nn.Module, name: str, value: Any, parameter: bool) -> None:
    *path, leaf = name.split(".")
    m = root
    for part in path:
        m = getattr(m, part)
    if parameter:
        m._parameters[leaf] = value
    else:
        m._buffers[leaf] = value


class FromPyTorch(Module):
    """``crypten.nn.from_pytorch``'s result: a copy of the torch model (``.module``),
    shared by ``encrypt(src)`` from rank ``src``'s copy; its forward runs the torch model
    itself on the shares."""

    def __init__(self, sources: list[nn.Module]) -> None:
        super().__init__()
        self.module = sources[0]
        self._sources = sources
        self.train(sources[0].training)

    def _source(self, src: int) -> nn.Module:
        self.module = self._sources[src]
        self._sources = []
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*unwrap_shared(args), **unwrap_shared(kwargs))


def from_pytorch(pytorch_model: nn.Module, dummy_input: Any = None) -> FromPyTorch:
    """A CrypTen module running ``pytorch_model`` (copied: the model you pass is never
    changed) on encrypted inputs and, after ``encrypt()``, on encrypted parameters. Any
    torch model whose ops the engine supports runs unmodified; there is no ONNX step, so
    ``dummy_input`` is not needed (accepted for CrypTen's signature)."""
    if not isinstance(pytorch_model, nn.Module):
        raise TypeError(f"from_pytorch takes a torch.nn.Module, got {type(pytorch_model).__name__}")
    if any(isinstance(p, SharedTensor) for p in pytorch_model.parameters()):
        raise ValueError(
            "this model's parameters are already shared (mpc.share): call it as it is, or "
            "start from its plain version"
        )

    def compute(models: list[nn.Module]) -> FromPyTorch:
        copies = {id(m): copy.deepcopy(m) for m in _distinct(models)}
        return FromPyTorch([copies[id(m)] for m in models])

    return _world.collective(  # type: ignore[no-any-return]
        "crypten.nn.from_pytorch", compute, pytorch_model
    )
