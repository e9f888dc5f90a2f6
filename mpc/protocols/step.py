"""A protocol step, declared once where it is defined.

A *step* is one function a worker runs for a protocol: a party's part (where its shares
live) or the dealer's. It is declared with :func:`step`, next to its code, with all a
worker needs to know of it::

    @step(rule=_mask_rule, size=_mask_size, keeps=records(2), makes_material=True)
    def beaver_mask(ctx, seed, nonce, x, y): ...

- ``rule``: what the worker checks before the step runs (which sealed inputs it takes,
  the labels of its outputs; :func:`pointers.worker.sealing.protocol_function`). None:
  the step takes and makes no sealed object (a local product by a public value). Every
  output that may leave the worker is then bound to the parties of the session whose
  seed the step runs on (:func:`mpc.protocols.rules.bind_outputs`).
- ``size`` and ``keeps``: the bytes one call allocates at its peak and keeps after it
  returned, from its parameters (:func:`pointers.worker.functions.sized`): a worker with
  a storage limit checks them before the step runs.
- ``makes_material``: its outputs are protocol material (sealed at the worker).
- ``opens``: the kinds of values its rule seals for the parties to open, each with how
  they open (:data:`SUM`, :data:`XOR`, or :data:`BITS`: an XOR of 0/1 values that
  travel packed 64 to a word, :mod:`mpc.math.bits`): the opening steps
  (:mod:`mpc.protocols.opening`) accept exactly these.
- ``name``: the name the wire carries, ``"mpc." + the function's name`` unless given.

The client calls a step by its function object (:func:`mpc.protocols.parties.at_parties`
and the like), never by a name typed elsewhere; :func:`table` builds a worker's function
table from the modules that define steps (:mod:`mpc.protocols.functions`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

from mpc.protocols.rules import bind_outputs
from pointers.worker.functions import SizeFunction, sized
from pointers.worker.sealing import ProtocolCall, Rule, protocol_function

F = TypeVar("F", bound=Callable[..., Any])

# how a value opens: the sum of the parties' shares, their XOR, or the XOR of bits packed
# 64 to a word (the step's output is the packed words; the opening unpacks them)
SUM, XOR, BITS = "sum", "xor", "bits"
HOWS = (SUM, XOR, BITS)

# kind of a value to open -> SUM, XOR or BITS, from the steps' declarations (``opens``)
_OPENINGS: dict[str, str] = {}


@dataclass(frozen=True)
class StepSpec:
    """What :func:`step` declared of a step besides its rule and size."""

    name: str
    makes_material: bool
    opens: tuple[tuple[str, str], ...] = ()


def step(
    *,
    size: SizeFunction,
    keeps: SizeFunction | int = 0,
    rule: Rule | None = None,
    makes_material: bool = False,
    opens: Mapping[str, str] | None = None,
    name: str | None = None,
) -> Callable[[F], F]:
    """Declare a protocol step (see the module docstring); returns the function itself,
    marked for the worker (its rule and size) and for :func:`table`."""
    opened = tuple(sorted((opens or {}).items()))
    for kind, how in opened:
        if how not in HOWS:
            raise ValueError(f"a value opens by one of {HOWS}, not {how!r}")
        if _OPENINGS.get(kind, how) != how:
            raise ValueError(f"values of kind {kind!r} open by {_OPENINGS[kind]!r} already")

    def declare(fn: F) -> F:
        if rule is not None:
            protocol_function(_bound(rule))(fn)
        sized(size, keeps)(fn)
        fn.__step__ = StepSpec(name or f"mpc.{fn.__name__}", makes_material, opened)  # type: ignore[attr-defined]
        _OPENINGS.update(opened)
        return fn

    return declare


def _bound(rule: Rule) -> Rule:
    """``rule``, its outputs bound to the session's parties (:func:`bind_outputs`)."""

    def checked(call: ProtocolCall) -> Any:
        return bind_outputs(call, rule(call))

    checked.__doc__ = rule.__doc__
    checked.__qualname__ = getattr(rule, "__qualname__", "rule")
    return checked


def spec_of(fn: Any) -> StepSpec:
    """The declaration of step ``fn``; ``TypeError`` for anything not declared a step."""
    spec = getattr(fn, "__step__", None)
    if not isinstance(spec, StepSpec):
        raise TypeError(f"{fn!r} is not a protocol step (declare it with mpc.protocols.step)")
    return spec


def name_of(fn: Any) -> str:
    """The name the wire carries for step ``fn``."""
    return spec_of(fn).name


def opens(kind: str) -> str | None:
    """How a value of ``kind`` opens (:data:`SUM`, :data:`XOR` or :data:`BITS`), or None: no step
    declared it a value to open."""
    return _OPENINGS.get(kind)


def opened_kinds() -> tuple[str, ...]:
    """Every kind of value some step declared a value to open."""
    return tuple(sorted(_OPENINGS))


def steps_of(module: ModuleType) -> list[Callable[..., Any]]:
    """The steps ``module`` defines (not those it imports from another)."""
    return [
        fn
        for fn in vars(module).values()
        if isinstance(getattr(fn, "__step__", None), StepSpec)
        and getattr(fn, "__module__", None) == module.__name__
    ]


def table_of(steps: Iterable[Callable[..., Any]]) -> dict[str, Callable[..., Any]]:
    """The function table of ``steps``, by name (two steps of one name: ``ValueError``):
    what a worker registers (``worker.functions.register_all``)."""
    out: dict[str, Callable[..., Any]] = {}
    for fn in steps:
        name = name_of(fn)
        if name in out and out[name] is not fn:
            raise ValueError(f"two steps are named {name!r}")
        out[name] = fn
    return out


def table(modules: Iterable[ModuleType]) -> dict[str, Callable[..., Any]]:
    """The function table of the steps the ``modules`` define (:func:`table_of`)."""
    return table_of(fn for module in modules for fn in steps_of(module))


def making_material(functions: Mapping[str, Callable[..., Any]]) -> frozenset[str]:
    """The names of the steps of ``functions`` whose outputs are protocol material."""
    specs = {name: getattr(fn, "__step__", None) for name, fn in functions.items()}
    return frozenset(
        name for name, spec in specs.items() if isinstance(spec, StepSpec) and spec.makes_material
    )


__all__ = [
    "BITS",
    "HOWS",
    "SUM",
    "XOR",
    "StepSpec",
    "making_material",
    "name_of",
    "opened_kinds",
    "opens",
    "spec_of",
    "step",
    "steps_of",
    "table",
    "table_of",
]
