"""Named functions a worker may run besides aten ops (an allow-list higher layers extend).

A registered function receives a :class:`FunctionContext` first (the worker's id, peer
delivery) and then the decoded arguments, with object references already resolved to
the stored tensors. It returns a tensor, a list/tuple of tensors, or None.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, Protocol

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
