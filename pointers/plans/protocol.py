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
signature and worker (see :class:`~pointers.plans.pointer_plan.PointerPlan`).

Inputs that already sit at one worker (pointers) are copied from there to the first
role's worker, party to party, and the outputs go back to that worker at the end: the
data owner gets the result, the client a pointer to it there.

A protocol is also an object that travels, as in PySyft 0.2: ``protocol.tag(...)``,
``protocol.send(worker)`` (stored there as bytes, msgpack without pickle, found with
:meth:`Protocol.search`), and ``.get()`` of the :class:`PointerProtocol` brings it back.
Plans decoded from bytes run the signatures they were traced for (see
:meth:`Plan.from_bytes`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import msgpack
import torch

from pointers.errors import DecodeError
from pointers.plans.graph import PlanDecodeError, PlanError, PlanNotBuiltError
from pointers.plans.plan import Plan
from pointers.plans.pointer_plan import PointerPlan
from pointers.plans.wire import PRECISE_BELOW, OuterReader, check_plan_bytes
from pointers.pointer_tensor import PointerTensor
from pointers.wire import serde

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
        self.tags: set[str] = set()
        self.description = ""

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
        first role's worker); returns pointers at the last role's worker. Run on data held
        at a worker (pointers, all at one worker), the result is that worker's: as in
        PySyft, a pointer to it at that worker, holding a pointer to the result at the last
        role's worker (a chain: ``.get().get()``). Network workers hold no pointers to
        one another: there the result moves to the data's worker (one ``.get()``)."""
        if self._deployed is None:
            raise ProtocolError("deploy the protocol to its workers before running it")
        first = self._deployed[0][0]
        owners = {a.location.id: a.location for a in args if isinstance(a, PointerTensor)}
        if len(owners) > 1:
            raise ProtocolError(
                f"the protocol's inputs sit at {sorted(owners)}: they must all be local, or "
                "all at one worker (whose result it then is)"
            )
        owner = next(iter(owners.values()), None)
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
        last = self._deployed[-1][0]
        if owner is not None and owner is not last:  # the data owner's result
            moved = [_owners_result(p, owner, last) for p in current]
            out = tuple(moved) if isinstance(out, tuple) else moved[0]
        return out

    # -- a protocol as an object: tags, bytes, sent to and found at a worker ------------
    def tag(self, *tags: str) -> Protocol:
        """Add search tags (found with :meth:`Protocol.search` once sent); returns self."""
        if not tags or not all(isinstance(t, str) for t in tags):
            raise TypeError("tag() takes one or more tag strings")
        self.tags.update(tags)
        return self

    def describe(self, description: str) -> Protocol:
        if not isinstance(description, str):
            raise TypeError("describe() takes a string")
        self.description = description
        return self

    def to_bytes(self) -> bytes:
        """The roles, their built plans (:meth:`Plan.to_bytes`), tags and description, as
        one msgpack byte string (no pickle)."""
        for role, plan in self._roles:
            if not plan.is_built:
                raise PlanNotBuiltError(f"role {role!r}: plan {plan.name!r} is not built yet")
        roles = [[r, p.to_bytes()] for r, p in self._roles]
        return msgpack.packb(
            [_MAGIC, roles, sorted(self.tags), self.description], use_bin_type=True
        )

    @staticmethod
    def from_bytes(data: bytes) -> Protocol:
        """A protocol from :meth:`to_bytes` output; every plan is validated as
        :meth:`Plan.from_bytes` validates it (:class:`ProtocolError` on anything else)."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise ProtocolError(f"a protocol decodes from bytes, not {type(data).__name__}")
        try:  # the outer layout first, within a worker's limits, without decoding it
            _check_protocol_bytes(data)
        except PlanDecodeError as e:
            if len(data) > PRECISE_BELOW:
                raise ProtocolError(str(e)) from None
            precise: ProtocolError | None = ProtocolError(str(e))
        else:
            precise = None
        try:  # within the wire's structural limits (nesting, declared lengths, objects)
            outer = serde.unpack_document(data)
        except DecodeError as e:
            raise ProtocolError(f"not a serialised protocol: {e}") from None
        if not (
            isinstance(outer, list)
            and len(outer) == 4
            and outer[0] == _MAGIC
            and isinstance(outer[1], list)
            and 0 < len(outer[1]) <= _MAX_ROLES
            and all(
                isinstance(r, list)
                and len(r) == 2
                and isinstance(r[0], str)
                and isinstance(r[1], bytes)
                for r in outer[1]
            )
            and isinstance(outer[2], list)
            and all(isinstance(t, str) for t in outer[2])
            and isinstance(outer[3], str)
        ):
            raise ProtocolError("not a serialised protocol (bad structure)")
        roles = []
        for role, blob in outer[1]:
            try:
                roles.append((role, Plan.from_bytes(blob)))
            except PlanDecodeError as e:  # the protocol's error, naming the role
                raise ProtocolError(f"role {role!r}: {e}") from e
        if precise is not None:  # (a small document that decodes, yet broke a limit)
            raise precise
        protocol = Protocol(roles)
        protocol.tags = set(outer[2])
        protocol.description = outer[3]
        return protocol

    def send(self, worker: WorkerClient) -> PointerProtocol:
        """Store the protocol at ``worker`` (as bytes, tagged with its tags and
        ``#protocol``), where :meth:`Protocol.search` finds it; returns a pointer to it,
        which owns it as any pointer does (dropping it deletes it at the worker).
        Nothing runs there: deploy it to run it."""
        from pointers.module import send, tag

        data = torch.frombuffer(bytearray(self.to_bytes()), dtype=torch.uint8)
        tag(data, PROTOCOL_TAG, *sorted(self.tags), description=self.description)
        return PointerProtocol(send(data, worker))

    @staticmethod
    def search(worker: WorkerClient, *tags: str) -> list[PointerProtocol]:
        """Pointers to the protocols sent to ``worker`` that carry every tag in ``tags``."""
        return [PointerProtocol(p) for p in worker.search(PROTOCOL_TAG, *tags)]

    def __repr__(self) -> str:
        parts = []
        for k, (role, plan) in enumerate(self._roles):
            where = f" @ {self._deployed[k][0].id}" if self._deployed else ""
            parts.append(f"{role}: {plan.name}{where}")
        return f"Protocol([{', '.join(parts)}])"


def _owners_result(p: PointerTensor, owner: WorkerClient, last: WorkerClient) -> PointerTensor:
    """The result of a run on ``owner``'s data: the client's pointer to ``owner``'s pointer
    to the result at ``last`` (PySyft's chain), in process; moved to ``owner`` otherwise."""
    from pointers.worker.base import VirtualWorker

    moved = p.move(owner)
    if isinstance(owner, VirtualWorker) and isinstance(last, VirtualWorker):
        return moved.send(last)  # the value goes back to last; owner keeps a pointer to it
    return moved


_MAGIC = "pointers.protocol/1"
_MAX_ROLES = 64
_MAX_TAGS = 4096  # tags of a serialised protocol


def _check_protocol_bytes(data: Any) -> None:
    """The outer layout of :meth:`Protocol.to_bytes` output, ``[magic, [[role, plan]...],
    [tags], description]``, checked before anything is decoded: at most
    :data:`_MAX_ROLES` roles and :data:`_MAX_TAGS` tags, each plan as
    :func:`~pointers.plans.wire.check_plan_bytes` checks it, and the plans' headers
    together within one message header's limit (``serde.MAX_HEADER_BYTES``, what a worker
    decodes from one message): decoding a hostile protocol then costs what one message
    costs a worker, not ~40x the protocol's size. Raises :class:`PlanDecodeError`."""
    what = "a serialised protocol"
    r = OuterReader(data, what)
    if r.array(4, "its outer value") != 4:
        raise r._fail("its outer value is not [magic, roles, tags, description]")
    r.string(64, "its magic")
    headers = 0
    for _ in range(r.array(_MAX_ROLES, "its roles")):
        if r.array(2, "a role") != 2:
            raise r._fail("a role is not [name, plan]")
        role = r.string(1024, "a role's name")
        size = r.binary(len(r.data), "a role's plan")
        try:
            headers += check_plan_bytes(r.data[r.pos - size : r.pos])
        except PlanDecodeError as e:  # the protocol's error, naming the role
            raise ProtocolError(f"role {role!r}: {e}") from e
        if headers > serde.MAX_HEADER_BYTES:
            raise r._fail(
                f"its plans' headers take more than {serde.MAX_HEADER_BYTES} bytes together"
            )
    for _ in range(r.array(_MAX_TAGS, "its tags")):
        r.string(len(r.data), "a tag")
    r.string(len(r.data), "its description")
    r.end()


#: the tag every protocol sent to a worker carries
PROTOCOL_TAG = "#protocol"


class PointerProtocol:
    """A protocol stored at a worker (PySyft's pointer to a sent protocol)."""

    def __init__(self, ptr: PointerTensor) -> None:
        if not isinstance(ptr, PointerTensor) or ptr.dtype != torch.uint8 or ptr.dim() != 1:
            raise ProtocolError("a protocol pointer points to a protocol's bytes at a worker")
        self._ptr = ptr

    @property
    def location(self) -> WorkerClient:
        return self._ptr.location

    @property
    def id_at_location(self) -> int:
        return self._ptr.id_at_location

    def get(self, delete: bool = True) -> Protocol:
        """The protocol, decoded and validated (``delete=False``: it stays at the worker)."""
        raw = self._ptr.get(delete=delete)
        return Protocol.from_bytes(raw.numpy().tobytes())

    def __repr__(self) -> str:
        return f"PointerProtocol(location={self.location.id!r}, id={self.id_at_location})"


__all__ = ["PROTOCOL_TAG", "PointerProtocol", "Protocol", "ProtocolError"]
