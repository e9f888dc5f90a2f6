"""CrypTen's ``crypten.mpc``: ``MPCTensor``, the ptypes and ``run_multiprocess``."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NoReturn

from mpc.crypten import _world
from mpc.crypten._errors import lookup
from mpc.crypten.cryptensor import MPCTensor, ptype

arithmetic = ptype.arithmetic
binary = ptype.binary

_PROVIDER = (
    "the crypto provider here is a worker of its own, the dealer, that colludes with no "
    "party (CrypTen's TTP); it is made by crypten.init() (or named: crypten.init(parties=[...], "
    "crypto_provider=worker)); there is no trusted-first-party mode"
)
_UNAVAILABLE = {
    "provider": _PROVIDER,
    "get_default_provider": _PROVIDER,
    "ttp_required": _PROVIDER,
    "primitives": "the sharing primitives are mpc.share / mpc.SharedTensor (arithmetic "
    "sharing over Z/2^64) and the protocols in mpc.protocols; binary sharing is internal to "
    "the comparison protocol",
    "ConfigManager": "the configuration is mpc.MPCConfig, passed as crypten.init(config=...)",
}


def run_multiprocess(world_size: int, maxsize: int | None = None) -> Callable[..., Any]:
    """CrypTen's decorator, here: the decorated function runs once per rank, each rank
    in a thread of this process (rank 0 in the caller's), in lockstep; every crypten call
    is made once for all ranks, on the ``world_size`` party workers of ``crypten.init()``
    (in-process, or served processes), with its data taken from rank ``src``. Returns the
    ranks' return values, in rank order. An error in any rank is raised here (CrypTen logs
    it and returns None). ``maxsize`` (CrypTen's result-queue size) has no use here."""
    if isinstance(world_size, bool) or not isinstance(world_size, int):
        raise TypeError(f"world_size must be an int, got {world_size!r}")

    def decorator(fn: Callable[..., Any]) -> Callable[..., list[Any]]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> list[Any]:
            if not _world._SETUP:
                from mpc.crypten import init

                init()
            return _world.run_world(world_size, fn, args, kwargs)

        return wrapper

    return decorator


def __getattr__(name: str) -> NoReturn:
    lookup(_UNAVAILABLE, "crypten.mpc", name)


__all__ = ["MPCTensor", "arithmetic", "binary", "ptype", "run_multiprocess"]
