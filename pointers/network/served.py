"""The serving side of a network worker: one :class:`ServedWorker` per client namespace.

A served process holds one namespace per client session (an identity and a session token,
see :mod:`pointers.network.lease`): its own object store, counters and peer links, so one
client's ids and objects are invisible to another, and the server frees a namespace whose
lease ran out (:meth:`ServedWorker.close`). Each namespace
is an ordinary :class:`pointers.worker.base.Worker` (same message handler as in process) with:

* a :class:`WaitingStore`: commands arrive on the client's connection while peer
  deliveries travel separately, so a command may reach this worker before an object a
  peer delivers to it. The client announces the ids it expects from each peer (the
  ``expect`` field of its envelopes), and a running program (``mpc.plan``, see
  :mod:`pointers.worker.program`) promises the ids it or its peers will produce; a lookup of
  such an id waits, bounded by the deadline, and then fails with
  :class:`~pointers.errors.PartyUnavailable`. An id nobody announced fails at once, as in
  process. Deliveries take the store's own lock, never the namespace's: a worker delivers
  while it runs a command (under its lock), so two workers delivering to each other at
  once must not wait on each other's locks.
* a :class:`NamespaceLock`: commands of the client and of the programs it started run one
  at a time, and a command waiting for an object sets the lock aside until it arrives, so
  the command (or program) that produces it can run meanwhile: a client's ``get`` waits
  for a program's output, and a program's step waits for a peer's delivery, without
  stopping the namespace.
* limits on what the client stores: bytes (``max_stored_bytes``; a program or plan by
  its Python objects, :func:`footprint`, and tags by their characters) and objects
  (``max_objects``); an op (:func:`op_bytes`) or a plan's outputs are sized on the
  ``meta`` device and refused before they run;
* a :class:`ProgramQueue` in the worker's :class:`ProgramPool`: programs run on a bounded
  number of threads, per session and per worker.
* the network control messages: ``ConnectPeer`` (a link to a peer) and ``AcceptPeer``
  (deliveries from that peer may land in this namespace).
"""

from __future__ import annotations

import math
import sys
import threading
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pointers.errors import (
    LimitExceeded,
    NotAllowedError,
    PartyUnavailable,
    PointerError,
    UnknownObjectError,
)
from pointers.plans.graph import PlanGraph
from pointers.wire import serde
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ErrorReply,
    ExecuteOp,
    Fetch,
    RunPlan,
    RunProgram,
    SendToPeer,
    Store,
    Tag,
    encode_message,
)
from pointers.worker.base import Frames, Worker, WorkerStats, handles
from pointers.worker.functions import bind_arguments, function_size
from pointers.worker.program import Program
from pointers.worker.program import _run_program as run_program_steps
from pointers.worker.store import Entry, ObjectStore

_ERROR_PREFIX = encode_message(ErrorReply("", ""))[0][:7]  # fixarray(3) + fixstr "error"
_MISSING: Any = object()
_LOCKED_IDS = 4096  # ids announced or promised per hold of a store's lock
MAX_PEER_LINKS = 64  # peers one session may deliver to (ConnectPeer)
HOLD_SECONDS = 300.0  # how long a delivery that arrived before its announcement is kept aside


def is_error_header(header: bytes | memoryview) -> bool:
    return bytes(header[:7]) == _ERROR_PREFIX


# What the bookkeeping of one id costs a namespace (an announced, expected, promised,
# dropped or failed id: a dict entry and its int), counted against its byte limit; and
# the longest reason a failed delivery keeps (longer ones are cut).
BOOK_BYTES = 96
MAX_REASON = 2000


def _size(value: Any) -> int:
    """What a held delivery counts: a tensor's storage, or a failure's reason."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if isinstance(value, str):
        return len(value) + BOOK_BYTES
    return 0


def _storage(value: Any) -> tuple[int, int]:
    """(data pointer, bytes) of the storage a plain tensor keeps alive; (0, 0) otherwise."""
    if type(value) is torch.Tensor:
        st = value.untyped_storage()
        return st.data_ptr(), st.nbytes()
    return 0, 0


TAG_BYTES = 64  # what one tag counts beyond its characters (a set slot and a str object)
_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def footprint(value: Any) -> int:
    """The bytes a stored object holds: a tensor's storage (all of it: a view keeps its
    base's storage alive), or for anything else (a program, a plan) its Python containers
    and values walked once (tensors by their data; functions and op handles, shared by
    every plan, count nothing)."""
    if type(value) is torch.Tensor:
        return value.untyped_storage().nbytes()
    total = 0
    seen: set[int] = set()
    stack = [value]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size() + 64
        elif isinstance(obj, _ATOMS):
            total += sys.getsizeof(obj)
        elif isinstance(obj, list | tuple | set | frozenset):
            total += sys.getsizeof(obj)
            stack.extend(obj)
        elif isinstance(obj, dict):
            total += sys.getsizeof(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("pointers."):  # plan nodes, program slots
            total += sys.getsizeof(obj)
            slots = getattr(type(obj), "__slots__", ())
            stack.extend(getattr(obj, n) for n in slots if hasattr(obj, n))
            d = getattr(obj, "__dict__", None)
            if d is not None:
                stack.append(d)
    return total


def _tag_bytes(tags: set[str] | list[str] | None, description: str) -> int:
    return sum(len(t) + TAG_BYTES for t in tags or ()) + len(description)


class NamespaceLock:
    """A reentrant lock that its owner can set aside while it waits.

    :meth:`suspend` releases it entirely (however deep the owner holds it) and returns
    what :meth:`resume` needs to take it back as it was. ``threading.RLock`` does this
    only through private methods, hence this small class.
    """

    __slots__ = ("_lock", "_owner", "_depth")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0

    def acquire(self) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        self._lock.acquire()
        self._owner = me
        self._depth = 1
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("cannot release a namespace lock this thread does not hold")
        self._depth -= 1
        if not self._depth:
            self._owner = None
            self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def suspend(self) -> int:
        """Release the lock if this thread holds it; the depth to resume (0: not held)."""
        if self._owner != threading.get_ident():
            return 0
        depth, self._depth, self._owner = self._depth, 0, None
        self._lock.release()
        return depth

    def resume(self, depth: int) -> None:
        """Take the lock back after :meth:`suspend` returned ``depth``."""
        if depth:
            self._lock.acquire()
            self._owner = threading.get_ident()
            self._depth = depth


class WaitingStore(ObjectStore):
    """An object store whose lookups wait for announced peer deliveries and for the ids a
    running program promised.

    Thread-safe for command and program threads (serialised by the namespace's ``lock``)
    plus any number of delivery threads: writes happen under the condition's lock; a
    lookup of a present object takes no lock. A lookup that waits suspends ``lock``
    meanwhile (see :class:`NamespaceLock`).
    """

    def __init__(
        self,
        owner: str,
        *,
        deadline: float,
        max_bytes: int | None,
        lock: NamespaceLock | None = None,
        max_objects: int | None = None,
    ) -> None:
        super().__init__(owner)
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.max_objects = max_objects
        # stored objects (a storage once however many views share it), held deliveries
        self.bytes = 0
        self.kept = 0  # what registered functions keep in function_state (see used())
        self._storages: dict[int, list[int]] = {}  # data pointer -> [bytes, stored tensors]
        self.closed: str | None = None  # why this namespace is gone (its lease expired)
        self.note = ""  # added to "no object" errors (an earlier session's lease expired)
        self.lock = lock
        self._cond = threading.Condition()
        self._expected: dict[int, str] = {}  # object id -> peer that will deliver it
        self._failed: dict[int, str] = {}  # object id -> why its delivery failed
        # ids a peer may deliver into: announced by the client (``expect``: that peer only)
        # or promised by a program (None: any accepted peer), until they arrive
        self._announced: dict[int, str | None] = {}
        # deliveries that came before their announcement (the client's expect travels on
        # another connection), by id then peer: (value or failure reason, sealed, failed,
        # when); and in the order they came (to expire them), so that every operation on
        # them costs O(1) per id, never a scan of all of them under the store's lock
        self._held: dict[int, dict[str, tuple[Any, Any, bool, float]]] = {}
        self._held_order: OrderedDict[tuple[str, int], float] = OrderedDict()
        # deliveries refused since the client's last sync (reported then, see
        # ServedWorker.take_lost): never dropped silently
        self._refused: list[str] = []
        self._refused_more = 0  # refusals beyond the ones kept
        self._dropped: dict[int, str | None] = {}  # announced ids deleted before they arrived
        self._unavailable: dict[str, str] = {}  # peer -> why a wait for it timed out
        self.on_wait_failed: Callable[[], None] | None = None  # a wait raised PartyUnavailable
        self._waiters = 0

    # -- writes ------------------------------------------------------------------------
    def put(
        self,
        obj_id: int,
        value: Any,
        tags: set[str] | None = None,
        description: str = "",
        sealed: Any = False,
    ) -> None:
        key, storage = _storage(value)
        own = 0 if type(value) is torch.Tensor else footprint(value)
        own += _tag_bytes(tags, description) if tags or description else 0
        with self._cond:
            if self.closed is not None:
                raise PartyUnavailable(self.closed, None)
            old = self._entries.get(obj_id)
            # a storage that another stored tensor (a view) keeps counts once
            size = own + (storage if key and key not in self._storages else 0)
            freed = 0
            if old is not None:
                freed = old.nbytes
                rec = self._storages.get(old.storage) if old.storage != key else None
                if rec is not None and rec[1] == 1:
                    freed += rec[0]
            total = self.used() + size - freed
            if self.max_bytes is not None and total > self.max_bytes and size:
                raise LimitExceeded(
                    f"storing object {obj_id} ({size} bytes) would take this client's "
                    f"storage at worker {self.owner!r} to {total} bytes, over its limit of "
                    f"{self.max_bytes} bytes (serve --max-stored-mb); get() or drop objects"
                )
            if old is None:
                self._check_count(obj_id)
            self._entries[obj_id] = Entry(
                value, set(tags) if tags else set(), description, sealed, own, key
            )
            self.bytes += own + self._ref(key, storage)
            if old is not None:
                self.bytes -= old.nbytes + self._unref(old.storage)
            self._announced.pop(obj_id, None)
            if self._promised:
                self._promised.pop(obj_id, None)
            if self._waiters:
                self._cond.notify_all()

    def _ref(self, key: int, nbytes: int) -> int:
        """One more stored tensor keeps storage ``key`` alive; the bytes newly counted."""
        if not key:
            return 0
        rec = self._storages.get(key)
        if rec is not None:
            rec[1] += 1
            return 0
        self._storages[key] = [nbytes, 1]
        return nbytes

    def _unref(self, key: int) -> int:
        """One stored tensor fewer keeps storage ``key`` alive; the bytes no longer counted."""
        rec = self._storages.get(key) if key else None
        if rec is None:
            return 0
        rec[1] -= 1
        if rec[1] > 0:
            return 0
        del self._storages[key]
        return rec[0]

    def used(self) -> int:
        """What this namespace counts against its byte limit: its stored objects and held
        deliveries (:attr:`bytes`), what its functions keep (:attr:`kept`: nonce records,
        input seeds) and the bookkeeping of its announced, promised and failed ids."""
        ids = len(self._announced) + len(self._expected) + len(self._promised)
        ids += len(self._dropped)
        return (
            self.bytes
            + self.kept
            + BOOK_BYTES * ids
            + (BOOK_BYTES + MAX_REASON) * len(self._failed)
        )

    def keep(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` that a registered function keeps (in ``function_state``, for as
        long as the namespace lives) against the limit, or refuse them."""
        if not nbytes:
            return
        with self._cond:
            total = self.used() + nbytes
            if self.max_bytes is not None and total > self.max_bytes:
                raise LimitExceeded(
                    f"{what} would keep {nbytes} more bytes of records at worker "
                    f"{self.owner!r}, taking this client's storage there to {total} bytes, "
                    f"over its limit of {self.max_bytes} bytes (serve --max-stored-mb); "
                    "records of used nonces last as long as the session: start a new one"
                )
            self.kept += nbytes

    def _check_ids(self, n: int, what: str) -> None:
        """Refuse the bookkeeping of ``n`` more ids past the limit (lock held)."""
        if self.max_bytes is None or not n:
            return
        total = self.used() + 2 * BOOK_BYTES * n
        if total > self.max_bytes:
            raise LimitExceeded(
                f"{what} {n} object ids would take this client's storage at worker "
                f"{self.owner!r} to {total} bytes ({2 * BOOK_BYTES} bytes an id), over its "
                f"limit of {self.max_bytes} bytes (serve --max-stored-mb)"
            )

    def _check_count(self, obj_id: int) -> None:
        """Refuse a new object over the count limit (with the store's lock held)."""
        limit = self.max_objects
        if limit is not None and len(self._entries) + len(self._held_order) >= limit:
            raise LimitExceeded(
                f"storing object {obj_id} would take this client's objects at worker "
                f"{self.owner!r} past its limit of {limit} objects (serve --max-objects); "
                "get() or drop objects"
            )

    def charge_check(self, obj_id: int | None, size: int, what: str) -> None:
        """Refuse, before it is allocated, an object of ``size`` bytes for ``obj_id``
        (None: a temporary) that would take the client past its byte limit."""
        if self.max_bytes is None or not size:
            return
        with self._cond:
            old = self._entries.get(obj_id) if obj_id is not None else None
            total = self.used() + size - (old.nbytes if old is not None else 0)
        if total > self.max_bytes:
            raise LimitExceeded(
                f"{what} would allocate {size} bytes, taking this client's storage at worker "
                f"{self.owner!r} to {total} bytes, over its limit of {self.max_bytes} bytes "
                "(serve --max-stored-mb); refused before running; get() or drop objects"
            )

    def retag(self, obj_id: int, tags: list[str], description: str) -> None:
        """Add ``tags`` (and set ``description`` if given) to a stored object, counting
        them against the client's byte limit."""
        with self._cond:
            e = self._entries.get(obj_id)
            if e is None:
                raise UnknownObjectError(f"worker {self.owner!r} holds no object with id {obj_id}")
            new_tags = e.tags | set(tags)
            new_desc = description or e.description
            extra = _tag_bytes(new_tags, new_desc) - _tag_bytes(e.tags, e.description)
            if self.max_bytes is not None and extra > 0 and self.used() + extra > self.max_bytes:
                raise LimitExceeded(
                    f"tagging object {obj_id} ({extra} bytes of tags and description) would "
                    f"take this client's storage at worker {self.owner!r} over its limit of "
                    f"{self.max_bytes} bytes (serve --max-stored-mb)"
                )
            e.tags, e.description = new_tags, new_desc
            e.nbytes += extra
            self.bytes += extra

    def receive(self, peer: str, obj_id: int, value: Any, sealed: Any = False) -> None:
        """A peer delivered ``value`` for ``obj_id`` (``sealed``: protocol material).

        Only an id the client announced for ``peer`` (or a program promised) is written;
        a delivery that comes before its announcement is kept aside (counted against the
        limit, :data:`HOLD_SECONDS` at most) until the announcement names this peer; any
        other delivery is refused and leaves the namespace as it was."""
        with self._cond:
            if not self._may_deliver(peer, obj_id):
                self._hold(peer, obj_id, value, sealed, False)
                return
            self._unavailable.pop(peer, None)
            self._expected.pop(obj_id, None)
            self._failed.pop(obj_id, None)
            if self._dropped.pop(obj_id, _MISSING) is not _MISSING:
                return  # its pointer died before the object arrived
            try:
                self.put(obj_id, value, sealed=sealed)
            except LimitExceeded as e:
                self._announced.pop(obj_id, None)
                self._failed[obj_id] = str(e)
                self._cond.notify_all()
                raise

    def _may_deliver(self, peer: str, obj_id: int, notice: bool = False) -> bool:
        """Whether ``peer`` may deliver ``obj_id`` now (False: not yet announced; raises
        for an id that is not this peer's to write, and notes the refusal for the
        client's next sync unless it is only a ``notice`` that the object will not come)."""
        who = self._announced.get(obj_id, _MISSING)
        if who is _MISSING:
            who = self._dropped.get(obj_id, _MISSING)
        if who is None or who == peer:
            return True
        if who is _MISSING and obj_id not in self._entries:
            return False
        why = (
            f"object {obj_id} was announced as a delivery from {who!r}"
            if isinstance(who, str)
            else f"object {obj_id} exists already"
        )
        if not notice:
            self._refuse(peer, obj_id, why)
        raise NotAllowedError(
            f"worker {self.owner!r}: the client did not announce object {obj_id} as a "
            f"delivery from {peer!r}; the delivery is refused"
        )

    def _refuse(self, peer: str, obj_id: int, why: str) -> None:
        """Note a refused delivery for the client's next sync (with the lock held)."""
        if len(self._refused) < 16:
            self._refused.append(
                f"worker {self.owner!r} refused a delivery of object {obj_id} from peer "
                f"{peer!r} ({why})"
            )
        else:
            self._refused_more += 1

    def take_refused(self) -> str | None:
        """The deliveries refused since the last call (one message), and forget them."""
        with self._cond:
            if not self._refused:
                return None
            more, self._refused_more = self._refused_more, 0
            refused, self._refused = self._refused, []
        tail = f"; and {more} more" if more else ""
        return "; ".join(refused) + tail

    def _hold(self, peer: str, obj_id: int, value: Any, sealed: Any, failed: bool) -> None:
        now = time.monotonic()
        order = self._held_order
        while order:  # the oldest first: O(1) per expired delivery
            key, when = next(iter(order.items()))
            if now - when <= HOLD_SECONDS:
                break
            self._unhold(*key)
        if self.closed is not None:
            raise PartyUnavailable(self.closed, None)
        size = _size(value)
        if (peer, obj_id) not in order:
            self._check_count(obj_id)
        if self.max_bytes is not None and self.used() + size > self.max_bytes and size:
            raise LimitExceeded(
                f"holding object {obj_id} ({size} bytes) from {peer!r} until the client "
                f"announces it would take this client's storage at worker {self.owner!r} "
                f"over its limit of {self.max_bytes} bytes (serve --max-stored-mb)"
            )
        self._unhold(peer, obj_id)
        self._held.setdefault(obj_id, {})[peer] = (value, sealed, failed, now)
        order[(peer, obj_id)] = now
        self.bytes += size

    def _unhold(self, peer: str, obj_id: int) -> tuple[Any, Any, bool, float] | None:
        by_peer = self._held.get(obj_id)
        held = by_peer.pop(peer, None) if by_peer is not None else None
        if held is not None:
            if not by_peer:
                del self._held[obj_id]
            self._held_order.pop((peer, obj_id), None)
            self.bytes -= _size(held[0])
        return held

    def _unhold_all(self, obj_id: int) -> dict[str, tuple[Any, Any, bool, float]]:
        by_peer = self._held.pop(obj_id, None)
        if not by_peer:
            return {}
        for peer, held in by_peer.items():
            self._held_order.pop((peer, obj_id), None)
            self.bytes -= _size(held[0])
        return by_peer

    def _adopt(self, peer: str | None, obj_id: int) -> None:
        """Take in what was held for ``obj_id`` from ``peer``, the peer the client named
        for it; a delivery held from any other peer is refused (noted for the client's
        next sync). ``None`` (an id a program promised, whose peer nobody named): only
        when exactly one peer delivered it; deliveries from several are all refused."""
        if obj_id not in self._held:
            return
        by_peer = self._unhold_all(obj_id)
        if peer is None and len(by_peer) > 1:
            for other in by_peer:
                self._refuse(other, obj_id, f"{len(by_peer)} peers delivered it")
            return
        chosen = peer if peer is not None else next(iter(by_peer))
        for other, (_, _, failed, _) in by_peer.items():
            if other != chosen and not failed:
                self._refuse(other, obj_id, f"object {obj_id} was announced from {chosen!r}")
        held = by_peer.get(chosen)
        if held is None:
            return
        value, sealed, failed, _ = held
        if failed:
            self.delivery_failed(chosen, obj_id, value)
        else:
            try:
                self.receive(chosen, obj_id, value, sealed)
            except LimitExceeded:
                pass  # (recorded as the id's failure)

    def delivery_failed(self, peer: str, obj_id: int, reason: str) -> None:
        """A peer could not deliver ``obj_id``: waiting commands fail with ``reason`` (cut
        to :data:`MAX_REASON` characters; a notice held before its announcement counts
        against the limit like a delivery)."""
        reason = reason[:MAX_REASON]
        with self._cond:
            if not self._may_deliver(peer, obj_id, notice=True):
                self._hold(peer, obj_id, reason, False, True)
                return
            self._expected.pop(obj_id, None)
            self._promised.pop(obj_id, None)
            self._announced.pop(obj_id, None)
            if obj_id not in self._entries and obj_id not in self._dropped:
                self._failed[obj_id] = f"peer {peer!r} could not deliver object {obj_id}: {reason}"
                self._cond.notify_all()
            self._dropped.pop(obj_id, None)

    def expect(self, peer: str, obj_ids: list[int]) -> None:
        """The client announced ``obj_ids`` as deliveries from ``peer``: only ``peer`` may
        write them (a delivery held for one of them is adopted from ``peer`` only)."""
        for k in range(0, len(obj_ids), _LOCKED_IDS):  # (the lock is let go in between)
            with self._cond:
                chunk = obj_ids[k : k + _LOCKED_IDS]
                self._check_ids(len(chunk), f"announcing deliveries from {peer!r} of")
                for i in chunk:
                    if i not in self._entries:
                        self._expected[i] = peer
                        self._announced[i] = peer
                        self._adopt(peer, i)

    def promise(self, ids: list[int], patient: bool = False) -> None:
        """Ids a program started here will produce, or its peers will deliver: lookups of
        them wait (see :mod:`pointers.worker.program`), and an accepted peer may deliver
        them (once). Every wait here is bounded by the deadline (``patient`` is for
        in-process lanes only, and ignored)."""
        for k in range(0, len(ids), _LOCKED_IDS):  # (the lock is let go in between)
            with self._cond:
                chunk = ids[k : k + _LOCKED_IDS]
                self._check_ids(len(chunk), "a program's promise of")
                for i in chunk:
                    if i not in self._entries and i not in self._failed:
                        self._promised[i] = None
                        named = self._announced.setdefault(i, None)  # (a peer, if named)
                        self._adopt(named, i)

    def release_promises(self, ids: list[int]) -> None:
        with self._cond:
            for i in ids:
                if self._promised.get(i, 0) is None:
                    del self._promised[i]
            self._cond.notify_all()

    def fail_promises(self, ids: list[int], why: str) -> None:
        with self._cond:
            for i in ids:
                if i in self._promised:
                    self._promised[i] = why
            self._cond.notify_all()

    def peer_available(self, peer: str) -> None:
        """Forget an earlier timeout of ``peer`` (the client introduced it again)."""
        with self._cond:
            self._unavailable.pop(peer, None)

    def discard(self, obj_id: int) -> None:
        with self._cond:
            e = self._entries.pop(obj_id, None)
            who = self._announced.pop(obj_id, _MISSING)
            self._expected.pop(obj_id, None)
            self._promised.pop(obj_id, None)
            if e is not None:
                self.bytes -= e.nbytes + self._unref(e.storage)
            elif who is not _MISSING:  # a delivery may still come: drop it then
                self._dropped[obj_id] = who
            self._unhold_all(obj_id)
            self._failed.pop(obj_id, None)

    def pop(self, obj_id: int) -> Any:
        value = self.get(obj_id)
        self.discard(obj_id)
        return value

    def forget(self, obj_id: int) -> Entry:
        """Drop the entry of ``obj_id`` (which must exist) and return it (a move: the
        caller holds the value). Its bytes no longer count."""
        with self._cond:
            e = self._entries.pop(obj_id)
            self.bytes -= e.nbytes + self._unref(e.storage)
            return e

    def close(self, reason: str) -> tuple[int, int]:
        """Free everything and refuse every later write with ``reason`` (the lease of this
        namespace expired); the objects and bytes it held."""
        with self._cond:
            held = len(self._entries) + len(self._held_order), self.bytes
            self.closed = reason
        self.clear()
        return held

    def clear(self) -> None:
        with self._cond:
            self._entries.clear()
            self._expected.clear()
            self._failed.clear()
            self._dropped.clear()
            self._announced.clear()
            self._held.clear()
            self._held_order.clear()
            self._refused.clear()
            self._refused_more = 0
            self._unavailable.clear()
            self._promised.clear()
            self._storages.clear()
            self.bytes = 0
            self.kept = 0
            self._cond.notify_all()

    # -- reads -------------------------------------------------------------------------
    def get(self, obj_id: int) -> Any:
        e = self._entries.get(obj_id)
        if e is None:
            e = self._wait(obj_id)
        return e.value

    def entry(self, obj_id: int) -> Entry:
        e = self._entries.get(obj_id)
        return e if e is not None else self._wait(obj_id)

    def _wait(self, obj_id: int) -> Entry:
        end = time.monotonic() + self.deadline
        lock = self.lock
        while True:
            depth = 0
            try:
                with self._cond:
                    e = self._entries.get(obj_id)
                    if e is not None:
                        return e
                    left = end - time.monotonic()
                    try:
                        self._check(obj_id, left)
                    except PartyUnavailable:
                        if self.on_wait_failed is not None:
                            self.on_wait_failed()
                        raise
                    self._waiters += 1
                    try:
                        if lock is not None:  # let the producer run meanwhile
                            depth = lock.suspend()
                        self._cond.wait(left)
                    finally:
                        self._waiters -= 1
            finally:
                if depth:  # outside the store's lock: the namespace's is taken first
                    lock.resume(depth)  # type: ignore[union-attr]

    def _check(self, obj_id: int, left: float) -> None:
        """Raise unless ``obj_id`` may still come (called with the store's lock held)."""
        failed = self._failed.pop(obj_id, None)
        if failed is not None:
            raise PartyUnavailable(failed, None)
        if obj_id in self._promised:
            why = self._promised[obj_id]
            if why is not None:
                del self._promised[obj_id]
                raise PartyUnavailable(f"worker {self.owner!r}: {why}", None)
            if left <= 0:
                del self._promised[obj_id]
                raise PartyUnavailable(
                    f"worker {self.owner!r} waited {self.deadline:g} s for object {obj_id}, "
                    "which a program or a peer was to produce: a party that is down or "
                    "unreachable from this worker, or one that refused its part (a limit, a "
                    "busy program slot: the client's next sync there names it)",
                    None,
                )
            return
        peer = self._expected.get(obj_id)
        if peer is None:
            raise UnknownObjectError(
                f"worker {self.owner!r} holds no object with id {obj_id}{self.note}"
            )
        reason = self._unavailable.get(peer)
        if reason is not None:
            raise PartyUnavailable(reason, peer)
        if left <= 0:
            reason = (
                f"worker {self.owner!r} waited {self.deadline:g} s for object {obj_id} "
                f"from peer {peer!r}, which did not deliver it: is {peer!r} still "
                "running and reachable from this worker?"
            )
            self._unavailable[peer] = reason
            self._expected.pop(obj_id, None)
            raise PartyUnavailable(reason, peer)

    def search(self, query: list[str]) -> list[int]:
        wanted = set(query)
        with self._cond:
            items = list(self._entries.items())
        return [i for i, e in items if wanted <= e.tags and not e.sealed]

    def ids(self) -> list[int]:
        with self._cond:
            return list(self._entries)

    def view(self, sealed: bool = True) -> Mapping[int, Any]:
        return _Snapshot(self)  # (the worker's own view: it is never sent to a client)


class _Snapshot(Mapping[int, Any]):
    def __init__(self, store: WaitingStore) -> None:
        self._store = store

    def __getitem__(self, key: int) -> Any:
        return self._store._entries[key].value

    def __iter__(self) -> Iterator[int]:
        return iter(self._store.ids())

    def __len__(self) -> int:
        return len(self._store._entries)


PeerLinkFactory = Callable[[str, str, str, str], Any]  # (peer, address, client, session)


class ProgramPool:
    """The threads that run a served worker's programs (``RunProgram``), bounded.

    At most ``per_worker`` programs run at once in the whole worker and ``per_client`` per
    client session; the others wait in their session's queue, in the order they came (the
    order a client posted them, the same at every worker, so the earliest program still
    running at one worker runs at the others too), and a session may queue
    ``max_queued`` at most: beyond, ``RunProgram`` is refused with
    :class:`~pointers.errors.LimitExceeded`. Threads are started when programs come and
    end when their queue is empty."""

    def __init__(self, per_worker: int, per_client: int, max_queued: int) -> None:
        if per_worker < 1 or per_client < 1 or max_queued < 1:
            raise ValueError("program limits must be at least 1")
        self.per_worker, self.per_client, self.max_queued = per_worker, per_client, max_queued
        self.cond = threading.Condition()
        self.running = 0
        self._ready: deque[ProgramQueue] = deque()  # queues waiting for a worker-wide slot

    def _schedule(self, q: ProgramQueue) -> None:
        """Start threads for ``q`` as the limits allow (with :attr:`cond` held)."""
        while q.jobs and q.running < self.per_client and self.running < self.per_worker:
            q.running += 1
            self.running += 1
            threading.Thread(
                target=self._drain, args=(q,), name=f"program-{q.name}", daemon=True
            ).start()
        if q.jobs and q.running < self.per_client and q not in self._ready:
            self._ready.append(q)

    def _drain(self, q: ProgramQueue) -> None:
        while True:
            with self.cond:
                if not q.jobs:
                    q.running -= 1
                    self.running -= 1
                    while self._ready and self.running < self.per_worker:
                        self._schedule(self._ready.popleft())
                    self.cond.notify_all()
                    return
                job = q.jobs.popleft()
            try:
                job()
            except Exception:  # noqa: S110 - a program reports its own failures
                pass


class ProgramQueue:
    """One session's programs waiting for, or running in, a :class:`ProgramPool`."""

    def __init__(self, pool: ProgramPool, name: str) -> None:
        self.pool, self.name = pool, name
        self.jobs: deque[Callable[[], None]] = deque()
        self.running = 0
        self.closed = False

    def submit(self, job: Callable[[], None]) -> None:
        pool = self.pool
        with pool.cond:
            if self.closed:
                raise PartyUnavailable("this client's session at the worker has ended", None)
            if len(self.jobs) >= pool.max_queued:
                raise LimitExceeded(
                    f"worker {self.name!r}: this client already has {len(self.jobs)} programs "
                    f"waiting to run ({self.running} running; at most {pool.per_client} run "
                    f"at once per client, {pool.per_worker} per worker, and "
                    f"{pool.max_queued} wait): wait for its programs (wait_programs) first"
                )
            self.jobs.append(job)
            pool._schedule(self)

    def wait(self, timeout: float | None) -> bool:
        """Wait until no program of this session runs or waits; False on timeout."""
        with self.pool.cond:
            return self.pool.cond.wait_for(lambda: not self.jobs and not self.running, timeout)

    def close(self) -> None:
        with self.pool.cond:
            self.closed = True
            self.jobs.clear()
            self.pool.cond.notify_all()


_OP_BYTES: dict[Any, int | None] = {}  # (op, shapes and arguments) -> bytes it allocates
_OP_BYTES_MAX = 4096


def _meta_key(obj: Any) -> Any:
    t = type(obj)
    if t is torch.Tensor or isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), obj.dtype)
    if t is list or t is tuple:
        return (t, *(_meta_key(o) for o in obj))
    if t is dict:
        return (dict, *((k, _meta_key(v)) for k, v in obj.items()))
    hash(obj)  # an unhashable value: no key (TypeError)
    return obj


def _to_meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device="meta")
    if isinstance(obj, list):
        return [_to_meta(o) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_to_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def warm_meta() -> None:
    """Run the meta path once: torch loads its meta kernels on first use (1 to 2 s on a
    busy machine), which a worker does at startup rather than inside a client's deadline."""
    op_bytes("aten::add.Tensor", torch.ops.aten.add.Tensor, [torch.ones(1), torch.ones(1)], {})
    op_bytes("aten::ones.default", torch.ops.aten.ones.default, [[1]], {})


def op_bytes(name: str, op: Any, args: list[Any], kwargs: dict[str, Any]) -> int:
    """The bytes the outputs of ``op(*args, **kwargs)`` take, found by running it on the
    ``meta`` device (no data: shapes only), cached by op, input shapes and other arguments.

    An op whose output's size depends on the values (a boolean mask's ``index``,
    ``where(cond)``) is bounded by its inputs (:func:`_data_dependent_bytes`: as if every
    element of the mask were set); any other op that the ``meta`` device cannot run is
    refused (``NotAllowedError``), and an op that fails there raises that error: nothing
    runs unsized."""
    try:
        key: Any = (name, _meta_key(args), _meta_key(kwargs))
        hit = _OP_BYTES.get(key, _MISSING)
    except TypeError:
        key, hit = None, _MISSING
    if hit is _MISSING:
        hit = _op_bytes(name, op, args, kwargs)
        if key is not None:
            if len(_OP_BYTES) >= _OP_BYTES_MAX:
                _OP_BYTES.clear()
            _OP_BYTES[key] = hit
    if isinstance(hit, BaseException):
        raise hit.with_traceback(None)
    return hit  # type: ignore[no-any-return]


def _leaf_bytes(result: Any) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in torch.utils._pytree.tree_leaves(result)
        if isinstance(t, torch.Tensor)
    )


def _op_bytes(name: str, op: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """:func:`op_bytes` uncached: the bytes, or the exception to raise."""
    margs, mkwargs = _to_meta(args), _to_meta(kwargs)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    elif not any(isinstance(a, torch.Tensor) for a in args):  # a factory: ones, arange, ...
        schema = getattr(op, "_schema", None)
        if schema is not None and any(a.name == "device" for a in schema.arguments):
            mkwargs["device"] = "meta"
    try:
        return _leaf_bytes(op(*margs, **mkwargs)) + _mask_bytes(name, margs)
    except NotImplementedError:
        bound = _data_dependent_bytes(name, op, margs, mkwargs)
        if bound is not None:
            return bound
        return NotAllowedError(
            f"op {name!r} cannot be sized before it runs (the size of its output depends "
            "on the values), so a worker with a storage limit refuses it (serve "
            "--max-stored-mb)"
        )
    except Exception as e:  # the op itself would fail the same way: it does not run
        return e


def _masks(name: str, margs: list[Any]) -> list[torch.Tensor]:
    """The boolean index tensors of an ``index``/``index_put`` op (empty for other ops)."""
    base = name.partition("::")[2].partition(".")[0]
    if base not in ("index", "index_put", "index_put_") or len(margs) < 2:
        return []
    indices = margs[1]
    if not isinstance(indices, list | tuple):
        return []
    return [
        i for i in indices if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
    ]


def _mask_bytes(name: str, margs: list[Any]) -> int:
    """What torch allocates for the boolean masks of an index op besides its output: the
    indices of the set elements (``nonzero``), as if every element were set."""
    return sum(m.numel() * max(m.dim(), 1) * 8 for m in _masks(name, margs))


def _data_dependent_bytes(name: str, op: Any, margs: list[Any], mkwargs: dict[str, Any]) -> Any:
    """An upper bound of the bytes of an op whose output size depends on the values:
    ``index`` with boolean masks sized as if every element of each mask were set (each
    mask of k dims is k index tensors of its element count), ``where(cond)`` likewise;
    None for any other op."""
    base = name.partition("::")[2].partition(".")[0]
    masks = _masks(name, margs)
    if base == "index" and masks:
        indices = []
        for i in margs[1]:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                full = torch.empty((i.numel(),), dtype=torch.int64, device="meta")
                indices.extend([full] * max(i.dim(), 1))
            else:
                indices.append(i)
        try:
            out = op(margs[0], indices, *margs[2:], **mkwargs)
        except Exception as e:
            return e
        return _leaf_bytes(out) + _mask_bytes(name, margs)
    if base == "where" and len(margs) == 1 and isinstance(margs[0], torch.Tensor):
        cond = margs[0]
        return 2 * cond.numel() * max(cond.dim(), 1) * 8  # nonzero, then its columns
    return None


class ServedWorker(Worker):
    """One client's namespace at a served worker."""

    def __init__(
        self,
        id: str,
        client: str,
        *,
        functions: Mapping[str, Callable[..., Any]],
        link_factory: PeerLinkFactory,
        deadline: float,
        max_stored_bytes: int | None,
        session: str = "",
        max_objects: int | None = None,
        programs: ProgramPool | None = None,
    ) -> None:
        super().__init__(id)
        self.client = client
        self.session = session
        lock = NamespaceLock()
        self._lock = lock
        self.store: WaitingStore = WaitingStore(
            id, deadline=deadline, max_bytes=max_stored_bytes, lock=lock, max_objects=max_objects
        )
        self.programs = ProgramQueue(programs or ProgramPool(64, 8, 1024), id)
        self.calls = 0  # calls of the client running now (the lease does not run out)
        self.seen = time.monotonic()  # when the client's last call ended (or began)
        self.functions.register_all(dict(functions))
        self.accepted: set[str] = set()
        self._link_factory = link_factory
        self._pop_after_reply: int | None = None
        # fetch replies built and not yet sent (released when their tensors are freed),
        # bounded by the message limit and the storage limit; the reservation of the
        # fetch running now (handed to its reply's buffers by handle_frames)
        server_config = getattr(getattr(link_factory, "__self__", None), "config", None)
        self.max_reply_bytes: int | None = getattr(server_config, "max_message_bytes", None)
        self._replying = 0
        self._reply_lock = threading.Lock()
        self._reserved = 0
        self._control = False
        self._lost_lock = threading.Lock()
        # set while a client's SendToPeer runs (a program's deliveries are not reported
        # here: the peers waiting for them fail, and so does the program's output)
        self._commanded = threading.local()
        self.store.on_wait_failed = self._forget_unreachable
        self._order_cond = threading.Condition()
        self._order_next: dict[str, int] = {}  # connection token -> the next call's number
        self._turn_waiters = 0
        # queued deliveries that failed, not reported yet: (peer unreachable, message)
        self._lost_deliveries: list[tuple[bool, str]] = []

    def handle_frames(
        self,
        header: bytes,
        buffers: list[Any],
        donated: bool = False,
        from_peer: str | None = None,
    ) -> Frames:
        with self._lock:
            self._control = False
            self._reserved = 0
            out = super().handle_frames(header, buffers, donated, from_peer)
            reserved, self._reserved = self._reserved, 0
            if reserved:  # a fetch's reply: its bytes count until its buffers are freed
                if out[1]:
                    alias = out[1][0].detach()
                    weakref.finalize(alias, self._replied, reserved)
                    out = (out[0], [alias, *out[1][1:]])
                else:
                    self._replied(reserved)
            # (reset after reading: a command that waited let other commands run meanwhile)
            control, self._control = self._control, False
            if control:  # introductions are control traffic: uncounted, as in process
                stats = self.stats
                stats.messages_received -= 1
                stats.bytes_received -= serde.nbytes(header, buffers)
                stats.messages_sent -= 1
                stats.bytes_sent -= serde.nbytes(*out)
            obj_id = self._pop_after_reply
            if obj_id is not None:  # a fetch-and-delete: delete once the reply is encoded
                self._pop_after_reply = None
                if not is_error_header(out[0]):
                    self.store.discard(obj_id)
            return out

    @handles(Fetch)
    def _fetch(self, msg: Fetch) -> Any:
        if not msg.delete:
            value = super()._fetch(msg)
        else:
            value = self._readable(msg.obj_id, "fetching it").value
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"object {msg.obj_id} is not a tensor")
        self._reserve_reply(msg.obj_id, value.numel() * value.element_size())
        if msg.delete:
            self._pop_after_reply = msg.obj_id
        return value

    def _reserve_reply(self, obj_id: int, size: int) -> None:
        """Count a fetch's reply (``size`` bytes of tensor data) before it is built: the
        replies built and not yet sent to this client may take at most the message
        limit (``serve --max-message-mb``, what one reply can carry) and the storage
        limit (``--max-stored-mb``), whichever is smaller."""
        limits = [x for x in (self.max_reply_bytes, self.store.max_bytes) if x]
        with self._reply_lock:
            total = self._replying + size
            if limits and size and total > min(limits):
                raise LimitExceeded(
                    f"worker {self.id!r}: the reply to a fetch of object {obj_id} ({size} "
                    f"bytes) would take the replies being built for this client to {total} "
                    f"bytes, over {min(limits)} bytes (the smaller of serve --max-message-mb "
                    "and --max-stored-mb); fetch fewer objects per call"
                )
            self._replying = total
        self._reserved += size

    def _replied(self, size: int) -> None:
        with self._reply_lock:
            self._replying -= size

    # -- deliveries that do not wait for the peer ----------------------------------------
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
        """Send ``value`` without waiting for the peer (see
        :class:`~pointers.network.server.PeerLink`); a link that cannot post delivers and
        waits, as in process. A failure is reported at the client's next call here
        (:meth:`take_lost`; a client's command only), to the peer, and to ``on_lost``
        (a move puts its object back)."""
        link = self.peer_link(peer)
        post = getattr(link, "post_frames", None)
        if post is None:
            return super().deliver(peer, obj_id, value, donate, lend, sealed)
        self._room_in_flight(peer, obj_id, _size(value) + 1024)
        header, buffers = encode_message(Store(obj_id, value, [], "", sealed))
        self.stats.peer_messages_sent += 1
        self.stats.peer_bytes_sent += serde.nbytes(header, buffers)
        report = getattr(self._commanded, "on", False)

        def failed(why: str) -> None:
            if report:
                self._lost(peer, obj_id, why)
            if on_lost is not None:
                on_lost(why)

        post(header, buffers, obj_id, failed if report or on_lost is not None else None)

    def in_flight(self) -> int:
        """Bytes of this session's deliveries posted to its peers and not yet answered."""
        return sum(
            getattr(link, "queued_bytes", getattr(link, "_queued_bytes", 0))
            for link in list(self._peer_links.values())
        )

    def _room_in_flight(self, peer: str, obj_id: int, size: int) -> None:
        """Wait (up to the deadline) until a delivery of ``size`` bytes fits: what the
        session stores plus its deliveries in flight (encoded copies, all its peers
        together) may take its byte limit at most; then ``LimitExceeded``."""
        store = self.store
        if store.max_bytes is None:
            return
        end = time.monotonic() + store.deadline
        while True:
            flying = self.in_flight()
            total = store.used() + flying + size
            if total <= store.max_bytes:
                return
            left = end - time.monotonic()
            if not flying or left <= 0:
                raise LimitExceeded(
                    f"worker {self.id!r}: delivering object {obj_id} ({size} bytes) to "
                    f"{peer!r} would take this client's stored bytes and its deliveries in "
                    f"flight ({flying} bytes) to {total} bytes, over its limit of "
                    f"{store.max_bytes} bytes (serve --max-stored-mb)"
                )
            for link in list(self._peer_links.values()):
                flush = getattr(link, "flush", None)
                if flush is not None:
                    flush(min(left, 0.5))

    def _lost(self, peer: str, obj_id: int, why: str) -> None:
        """A delivery did not arrive (called on a gRPC thread): reported to
        the client by :meth:`take_lost`."""
        with self._lost_lock:
            if len(self._lost_deliveries) < 16:
                self._lost_deliveries.append(
                    (
                        why.startswith("PartyUnavailable"),
                        f"worker {self.id!r} could not deliver object {obj_id} to its peer "
                        f"{peer!r}: {why}",
                    )
                )

    # -- the order of a connection's calls ---------------------------------------------
    MAX_CONNECTIONS_ORDERED = 64  # connection tokens remembered per namespace
    MAX_CALLS_AHEAD = 16  # how far ahead of the next call a pipelined one may be numbered
    MAX_TURN_WAITERS = 16  # calls of a session waiting for their turn at once (threads)

    def wait_turn(self, token: str, number: int, pipelined: bool) -> None:
        """Wait until the calls a pipelined call left after have run here (bounded by
        the deadline: a call that never comes is not waited for longer). A call older
        than one that already ran is refused: its place is gone."""
        if not pipelined:
            return
        with self._order_cond:
            nxt = self._order_next.get(token)
            if nxt is not None and number > nxt + self.MAX_CALLS_AHEAD:
                raise PointerError(
                    f"worker {self.id!r}: call {number} of this connection cannot wait for "
                    f"call {nxt}: at most {self.MAX_CALLS_AHEAD} calls may be in flight"
                )
            if self._turn_waiters >= self.MAX_TURN_WAITERS and (nxt is None or number > nxt):
                raise LimitExceeded(
                    f"worker {self.id!r}: {self._turn_waiters} calls of this session already "
                    "wait for the calls before them; send fewer at once"
                )
            end = time.monotonic() + self.store.deadline
            self._turn_waiters += 1
            try:
                while number > (nxt or 0):  # (None: none of its calls ran here yet)
                    left = end - time.monotonic()
                    if left <= 0:
                        return  # the calls before it did not come: run it anyway
                    self._order_cond.wait(left)
                    nxt = self._order_next.get(token)
            finally:
                self._turn_waiters -= 1
            nxt = nxt or 0
            if number < nxt:
                raise PointerError(
                    f"worker {self.id!r}: call {number} of this connection came after call "
                    f"{nxt - 1} had run (it arrived too late to keep its place)"
                )

    def end_turn(self, token: str, number: int) -> None:
        with self._order_cond:
            order = self._order_next
            if token not in order and len(order) >= self.MAX_CONNECTIONS_ORDERED:
                del order[next(iter(order))]  # the oldest connection's
            order[token] = max(order.get(token, 0), number + 1)
            self._order_cond.notify_all()

    def _forget_unreachable(self) -> None:
        """A wait here failed for want of a peer: the client learns of it from that
        failure, so the deliveries lost to unreachable peers so far are not reported
        again at the next sync."""
        with self._lost_lock:
            self._lost_deliveries = [(u, m) for u, m in self._lost_deliveries if not u]

    def take_lost(self, unreachable: bool = True) -> str | None:
        """The deliveries that failed and were not reported yet (one message), and forget
        them. ``unreachable=False`` (a call's commands): only those a peer refused; those
        to an unreachable peer wait for the next sync (whoever waits for that peer learns
        it anyway, from the deadline there), so a call after a failed protocol step does
        not fail again for the same dead peer; nor are they once a wait here failed (see
        :meth:`_forget_unreachable`)."""
        with self._lost_lock:
            take = [m for u, m in self._lost_deliveries if unreachable or not u]
            self._lost_deliveries = [
                (u, m) for u, m in self._lost_deliveries if not (unreachable or not u)
            ]
        # deliveries into this namespace that it refused: reported at the next sync
        refused = self.store.take_refused() if unreachable else None
        if refused is not None:
            take.append(refused)
        return "; ".join(take) if take else None

    def flush_deliveries(self, timeout: float | None = None) -> bool:
        """Wait until every delivery of this namespace in flight was answered (False: timed out)."""
        ok = True
        for link in list(self._peer_links.values()):
            flush = getattr(link, "flush", None)
            if flush is not None:
                ok = flush(timeout) and ok
        return ok

    @handles(SendToPeer)
    def _send_to_peer(self, msg: SendToPeer) -> None:
        self._commanded.on = True  # a client's command: a lost delivery is reported to it
        try:
            return super()._send_to_peer(msg)
        except PartyUnavailable:
            raise  # the peer itself is unreachable: nobody to tell
        except Exception as e:
            link = self.peer_link(msg.peer)
            notify = getattr(link, "delivery_failed", None)
            if notify is not None:
                try:  # best effort: let the peer fail its waiting command at once
                    notify(msg.new_id, f"{type(e).__name__}: {e}")
                except Exception:  # noqa: S110 - the original error is what matters
                    pass
            raise
        finally:
            self._commanded.on = False

    @handles(ConnectPeer)
    def _connect_peer(self, msg: ConnectPeer) -> None:
        self._control = True
        if msg.peer == self.id:
            raise ValueError(f"worker {self.id!r} cannot be its own peer")
        old = self.peer_link(msg.peer)
        if old is None and len(self._peer_links) >= MAX_PEER_LINKS:
            raise LimitExceeded(
                f"worker {self.id!r}: this session may deliver to at most {MAX_PEER_LINKS} peers"
            )
        link = self._link_factory(msg.peer, msg.address, self.client, self.session)
        self.add_peer_link(msg.peer, link)
        close = getattr(old, "close", None)
        if close is not None:  # (its channel is closed once no session's link uses it)
            close()

    @handles(AcceptPeer)
    def _accept_peer(self, msg: AcceptPeer) -> None:
        self._control = True
        peer = msg.peer
        if peer == self.client:
            raise ValueError(f"the client {peer!r} cannot also be a delivering peer")
        self.accepted.add(peer)
        self.store.peer_available(peer)

    def wait_programs(self, timeout: float | None = None) -> None:
        """Wait until this client's programs ended, ``timeout`` seconds at most in all."""
        self.programs.wait(timeout)

    @handles(RunProgram)
    def _run_program(self, msg: RunProgram) -> None:
        """Queue the program in this session's :class:`ProgramQueue` (bounded threads)."""
        program = self.store.get(msg.program_id)
        if not isinstance(program, Program):
            raise TypeError(f"object {msg.program_id} is not a program")
        if len(msg.bindings) < program.n_slots:
            raise PointerError(
                f"the program needs {program.n_slots} bindings, got {len(msg.bindings)}"
            )
        bindings, promised = list(msg.bindings), list(msg.promised)
        self.store.promise(promised)
        try:
            self.programs.submit(lambda: run_program_steps(self, program, bindings, promised))
        except BaseException:
            self.store.release_promises(promised)
            raise

    @handles(RunPlan)
    def _run_plan(self, msg: RunPlan) -> Any:
        """Size a plan's outputs on the ``meta`` device before it runs (as an op's)."""
        store = self.store
        if store.max_bytes is not None:
            plan = store.get(msg.plan_id)
            if isinstance(plan, PlanGraph):
                try:
                    args = self._resolve(msg.args)
                    metas = (
                        plan.infer(args) if all(isinstance(a, torch.Tensor) for a in args) else None
                    )
                except Exception:  # the run itself reports bad arguments
                    metas = None
                if metas:
                    size = sum(math.prod(shape) * dtype.itemsize for shape, _, dtype in metas)
                    store.charge_check(None, size, f"plan {plan.name!r}")
        return super()._run_plan(msg)

    @handles(Tag)
    def _tag(self, msg: Tag) -> None:
        self._readable(msg.obj_id, "tagging it")
        self.store.retag(msg.obj_id, list(msg.tags), msg.description)

    def check_op(self, msg: ExecuteOp, op: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Refuse an op whose outputs would take the client past its byte limit, before
        it runs (their size from the op run on the ``meta`` device)."""
        store = self.store
        if store.max_bytes is None:
            return
        size = op_bytes(msg.op, op, args, kwargs)
        if size:
            ids = msg.out_ids
            store.charge_check(ids[0] if len(ids) == 1 else None, size, f"{msg.op}")

    def check_function(
        self, name: str, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Refuse a registered function whose declared size (its peak and what it keeps,
        :func:`pointers.worker.functions.sized`) would take the client past its byte
        limit, before it runs, and count what it keeps. With a limit, a function that
        declares no size is refused."""
        self._check_function(name, fn, args, kwargs, 0, name)

    def _check_function(
        self,
        name: str,
        fn: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
        live: int,
        what: str,
    ) -> None:
        store = self.store
        if store.max_bytes is None:
            return
        spec = function_size(fn)
        if spec is None:
            raise NotAllowedError(
                f"worker {self.id!r}: function {name!r} declares no size "
                "(pointers.worker.functions.sized), and a worker with a storage limit runs "
                "only functions it can size before they run (serve --max-stored-mb)"
            )
        try:
            params = bind_arguments(fn, args, kwargs)
        except TypeError as e:
            raise TypeError(f"{name}: {e}") from None
        peak, kept = spec.bytes(params)
        store.charge_check(None, live + peak + kept, what)
        store.keep(kept, what)

    def check_node(
        self,
        kind: str,
        target: str,
        fn: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        live: int,
        where: str,
    ) -> None:
        """Refuse a plan's node (an aten op, or a registered function: ``kind``) whose
        outputs, with the intermediates the plan holds now (``live`` bytes), would take
        the client past its byte limit, before it runs (called by
        :meth:`pointers.plans.graph.PlanGraph.run`)."""
        store = self.store
        if store.max_bytes is None:
            return
        if kind == "fn":
            self._check_function(target, fn, args, kwargs, live, where)
            return
        size = op_bytes(target, fn, args, kwargs)
        store.charge_check(None, live + size, where)

    def close(self, reason: str) -> tuple[int, int]:
        """End this namespace (its lease expired): free its objects and queued programs;
        the objects and bytes it held."""
        self.programs.close()
        held = self.store.close(reason)
        self.function_state.clear()
        for link in self._peer_links.values():
            close = getattr(link, "close", None)
            if close is not None:
                close()
        self._peer_links.clear()
        self.accepted.clear()
        return held

    def clear(self) -> None:
        """Forget every object and zero the counters (the client asked for a fresh start)."""
        with self._lock:
            self.store.clear()
            self.function_state.clear()
            self.stats = WorkerStats()
        with self._lost_lock:
            self._lost_deliveries = []
