"""A plan's graph: the allow-listed ops it runs, and its interpreter.

A plan's values live in numbered *slots*. Slots ``0 .. n_inputs-1`` are the call's
arguments, the next ``len(tensors)`` slots are the tensors stored with the plan (its state
first, then constants the trace captured), and each node adds one slot. A node's
arguments refer to earlier slots with :class:`~pointers.wire.serde.Ref`, so a plan can only
use values that already exist: no cycles, no forward references.

Node targets (the whole vocabulary a worker accepts in a plan):

- ``"aten::name.overload"``: an aten op, resolved with :func:`pointers.wire.ops.resolve_op`,
  the same allow-list that single-op commands go through;
- ``"sym::add"``, ``"sym::mul"``, ``"sym::eq"`` ...: integer arithmetic and comparisons on
  sizes (plans traced with dynamic sizes compute view/reshape arguments this way);
- ``"plan::getitem"``: item ``k`` of a multi-output op; ``"plan::check"``: a size condition
  the trace relied on (a failed check is a :class:`PlanCallError`);
- ``"fn::name"``: a function registered at the worker that runs the plan (the extension
  point higher layers use, as with :func:`pointers.call_function`).

The wire form and its validation are in :mod:`pointers.plans.wire`.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pointers.errors import DecodeError, PointerError
from pointers.wire.ops import resolve_op
from pointers.wire.serde import Ref

_INT_LIMIT = 1 << 63  # size arithmetic never leaves int64

# ----------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------


def is_protocol_step(fn: Any) -> bool:
    """Whether a registered function is a protocol step (it carries the rule that
    :func:`pointers.worker.sealing.protocol_function` attached): those run only as
    commands, where the worker checks their material, never as a plan's node."""
    return getattr(fn, "__sealing__", None) is not None


class PlanError(PointerError):
    """Base class of the errors of plans and protocols."""


class PlanNotBuiltError(PlanError):
    """The plan has not been traced yet (call ``build`` or give ``args_shape``)."""


class PlanBuildError(PlanError):
    """Tracing failed, or the traced function uses something a plan cannot hold."""

    data_dependent = False  # the function reads a tensor's value (a plan cannot record it)


class PlanCallError(PlanError, TypeError):
    """A plan was called with the wrong number or kinds of arguments, or a graph with a
    signature (shapes, dtypes) it was not traced for and no Python function to trace."""


class PlanRunError(PlanError):
    """An op inside a plan failed while running; names the node and the op."""


class PlanDecodeError(PlanError, DecodeError):
    """Bytes or a wire value do not describe a valid plan."""


# ----------------------------------------------------------------------------------------
# Size arithmetic: the non-aten node targets
# ----------------------------------------------------------------------------------------


def _num(*xs: Any) -> None:
    for x in xs:
        if type(x) not in (int, float, bool):
            raise TypeError(f"size arithmetic takes numbers, got {type(x).__name__}")


def _bounded(x: Any) -> Any:
    if type(x) is int and not -_INT_LIMIT <= x < _INT_LIMIT:
        raise OverflowError("size arithmetic left the int64 range")
    return x


def _binary(fn: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    def op(a: Any, b: Any) -> Any:
        _num(a, b)
        return _bounded(fn(a, b))

    return op


def _unary(fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    def op(a: Any) -> Any:
        _num(a)
        return _bounded(fn(a))

    return op


def _pow(a: Any, b: Any) -> Any:
    _num(a, b)
    if abs(b) > 64:
        raise OverflowError("exponent too large for size arithmetic")
    return _bounded(a**b)


def _getitem(seq: Any, index: Any) -> Any:
    if not isinstance(seq, tuple | list) or type(index) is not int:
        raise TypeError("plan::getitem takes a tuple of outputs and an int index")
    return seq[index]


def _check(cond: Any, message: Any) -> None:
    if type(cond) is not bool or type(message) is not str:
        raise TypeError("plan::check takes a bool and a message")
    if not cond:
        raise PlanCallError(message)


SYM_OPS: dict[str, Callable[..., Any]] = {
    "sym::add": _binary(operator.add),
    "sym::sub": _binary(operator.sub),
    "sym::mul": _binary(operator.mul),
    "sym::floordiv": _binary(operator.floordiv),
    "sym::truediv": _binary(operator.truediv),
    "sym::mod": _binary(operator.mod),
    "sym::pow": _pow,
    "sym::neg": _unary(operator.neg),
    "sym::eq": _binary(operator.eq),
    "sym::ne": _binary(operator.ne),
    "sym::lt": _binary(operator.lt),
    "sym::le": _binary(operator.le),
    "sym::gt": _binary(operator.gt),
    "sym::ge": _binary(operator.ge),
    "sym::and": _binary(lambda a, b: bool(a) and bool(b)),
    "sym::or": _binary(lambda a, b: bool(a) or bool(b)),
    "sym::not": _unary(operator.not_),
    "sym::max": _binary(max),
    "sym::min": _binary(min),
    "sym::float": _unary(float),
    "sym::int": _unary(int),
    "plan::getitem": _getitem,
    "plan::check": _check,
}


# ----------------------------------------------------------------------------------------
# The graph
# ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class InputSpec:
    """What a plan accepts at one argument: a shape (None: any size) and a dtype."""

    shape: tuple[int | None, ...]
    dtype: torch.dtype

    def describe(self) -> str:
        dims = ", ".join("*" if s is None else str(s) for s in self.shape)
        return f"({dims}{',' if len(self.shape) == 1 else ''}) {self.dtype}"


@dataclass(frozen=True, slots=True)
class Node:
    """One step: ``target`` applied to ``args``/``kwargs`` (Refs name earlier slots)."""

    target: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


@dataclass(frozen=True, slots=True)
class _Step:  # a node ready to run: its callable and the slots it frees afterwards
    fn: Any
    kind: str  # "aten", "sym", "fn"
    node: Node
    free: tuple[int, ...]


class _NeedsWorker(Exception):
    """Raised during shape inference when a node cannot run on meta tensors."""


class PlanGraph:
    """A validated plan: inputs, stored tensors, nodes, outputs; runnable and serialisable."""

    def __init__(
        self,
        name: str,
        inputs: Sequence[InputSpec],
        n_state: int,
        tensors: Sequence[torch.Tensor],
        nodes: Sequence[Node],
        outputs: Sequence[int],
        tuple_output: bool,
    ) -> None:
        self.name = name
        self.inputs = tuple(inputs)
        self.n_state = n_state
        self.tensors = tuple(tensors)
        self.nodes = tuple(nodes)
        self.outputs = tuple(outputs)
        self.tuple_output = tuple_output
        self._steps = self._compile()
        self._meta_tensors: list[torch.Tensor] | None = None
        self._meta_cache: dict[Any, list[tuple[Any, Any, torch.dtype]] | None] = {}

    # -- structure -----------------------------------------------------------------------
    @property
    def n_inputs(self) -> int:
        return len(self.inputs)

    @property
    def n_outputs(self) -> int:
        return len(self.outputs)

    @property
    def state(self) -> tuple[torch.Tensor, ...]:
        return self.tensors[: self.n_state]

    def op_names(self) -> list[str]:
        """The targets of the plan's nodes, in order."""
        return [n.target for n in self.nodes]

    def with_state(self, state: Sequence[torch.Tensor]) -> PlanGraph:
        """The same plan carrying other state tensors (same shapes and dtypes)."""
        state = [t.detach() for t in state]
        _check_state(self, state)
        return PlanGraph(
            self.name,
            self.inputs,
            self.n_state,
            [*state, *self.tensors[self.n_state :]],
            self.nodes,
            self.outputs,
            self.tuple_output,
        )

    def _compile(self) -> tuple[_Step, ...]:
        first_node = self.n_inputs + len(self.tensors)
        last_use: dict[int, int] = {}
        for i, node in enumerate(self.nodes):
            for slot in _refs_in((node.args, node.kwargs)):
                last_use[slot] = i
        keep = set(self.outputs)
        frees: list[list[int]] = [[] for _ in self.nodes]
        for slot, i in last_use.items():
            if slot not in keep and slot >= first_node:
                frees[i].append(slot)
        steps = []
        for node, free in zip(self.nodes, frees):
            ns = node.target.partition("::")[0]
            if ns == "aten":
                steps.append(_Step(resolve_op(node.target), "aten", node, tuple(free)))
            elif ns == "fn":
                steps.append(_Step(node.target[4:], "fn", node, tuple(free)))
            else:
                steps.append(_Step(SYM_OPS[node.target], "sym", node, tuple(free)))
        return tuple(steps)

    # -- checks ----------------------------------------------------------------------------
    @property
    def has_checks(self) -> bool:
        """Whether the plan checks size conditions its trace relied on (``plan::check``)."""
        return any(n.target == "plan::check" for n in self.nodes)

    def check_kinds(self, args: Sequence[Any]) -> None:
        """Check the number of a call's arguments and that each is a tensor."""
        if len(args) != self.n_inputs:
            raise PlanCallError(
                f"plan {self.name!r} takes {self.n_inputs} argument"
                f"{'' if self.n_inputs == 1 else 's'}, got {len(args)}"
            )
        for k, a in enumerate(args):
            if not isinstance(a, torch.Tensor):
                raise PlanCallError(
                    f"plan {self.name!r}: argument {k} must be a tensor, got {type(a).__name__}"
                )

    def check_args(self, args: Sequence[Any]) -> None:
        """Check the number, kinds, shapes and dtypes of a call's arguments against the
        signature this graph was traced for."""
        self.check_kinds(args)
        for k, (a, spec) in enumerate(zip(args, self.inputs)):
            shape = tuple(a.shape)
            if len(shape) != len(spec.shape) or any(
                s is not None and s != d for s, d in zip(spec.shape, shape)
            ):
                hint = " ('*': any size)" if None in spec.shape else ""
                raise PlanCallError(
                    f"plan {self.name!r}: argument {k} has shape {shape}, but this graph "
                    f"was traced for {spec.describe()}{hint}"
                )
            if a.dtype != spec.dtype:
                raise PlanCallError(
                    f"plan {self.name!r}: argument {k} has dtype {a.dtype}, but this graph "
                    f"was traced for {spec.dtype}"
                )

    # -- running ---------------------------------------------------------------------------
    def run(
        self,
        args: Sequence[Any],
        *,
        state: Sequence[torch.Tensor] | None = None,
        functions: Any = None,
        ctx: Any = None,
    ) -> list[Any]:
        """Run the plan on ``args``; returns the list of outputs.

        ``state`` replaces the stored state tensors (a module plan passes its current
        parameters); ``functions``/``ctx`` are the registry and context for ``fn::`` nodes.

        A ``ctx`` with a ``check_node`` method (a served worker's namespace, see
        :meth:`pointers.network.served.ServedWorker.check_node`) sizes every node before it
        runs: it is called with the node's kind (``"aten"`` or ``"fn"``), target, callable
        and arguments, the bytes of the intermediate values the plan holds at that moment
        (each storage once; the arguments and stored tensors not counted) and where the
        node is, and raises to refuse it.
        """
        self.check_args(args)
        stored = self.tensors
        if state is not None:
            if len(state) != self.n_state:
                raise PlanCallError(
                    f"plan {self.name!r} has {self.n_state} state tensors, got {len(state)}"
                )
            stored = (*state, *stored[self.n_state :])
        return self._interpret([*args, *stored], functions, ctx, meta=False)

    def infer(self, args: Sequence[torch.Tensor]) -> list[tuple[Any, Any, torch.dtype]] | None:
        """Output (shape, stride, dtype) for arguments like ``args`` (inferred on meta
        tensors, cached); None when a node can only run at a worker."""
        self.check_args(args)
        key = tuple((tuple(a.shape), a.stride(), a.dtype) for a in args)
        if key in self._meta_cache:
            return self._meta_cache[key]
        if self._meta_tensors is None:
            self._meta_tensors = [_to_meta(t) for t in self.tensors]
        metas = [_to_meta(a) for a in args]
        try:
            outs = self._interpret([*metas, *self._meta_tensors], None, None, meta=True)
        except _NeedsWorker:
            result = None
        else:
            result = []
            for k, o in enumerate(outs):
                if not isinstance(o, torch.Tensor):
                    raise PlanRunError(f"plan {self.name!r}: output {k} is not a tensor")
                result.append((tuple(o.shape), o.stride(), o.dtype))
        if len(self._meta_cache) > 256:
            self._meta_cache.clear()
        self._meta_cache[key] = result
        return result

    def _interpret(self, values: list[Any], functions: Any, ctx: Any, meta: bool) -> list[Any]:
        check = None if meta or ctx is None else getattr(ctx, "check_node", None)
        live = 0  # bytes of the intermediates held now (with a check)
        held: dict[int, list[int]] = {}  # their storages: data pointer -> [bytes, uses]
        given = {k for k, _ in map(_storage_of, _tensor_leaves(values))} if check else set()
        for i, step in enumerate(self._steps):
            node = step.node
            args = [_load(a, values, meta) for a in node.args]
            kwargs = {k: _load(v, values, meta) for k, v in node.kwargs.items()}
            if meta and step.kind == "aten":
                kwargs = _meta_factory(step.fn, args, kwargs)
            if check is not None and step.kind != "sym":
                fn = step.fn if step.kind == "aten" else None
                if step.kind == "fn" and functions is not None and step.fn in functions:
                    fn = functions.get(step.fn)
                if fn is not None and not (step.kind == "fn" and is_protocol_step(fn)):
                    where = f"plan {self.name!r}, node {i} ({node.target})"
                    check(step.kind, node.target[4:] if step.kind == "fn" else node.target,
                          fn, args, kwargs, live, where)  # fmt: skip
            try:
                if step.kind == "fn":
                    if meta:
                        raise _NeedsWorker
                    if functions is None:
                        raise PlanRunError(
                            f"plan {self.name!r} calls the registered function {step.fn!r}; "
                            "run it at a worker that registers it"
                        )
                    fn = functions.get(step.fn)
                    if is_protocol_step(fn):
                        raise PlanRunError(
                            f"plan {self.name!r} calls the protocol step {step.fn!r}, which "
                            "runs only as a command (its worker checks its material)"
                        )
                    out = fn(ctx, *args, **kwargs)
                else:
                    out = step.fn(*args, **kwargs)
            except (PlanError, _NeedsWorker):
                raise
            except NotImplementedError as e:
                if meta:
                    raise _NeedsWorker from e
                raise self._node_error(i, e) from e
            except Exception as e:
                raise self._node_error(i, e) from e
            values.append(out)
            if check is not None:
                live += _track(out, held, given)
            for s in step.free:
                if check is not None:
                    live -= _untrack(values[s], held)
                values[s] = None
        return [values[s] for s in self.outputs]

    def _node_error(self, i: int, e: Exception) -> PlanRunError:
        return PlanRunError(
            f"plan {self.name!r}, node {i} ({self.nodes[i].target}) failed: {type(e).__name__}: {e}"
        )

    def __repr__(self) -> str:
        ins = ", ".join(i.describe() for i in self.inputs)
        return (
            f"<PlanGraph {self.name!r} inputs=[{ins}] nodes={len(self.nodes)} "
            f"state={self.n_state} tensors={len(self.tensors)} outputs={len(self.outputs)}>"
        )


def _to_meta(t: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="meta")


_META = torch.device("meta")


def _meta_factory(op: Any, args: list[Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keywords of an aten node for the meta dry run: a ``device`` given in any form
    becomes ``meta``, and a factory op given none (``ones``, ``arange``: no tensor
    argument, a ``device`` parameter) gets ``device=meta``, so that shape inference
    never allocates."""
    if "device" in kwargs:
        return {**kwargs, "device": _META}
    if any(isinstance(a, torch.Tensor) for a in args):
        return kwargs
    schema = getattr(op, "_schema", None)
    if schema is not None and any(a.name == "device" for a in schema.arguments):
        return {**kwargs, "device": _META}
    return kwargs


def _tensor_leaves(value: Any) -> list[torch.Tensor]:
    if type(value) is torch.Tensor:
        return [value]
    if isinstance(value, list | tuple):
        out: list[torch.Tensor] = []
        for v in value:
            out.extend(_tensor_leaves(v))
        return out
    return [value] if isinstance(value, torch.Tensor) else []


def _storage_of(t: torch.Tensor) -> tuple[int, int]:
    st = t.untyped_storage()
    return st.data_ptr(), st.nbytes()


def _track(value: Any, held: dict[int, list[int]], given: set[int]) -> int:
    """Count the storages of a node's output (once each, not the plan's own tensors)."""
    added = 0
    for t in _tensor_leaves(value):
        key, nbytes = _storage_of(t)
        if key in given:
            continue
        rec = held.get(key)
        if rec is None:
            held[key] = [nbytes, 1]
            added += nbytes
        else:
            rec[1] += 1
    return added


def _untrack(value: Any, held: dict[int, list[int]]) -> int:
    """Release what :func:`_track` counted for a freed value; the bytes released."""
    freed = 0
    for t in _tensor_leaves(value):
        key = _storage_of(t)[0]
        rec = held.get(key)
        if rec is not None:
            rec[1] -= 1
            if not rec[1]:
                del held[key]
                freed += rec[0]
    return freed


def _load(a: Any, values: list[Any], meta: bool) -> Any:
    t = type(a)
    if t is Ref:
        return values[a.obj_id]
    if t is list:
        return [_load(x, values, meta) for x in a]
    if t is tuple:
        return tuple(_load(x, values, meta) for x in a)
    if meta and t is torch.device:
        return _META
    return a


def _refs_in(obj: Any) -> list[int]:
    out: list[int] = []

    def walk(o: Any) -> None:
        if type(o) is Ref:
            out.append(o.obj_id)
        elif isinstance(o, list | tuple):
            for x in o:
                walk(x)
        elif isinstance(o, dict):
            for x in o.values():
                walk(x)

    walk(obj)
    return out


def _check_state(graph: PlanGraph, state: Sequence[torch.Tensor]) -> None:
    if len(state) != graph.n_state:
        raise PlanCallError(
            f"plan {graph.name!r} has {graph.n_state} state tensors, got {len(state)}"
        )
    for k, (new, old) in enumerate(zip(state, graph.tensors)):
        if not isinstance(new, torch.Tensor) or new.shape != old.shape or new.dtype != old.dtype:
            raise PlanCallError(
                f"plan {graph.name!r}: state tensor {k} must keep shape {tuple(old.shape)} "
                f"and dtype {old.dtype}"
            )


__all__ = [
    "InputSpec",
    "Node",
    "PlanBuildError",
    "PlanCallError",
    "PlanDecodeError",
    "PlanError",
    "PlanGraph",
    "PlanNotBuiltError",
    "PlanRunError",
    "SYM_OPS",
]
