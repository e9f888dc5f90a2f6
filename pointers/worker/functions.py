"""Named functions a worker may run besides aten ops (an allow-list higher layers extend).

A registered function receives a :class:`FunctionContext` first (the worker's id, peer
delivery) and then the decoded arguments, with object references already resolved to
the stored tensors. It returns a tensor, a list/tuple of tensors, or None.

A function declares what it allocates with :func:`sized`: from its parameters, the bytes
it allocates at its peak (its outputs and temporaries) and the bytes it keeps at the
worker after it returned (bookkeeping such as the nonces it recorded). A worker with a
storage limit (a served worker's namespace) checks them before the function runs and
refuses a function that declares nothing (see :meth:`pointers.network.served.ServedWorker.check_function`).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pointers.errors import NotAllowedError


class FunctionContext(Protocol):
    """What a registered function may use of the worker running it."""

    @property
    def id(self) -> str: ...

    def deliver(self, peer: str, obj_id: int, value: Any) -> None:
        """Store ``value`` at peer ``peer`` under ``obj_id`` (party-to-party delivery)."""
        ...

    @property
    def function_state(self) -> dict[str, Any]:
        """State registered functions keep at this worker (per client namespace), keyed
        by the function family's name."""
        ...

    def take(self, obj_id: int) -> Any:
        """Remove and return a stored object (e.g. one a peer delivered)."""
        ...


RegisteredFunction = Callable[..., Any]
F = TypeVar("F", bound=Callable[..., Any])

# the call's arguments by parameter name (after the context) -> bytes
SizeFunction = Callable[[dict[str, Any]], int]


@dataclass(frozen=True)
class FunctionSize:
    """What a registered function allocates, from its parameters (see :func:`sized`)."""

    peak: SizeFunction  # bytes allocated at the peak of the call, outputs included
    keeps: SizeFunction | int = 0  # bytes kept at the worker after the call (bookkeeping)

    def bytes(self, params: dict[str, Any]) -> tuple[int, int]:
        """(peak, kept) for a call with these arguments (by parameter name); raises the
        size function's own error for malformed parameters."""
        peak = int(self.peak(params))
        keeps = self.keeps
        kept = int(keeps(params)) if callable(keeps) else int(keeps)
        if peak < 0 or kept < 0:
            raise ValueError("a size function returned a negative size")
        return peak, kept


def sized(peak: SizeFunction, keeps: SizeFunction | int = 0) -> Callable[[F], F]:
    """Declare the bytes a registered function allocates: ``peak(params)`` (the call's
    arguments after the context by parameter name, defaults filled in, object references
    resolved) is an upper bound of what one call allocates at its peak, its outputs
    included; ``keeps`` (an int, or a function of the same mapping) what it keeps at the
    worker once it returned, beyond its outputs (records in ``function_state``). A worker
    with a storage limit checks both against the client's limit before the call runs."""

    def mark(fn: F) -> F:
        fn.__size__ = FunctionSize(peak, keeps)  # type: ignore[attr-defined]
        return fn

    return mark


def function_size(fn: Callable[..., Any]) -> FunctionSize | None:
    """The size a registered function declared with :func:`sized` (None: none)."""
    spec = getattr(fn, "__size__", None)
    return spec if isinstance(spec, FunctionSize) else None


_SIGNATURES: dict[Any, inspect.Signature] = {}


def bind_arguments(fn: Callable[..., Any], args: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """A call's arguments (after the context) by parameter name, defaults filled in;
    ``TypeError`` if they do not fit the function's signature."""
    sig = _SIGNATURES.get(fn)
    if sig is None:
        sig = inspect.signature(fn)
        if len(_SIGNATURES) < 1024:
            _SIGNATURES[fn] = sig
    bound = sig.bind(None, *args, **kwargs)
    bound.apply_defaults()
    out = dict(bound.arguments)
    out.pop(next(iter(sig.parameters)), None)  # the context
    return out


class FunctionRegistry:
    """The functions one worker may run, by name."""

    def __init__(self) -> None:
        self._functions: dict[str, RegisteredFunction] = {}
        self._parameters: dict[str, tuple[str, ...]] = {}

    def register(self, name: str, fn: RegisteredFunction) -> None:
        existing = self._functions.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(f"a different function is already registered as {name!r}")
        self._functions[name] = fn
        self._parameters.pop(name, None)

    def register_all(self, table: dict[str, RegisteredFunction]) -> None:
        for name, fn in table.items():
            self.register(name, fn)

    def replace(self, name: str, fn: RegisteredFunction) -> RegisteredFunction:
        """Put ``fn`` in place of the function registered as ``name``; the old one
        (fault injection for tests: :mod:`pointers.worker.faults`)."""
        old = self.get(name)
        self._functions[name] = fn
        self._parameters.pop(name, None)
        return old

    def get(self, name: str) -> RegisteredFunction:
        try:
            return self._functions[name]
        except KeyError:
            raise NotAllowedError(f"no function {name!r} is registered at this worker") from None

    def parameters(self, name: str) -> tuple[str, ...]:
        """The names of the positional parameters of ``name`` after the context."""
        names = self._parameters.get(name)
        if names is None:
            try:
                sig = inspect.signature(self.get(name))
                kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
                names = tuple(p.name for p in sig.parameters.values() if p.kind in kinds)[1:]
            except (TypeError, ValueError):
                names = ()
            self._parameters[name] = names
        return names

    def __contains__(self, name: object) -> bool:
        return name in self._functions

    def names(self) -> list[str]:
        return sorted(self._functions)
