"""Protocols: roles mapped to plans, deployed on workers and run as a chain.

>>> import torch, pointers as pt
>>> inc = pt.func2plan(args_shape=[(1,)])(lambda x: x + 1)
>>> dbl = pt.func2plan(args_shape=[(1,)])(lambda x: x * 2)
>>> protocol = pt.Protocol([("first", inc), ("second", dbl)])
>>> _ = protocol.deploy(pt.VirtualWorker("alice"), pt.VirtualWorker("bob"))
>>> protocol.run(torch.tensor([1.0, 2.0])).get()  # built for (1,): any shape runs
tensor([4., 6.])

Deploying sends role ``k``'s plan to the ``k``-th worker (one message each). Running sends
the input to the first role's worker with its plan call, then moves each role's outputs
to the next role's worker, party to party (:meth:`PointerTensor.move`): the client sends
one message per role plus one per moved output, and sees no intermediate value. An input
signature (shapes, dtypes) a role's plan was not built for costs no extra message: the
plan is traced again for it and the new graph travels with that role's call, once per
signature and worker (see :class:`~pointers.plans.plan.PointerPlan`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from pointers.plans.graph import PlanError, PlanNotBuiltError
from pointers.plans.plan import Plan, PointerPlan
from pointers.pointer_tensor import PointerTensor

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient


class ProtocolError(PlanError):
    """A protocol was declared, deployed or run the wrong way."""


class Protocol:
    """An ordered list of ``(role, plan)`` pairs; :meth:`deploy` binds roles to workers."""

    def __init__(self, roles: Sequence[tuple[str, Plan]]) -> None:
        pairs = list(roles)
        if not pairs:
            raise ProtocolError("a protocol needs at least one (role, plan) pair")
        for k, pair in enumerate(pairs):
            if not (
                isinstance(pair, tuple | list)
                and len(pair) == 2
                and isinstance(pair[0], str)
                and isinstance(pair[1], Plan)
            ):
                raise ProtocolError(f"role {k} must be a (name, Plan) pair, got {pair!r}"[:300])
        names = [r for r, _ in pairs]
        if len(set(names)) != len(names):
            raise ProtocolError(f"role names must be unique, got {names}")
        self._roles: list[tuple[str, Plan]] = [(r, p) for r, p in pairs]
        self._deployed: list[tuple[WorkerClient, PointerPlan]] | None = None

    @property
    def roles(self) -> list[str]:
        """The role names, in order."""
        return [r for r, _ in self._roles]

    @property
    def plans(self) -> dict[str, Plan]:
        """Role name -> plan."""
        return dict(self._roles)

    @property
    def is_deployed(self) -> bool:
        return self._deployed is not None

    @property
    def workers(self) -> dict[str, WorkerClient]:
        """Role name -> worker (empty before :meth:`deploy`)."""
        if self._deployed is None:
            return {}
        return {r: w for (r, _), (w, _) in zip(self._roles, self._deployed)}

    def deploy(self, *workers: WorkerClient) -> Protocol:
        """Send role ``k``'s plan to ``workers[k]``; returns the protocol."""
        if len(workers) != len(self._roles):
            raise ProtocolError(
                f"this protocol has {len(self._roles)} role"
                f"{'' if len(self._roles) == 1 else 's'} ({', '.join(self.roles)}) but "
                f"{len(workers)} {'worker was' if len(workers) == 1 else 'workers were'} given; "
                "deploy it to exactly one worker per role, in role order"
            )
        for (role, _), w in zip(self._roles, workers):
            if not (hasattr(w, "id") and hasattr(w, "new_id") and hasattr(w, "post")):
                raise ProtocolError(f"role {role!r}: expected a worker, got {type(w).__name__}")
        for role, plan in self._roles:
            if not plan.is_built:
                raise PlanNotBuiltError(
                    f"role {role!r}: plan {plan.name!r} is not built yet; build it (or give "
                    "args_shape) before deploying the protocol"
                )
        for (role, plan), (next_role, next_plan) in zip(self._roles, self._roles[1:]):
            n_out, n_in = plan.graph.n_outputs, next_plan.graph.n_inputs  # type: ignore[union-attr]
            if n_out != n_in:
                raise ProtocolError(
                    f"role {role!r} returns {n_out} tensor{'' if n_out == 1 else 's'} but role "
                    f"{next_role!r} takes {n_in}: each plan's outputs are the next one's inputs"
                )
        self._deployed = [(w, plan.send(w)) for w, (_, plan) in zip(workers, self._roles)]
        return self

    def run(self, *args: torch.Tensor) -> Any:
        """Run the chain on ``args`` (local tensors, or pointers, which are copied to the
        first role's worker); returns pointers at the last role's worker."""
        if self._deployed is None:
            raise ProtocolError("deploy the protocol to its workers before running it")
        first = self._deployed[0][0]
        current: list[Any] = [
            a.copy_to(first) if isinstance(a, PointerTensor) and a.location is not first else a
            for a in args
        ]
        out: Any = None
        for k, (_, ptr_plan) in enumerate(self._deployed):
            out = ptr_plan(*current)
            current = list(out) if isinstance(out, tuple) else [out]
            if k + 1 < len(self._deployed):
                nxt = self._deployed[k + 1][0]
                current = [p.move(nxt) for p in current]
        return out

    def __repr__(self) -> str:
        parts = []
        for k, (role, plan) in enumerate(self._roles):
            where = f" @ {self._deployed[k][0].id}" if self._deployed else ""
            parts.append(f"{role}: {plan.name}{where}")
        return f"Protocol([{', '.join(parts)}])"


__all__ = ["Protocol", "ProtocolError"]
