"""Plans: a function or module traced once into aten ops, sent once, run with one message.

>>> import torch, pointers as pt
>>> @pt.func2plan()
... def double_abs(x):
...     return torch.abs(x + x)
>>> _ = double_abs.build(torch.tensor([1.0, -2.0]))
>>> alice = pt.VirtualWorker("alice")
>>> ptr_plan = double_abs.send(alice)  # one message carries the whole plan
>>> ptr_plan(pt.send(torch.tensor([3.0, -4.0]), alice)).get()  # one message per call
tensor([6., 8.])

A :class:`Plan` is an ``nn.Module``: subclass it and write ``forward`` for a module-like
plan whose parameters travel with it as its state. :func:`func2plan` turns a function
into a plan. Tracing and its limits are in :mod:`pointers.plans.trace`; the graph format
and interpreter in :mod:`pointers.plans.graph`, the wire form in :mod:`pointers.plans.wire`,
the plan stored at a worker (:class:`~pointers.plans.pointer_plan.PointerPlan`) and call
signatures in :mod:`pointers.plans.pointer_plan`.

Other shapes and dtypes: as in PySyft, the build's examples (or ``args_shape``) only
serve to trace; a plan runs on any input its function accepts. A call whose signature
(shapes, dtypes, strides) the built graph does not accept is traced again for that
signature by the plan's owner, which keeps the Python function; the new graph (a
*variant*) is cached per signature, and travels to a worker with the call that first
needs it there, as one :class:`~pointers.wire.messages.StoreRunPlan` message (without the
state, which the worker already holds). Later calls with that signature are a plain
:class:`~pointers.wire.messages.RunPlan`. A plan without its function (loaded from bytes)
runs only the signatures it was traced for.

>>> ptr_plan(pt.send(torch.tensor([[1, -2], [3, -4]]), alice)).get()  # (2, 2) int64
tensor([[2, 4],
        [6, 8]])
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from pointers.plans.graph import (
    PlanBuildError,
    PlanCallError,
    PlanDecodeError,
    PlanGraph,
    PlanNotBuiltError,
)
from pointers.plans.pointer_plan import (
    MAX_VARIANTS,
    Layout,
    PointerPlan,
    Signature,
    accepts,
    layout_of,
    signature_of,
    traced_only,
)
from pointers.plans.trace import TRACE_SIZE, trace_plan
from pointers.plans.wire import (
    PRECISE_BELOW,
    check_plan_bytes,
    plan_from_bytes,
    plan_to_bytes,
    plan_to_wire,
)
from pointers.pointer_tensor import PointerTensor
from pointers.wire.messages import StorePlan

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient

Shape = Sequence[int]

REAL_TRACE_LIMIT = 1 << 26  # bytes of examples a retrace may allocate (see _variant_for)


def _storage_size(a: torch.Tensor) -> int:
    """Elements of memory a tensor with ``a``'s shape and strides spans."""
    shape, stride = tuple(a.shape), tuple(a.stride())
    return 0 if 0 in shape else 1 + sum((s - 1) * st for s, st in zip(shape, stride))


def _example(a: torch.Tensor) -> torch.Tensor:
    """A fresh tensor with ``a``'s shape, strides and dtype to trace on: ``a``'s values
    for a local tensor (where its layout lets them be copied), ones for a pointer."""
    t = torch.ones(_storage_size(a), dtype=a.dtype).as_strided(tuple(a.shape), a.stride())
    if type(a) is torch.Tensor:
        try:
            t.copy_(a.detach())
        except RuntimeError:  # overlapping strides (an expanded tensor): keep the ones
            pass
    return t


class State:
    """The tensors a plan carries with it, stored with the plan and sent once.

    A function plan built with ``state=(...)`` receives a ``State`` as its last argument;
    ``state.read()`` returns the tensors in the order they were given.
    """

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self._tensors = list(tensors)

    def read(self) -> list[torch.Tensor]:
        """The state tensors, in order."""
        return list(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._tensors)

    def __repr__(self) -> str:
        shapes = ", ".join(str(tuple(t.shape)) for t in self._tensors)
        return f"State([{shapes}])"


class Plan(nn.Module):
    """A function or module traced once at the aten level, runnable locally or at a worker.

    - ``Plan(fn)`` (or :func:`func2plan`) wraps a function of tensors; with ``state=`` the
      function receives a :class:`State` as its last argument.
    - A subclass with a ``forward`` is a module-like plan: its parameters and buffers are
      its state, and travel with it when it is sent.

    Not built, a plan called locally simply runs the Python code. :meth:`build` traces it
    (``make_fx``); afterwards a local call runs the traced ops, a call with pointers runs
    it at their worker, and :meth:`send` returns a :class:`PointerPlan`.
    """

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        state: Sequence[torch.Tensor] | None = None,
        args_shape: Sequence[Shape] | None = None,
        args_dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
    ) -> None:
        super().__init__()
        if fn is not None and not callable(fn):
            raise TypeError(f"a plan wraps a function, got {type(fn).__name__}")
        if state is not None:
            if fn is None:
                raise TypeError(
                    "state= is for function plans; a module plan's state is its "
                    "parameters and buffers"
                )
            if not all(isinstance(t, torch.Tensor) and type(t) is torch.Tensor for t in state):
                raise TypeError("a plan's state must be a sequence of local tensors")
        self._fn = fn
        self._has_state = state is not None
        self._state_tensors = [t.detach().clone() for t in state or ()]
        self._graph: PlanGraph | None = None
        self._layouts: list[Layout] = []  # the built graph's argument strides
        self._variants: OrderedDict[Signature, PlanGraph] = OrderedDict()
        self._loaded = False
        self._tracing = False
        self._sent: dict[int, PointerPlan] = {}
        self.name = name or getattr(fn, "__name__", None) or type(self).__name__
        if args_shape is not None:
            self.build_from_shapes(args_shape, args_dtype)

    # -- building --------------------------------------------------------------------------
    @property
    def is_built(self) -> bool:
        """Whether the plan has been traced."""
        return self._graph is not None

    @property
    def graph(self) -> PlanGraph | None:
        """The traced graph (None until built)."""
        return self._graph

    @property
    def state(self) -> State:
        """The plan's current state: its state tensors, or a module plan's parameters and
        buffers."""
        return State(self._current_state())

    def build(self, *args: torch.Tensor, dynamic_dims: Sequence[Shape] | None = None) -> Plan:
        """Trace the plan on example tensors ``args``; returns the plan.

        Sizes are fixed to those of ``args`` except the dims listed, per argument, in
        ``dynamic_dims`` (e.g. ``[(0,)]``: the first argument's batch size may vary).
        """
        if self._loaded:
            raise PlanBuildError(
                f"plan {self.name!r} was loaded from bytes: it has no Python code to trace"
            )
        self._check_arity(args)
        state = self._current_state()
        self._graph = trace_plan(
            self._run_python_with,
            list(args),
            state,
            name=self.name,
            dynamic_dims=dynamic_dims,
            arg_names=self._arg_names(),
        )
        self._layouts = [layout_of(a) for a in args]
        self._variants.clear()
        self._sent.clear()
        return self

    def build_from_shapes(
        self,
        args_shape: Sequence[Shape],
        args_dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
    ) -> Plan:
        """Build from shapes alone; ``-1`` marks a dim that may have any size."""
        if not isinstance(args_shape, list | tuple) or not all(
            isinstance(s, list | tuple) and all(type(d) is int and d >= -1 for d in s)
            for s in args_shape
        ):
            raise PlanBuildError(
                f"plan {self.name!r}: args_shape must be a list of shapes such as "
                f"[(1, 2), (-1, 2)] (-1: any size), got {args_shape!r}"
            )
        dtypes = (
            [args_dtype] * len(args_shape)
            if isinstance(args_dtype, torch.dtype)
            else list(args_dtype)
        )
        if len(dtypes) != len(args_shape) or not all(isinstance(d, torch.dtype) for d in dtypes):
            raise PlanBuildError(f"plan {self.name!r}: give one dtype, or one per shape")
        examples = [
            torch.ones([TRACE_SIZE if d == -1 else d for d in shape], dtype=dt)
            for shape, dt in zip(args_shape, dtypes)
        ]
        dynamic = [[k for k, d in enumerate(shape) if d == -1] for shape in args_shape]
        return self.build(*examples, dynamic_dims=dynamic)

    def _require_built(self, what: str) -> PlanGraph:
        if self._graph is None:
            raise PlanNotBuiltError(
                f"plan {self.name!r} is not built yet, so it cannot be {what}: call "
                ".build(example_args...) first, or give args_shape to func2plan"
            )
        return self._graph

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *args: Any) -> Any:
        if self._tracing:  # inside functional_call while tracing a module plan
            return nn.Module.__call__(self, *args)
        if any(isinstance(a, PointerTensor) for a in args):
            return self._remote_call(args)
        graph = self._graph
        if graph is None:
            return self._run_python(args)
        graph = self._graph_for(graph, self._layouts, args)
        outs = graph.run(list(args), state=self._current_state())
        return tuple(outs) if graph.tuple_output else outs[0]

    # -- other signatures ------------------------------------------------------------------
    @property
    def can_trace(self) -> bool:
        """Whether the plan has its Python code, and so can be traced for other shapes and
        dtypes (False for a plan loaded from bytes)."""
        return not self._loaded

    @property
    def variants(self) -> list[PlanGraph]:
        """The graphs traced for call signatures other than the built one (cached,
        least recently used first)."""
        return list(self._variants.values())

    def _graph_for(
        self, base: PlanGraph, layouts: Sequence[Layout], args: Sequence[Any]
    ) -> PlanGraph:
        """The graph that runs ``args``: ``base`` where it accepts them, else the variant
        traced for their signature (traced now if new)."""
        if not self.can_trace:
            return traced_only(base, args)
        base.check_kinds(args)
        if accepts(base, layouts, args):
            return base
        return self._variant_for(args)

    def _variant_for(self, args: Sequence[torch.Tensor]) -> PlanGraph:
        """The graph traced for the signature of ``args`` (cached, at most MAX_VARIANTS).

        It is traced as :meth:`build` traces, on real tensors of that signature: the
        call's own values for local arguments, ones for pointers (as ``args_shape``
        does). So a function that cannot take these inputs raises here, before any
        message, the very error an eager call raises. Beyond REAL_TRACE_LIMIT bytes of
        inputs it is traced on fake tensors instead, which allocate and compute nothing;
        torch words a few errors differently there, and an op that does not support a
        dtype then fails only when the worker runs it."""
        sig = signature_of(args)
        graph = self._variants.get(sig)
        if graph is not None:
            self._variants.move_to_end(sig)
            return graph
        common: dict[str, Any] = {
            "name": self.name,
            "arg_names": self._arg_names(),
            "own_errors": True,
        }
        state = self._current_state()
        if sum(_storage_size(a) * a.element_size() for a in args) <= REAL_TRACE_LIMIT:
            examples = [_example(a) for a in args]
            graph = trace_plan(self._run_python_with, examples, state, copy_inputs=False, **common)
        else:
            metas = [
                torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") for a in args
            ]
            graph = trace_plan(self._run_python_with, metas, state, mode="fake", **common)
        self._variants[sig] = graph
        if len(self._variants) > MAX_VARIANTS:
            self._variants.popitem(last=False)
        return graph

    def _remote_call(self, args: tuple[Any, ...]) -> Any:
        self._require_built("run at a worker")
        location = next(a for a in args if isinstance(a, PointerTensor)).location
        pointer = self._sent.get(id(location))
        if pointer is None or pointer.location is not location:
            pointer = self._sent[id(location)] = self.send(location)
        return pointer(*args)

    def _run_python(self, args: Sequence[Any]) -> Any:
        if self._fn is None:
            return nn.Module.__call__(self, *args)
        if self._has_state:
            return self._fn(*args, State(self._state_tensors))
        return self._fn(*args)

    def _run_python_with(self, args: list[torch.Tensor], state: list[torch.Tensor]) -> Any:
        """Run the Python code on ``args`` with ``state`` in place of the plan's state."""
        if self._fn is not None:
            return self._fn(*args, State(state)) if self._has_state else self._fn(*args)
        names = self._state_names()
        self._tracing = True
        try:
            return torch.func.functional_call(self, dict(zip(names, state)), tuple(args))
        finally:
            self._tracing = False

    def _state_names(self) -> list[str]:
        return [n for n, _ in self.named_parameters()] + [n for n, _ in self.named_buffers()]

    def _current_state(self) -> list[torch.Tensor]:
        if self._fn is not None or self._loaded:
            return list(self._state_tensors)
        return [p for _, p in self.named_parameters()] + [b for _, b in self.named_buffers()]

    def _signature(self) -> inspect.Signature | None:
        try:
            return inspect.signature(self._fn if self._fn is not None else self.forward)
        except (TypeError, ValueError):
            return None

    def _arg_names(self) -> list[str]:
        sig = self._signature()
        if sig is None:
            return []
        return [
            p.name
            for p in sig.parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]

    def _check_arity(self, args: Sequence[Any]) -> None:
        sig = self._signature()
        if sig is None:
            return
        try:
            sig.bind(*args, *([None] if self._has_state else []))
        except TypeError as e:
            extra = " (plus the state)" if self._has_state else ""
            raise PlanBuildError(
                f"plan {self.name!r} cannot be built with {len(args)} example argument"
                f"{'' if len(args) == 1 else 's'}{extra}: {e}"
            ) from None

    # -- sending and bytes -----------------------------------------------------------------
    def send(self, worker: WorkerClient) -> PointerPlan:
        """Store the plan (with its current state) at ``worker``; returns a PointerPlan."""
        graph = self._require_built("sent")
        if not (hasattr(worker, "new_id") and hasattr(worker, "post")):
            raise TypeError(f"send() expects a worker, got {type(worker).__name__}")
        snapshot = graph.with_state(self._current_state())
        obj_id = worker.new_id()
        worker.post(StorePlan(obj_id, plan_to_wire(snapshot)))
        return PointerPlan(worker, obj_id, snapshot, owner=self, layouts=self._layouts)

    def to_bytes(self) -> bytes:
        """The built plan and its current state as bytes (msgpack, no pickle)."""
        graph = self._require_built("serialised")
        return plan_to_bytes(graph.with_state(self._current_state()))

    @staticmethod
    def from_bytes(data: bytes) -> Plan:
        """A built plan from :meth:`to_bytes` output; every field is validated, and an op
        outside the allow-list is refused (:class:`~pointers.PlanDecodeError`). Decoded
        within a worker's limits: the outer layout is checked before anything is built
        (:func:`check_plan_bytes`), and the plan's header is held to a message header's
        (``serde.MAX_HEADER_BYTES``)."""
        try:
            check_plan_bytes(data)
        except PlanDecodeError:
            if len(data) <= PRECISE_BELOW:  # the structural scan names what is wrong
                plan_from_bytes(data)
            raise
        graph = plan_from_bytes(data)
        plan = Plan(name=graph.name)
        plan._graph = graph
        plan._state_tensors = list(graph.state)
        plan._loaded = True
        return plan

    def extra_repr(self) -> str:
        return f"plan={self.name!r}, built={self.is_built}"

    def __repr__(self) -> str:
        if type(self) is Plan:
            return f"Plan({self.name!r}, built={self.is_built})"
        return super().__repr__()


def func2plan(
    args_shape: Sequence[Shape] | Callable[..., Any] | None = None,
    state: Sequence[torch.Tensor] | None = None,
    *,
    args_dtype: torch.dtype | Sequence[torch.dtype] = torch.float32,
) -> Any:
    """Decorator turning a function into a :class:`Plan`.

    With ``args_shape`` the plan is built at once (``-1``: a dim of any size); with
    ``state`` the function receives a :class:`State` as its last argument.
    """
    if callable(args_shape):  # used bare: @func2plan
        return Plan(args_shape)

    def wrap(fn: Callable[..., Any]) -> Plan:
        return Plan(fn, state=state, args_shape=args_shape, args_dtype=args_dtype)

    return wrap


__all__ = ["Plan", "PlanCallError", "PointerPlan", "State", "func2plan"]
