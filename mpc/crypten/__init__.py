"""A home for CrypTen users: ``import mpc.crypten as crypten``.

CrypTen's names over this project's engine (see docs/coming-from-crypten.md):
``crypten.init()``, ``crypten.cryptensor(x, src=0)``, ``x_enc.get_plain_text()``,
``crypten.nn.from_pytorch(model, dummy_input)`` (the unmodified torch model, no ONNX step),
``model.encrypt(src=0)``, ``@crypten.mpc.run_multiprocess(world_size=2)``,
``crypten.communicator.get().get_rank()``, ``crypten.print_communication_stats()``.
An encrypted tensor is an :class:`mpc.SharedTensor` (``x_enc._shared``), shared by this
process (the client) among party workers, with a crypto provider (the dealer) dealing
the correlated randomness. A CrypTen name with no honest equivalent raises
:class:`NotAvailableError`, which names what to use instead.

>>> import torch, mpc.crypten as crypten
>>> crypten.init()
>>> x_enc = crypten.cryptensor([1.0, 2.0, 3.0])
>>> (x_enc * 2 + 1).get_plain_text()
tensor([3., 5., 7.])
>>> crypten.uninit()
"""

from __future__ import annotations

import builtins
import io
import sys
from collections.abc import Callable
from typing import Any, NoReturn

import torch
from torch import nn as _torch_nn

from mpc.config import MPCConfig
from mpc.crypten import _world, common, communicator, nn, optim
from mpc.crypten import mpc as mpc  # (CrypTen's crypten.mpc)
from mpc.crypten._errors import (
    CollectiveMismatchError,
    NotAvailableError,
    NotInitializedError,
    lookup,
    unavailable,
)
from mpc.crypten._setup import Setup
from mpc.crypten.cryptensor import CrypTensor, MPCTensor, where

no_grad = torch.no_grad
enable_grad = torch.enable_grad
set_grad_enabled = torch.set_grad_enabled

_SHARES_STAY = (
    "the shares stay at the party workers, and a client holding every share would hold the "
    "value: save the plaintext (x_enc.get_plain_text(), or model.decrypt() first), or keep a "
    "shared model in a plan (mpc.plan) or with its owner (mpc.offer / serve --offer)"
)


def init(
    config_file: Any = None,
    party_name: Any = None,
    device: Any = None,
    *,
    parties: Any = None,
    crypto_provider: Any = None,
    served: bool = False,
    config: MPCConfig | None = None,
) -> None:
    """Set up the parties. By default, in-process workers ``party0``, ``party1``, ... (as
    many as a world needs, up to 5) and a crypto provider ``dealer``; the default world
    (outside ``run_multiprocess``) has 2 ranks (``parties=3``: 3).

    ``served=True``: the parties and the dealer are served processes on this machine
    (``python -m pointers serve``, mutual TLS), started on first use, one group per world
    size, stopped by :func:`uninit`. ``parties=[w0, w1, ...]`` and ``crypto_provider=w``:
    workers you made (``pointers.connect(...)`` for served ones). ``config``: an
    :class:`mpc.MPCConfig` (fractional bits, comparison mode). CrypTen's ``config_file`` is
    refused (pass ``config``); ``device`` other than the CPU too. Calling it again with no
    arguments keeps the current setup; with arguments it replaces it."""
    if config_file is not None:
        unavailable(
            "crypten.init(config_file=...)", "pass config=mpc.MPCConfig(frac_bits=..., ...)"
        )
    if device is not None and torch.device(device).type != "cpu":
        unavailable(f"crypten.init(device={device!r})", "the engine runs on CPU")
    fresh = parties is None and crypto_provider is None and not served and config is None
    if _world._SETUP and fresh:
        return
    _world.install(Setup(parties, crypto_provider, served, config))


def uninit() -> None:
    """Forget the setup (served workers this setup started are stopped)."""
    _world.install(None)


def is_initialized() -> bool:
    return bool(_world._SETUP)


def cryptensor(*args: Any, cryptensor_type: Any = None, **kwargs: Any) -> MPCTensor:
    """Encrypt a tensor (or a list or number): rank ``src``'s value (default 0) shared among
    the world's parties. Arguments as :class:`MPCTensor`."""
    if cryptensor_type not in (None, "mpc"):
        unavailable(f"cryptensor_type={cryptensor_type!r}", "the one type here is 'mpc'")
    return MPCTensor(*args, **kwargs)


def is_encrypted_tensor(obj: Any) -> bool:
    return isinstance(obj, CrypTensor)


def get_default_cryptensor_type() -> str:
    return "mpc"


def cat(tensors: list[Any], dim: int = 0) -> Any:
    """Concatenate encrypted (or plain) tensors along ``dim``."""
    if not isinstance(tensors, list | tuple):
        raise TypeError("crypten.cat takes a list of tensors")
    return torch.cat(list(tensors), dim=dim)


def stack(tensors: list[Any], dim: int = 0) -> Any:
    """Stack encrypted (or plain) tensors along a new dimension ``dim``."""
    if not isinstance(tensors, list | tuple):
        raise TypeError("crypten.stack takes a list of tensors")
    return torch.stack(list(tensors), dim=dim)


def _ranks_print(emit: Callable[[str], None], args: Any, in_order: bool, dst: Any, kw: Any) -> None:
    buf = io.StringIO()
    builtins.print(*args, **kw, file=buf)
    text = buf.getvalue()
    if in_order:  # every rank, rank 0 first (one collective: rank 0's thread writes)

        def write(texts: list[str]) -> None:
            for t in texts:
                emit(t)

        _world.collective("crypten.print", write, text)
        return
    ranks = [dst] if isinstance(dst, int) else list(dst)
    if _world.rank() in ranks:
        emit(text)


def print(*args: Any, in_order: bool = False, dst: Any = 0, **kwargs: Any) -> None:  # noqa: A001
    """Print from rank ``dst`` only (a rank or a list of ranks), or from every rank in
    rank order (``in_order=True``), as CrypTen's."""
    file = kwargs.pop("file", None)

    def emit(text: str) -> None:
        (file or sys.stdout).write(text)

    _ranks_print(emit, args, in_order, dst, kwargs)


def log(*args: Any, in_order: bool = False, dst: Any = 0, **kwargs: Any) -> None:
    """As :func:`print`, to ``logging.info``."""
    import logging

    _ranks_print(lambda t: logging.info(t.rstrip("\n")), args, in_order, dst, kwargs)


def print_communication_stats() -> None:
    """Rounds, bytes per party and time of the crypten calls since init or the last reset
    (:meth:`communicator.Communicator.print_communication_stats`)."""
    communicator.get().print_communication_stats()


def reset_communication_stats() -> None:
    communicator.get().reset_communication_stats()


def _at_src(src: int) -> bool:
    """Whether this thread plays rank ``src`` (the client outside run_multiprocess plays
    every rank)."""
    return _world.current_world() is None or _world.rank() == src


def load_from_party(
    f: Any = None,
    preloaded: Any = None,
    encrypted: bool = False,
    model_class: Any = None,
    src: int = 0,
    load_closure: Callable[..., Any] = torch.load,
    **kwargs: Any,
) -> Any:
    """Rank ``src`` loads ``f`` (with ``load_closure``, torch's weights-only load by
    default: classes of a saved model need ``crypten.common.serial.register_safe_class``):
    a tensor comes back encrypted from ``src``, a model as the plain model (encrypt it
    with ``crypten.nn.from_pytorch(model, dummy).encrypt(src=src)``)."""
    if encrypted:
        unavailable("load_from_party(encrypted=True)", _SHARES_STAY)
    _world.check_src(src)
    obj = None
    if _at_src(src):
        if preloaded is not None:
            obj = preloaded
        elif f is None:
            raise ValueError("load_from_party needs a file f (or preloaded=obj)")
        else:
            obj = load_closure(f, **kwargs)

    def compute(payloads: list[Any]) -> Any:
        o = payloads[src]
        if isinstance(o, torch.Tensor):
            return cryptensor(o, src=src)
        if isinstance(o, _torch_nn.Module):
            return o
        raise TypeError(f"load_from_party loads a tensor or a torch model, got {type(o).__name__}")

    return _world.collective("crypten.load_from_party", compute, obj)


def load(f: Any, load_closure: Callable[..., Any] = torch.load, **kwargs: Any) -> Any:
    """Load a plain object (each rank reads the file itself)."""
    return load_closure(f, **kwargs)


def _plain(obj: Any, what: str) -> None:
    encrypted_module = isinstance(obj, nn.Module) and obj.encrypted
    if isinstance(obj, CrypTensor) or encrypted_module:
        unavailable(f"{what} of an encrypted object", _SHARES_STAY)


def save_from_party(
    obj: Any, f: Any, src: int = 0, save_closure: Callable[..., Any] = torch.save, **kwargs: Any
) -> None:
    """Rank ``src`` saves its (plain) ``obj`` to ``f``; every rank waits for it."""
    _plain(obj, "save_from_party")
    _world.check_src(src)
    if _at_src(src):
        save_closure(obj, f, **kwargs)
    communicator.get().barrier()


def save(obj: Any, f: Any, save_closure: Callable[..., Any] = torch.save, **kwargs: Any) -> None:
    """Save a plain object (rank 0 writes; every rank waits for it)."""
    _plain(obj, "save")
    if _world.rank() == 0:
        save_closure(obj, f, **kwargs)
    communicator.get().barrier()


_UNAVAILABLE = {
    "rand": "values the parties draw jointly are not offered: share a value the client draws, "
    "crypten.cryptensor(torch.rand(...)) (the client then knows it)",
    "randn": "see crypten.rand",
    "bernoulli": "see crypten.rand",
    "manual_seed": "shares and masks come from a CSPRNG seeded by os.urandom and cannot be "
    "seeded; torch.manual_seed seeds the plain values you encrypt",
    "debug": "the engine's checks run always (ranges are documented per function); to see a "
    "value, decrypt it with .get_plain_text()",
    "cfg": "the configuration is mpc.MPCConfig, passed as crypten.init(config=...)",
    "config": "the configuration is mpc.MPCConfig, passed as crypten.init(config=...)",
    "register_cryptensor": "the one encrypted tensor type is MPCTensor (over mpc.SharedTensor)",
    "set_default_cryptensor_type": "the one encrypted tensor type is MPCTensor",
    "init_thread": "ranks are run by crypten.mpc.run_multiprocess",
    "generators": "shares and masks come from a CSPRNG (mpc.math.prg), not torch generators",
    "trace": "the dealer's material is made per op; record a function once into per-party "
    "programs with mpc.plan, or deal material ahead with mpc.preprocess",
    "trace_once": "see crypten.trace",
    "fill_cache": "see crypten.trace",
    "models": "CrypTen's model zoo is not included: encrypt any torch model with "
    "crypten.nn.from_pytorch(model, dummy_input) (torchvision's and Hugging Face's run "
    "unmodified, see docs/transformers.md)",
    "cuda": "the engine runs on CPU",
    "gradients": "autograd is torch's own, on the shares: x_enc.backward(), p.grad",
}


def __getattr__(name: str) -> NoReturn:
    lookup(_UNAVAILABLE, "crypten", name)


__all__ = [
    "CollectiveMismatchError",
    "CrypTensor",
    "MPCTensor",
    "NotAvailableError",
    "NotInitializedError",
    "cat",
    "common",
    "communicator",
    "cryptensor",
    "enable_grad",
    "get_default_cryptensor_type",
    "init",
    "is_encrypted_tensor",
    "is_initialized",
    "load",
    "load_from_party",
    "log",
    "mpc",
    "nn",
    "no_grad",
    "optim",
    "print",
    "print_communication_stats",
    "reset_communication_stats",
    "save",
    "save_from_party",
    "set_grad_enabled",
    "stack",
    "uninit",
    "where",
]
