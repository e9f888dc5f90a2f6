"""Sealed objects: protocol material that no client may read.

A higher layer (``mpc``) creates objects at the workers that must never reach the client
that orchestrates it: seeds, masks, opened values, dealer corrections, triples. They are
*sealed* where they are created, and the worker enforces the rule, whatever the client
sends:

* a client cannot fetch, describe, tag or find (search) a sealed object, nor run a plan on
  one; stores from a client are never sealed;
* a peer delivery (``copy_to``, ``move``) of a sealed object arrives sealed;
* an aten op may take a sealed input only if it is one of :data:`SEALED_OPS` (the sums
  and XORs that open a value among the parties); its outputs are sealed, and an in-place
  one must write into a sealed object (no sealed value leaks into a client's tensor);
* a registered function declares, with :func:`protocol_function`, which parameters take
  protocol material (only sealed objects, or None), which take either material or a
  share (a sealed one seals the outputs), and whether its outputs are material; any other
  parameter refuses a sealed object, and an undeclared function takes none.

The values a protocol means to reveal (the shares of its outputs, which the caller
reconstructs with ``get()``) are ordinary objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from pointers.errors import NotAllowedError

F = TypeVar("F", bound=Callable[..., Any])

RULE = "protocol material is sealed at the workers (docs/security.md)"

# aten ops that may take sealed inputs, and whether they write into their first argument:
# the sums and XORs that open a value among the parties.
SEALED_OPS: dict[str, bool] = {
    "aten::add.Tensor": False,
    "aten::add_.Tensor": True,
    "aten::sub.Tensor": False,
    "aten::sub_.Tensor": True,
    "aten::bitwise_xor.Tensor": False,
    "aten::bitwise_xor_.Tensor": True,
}


@dataclass(frozen=True)
class Sealing:
    """How a registered function treats sealed objects (see the module docstring)."""

    material: frozenset[str] = frozenset()
    either: frozenset[str] = frozenset()
    sealed_outputs: bool = False


NO_SEALING = Sealing()


def protocol_function(
    *, material: tuple[str, ...] = (), either: tuple[str, ...] = (), sealed_outputs: bool = False
) -> Callable[[F], F]:
    """Declare how a registered function treats sealed objects (protocol material)."""

    def mark(fn: F) -> F:
        fn.__sealing__ = Sealing(frozenset(material), frozenset(either), sealed_outputs)  # type: ignore[attr-defined]
        return fn

    return mark


def sealing_of(fn: Callable[..., Any]) -> Sealing:
    spec = getattr(fn, "__sealing__", None)
    return spec if isinstance(spec, Sealing) else NO_SEALING


def refused(what: str, obj_id: int | None = None) -> NotAllowedError:
    obj = f"object {obj_id} is sealed" if obj_id is not None else "sealed objects"
    return NotAllowedError(f"{obj}: {what} is refused; {RULE}")
