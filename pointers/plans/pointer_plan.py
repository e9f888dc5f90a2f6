"""A plan stored at a worker (:class:`PointerPlan`), and the call signatures plans trace for.

:meth:`pointers.plans.plan.Plan.send` stores a plan at a worker and returns a
:class:`PointerPlan`: calling it sends one message and returns pointers, their shapes
inferred locally from the trace. A call whose signature (shapes, dtypes, strides) the
stored graph does not accept runs a *variant* that the plan's owner traces for it
(:class:`PlanOwner`), stored at the worker by that same call and reused by later calls.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import torch

from pointers.errors import LocationMismatchError
from pointers.plans.graph import PlanCallError, PlanGraph, PlanRunError
from pointers.plans.wire import variant_to_wire
from pointers.pointer_tensor import PointerTensor, RemoteRef
from pointers.wire.messages import RunPlan, StoreRunPlan
from pointers.wire.serde import dtype_from_name

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient

Layout = tuple[int, ...] | None  # an argument's strides; None: contiguous
Signature = tuple[tuple[tuple[int, ...], torch.dtype, Layout], ...]

MAX_VARIANTS = 64  # signatures traced per plan (and stored per plan and worker), LRU


def layout_of(a: torch.Tensor) -> Layout:
    """``a``'s strides, or None when it is contiguous (the common case)."""
    shape, stride = tuple(a.shape), tuple(a.stride())
    if 0 in shape:
        return None
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1 and st != expected:
            return stride
        expected *= size
    return None


def signature_of(args: Sequence[torch.Tensor]) -> Signature:
    return tuple((tuple(a.shape), a.dtype, layout_of(a)) for a in args)


def accepts(graph: PlanGraph, layouts: Sequence[Layout] | None, args: Sequence[Any]) -> bool:
    """Whether ``graph`` runs ``args`` as the function would: their shapes and dtypes fit
    its inputs, their strides are those it was traced with (a traced ``reshape`` is a
    ``view`` for contiguous inputs, a copy for others), and its size checks pass."""
    try:
        graph.check_args(args)
    except PlanCallError:
        return False
    if layouts and any(layout_of(a) != lay for a, lay in zip(args, layouts)):
        return False
    if graph.has_checks or any(None in i.shape for i in graph.inputs):
        try:
            graph.infer(args)  # its size checks, and ops that cannot take these sizes
        except (PlanCallError, PlanRunError):
            return False
    return True


def traced_only(graph: PlanGraph, args: Sequence[Any]) -> PlanGraph:
    """``graph``, if it accepts ``args``: a plan without its Python function cannot be
    traced for another signature."""
    graph.check_kinds(args)
    try:
        graph.check_args(args)
    except PlanCallError as e:
        raise PlanCallError(
            f"{e}. Plan {graph.name!r} has no Python function here (it was loaded from "
            "bytes, or received without its code), so it runs only the input shapes and "
            "dtypes it was traced for; build it from its function to run it on others"
        ) from None
    return graph


class PlanOwner(Protocol):
    """What a pointer plan asks of the plan it was sent from
    (:class:`~pointers.plans.plan.Plan`): a variant traced for another signature."""

    @property
    def can_trace(self) -> bool: ...
    def _variant_for(self, args: Sequence[torch.Tensor]) -> PlanGraph: ...


class PointerPlan:
    """A plan stored at a worker. Calling it sends one message and returns pointers.

    Arguments are pointers at the plan's worker (or local tensors, which travel with the
    call). The outputs' shapes are inferred locally from the trace, so the call does not
    wait for a reply, as with single ops. A pointer plan made by :meth:`~pointers.plans.plan.Plan.send` keeps
    its plan (the ``owner``): a call with a signature its graph does not accept gets the
    variant the owner traces for it, stored at the worker by that same call (one
    :class:`~pointers.wire.messages.StoreRunPlan` message) and reused by later calls.
    """

    def __init__(
        self,
        location: WorkerClient,
        obj_id: int,
        graph: PlanGraph,
        *,
        owner: PlanOwner | None = None,
        layouts: Sequence[Layout] = (),
    ) -> None:
        self._ref = RemoteRef(location, obj_id)
        self.graph = graph
        self._owner = owner
        self._layouts = list(layouts)
        # signature -> (the variant stored at the worker, its graph), least recent first
        self._variants: OrderedDict[Signature, tuple[RemoteRef, PlanGraph]] = OrderedDict()

    @property
    def location(self) -> WorkerClient:
        """The worker that stores the plan."""
        return self._ref.location

    @property
    def id_at_location(self) -> int:
        return self._ref.obj_id

    @property
    def name(self) -> str:
        return self.graph.name

    @property
    def variants(self) -> list[PlanGraph]:
        """The graphs for other signatures stored at the worker by earlier calls (least
        recently used first)."""
        return [graph for _, graph in self._variants.values()]

    def __call__(self, *args: Any) -> Any:
        ref = self._ref
        ref.check()
        location = ref.location
        wire_args: list[Any] = []
        for a in args:
            if isinstance(a, PointerTensor):
                a._ref.check()
                if a._ref.location is not location:
                    raise LocationMismatchError(
                        f"plan {self.name!r}", location.id, a._ref.location.id
                    )
                wire_args.append(a._ref.wire())
            elif isinstance(a, torch.Tensor):
                wire_args.append(a.detach())
            else:
                wire_args.append(a)
        graph, run_id, variant = self._select(args)
        metas = graph.infer(args)  # checks count, shapes, dtypes and size guards

        def message(out_ids: list[int | None], want_meta: bool) -> Any:
            if variant is None:
                return RunPlan(run_id, wire_args, out_ids, want_meta)
            return StoreRunPlan(ref.obj_id, run_id, variant, wire_args, out_ids, want_meta)

        if metas is not None:
            ids = [location.new_id() for _ in metas]
            try:
                location.post(message(list(ids), False))
            finally:  # in process, a failed run raises here; the variant was stored first
                self._stored(args, run_id, graph, variant)
            outs = [
                PointerTensor(RemoteRef(location, i), shape, stride, dtype)
                for i, (shape, stride, dtype) in zip(ids, metas)
            ]
        else:  # a node can only run at the worker: the reply describes the outputs
            base = location.new_id()
            for _ in range(graph.n_outputs - 1):
                location.new_id()
            try:
                _, described = location.request(message([base], True))
            finally:  # stored even when the run failed (the store comes first)
                self._stored(args, run_id, graph, variant)
            outs = [
                PointerTensor(
                    RemoteRef(location, base + k), tuple(m[0]), tuple(m[1]), dtype_from_name(m[2])
                )
                for k, m in enumerate(described)
            ]
        return tuple(outs) if graph.tuple_output else outs[0]

    def _select(self, args: Sequence[Any]) -> tuple[PlanGraph, int, list[Any] | None]:
        """The graph for ``args``, the id to run at the worker, and the variant's wire
        form when the worker does not have it yet (None: it has)."""
        base, owner = self.graph, self._owner
        if owner is None or not owner.can_trace:
            return traced_only(base, args), self._ref.obj_id, None
        base.check_kinds(args)
        if accepts(base, self._layouts, args):
            return base, self._ref.obj_id, None
        sig = signature_of(args)
        known = self._variants.get(sig)
        if known is not None:
            self._variants.move_to_end(sig)
            return known[1], known[0].obj_id, None
        graph = owner._variant_for(args)
        shapes = [(t.shape, t.dtype) for t in graph.state]
        if shapes != [(t.shape, t.dtype) for t in base.state]:
            raise PlanCallError(
                f"plan {self.name!r}: its state changed shape or dtype since it was sent to "
                f"{self.location.id!r}; send it again"
            )
        return graph, self.location.new_id(), variant_to_wire(graph)

    def _stored(
        self, args: Sequence[Any], run_id: int, graph: PlanGraph, variant: list[Any] | None
    ) -> None:
        """Remember a variant sent to the worker (dropping the least recently used one
        beyond MAX_VARIANTS deletes it there)."""
        if variant is None:
            return
        self._variants[signature_of(args)] = (RemoteRef(self.location, run_id), graph)
        if len(self._variants) > MAX_VARIANTS:
            self._variants.popitem(last=False)

    def __repr__(self) -> str:
        gone = " (deleted)" if self._ref.gone else ""
        return (
            f"PointerPlan({self.name!r}, location={self._ref.location.id!r}, "
            f"id={self._ref.obj_id}){gone}"
        )


__all__ = ["MAX_VARIANTS", "Layout", "PlanOwner", "PointerPlan", "Signature"]
