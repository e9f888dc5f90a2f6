"""The one registry of secure op implementations, keyed by aten overload.

Groups (each module under ``mpc.ops`` registers one): local on shares (views, sums, ops
with a public operand), bilinear (Beaver: mul, matmul, conv), non-linear (comparison
protocol: compare, relu, max, pooling). The malicious mode's ops (``mpc.authenticated``)
register in :data:`AUTH_OPS`. An op not registered raises an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]

OPS: dict[Any, Handler] = {}
# The malicious mode's ops on AuthenticatedTensor (mpc.authenticated.ops and .nonlinear),
# keyed the same way: the two modes share no op code, each op is in one table or the other
AUTH_OPS: dict[Any, Handler] = {}
# Handlers that accept operands with a pending truncation (see SharedTensor.pending);
# for every other handler the dispatcher truncates such operands first.
LAZY: set[Handler] = set()


def register(
    *ops: Any, lazy: bool = False, authenticated: bool = False
) -> Callable[[Handler], Handler]:
    """Register the decorated handler for ``ops`` (on SharedTensor; ``authenticated``: on
    AuthenticatedTensor)."""
    table = AUTH_OPS if authenticated else OPS

    def deco(fn: Handler) -> Handler:
        if lazy:
            LAZY.add(fn)
        for op in ops:
            if op in table:
                raise ValueError(f"{op} is registered twice")
            table[op] = fn
        return fn

    return deco


# What runs around every op on shared tensors besides its handler, filled by the modules
# above as they are imported (each by a decorator, as ops register): "result" (mpc.ranges:
# the result's bound and the range warning), "run" (mpc.debugging: runs the op and checks
# it against plaintext), "function" (mpc.debugging: refuses an op before it starts),
# "module_get" (mpc.api.get: pointers.get of a model with shared tensors).
HOOKS: dict[str, Callable[..., Any]] = {}
HOOK_NAMES = ("result", "run", "function", "module_get")


def hook(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Install the decorated function as the hook ``name`` (see :data:`HOOKS`)."""
    if name not in HOOK_NAMES:
        raise ValueError(f"unknown hook {name!r}: one of {HOOK_NAMES}")

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        HOOKS[name] = fn
        return fn

    return deco
