"""Workers: an object store, a function registry and a message handler.

:class:`Worker` is the serving side, identical for every transport: it decodes a message,
runs it against its store and encodes the reply. :class:`VirtualWorker` adds the client
side for in-process use; every message still goes through the encoder and decoder and is
counted in :attr:`Worker.stats`, as it would be on a wire.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar, Protocol, TypeVar

import torch
import torch.utils._pytree as pytree

from pointers.errors import (
    DecodeError,
    NotAllowedError,
    RemoteError,
    UnknownObjectError,
    ValueRequiresGetError,
)
from pointers.plans.graph import PlanGraph
from pointers.plans.wire import plan_from_wire, variant_from_wire
from pointers.pointer_tensor import PointerTensor, search_worker
from pointers.wire import serde
from pointers.wire.messages import (
    CallFunction,
    Delete,
    Describe,
    ErrorReply,
    ExecuteOp,
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
from pointers.wire.ops import resolve_op
from pointers.wire.serde import Ref
from pointers.worker.client import Recorder, WorkerStats
from pointers.worker.functions import FunctionRegistry
from pointers.worker.program import program_from_wire, start_program
from pointers.worker.sealing import (
    Arg,
    ProtocolCall,
    after_delivery,
    delivered_seal,
    refused,
    sealing_of,
    spend,
)
from pointers.worker.store import ObjectStore

Frames = tuple[bytes, list[Any]]


class Lock(Protocol):
    """What a worker's lock offers: a reentrant context manager."""

    def __enter__(self) -> Any: ...
    def __exit__(self, *exc: Any) -> Any: ...


_OK_NONE = encode_message(Reply(None))[0]


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


def _owns_storage(t: torch.Tensor) -> bool:
    """Whether ``t`` is all of its storage (not a view into a larger buffer)."""
    return t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _seal_of(seals: Any, k: int) -> Any:
    """The seal of output ``k`` of a step (see :meth:`Worker._store_outputs`)."""
    if seals is None or seals is False:
        return False
    if isinstance(seals, list) and seals and type(seals[0]) is str:
        return seals  # one label for every output
    if isinstance(seals, list | tuple):
        s = seals[k] if k < len(seals) else None
        return s if s else False
    raise TypeError(f"a protocol rule returned {type(seals).__name__} as its seals")


_DELETE_BATCH = 64  # deletes of dropped pointers travel in batches

F = TypeVar("F", bound=Callable[..., Any])
Handler = Callable[[Any, Any], Any]  # (worker, message) -> reply value


def handles(kind: type[Message]) -> Callable[[F], F]:
    """Mark a worker method as the handler of the commands of type ``kind``.

    A worker class's :attr:`Worker.handlers` maps each message type to the method marked
    for it, the most derived class's winning: a subclass extends or replaces handlers by
    marking methods of its own (or by overriding a handler method under the same name)."""

    def mark(fn: F) -> F:
        setattr(fn, "_handles", kind)  # noqa: B010 - an attribute of a function
        return fn

    return mark


def _handler_table(cls: type) -> dict[type[Message], Handler]:
    names: dict[type[Message], str] = {}
    for klass in reversed(cls.__mro__):
        for name, attr in vars(klass).items():
            kind = getattr(attr, "_handles", None)
            if kind is not None:
                names[kind] = name
    return {kind: getattr(cls, name) for kind, name in names.items()}


def tensor_meta(t: torch.Tensor) -> list[Any]:
    return [list(t.shape), list(t.stride()), serde.dtype_name(t.dtype)]


class Worker:
    """The serving side of a worker: store, registered functions, message handler.

    Each command type has a handler method (marked with :func:`handles`), found through
    the class's :attr:`handlers` table; subclasses extend the table with their own."""

    handlers: ClassVar[dict[type[Message], Handler]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.handlers = _handler_table(cls)

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
                out = (_OK_NONE, []) if reply is None else encode_message(reply)
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
        self.store.put(msg.obj_id, msg.value, set(msg.tags), msg.description)

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
        return [tensor_meta(self._readable(i, "describing it").value) for i in msg.obj_ids]

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
            raise refused(what, obj_id)
        return e

    @handles(ExecuteOp)  # the hot path
    def _execute_op(self, msg: ExecuteOp) -> Any:
        op = resolve_op(msg.op)
        args = msg.args
        entry = self.store.entry
        sealed = False
        for k, a in enumerate(args):  # one pass; nested lists take the general path
            t = type(a)
            if t is Ref:
                e = entry(a.obj_id)
                args[k] = e.value
                if e.sealed:
                    sealed = True
            elif t is list or t is tuple or t is dict:
                marks = [0, 0, 0]
                args = self._resolve_marked(args, marks)
                sealed = sealed or marks[0] > 0
                break
        if msg.kwargs:
            marks = [0, 0, 0]
            kwargs = self._resolve_marked(msg.kwargs, marks)
            sealed = sealed or marks[0] > 0
        else:
            kwargs = {}
        if sealed:  # protocol material: only protocol steps take it (a registered rule)
            raise refused(f"running {msg.op} on it")
        self.check_op(msg, op, args, kwargs)
        return self._store_outputs(op(*args, **kwargs), msg.out_ids, msg.want_meta)

    def check_op(self, msg: ExecuteOp, op: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Called before an op runs, with its resolved arguments: a worker with limits
        refuses here what would take it past them (a served worker's namespace)."""

    def check_function(
        self, name: str, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Called before a registered function runs, with its resolved arguments: a worker
        with limits refuses here a call whose declared size
        (:func:`pointers.worker.functions.sized`) would take it past them, and charges
        what the call keeps (a served worker's namespace)."""

    @handles(CallFunction)
    def _call_function(self, msg: CallFunction) -> Any:
        fn = self.functions.get(msg.name)
        rule = sealing_of(fn).rule
        params = self.functions.parameters(msg.name)
        if rule is None:  # an ordinary function: no sealed input, no sealed output
            marks = [0, 0, 0]
            args = self._resolve_marked(msg.args, marks)
            kwargs = self._resolve_marked(msg.kwargs, marks)
            if marks[0]:
                raise refused(f"passing it to {msg.name}, which is not a protocol step")
            self.check_function(msg.name, fn, args, kwargs)
            return self._store_outputs(fn(self, *args, **kwargs), msg.out_ids, msg.want_meta)
        named: dict[str, Arg] = {}
        args = []
        for k, raw in enumerate(msg.args):
            a = self._protocol_arg(raw)
            args.append(a.value)
            if k < len(params):
                named[params[k]] = a
        kwargs = {}
        for key, raw in msg.kwargs.items():
            a = self._protocol_arg(raw)
            kwargs[key] = a.value
            named[key] = a
        self.check_function(msg.name, fn, args, kwargs)  # (before the rule: it has effects)
        call = ProtocolCall(msg.name, self.id, self.function_state, named)
        seals = rule(call)
        result = fn(self, *args, **kwargs)
        spend(call.spend)
        if seals is None and type(result) is torch.Tensor and not _owns_storage(result):
            result = result.clone()  # a final share keeps no view of material (e.g. [e | f])
        return self._store_outputs(result, msg.out_ids, msg.want_meta, seals)

    def _protocol_arg(self, raw: Any) -> Arg:
        """An argument of a protocol step with the store entries it refers to."""
        if type(raw) is Ref:
            e = self.store.entry(raw.obj_id)
            return Arg(e.value, entry=e)
        if type(raw) is list and raw and all(type(r) is Ref for r in raw):
            entries = [self.store.entry(r.obj_id) for r in raw]
            return Arg([e.value for e in entries], entries=entries)
        marks = [0, 0, 0]
        value = self._resolve_marked(raw, marks)
        if marks[0]:
            raise refused("passing it to a protocol step inside a structure")
        return Arg(value)

    def _resolve_marked(self, obj: Any, marks: list[int]) -> Any:
        """:meth:`_resolve`, counting in ``marks`` the sealed and unsealed references
        and the other values (not None) it meets."""
        t = type(obj)
        if t is Ref:
            e = self.store.entry(obj.obj_id)
            marks[0 if e.sealed else 1] += 1
            return e.value
        if t is list:
            return [self._resolve_marked(o, marks) for o in obj]
        if t is tuple:
            return tuple(self._resolve_marked(o, marks) for o in obj)
        if t is dict:
            return {k: self._resolve_marked(v, marks) for k, v in obj.items()}
        if obj is not None:
            marks[2] += 1
        return obj

    def _resolve(self, obj: Any) -> Any:
        if isinstance(obj, Ref):
            return self.store.get(obj.obj_id)
        if isinstance(obj, list):
            return [self._resolve(o) for o in obj]
        if isinstance(obj, tuple):
            return tuple(self._resolve(o) for o in obj)
        if isinstance(obj, dict):
            return {k: self._resolve(v) for k, v in obj.items()}
        return obj

    def _store_outputs(
        self, result: Any, out_ids: list[int | None], want_meta: bool, seals: Any = None
    ) -> Any:
        """Store an op's or a function's outputs. ``seals``: a protocol step's output
        labels (see :mod:`pointers.worker.sealing`), one per output (None: an ordinary
        object), or one label for every output."""
        put = self.store.put
        if type(result) is torch.Tensor and not want_meta and len(out_ids) == 1:
            if out_ids[0] is not None:
                put(out_ids[0], result, None, "", _seal_of(seals, 0))
            return None
        leaves, spec = pytree.tree_flatten(result)
        if want_meta:
            # Ids were not known to the sender: outputs go to out_ids[0] + k.
            base = out_ids[0] if out_ids else None
            metas: list[Any] = []
            for k, leaf in enumerate(leaves):
                if leaf is None:
                    metas.append(None)
                elif isinstance(leaf, torch.Tensor):
                    if base is None:
                        raise ValueError("want_meta needs a base output id")
                    put(base + k, leaf, None, "", _seal_of(seals, k))
                    metas.append(tensor_meta(leaf))
                else:
                    raise ValueRequiresGetError(
                        f"the op returned a Python {type(leaf).__name__}, not a tensor"
                    )
            return [isinstance(result, tuple | list), metas]
        if len(leaves) != len(out_ids):
            raise ValueError(
                f"the op returned {len(leaves)} outputs but {len(out_ids)} ids were sent"
            )
        for k, (leaf, obj_id) in enumerate(zip(leaves, out_ids)):
            if obj_id is not None:
                if not isinstance(leaf, torch.Tensor):
                    raise TypeError(f"output for id {obj_id} is a {type(leaf).__name__}")
                put(obj_id, leaf, None, "", _seal_of(seals, k))
        return None

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
                sent = delivered_seal(sealed, self.id)
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

    def peer_link(self, peer_id: str) -> Any | None:
        """The link this worker delivers to peer ``peer_id`` through (None: no link)."""
        return self._peer_links.get(peer_id)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} id={self.id!r} objects={len(self.store)}>"


Worker.handlers = _handler_table(Worker)


class VirtualWorker(Worker):
    """An in-process worker, with the client side of the message layer built in.

    ``data`` holds tensors the worker owns from the start (tag them with
    :func:`pointers.tag` so that :meth:`search` finds them). ``concurrent=False``: the
    worker runs every command in the caller's thread even inside
    :func:`pointers.concurrently` (one party after the other, e.g. to measure the work
    of a protocol on one core).
    """

    def __init__(self, id: str, data: Iterable[torch.Tensor] = (), concurrent: bool = True) -> None:
        super().__init__(id)
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
        block = self._block
        if block is not None:  # running concurrently (pointers.worker.lanes)
            if not want_reply:
                block.post(self, msg)
                return None
            block.barrier()  # a reply needs everything posted before it done
        header, buffers = encode_message(msg)
        rh, rb = self.handle_frames(header, buffers)
        if rh == _OK_NONE and not rb:
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
