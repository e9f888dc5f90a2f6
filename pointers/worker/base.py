"""Workers: an object store, a function registry and a message handler.

:class:`Worker` is the serving side, identical for every transport: it decodes a message,
runs it against its store and encodes the reply (ops and registered functions run in
:mod:`pointers.worker.execution`; here are the other commands and peer delivery). :class:`VirtualWorker` adds the client
side for in-process use; every message still goes through the encoder and decoder and is
counted in :attr:`Worker.stats`, as it would be on a wire.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol

import torch

from pointers.errors import DecodeError, NotAllowedError, RemoteError, UnknownObjectError
from pointers.plans.graph import PlanGraph
from pointers.plans.wire import plan_from_wire, variant_from_wire
from pointers.pointer_tensor import PointerTensor, search_worker
from pointers.wire import serde
from pointers.wire.messages import (
    Delete,
    Describe,
    ErrorReply,
    Fetch,
    Message,
    Reply,
    RunPlan,
    RunProgram,
    Search,
    SendToPeer,
    Store,
    StorePlan,
    StoreProgram,
    StoreRunPlan,
    Tag,
    decode_message,
    encode_message,
)
from pointers.worker import holding
from pointers.worker.client import Recorder, WorkerStats, sends
from pointers.worker.execution import Execution, Handler, handler_table, handles, tensor_meta
from pointers.worker.functions import FunctionRegistry
from pointers.worker.owners import DataPolicy
from pointers.worker.program import program_from_wire, start_program
from pointers.worker.sealing import (
    after_delivery,
    delivered_seal,
    is_owners_data,
    refused,
    refused_entry,
)
from pointers.worker.store import ObjectStore

Frames = tuple[bytes, list[Any]]


class Lock(Protocol):
    """What a worker's lock offers: a reentrant context manager."""

    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...


OK_NONE = encode_message(Reply(None))[0]


def _refs_and_uses(t: Any) -> tuple[int, int]:
    """Python references to ``t`` and tensors using its memory (as seen from here)."""
    return sys.getrefcount(t), torch._C._storage_Use_Count(t.untyped_storage()._cdata)


def _lone_tensor() -> tuple[int, int]:
    t = torch.empty(2)
    return _refs_and_uses(t)


_LONE: tuple[int, int] | None = None  # the counts of a lone tensor, measured on first use


def _lone() -> tuple[int, int]:
    """What :func:`_refs_and_uses` says of a tensor held by one local name, its memory by
    nobody else (measured once, on the first move: the counts differ between CPython and
    torch versions); (-1, -1) if torch's private counter is gone (then never donate)."""
    global _LONE
    if _LONE is None:
        try:
            _LONE = _lone_tensor()
        except (AttributeError, RuntimeError):
            _LONE = (-1, -1)
    return _LONE


def _sole_owner(value: Any) -> bool:
    """Whether the caller's one local name is all that refers to the plain tensor
    ``value`` and to its memory (no other name, store entry, view or base), so that an
    in-process peer may take it over without a copy."""
    if type(value) is not torch.Tensor or not value.is_contiguous():
        return False
    lone = _lone()
    return _refs_and_uses(value) == (lone[0] + 1, lone[1])  # + this function's parameter


_DELETE_BATCH = 64  # deletes of dropped pointers travel in batches


class Worker(Execution):
    """The serving side of a worker: store, registered functions, message handler.

    Each command type has a handler method (marked with :func:`handles`), found through
    the class's :attr:`handlers` table; subclasses extend the table with their own."""

    handlers: ClassVar[dict[type[Message], Handler]] = {}
    # what this worker knows of data owners (pointers.worker.owners.DataPolicy; None: none)
    data_policy: DataPolicy | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.handlers = handler_table(cls)

    def __init__(self, id: str) -> None:
        if not isinstance(id, str) or not id:
            raise ValueError(f"a worker id must be a non-empty string, got {id!r}")
        self.id = id
        rlock = threading.RLock()
        self._lock: Lock = rlock
        self.store = ObjectStore(id, threading.Condition(rlock))
        self.functions = FunctionRegistry()
        self.stats = WorkerStats()
        self._peer_links: dict[str, Any] = {}
        # the threads running this worker's programs (see pointers.worker.program)
        self.program_threads: list[threading.Thread] = []
        # state that registered functions keep at this worker, by the function family's
        # name (e.g. the nonces mpc has used with each seed)
        self.function_state: dict[str, Any] = {}

    @property
    def lock(self) -> Lock:
        """The lock that serialises this worker's commands (reentrant)."""
        return self._lock

    def run_locked(self, msg: Message) -> Any:
        """Run one decoded command under this worker's lock and return its reply value
        (raises its error): a step of a program (:mod:`pointers.worker.program`)."""
        with self._lock:
            return self._run(msg)

    def add_program_thread(self, thread: threading.Thread) -> None:
        """Track a thread that runs one of this worker's programs (see :meth:`wait_programs`)."""
        self.program_threads = [t for t in self.program_threads if t.is_alive()]
        self.program_threads.append(thread)

    def wait_programs(self, timeout: float | None = None) -> None:
        """Wait until the programs this worker runs (see :mod:`pointers.worker.program`) end."""
        for t in list(self.program_threads):
            t.join(timeout)
        self.program_threads = [t for t in self.program_threads if t.is_alive()]

    # -- serving ---------------------------------------------------------------------
    def handle_frames(
        self,
        header: bytes,
        buffers: list[Any],
        donated: bool = False,
        from_peer: str | None = None,
    ) -> Frames:
        """Decode one request, run it, return the encoded reply. Never raises.

        ``donated``: the buffers are tensors nobody else refers to (an in-process peer
        moving an object), taken over without a copy. ``from_peer``: an in-process peer
        worker delivers an object (a :class:`Store`, which may be sealed), not a client."""
        with self._lock:
            stats = self.stats
            stats.messages_received += 1
            stats.bytes_received += serde.nbytes(header, buffers) if buffers else len(header)
            try:
                msg = decode_message(header, buffers, copy=not donated)
                if from_peer is None:
                    value = self._run(msg)
                elif type(msg) is Store:
                    self.store.put(
                        msg.obj_id, msg.value, set(msg.tags), msg.description, msg.sealed
                    )
                    value = None
                else:
                    raise NotAllowedError(f"a peer may only deliver objects, not {msg.KIND!r}")
                reply: Message | None = None if value is None else Reply(value)
            except Exception as e:  # every failure becomes an error reply
                reply = ErrorReply(type(e).__name__, str(e))
            try:
                out = (OK_NONE, []) if reply is None else encode_message(reply)
            except Exception as e:
                out = encode_message(ErrorReply(type(e).__name__, f"reply not encodable: {e}"))
            stats.messages_sent += 1
            stats.bytes_sent += serde.nbytes(*out) if out[1] else len(out[0])
            return out

    def _run(self, msg: Message) -> Any:
        """Run one decoded command (the caller holds the lock): the handler of its type."""
        handler = self.handlers.get(type(msg))
        if handler is None:
            raise DecodeError(f"a worker cannot run a {msg.KIND!r} message")
        return handler(self, msg)

    # -- the command handlers (see :func:`handles`) ------------------------------------
    @handles(Store)
    def _store(self, msg: Store) -> None:
        if msg.sealed:
            raise refused("a client's store of a sealed object")
        run = holding.current()  # (in an approved run, what it stores is held too)
        sealed = False if run is None else run.seal()
        self.store.put(msg.obj_id, msg.value, set(msg.tags), msg.description, sealed)

    @handles(Fetch)
    def _fetch(self, msg: Fetch) -> Any:
        value = self._readable(msg.obj_id, "fetching it").value
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"object {msg.obj_id} is not a tensor")
        if isinstance(value, PointerTensor):  # a chain's hop: refused before it is dropped
            raise NotAllowedError(
                f"object {msg.obj_id} is a pointer chain's hop, not a tensor: "
                "get() the chain's pointer instead (one hop at a time)"
            )
        if msg.delete:
            self.store.discard(msg.obj_id)
        return value

    @handles(Delete)
    def _delete(self, msg: Delete) -> None:
        for i in msg.obj_ids:
            self.store.discard(i)

    @handles(Search)
    def _search(self, msg: Search) -> list[Any]:
        out = []
        for i in self.store.search(msg.query):
            e = self.store.entry(i)
            if isinstance(e.value, torch.Tensor):
                out.append([i, *tensor_meta(e.value), sorted(e.tags), e.description])
        return out

    @handles(Tag)
    def _tag(self, msg: Tag) -> None:
        e = self._readable(msg.obj_id, "tagging it")
        e.tags.update(msg.tags)
        if msg.description:
            e.description = msg.description

    @handles(Describe)
    def _describe(self, msg: Describe) -> list[Any]:
        return [tensor_meta(self._describable(i).value) for i in msg.obj_ids]

    @handles(SendToPeer)
    def _send_to_peer(self, msg: SendToPeer) -> None:
        self.send_to_peer(msg)

    @handles(StorePlan)
    def _store_plan(self, msg: StorePlan) -> None:  # validated op by op before it is stored
        self.store.put(msg.obj_id, plan_from_wire(msg.plan, self.functions))

    @handles(StoreRunPlan)
    def _store_run_plan(self, msg: StoreRunPlan) -> Any:
        """A plan traced for a new signature: store it, then run it."""
        base = self.store.get(msg.plan_id)
        if not isinstance(base, PlanGraph):
            raise TypeError(f"object {msg.plan_id} is not a plan")
        self.store.put(msg.obj_id, variant_from_wire(base, msg.plan, self.functions))
        return self._run_plan(RunPlan(msg.obj_id, msg.args, msg.out_ids, msg.want_meta))

    @handles(RunPlan)
    def _run_plan(self, msg: RunPlan) -> Any:
        plan = self.store.get(msg.plan_id)
        if not isinstance(plan, PlanGraph):
            raise TypeError(f"object {msg.plan_id} is not a plan")
        marks = [0, 0, 0]
        args = self._resolve_marked(msg.args, marks)
        if marks[0]:
            raise refused("running a plan on it")
        outs = plan.run(args, functions=self.functions, ctx=self)
        return self._store_outputs(outs, msg.out_ids, msg.want_meta)

    @handles(StoreProgram)
    def _store_program(self, msg: StoreProgram) -> None:
        self.store.put(msg.obj_id, program_from_wire(msg.messages))

    @handles(RunProgram)
    def _run_program(self, msg: RunProgram) -> None:
        start_program(self, msg)

    def _readable(self, obj_id: int, what: str) -> Any:
        """The entry of ``obj_id``, unless it is sealed (then ``what`` is refused)."""
        e = self.store.entry(obj_id)
        if e.sealed:
            raise refused_entry(what, obj_id, e.sealed)
        return e

    def _describable(self, obj_id: int) -> Any:
        """The entry of ``obj_id`` if its shape may be told: an ordinary object, or an
        owner's data (which a search describes too), never protocol material."""
        e = self.store.entry(obj_id)
        if e.sealed and not is_owners_data(e.sealed):
            raise refused("describing it", obj_id)
        return e

    # -- peer delivery -----------------------------------------------------------------
    def deliver(
        self,
        peer: str,
        obj_id: int,
        value: Any,
        donate: bool = False,
        lend: bool = False,
        sealed: Any = False,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        """Send ``value`` to peer worker ``peer``, stored there under ``obj_id``.

        ``on_lost(reason)``: for a worker whose deliveries do not wait for the peer (a
        served worker), called from another thread if this one does not arrive; here a
        failure raises instead, and the callback is never called.

        ``donate``: nothing else refers to ``value`` (see :func:`_sole_owner`); ``lend``:
        both sides only read it (see :class:`~pointers.wire.messages.SendToPeer`). Either way
        an in-process peer keeps the tensor itself instead of a copy. ``sealed``: it is
        protocol material, and stays sealed at the peer with this label (a list; see
        :mod:`pointers.worker.sealing`)."""
        link = self.peer_link(peer)
        if link is None:
            raise UnknownObjectError(f"worker {self.id!r} has no link to peer {peer!r}")
        header, buffers = encode_message(Store(obj_id, value, [], "", sealed))
        self.stats.peer_messages_sent += 1
        self.stats.peer_bytes_sent += serde.nbytes(header, buffers)
        if isinstance(link, Worker):  # in process
            rh, rb = link.handle_frames(
                header,
                buffers,
                donated=(donate or lend) and isinstance(link, VirtualWorker),
                from_peer=self.id,
            )
        else:
            rh, rb = link.handle_frames(header, buffers)
        reply = decode_message(rh, rb)
        if isinstance(reply, ErrorReply):
            raise RemoteError(peer, reply.kind, reply.message)

    def send_to_peer(self, msg: SendToPeer) -> None:
        """Copy or move (``msg.delete``) a stored object to a peer worker.

        This worker's lock is taken only to read the object (for a move: to drop the
        store's reference), not while the peer stores it, so that two workers delivering
        to each other from their own threads do not wait on each other's locks (a caller
        that already holds the lock, such as :meth:`handle_frames`, keeps holding it).
        A move that fails puts the object back: nothing is lost."""
        with self._lock:
            entry = self.store.entry(msg.obj_id)
            value, sealed = entry.value, entry.sealed
            tags, description = entry.tags, entry.description
            sent: Any = False
            if sealed:  # the copy records its sender; a seed leaves its dealer once
                holding.check_send(sealed)
                sent = delivered_seal(sealed, self.id, msg.peer)
                entry.sealed = sealed = after_delivery(sealed)
            del entry  # (it refers to the value too)
            if msg.delete:
                self.store.forget(msg.obj_id)
            donate = msg.delete and _sole_owner(value)  # before ``value`` is an argument

        def put_back(why: str) -> None:  # a move whose delivery failed after it left
            try:
                self.store.put(msg.obj_id, value, tags, description, sealed)
            except Exception:  # noqa: S110 - the store closed or is full: reported anyway
                pass

        try:
            self.deliver(
                msg.peer,
                msg.new_id,
                value,
                donate=donate,
                lend=msg.lend,
                sealed=sent,
                on_lost=put_back if msg.delete else None,
            )
        except BaseException:
            if msg.delete:
                with self._lock:
                    self.store.put(msg.obj_id, value, tags, description, sealed)
            raise

    def send_to_peer_unlocked(self, msg: SendToPeer) -> None:
        """:meth:`send_to_peer` as a command from a thread that does not hold this
        worker's lock (a :mod:`pointers.worker.lanes` lane), counted like any other."""
        with self._lock:
            self.stats.messages_received += 1
        try:
            self.send_to_peer(msg)
        finally:
            with self._lock:
                self.stats.messages_sent += 1

    def take(self, obj_id: int) -> Any:
        """Remove and return a stored object (used by registered functions)."""
        return self.store.pop(obj_id)

    def add_peer_link(self, peer_id: str, link: Any) -> None:
        self._peer_links[peer_id] = link

    def delivery_failed(self, obj_id: int, why: str) -> None:
        """A peer in this process will not deliver ``obj_id`` (its program failed): a
        command of ours waiting for it fails now, with ``why``, instead of at the
        deadline (a direct call between in-process workers, never a message)."""
        with self._lock:
            self.store.fail_promises([obj_id], why)

    def peer_link(self, peer_id: str) -> Any | None:
        """The link this worker delivers to peer ``peer_id`` through (None: no link)."""
        return self._peer_links.get(peer_id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} objects={len(self.store)}>"


Worker.handlers = handler_table(Worker)


class VirtualWorker(Worker):
    """An in-process worker, with the client side of the message layer built in.

    ``data`` holds tensors the worker holds from the start (PySyft's ``data=``; tag them
    with :func:`pointers.tag` so that :meth:`search` finds them): the script that makes an
    in-process worker is its client, and these are its own (a data owner puts data it
    keeps to itself with :func:`pointers.own`). ``owners``: as a party, the deployment's
    data owners, by worker name (whose shares it adds into aggregates), or a
    :class:`pointers.worker.owners.DataPolicy`. ``concurrent=False``: the worker runs
    every command in the caller's thread even inside :func:`pointers.concurrently` (one
    party after the other, e.g. to measure the work of a protocol on one core).

    A command that needs an object a program or a peer is still to produce waits for it
    at most :attr:`DELIVERY_WAIT` seconds (``store.wait_seconds``): the peers run in this
    process, and a failed program tells its peers at once, so the bound only catches a
    peer that stopped; a long program (a language model's decoding step) on a loaded
    machine may lag its peers by several seconds.
    """

    DELIVERY_WAIT = 120.0

    def __init__(
        self,
        id: str,
        data: Iterable[torch.Tensor] = (),
        concurrent: bool = True,
        owners: Iterable[str] | DataPolicy | None = None,
    ) -> None:
        super().__init__(id)
        self.store.wait_seconds = self.DELIVERY_WAIT
        if owners is not None:
            policy = owners if isinstance(owners, DataPolicy) else DataPolicy(owners)
            if id in policy.owners:
                raise ValueError(f"worker {id!r} is a party: a party is never a data owner")
            self.data_policy = policy
        self.concurrent = bool(concurrent)
        # Ids are chosen by the sender; start at a random point so that pointers made
        # in different sessions do not look alike.
        self._ids = itertools.count(int.from_bytes(os.urandom(4), "little") << 20)
        self._pending_deletes: list[int] = []
        self._block: Any = None  # the pointers.worker.lanes block this worker runs in, if any
        self.recorder: Recorder | None = None  # a program recording this client, if any
        self._lane: Any = None  # and the thread that runs its commands there
        for t in data:
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"worker data must be tensors, got {type(t).__name__}")
            tags = getattr(t, "tags", None) or set()
            desc = getattr(t, "description", "") or ""
            self.store.put(self.new_id(), t.detach().clone(), set(tags), desc)

    # -- client side -------------------------------------------------------------------
    def new_id(self) -> int:
        i = next(self._ids)
        if self.recorder is not None:
            self.recorder.record_new_id(self.id, i)
        return i

    def set_recorder(self, recorder: Recorder | None) -> None:
        """While set, ``recorder`` sees every command and every new id of this client."""
        self.recorder = recorder

    def request(self, msg: Message) -> Any:
        """Send ``msg`` and wait for its reply value (raises the worker's error)."""
        self.flush_deletes()
        return self._exchange(msg)

    def post(self, msg: Message) -> None:
        """Send ``msg`` without needing its value (in process: errors raise at once, or at
        the end of a :func:`~pointers.concurrently` block)."""
        if len(self._pending_deletes) >= _DELETE_BATCH:
            self.flush_deletes()
        self._exchange(msg, False)

    def _exchange(self, msg: Message, want_reply: bool = True) -> Any:
        """Every command passes here (the recorder, if any, sees it first)."""
        if self.recorder is not None:
            self.recorder.record_command(self.id, msg)
            if not sends(self.recorder, msg, want_reply):
                return None
        block = self._block
        if block is not None:  # running concurrently (pointers.worker.lanes)
            if not want_reply:
                block.post(self, msg)
                return None
            block.barrier()  # a reply needs everything posted before it done
        header, buffers = encode_message(msg)
        rh, rb = self.handle_frames(header, buffers)
        if rh == OK_NONE and not rb:
            return None
        reply = decode_message(rh, rb)
        if isinstance(reply, ErrorReply):
            raise RemoteError(self.id, reply.kind, reply.message)
        assert isinstance(reply, Reply)
        return reply.value

    def queue_delete(self, obj_id: int) -> None:
        """Called when a pointer dies: no I/O and no lock here (it may run inside any
        other call, garbage collection included); the delete travels with a later message.
        ``list.append`` and slice deletion are atomic under the GIL."""
        self._pending_deletes.append(obj_id)

    def flush_deletes(self) -> None:
        """Send the deletes of dropped pointers now, as one ``Delete`` command."""
        pending = self._pending_deletes
        n = len(pending)
        if not n:
            return
        ids = pending[:n]
        del pending[:n]
        self._exchange(Delete(ids), False)

    def introduce(self, peer: Worker) -> None:
        """Let this worker deliver objects to ``peer`` directly."""
        if not isinstance(peer, Worker):
            raise TypeError(f"expected a worker, got {type(peer).__name__}")
        self.add_peer_link(peer.id, peer)

    @property
    def objects(self) -> Mapping[int, Any]:
        """A read-only view of the objects this worker stores, protocol material (sealed)
        left out: a client reads no seed or mask here either."""
        self.flush_deletes()
        return self.store.view(sealed=False)

    def search(self, *query: str) -> list[Any]:
        """Pointers to the stored tensors carrying every tag in ``query``."""
        return search_worker(self, query)

    def clear_objects(self) -> None:
        """Drop every stored object (pointers to them become dangling)."""
        with self._lock:
            for i in list(self.store.view()):
                self.store.discard(i)
