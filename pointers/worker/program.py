"""Programs: the commands a client sent to each worker during one run, stored at the
workers and replayed with one message per worker.

A :class:`Recording` captures, per worker, every command the client sends while it runs
some code (ops, function calls, stores, deletes, party-to-party deliveries) and the ids
it allocated. :func:`build_programs` turns the captured commands into one program per
worker, replacing each id allocated during the recording (and any extra run-specific
value, such as a protocol nonce) by a numbered slot. Replaying binds fresh values to the
slots: every worker runs its program in its own thread, waiting (bounded) for objects a
peer delivers to it, so programs whose steps depend on each other across workers run
without the client in the loop.

Slots are marked explicitly, never guessed from values: an id the recording allocated
becomes a slot where it stands in an id position (``obj_id``, ``new_id``, ``out_ids``,
``obj_ids``) or in an object reference, and any other run-specific value is a
:class:`RunValue` (an ``int`` subclass the higher layer hands out while recording, e.g. a
protocol nonce). An ordinary int argument that happens to equal an id stays a constant.

This is how an encrypted inference becomes one message per party (see ``mpc.plan``).
Both worker kinds record and run programs: in-process workers (``VirtualWorker``) and
network workers (``pointers.connect``), whose served namespaces run a program in a thread
that sets the namespace's lock aside while it waits for a peer's delivery.

A worker client can be recorded when it has ``set_recorder(recorder)``: while a
:class:`~pointers.worker.client.Recorder` is set, the client tells it every command it sends
and every id it allocates with ``new_id()``, and ``flush_deletes()`` sends the deletes of
dropped pointers as a ``Delete`` command it records too (a client whose deletes normally
travel another way, such as a network worker's with its batches, holds them for
``flush_deletes`` while recorded). The serving side runs programs through the worker's
public seam: ``run_locked``, ``send_to_peer``, ``lock``, ``add_program_thread`` and
``peer_link``.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import fields
from typing import Any, Protocol

import msgpack

from pointers.errors import PointerError
from pointers.wire.messages import (
    MESSAGE_TYPES,
    CallFunction,
    Delete,
    ExecuteOp,
    Message,
    RunProgram,
    SendToPeer,
    Store,
    Tag,
    message_from_list,
)
from pointers.wire.serde import Ref, Slot, SlotRef, ref_id
from pointers.worker import holding
from pointers.worker.client import Recorder, WorkerClient
from pointers.worker.store import ObjectStore


class Worker(Protocol):
    """What a program needs of the worker it runs at (:class:`pointers.worker.base.Worker`,
    which imports this module): its store and lock, its peers, and its message handler."""

    id: str

    @property
    def store(self) -> ObjectStore: ...
    @property
    def lock(self) -> AbstractContextManager[Any]: ...
    @property
    def function_state(self) -> dict[str, Any]: ...
    def add_program_thread(self, thread: threading.Thread) -> None: ...
    def peer_link(self, peer_id: str) -> Any | None: ...
    def run_locked(self, msg: Message) -> Any: ...
    def send_to_peer(self, msg: SendToPeer) -> None: ...


RECORDABLE = (ExecuteOp, CallFunction, Store, Delete, SendToPeer, Tag)
_KINDS = {cls.KIND for cls in RECORDABLE}
# the fields of the recordable commands that hold object ids
_ID_FIELDS = frozenset({"obj_id", "new_id", "out_ids", "obj_ids"})


class RunValue(int):
    """An int that a recorded program binds anew at every run (for example a protocol
    nonce): :func:`build_programs` makes each one a slot because of its type."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"RunValue({int(self)})"


class Recording:
    """``with Recording(workers) as rec:`` captures the commands sent to ``workers``.

    The commands still run (the recording run computes real results); a command that
    needs a reply (a fetch, a search) cannot be part of a program and raises.
    ``runs=False``: the commands are captured and not sent (nothing runs at the workers,
    nothing is made there: a recording whose results no one reads, such as one on
    stand-in values). The recorded commands are the same, since none of them waits for a
    reply.
    """

    def __init__(self, workers: Iterable[WorkerClient], runs: bool = True) -> None:
        self.workers = list(workers)
        self.runs = bool(runs)
        self.messages: dict[str, list[Message]] = {w.id: [] for w in self.workers}
        self.new_ids: dict[str, list[int]] = {w.id: [] for w in self.workers}
        self._outer: dict[str, Recorder | None] = {}  # a recording this one runs inside

    # -- the recorder hook (pointers.worker.client.Recorder) ---------------------------------
    def record_command(self, worker_id: str, msg: Message) -> None:
        if not isinstance(msg, RECORDABLE):
            raise PointerError(
                f"a {msg.KIND!r} command waits for a reply and cannot be part of a "
                "program; keep fetches and searches outside the recorded code"
            )
        self.messages[worker_id].append(msg)
        outer = self._outer.get(worker_id)
        if outer is not None:
            outer.record_command(worker_id, msg)

    def record_new_id(self, worker_id: str, obj_id: int) -> None:
        self.new_ids[worker_id].append(obj_id)
        outer = self._outer.get(worker_id)
        if outer is not None:
            outer.record_new_id(worker_id, obj_id)

    def __enter__(self) -> Recording:
        for w in self.workers:
            if not callable(getattr(w, "set_recorder", None)):
                raise PointerError(
                    f"worker {w.id!r} ({type(w).__name__}) cannot be recorded: it has no "
                    "set_recorder"
                )
        for w in self.workers:
            w.flush_deletes()  # earlier garbage is not part of the program
            self._outer[w.id] = w.recorder
            w.set_recorder(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            if exc[0] is None:
                gc.collect()
                for w in self.workers:  # temporaries dropped in the run: their deletes
                    w.flush_deletes()
        finally:
            for w in self.workers:
                w.set_recorder(self._outer.pop(w.id, None))


class Slots:
    """The run-specific values of a recording, numbered."""

    def __init__(self) -> None:
        self.index: dict[int, int] = {}
        # ("new", worker id) | ("input", k) | ("extra", k) | ("carried", k)
        self.kind: list[tuple[str, Any]] = []
        self.extras: list[int] = []  # the RunValues, in the order of their ("extra", k) slots

    def add(self, value: int, kind: tuple[str, Any]) -> None:
        if value in self.index:
            raise PointerError(f"internal: value {value} recorded twice")
        self.index[value] = len(self.kind)
        self.kind.append(kind)

    def __len__(self) -> int:
        return len(self.kind)


def build_programs(
    rec: Recording, inputs: list[int], carried: dict[int, int] | None = None
) -> tuple[dict[str, list[Any]], Slots]:
    """Per worker, its recorded commands in wire form with run-specific values as slots.

    ``inputs`` are the ids of the run's input objects (bound anew at each run); the ids the
    recording allocated are slots too, and every :class:`RunValue` in a command's payload
    becomes an ``("extra", k)`` slot (``slots.extras[k]`` is its recorded value).
    ``carried``: values an earlier recording made (object ids it allocated, RunValues it
    drew), each with its slot k there: where this recording refers to one, the program
    takes a ``("carried", k)`` slot (a run binds it to what an earlier run bound to k)."""
    carried = carried or {}
    slots = Slots()
    for wid, ids in rec.new_ids.items():
        for i in ids:
            slots.add(i, ("new", wid))
    for k, i in enumerate(inputs):
        slots.add(i, ("input", k))
    temps = set(slots.index)

    def carry(v: int) -> int | None:
        k = slots.index.get(v)
        if k is None and v in carried:
            slots.add(v, ("carried", carried[v]))
            k = slots.index[v]
        return k

    def sub_id(o: Any) -> Any:
        if isinstance(o, list):
            return [sub_id(x) for x in o]
        k = carry(o) if isinstance(o, int) and not isinstance(o, bool) else None
        return Slot(k) if k is not None else o

    def sub(o: Any) -> Any:
        if isinstance(o, RunValue):
            k = carry(int(o))
            if k is None:
                slots.add(int(o), ("extra", len(slots.extras)))
                slots.extras.append(int(o))
                k = slots.index[o]
            return Slot(k)
        rid = ref_id(o)
        if rid is not None:
            k = carry(rid)
            return SlotRef(k) if k is not None else o
        if isinstance(o, list):
            return [sub(x) for x in o]
        if isinstance(o, tuple):
            return tuple(sub(x) for x in o)
        if isinstance(o, dict):
            return {k2: sub(v) for k2, v in o.items()}
        return o

    programs: dict[str, list[Any]] = {}
    for wid, msgs in rec.messages.items():
        out = []
        for m in msgs:
            if isinstance(m, Delete):  # only the run's own temporaries
                ids = [i for i in m.obj_ids if i in temps]
                if not ids:
                    continue
                m = Delete(ids)
            raw = [m.KIND]
            for f in fields(m):
                v = getattr(m, f.name)
                raw.append(sub_id(v) if f.name in _ID_FIELDS else sub(v))
            out.append(raw)
        programs[wid] = out
    return programs, slots


def bind(raw: Any, bindings: list[int]) -> Any:
    if isinstance(raw, Slot):
        return bindings[raw.index]
    if isinstance(raw, SlotRef):
        return Ref(bindings[raw.index])
    if isinstance(raw, list):
        return [bind(x, bindings) for x in raw]
    if isinstance(raw, tuple):
        return tuple(bind(x, bindings) for x in raw)
    if isinstance(raw, dict):
        return {k: bind(v, bindings) for k, v in raw.items()}
    if isinstance(raw, msgpack.ExtType):
        rid = ref_id(raw)
        return Ref(rid) if rid is not None else raw
    return raw


def _max_slot(raw: Any) -> int:
    if isinstance(raw, Slot | SlotRef):
        return raw.index
    if isinstance(raw, list | tuple):
        return max((_max_slot(x) for x in raw), default=-1)
    if isinstance(raw, dict):
        return max((_max_slot(x) for x in raw.values()), default=-1)
    return -1


Binder = Any  # (bindings) -> a bound value


def _const(value: Any) -> Binder:
    return lambda b: value


def _compile(raw: Any) -> tuple[Binder, bool]:
    """A binder of ``raw`` (what :func:`bind` computes, with the structure walked once,
    when the program is stored) and whether ``raw`` holds a slot. A subtree without
    slots is bound once (references made once: a :class:`Ref` is immutable) and shared
    by every run; a list or dict holding slots is built anew at each run."""
    if isinstance(raw, Slot):
        k = raw.index
        return (lambda b: b[k]), True
    if isinstance(raw, SlotRef):
        k = raw.index
        return (lambda b: Ref(b[k])), True
    if isinstance(raw, list | tuple):
        parts = [_compile(x) for x in raw]
        if not any(has for _, has in parts):
            return _const(bind(raw, [])), False
        # the common case: slots at the top level only (an op's arguments)
        template = [None if has else f(None) for f, has in parts]
        fills = [(i, f) for i, (f, has) in enumerate(parts) if has]
        if isinstance(raw, tuple):
            return (lambda b: tuple(_filled(template, fills, b))), True
        return (lambda b: _filled(template, fills, b)), True
    if isinstance(raw, dict):
        items = [(k, *_compile(v)) for k, v in raw.items()]
        if not any(has for _, _, has in items):
            return _const(bind(raw, [])), False
        return (lambda b: {k: f(b) for k, f, _ in items}), True
    return _const(bind(raw, [])), False


def _filled(template: list[Any], fills: list[tuple[int, Binder]], b: list[int]) -> list[Any]:
    out = template.copy()
    for i, f in fills:
        out[i] = f(b)
    return out


class Step:
    """One command of a stored program, compiled when the program is stored: its message
    type and a binder per field. A run binds the fields and builds the message directly
    (its structure and types were checked once, with every slot bound to 0: a run only
    puts other ints where the slots are)."""

    __slots__ = ("cls", "fields", "send")

    def __init__(self, raw: list[Any]) -> None:
        self.cls = MESSAGE_TYPES[raw[0]]
        self.send = self.cls is SendToPeer
        fields_ = []
        for value in raw[1:]:
            f, has = _compile(value)
            # a field without slots: its top-level list is still copied at each run (a
            # handler may write into it, e.g. an op's arguments as they are resolved)
            if not has and isinstance(value, list):
                const = f(None)
                f = _copied(const)
            fields_.append(f)
        self.fields = fields_

    def message(self, bindings: list[int]) -> Message:
        return self.cls(*[f(bindings) for f in self.fields])  # type: ignore[no-any-return]


def _copied(const: list[Any]) -> Binder:
    return lambda b: const.copy()


class Program:
    """A stored program: validated commands with slots, compiled (:class:`Step`), and how
    many slots it needs."""

    def __init__(self, raw: list[Any]) -> None:
        self.raw = raw
        self.n_slots = _max_slot(raw) + 1
        self.steps = [Step(r) for r in raw]
        # what an approved run's check derives from the structure alone, kept for the
        # next runs (pointers.worker.holding.program_digest's cache)
        self.checks: dict[Any, Any] = {}


def program_from_wire(messages: list[Any]) -> Program:
    """Validate a program's commands (kinds, field types with slots bound to 0), once,
    when it is stored, and compile them (:class:`Step`)."""
    for raw in messages:
        if not isinstance(raw, list) or not raw or raw[0] not in _KINDS:
            kind = raw[0] if isinstance(raw, list) and raw else raw
            raise PointerError(f"a program may not contain a {kind!r} command")
    n = _max_slot(messages) + 1
    zeros = [0] * n
    for raw in messages:
        message_from_list(bind(raw, zeros))
    return Program(messages)


def start_program(worker: Worker, msg: RunProgram) -> None:
    """Run a stored program in a thread of its own (the worker keeps serving)."""
    program = worker.store.get(msg.program_id)
    if not isinstance(program, Program):
        raise TypeError(f"object {msg.program_id} is not a program")
    if len(msg.bindings) < program.n_slots:
        raise PointerError(f"the program needs {program.n_slots} bindings, got {len(msg.bindings)}")
    run = held_run(worker, program, msg)
    worker.store.promise(msg.promised)
    thread = threading.Thread(
        target=run_program,
        args=(worker, program, list(msg.bindings), list(msg.promised), run),
        name=f"program-{worker.id}",
        daemon=True,
    )
    worker.add_program_thread(thread)
    thread.start()


def held_run(worker: Worker, program: Program, msg: RunProgram) -> holding.HeldRun | None:
    """The approved run ``msg`` starts (None: an ordinary run; refused if not approved)."""
    if not msg.held and not msg.outputs:
        return None
    with worker.lock:
        return holding.begin(
            worker.id,
            worker.store,
            worker.function_state,
            program.raw,
            list(msg.bindings),
            list(msg.held),
            list(msg.outputs),
            program.checks,
        )


def run_program(
    worker: Worker,
    program: Program,
    bindings: list[int],
    promised: list[int],
    run: holding.HeldRun | None = None,
) -> None:
    step = 0
    try:
        with holding.running(run):
            run_locked, send, steps = worker.run_locked, worker.send_to_peer, program.steps
            for step in range(len(steps)):
                compiled = steps[step]
                msg = compiled.message(bindings)
                if compiled.send:
                    send(msg)  # type: ignore[arg-type]  # (our lock only to read)
                else:
                    run_locked(msg)
            if run is not None:
                with worker.lock:
                    holding.release(worker.store, run)
    except Exception as e:  # waiting clients and peers learn it at once
        why = f"program failed: {type(e).__name__}: {e}"
        worker.store.fail_promises(promised, why)
        _tell_peers(worker, program.raw[step:], bindings, why)
    finally:
        with worker.lock:  # ids it never made: waiters for them fail now, not at the deadline
            if run is not None:
                holding.end(worker.store, worker.function_state, run)
            worker.store.release_promises(promised)


def _tell_peers(worker: Worker, rest: list[Any], bindings: list[int], why: str) -> None:
    """Best effort: the peers a failed program was still to deliver to stop waiting now
    (through links that can tell them; a peer without such a link waits its deadline)."""
    unreachable: set[str] = set()
    for raw in rest:
        if not (isinstance(raw, list) and raw and raw[0] == SendToPeer.KIND):
            continue
        peer = None
        try:
            msg = message_from_list(bind(raw, bindings))
            if not isinstance(msg, SendToPeer):
                continue
            peer = msg.peer
            notify = getattr(worker.peer_link(peer), "delivery_failed", None)
            if notify is not None and peer not in unreachable:
                notify(msg.new_id, f"worker {worker.id!r}: {why}")
        except Exception:  # the program's own error is what matters
            if peer is not None:
                unreachable.add(peer)


def run_programs(
    program_ids: dict[str, int],
    workers: list[WorkerClient],
    bindings: list[int],
    promised: dict[str, list[int]],
    held: dict[str, tuple[list[Any], list[int]]] | None = None,
) -> None:
    """Start the programs at every worker (one message each); ``held``: per worker, the
    held parameter slots and output slots of an approved run (see
    :mod:`pointers.worker.holding`)."""
    for w in workers:
        pairs, outputs = (held or {}).get(w.id, ([], []))
        w.post(RunProgram(program_ids[w.id], bindings, promised[w.id], pairs, outputs))
