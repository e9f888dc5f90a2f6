"""The one registry of secure op implementations, keyed by aten overload.

Groups (each module under ``mpc.ops`` registers one): local on shares (views, sums, ops
with a public operand), bilinear (Beaver: mul, matmul, conv), non-linear (comparison
protocol: compare, relu, max, pooling). An op not registered raises an error naming it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]

OPS: dict[Any, Handler] = {}
# Handlers that accept operands with a pending truncation (see SharedTensor.pending);
# for every other handler the dispatcher truncates such operands first.
LAZY: set[Handler] = set()


def register(*ops: Any, lazy: bool = False) -> Callable[[Handler], Handler]:
    def deco(fn: Handler) -> Handler:
        if lazy:
            LAZY.add(fn)
        for op in ops:
            if op in OPS:
                raise ValueError(f"{op} is registered twice")
            OPS[op] = fn
        return fn

    return deco
