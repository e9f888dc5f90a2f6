"""Fault injection, for the tests of the malicious mode only: a worker whose registered
function deviates from what it was written to do (an error added to one word of one of
its outputs), as a cheating party would.

Off by default, and refused unless the deployment sets ``POINTERS_ALLOW_FAULTS=1`` in
the worker's environment: a client can never turn it on, and a served worker takes it
only from its command line (``python -m pointers serve --fault NAME:OUTPUT:ERROR[:INDEX]``,
read when it starts). A fault keeps the function's declarations (its rule and size), so
the worker checks and runs the call as usual; only the returned value changes.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from pointers.errors import NotAllowedError

ALLOW_ENV = "POINTERS_ALLOW_FAULTS"
# what a deviating function keeps of the original (its sealing rule, size, protocol step)
_DECLARATIONS = ("__sealing__", "__size__", "__step__")


@dataclass(frozen=True)
class Fault:
    """``error`` (mod 2^64; mod 2^8 for a byte tensor) added to the word at ``index`` of
    output ``output`` of function ``function`` (the name on the wire), at its ``call``-th
    call (0: every call)."""

    function: str
    output: int = 0
    error: int = 1
    index: tuple[int, ...] = ()
    call: int = 0

    def __post_init__(self) -> None:
        if not self.function or self.output < 0 or self.call < 0:
            raise ValueError(f"not a fault: {self}")
        if self.error % (1 << 64) == 0:
            raise ValueError("a fault's error is not 0 mod 2^64")


def parse_fault(text: str) -> Fault:
    """``NAME:OUTPUT:ERROR[:I,J,...]`` (ERROR an int, 0x... allowed; INDEX the word's
    index in the output, zeros where left out)."""
    parts = text.split(":")
    if not 3 <= len(parts) <= 4:
        raise ValueError(f"--fault takes NAME:OUTPUT:ERROR[:I,J,...], got {text!r}")
    try:
        index = tuple(int(i) for i in parts[3].split(",")) if len(parts) == 4 else ()
        return Fault(parts[0], int(parts[1]), int(parts[2], 0), index)
    except ValueError as e:
        raise ValueError(f"--fault {text!r}: {e}") from None


def check_allowed() -> None:
    """Refuse fault injection unless the deployment allows it (tests only)."""
    if os.environ.get(ALLOW_ENV) != "1":
        raise NotAllowedError(
            f"fault injection is for tests only: the deployment must set {ALLOW_ENV}=1"
        )


def add_error(t: torch.Tensor, index: tuple[int, ...], error: int) -> torch.Tensor:
    """A copy of ``t`` with ``error`` added to its word at ``index`` (zeros appended)."""
    out = t.clone()
    idx = index + (0,) * (out.dim() - len(index))
    if out.dtype == torch.uint8:
        out[idx] = (int(out[idx]) + error) % 256
    else:
        v = (int(out[idx]) + error) % (1 << 64)
        out[idx] = v - (1 << 64) if v >> 63 else v
    return out


def deviating(fn: Callable[..., Any], fault: Fault) -> Callable[..., Any]:
    """``fn`` with ``fault`` applied to what it returns (its declarations kept)."""
    calls = [0]

    @functools.wraps(fn)
    def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(ctx, *args, **kwargs)
        calls[0] += 1
        if fault.call and calls[0] != fault.call:
            return out
        many = isinstance(out, list | tuple)
        outs = list(out) if many else [out]
        if fault.output >= len(outs) or not isinstance(outs[fault.output], torch.Tensor):
            raise ValueError(f"fault {fault}: {fault.function} has no tensor output there")
        outs[fault.output] = add_error(outs[fault.output], fault.index, fault.error)
        return outs if many else outs[0]

    for attr in _DECLARATIONS:
        if hasattr(fn, attr):
            setattr(run, attr, getattr(fn, attr))
    run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return run


def with_faults(
    functions: Mapping[str, Callable[..., Any]], faults: tuple[Fault, ...]
) -> dict[str, Callable[..., Any]]:
    """A copy of a worker's function table with ``faults`` applied (refused unless the
    deployment allows faults)."""
    out = dict(functions)
    if not faults:
        return out
    check_allowed()
    for f in faults:
        if f.function not in out:
            raise ValueError(f"fault on {f.function!r}: no such function at this worker")
        out[f.function] = deviating(out[f.function], f)
    return out


def inject(registry: Any, fault: Fault) -> Callable[..., Any]:
    """Apply ``fault`` to an in-process worker's function registry (``worker.functions``;
    refused unless the deployment allows faults); the original function, to put back
    with ``registry.replace(fault.function, original)``."""
    check_allowed()
    original: Callable[..., Any] = registry.get(fault.function)
    registry.replace(fault.function, deviating(original, fault))
    return original
