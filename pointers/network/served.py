"""The serving side of a network worker: one :class:`ServedWorker` per client namespace.

A served process holds one namespace per client identity: its own object store, counters
and peer links, so one client's ids and objects are invisible to another. Each namespace
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
* a byte limit on what the client stores (``max_stored_bytes``).
* the network control messages: ``ConnectPeer`` (a link to a peer) and ``AcceptPeer``
  (deliveries from that peer may land in this namespace).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pointers.errors import LimitExceeded, NotAllowedError, PartyUnavailable, UnknownObjectError
from pointers.wire import serde
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ErrorReply,
    Fetch,
    SendToPeer,
    encode_message,
)
from pointers.worker.base import Frames, Worker, WorkerStats, handles
from pointers.worker.store import Entry, ObjectStore

_ERROR_PREFIX = encode_message(ErrorReply("", ""))[0][:7]  # fixarray(3) + fixstr "error"
_MISSING: Any = object()
HOLD_SECONDS = 300.0  # how long a delivery that arrived before its announcement is kept aside


def is_error_header(header: bytes | memoryview) -> bool:
    return bytes(header[:7]) == _ERROR_PREFIX


def _size(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    return 0


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
    ) -> None:
        super().__init__(owner)
        self.deadline = deadline
        self.max_bytes = max_bytes
        self.bytes = 0
        self.lock = lock
        self._cond = threading.Condition()
        self._expected: dict[int, str] = {}  # object id -> peer that will deliver it
        self._failed: dict[int, str] = {}  # object id -> why its delivery failed
        # ids a peer may deliver into: announced by the client (``expect``: that peer only)
        # or promised by a program (None: any accepted peer), until they arrive
        self._announced: dict[int, str | None] = {}
        # deliveries that came before their announcement (the client's expect travels on
        # another connection): (peer, id) -> (value or failure reason, sealed, failed, when)
        self._held: dict[tuple[str, int], tuple[Any, bool, bool, float]] = {}
        self._dropped: dict[int, str | None] = {}  # announced ids deleted before they arrived
        self._unavailable: dict[str, str] = {}  # peer -> why a wait for it timed out
        self._waiters = 0

    # -- writes ------------------------------------------------------------------------
    def put(
        self,
        obj_id: int,
        value: Any,
        tags: set[str] | None = None,
        description: str = "",
        sealed: bool = False,
    ) -> None:
        size = _size(value)
        with self._cond:
            old = self._entries.get(obj_id)
            total = self.bytes + size - (_size(old.value) if old is not None else 0)
            if self.max_bytes is not None and total > self.max_bytes and size:
                raise LimitExceeded(
                    f"storing object {obj_id} ({size} bytes) would take this client's "
                    f"storage at worker {self.owner!r} to {total} bytes, over its limit of "
                    f"{self.max_bytes} bytes (serve --max-stored-mb); get() or drop objects"
                )
            self._entries[obj_id] = Entry(value, set(tags) if tags else set(), description, sealed)
            self.bytes = total
            self._announced.pop(obj_id, None)
            if self._promised:
                self._promised.pop(obj_id, None)
            if self._waiters:
                self._cond.notify_all()

    def receive(self, peer: str, obj_id: int, value: Any, sealed: bool = False) -> None:
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

    def _may_deliver(self, peer: str, obj_id: int) -> bool:
        """Whether ``peer`` may deliver ``obj_id`` now (False: not yet announced; raises
        for an id that is not this peer's to write)."""
        who = self._announced.get(obj_id, _MISSING)
        if who is _MISSING:
            who = self._dropped.get(obj_id, _MISSING)
        if who is None or who == peer:
            return True
        if who is _MISSING and obj_id not in self._entries:
            return False
        raise NotAllowedError(
            f"worker {self.owner!r}: the client did not announce object {obj_id} as a "
            f"delivery from {peer!r}; the delivery is refused"
        )

    def _hold(self, peer: str, obj_id: int, value: Any, sealed: bool, failed: bool) -> None:
        now = time.monotonic()
        for key in [k for k, h in self._held.items() if now - h[3] > HOLD_SECONDS]:
            self._unhold(key)
        size = _size(value)
        if self.max_bytes is not None and self.bytes + size > self.max_bytes and size:
            raise LimitExceeded(
                f"holding object {obj_id} ({size} bytes) from {peer!r} until the client "
                f"announces it would take this client's storage at worker {self.owner!r} "
                f"over its limit of {self.max_bytes} bytes (serve --max-stored-mb)"
            )
        self._unhold((peer, obj_id))
        self._held[(peer, obj_id)] = (value, sealed, failed, now)
        self.bytes += size

    def _unhold(self, key: tuple[str, int]) -> tuple[Any, bool, bool, float] | None:
        held = self._held.pop(key, None)
        if held is not None:
            self.bytes -= _size(held[0])
        return held

    def _adopt(self, peer: str | None, obj_id: int) -> None:
        """Take in what was held for ``obj_id`` (from ``peer``; None: from any peer)."""
        if not self._held:
            return
        keys = [k for k in self._held if k[1] == obj_id and (peer is None or k[0] == peer)]
        for key in keys[:1]:
            value, sealed, failed, _ = self._unhold(key)  # type: ignore[misc]
            if failed:
                self.delivery_failed(key[0], obj_id, value)
            else:
                try:
                    self.receive(key[0], obj_id, value, sealed)
                except LimitExceeded:
                    pass  # (recorded as the id's failure)

    def delivery_failed(self, peer: str, obj_id: int, reason: str) -> None:
        """A peer could not deliver ``obj_id``: waiting commands fail with ``reason``."""
        with self._cond:
            if not self._may_deliver(peer, obj_id):
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
        with self._cond:
            for i in obj_ids:
                if i not in self._entries:
                    self._expected[i] = peer
                    self._announced[i] = peer
                    self._adopt(peer, i)

    def promise(self, ids: list[int], patient: bool = False) -> None:
        """Ids a program started here will produce, or its peers will deliver: lookups of
        them wait (see :mod:`pointers.worker.program`), and an accepted peer may deliver
        them (once). Every wait here is bounded by the deadline (``patient`` is for
        in-process lanes only, and ignored)."""
        with self._cond:
            for i in ids:
                if i not in self._entries and i not in self._failed:
                    self._promised[i] = None
                    if self._announced.get(i, _MISSING) is _MISSING:
                        self._announced[i] = None
                    self._adopt(None, i)

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
                self.bytes -= _size(e.value)
            elif who is not _MISSING:  # a delivery may still come: drop it then
                self._dropped[obj_id] = who
            for key in [k for k in self._held if k[1] == obj_id]:
                self._unhold(key)
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
            self.bytes -= _size(e.value)
            return e

    def clear(self) -> None:
        with self._cond:
            self._entries.clear()
            self._expected.clear()
            self._failed.clear()
            self._dropped.clear()
            self._announced.clear()
            self._held.clear()
            self._unavailable.clear()
            self._promised.clear()
            self.bytes = 0
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
                    self._check(obj_id, left)
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
                    "which a program or a peer was to produce: are the other parties running "
                    "and reachable from this worker?",
                    None,
                )
            return
        peer = self._expected.get(obj_id)
        if peer is None:
            raise UnknownObjectError(f"worker {self.owner!r} holds no object with id {obj_id}")
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

    def view(self) -> Mapping[int, Any]:
        return _Snapshot(self)


class _Snapshot(Mapping[int, Any]):
    def __init__(self, store: WaitingStore) -> None:
        self._store = store

    def __getitem__(self, key: int) -> Any:
        return self._store._entries[key].value

    def __iter__(self) -> Iterator[int]:
        return iter(self._store.ids())

    def __len__(self) -> int:
        return len(self._store._entries)


PeerLinkFactory = Callable[[str, str, str], Any]  # (peer id, address, client) -> link


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
    ) -> None:
        super().__init__(id)
        self.client = client
        lock = NamespaceLock()
        self._lock = lock
        self.store: WaitingStore = WaitingStore(
            id, deadline=deadline, max_bytes=max_stored_bytes, lock=lock
        )
        self.functions.register_all(dict(functions))
        self.accepted: set[str] = set()
        self._link_factory = link_factory
        self._pop_after_reply: int | None = None
        self._control = False

    def handle_frames(
        self,
        header: bytes,
        buffers: list[Any],
        donated: bool = False,
        from_peer: str | None = None,
    ) -> Frames:
        with self._lock:
            self._control = False
            out = super().handle_frames(header, buffers, donated, from_peer)
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
            return super()._fetch(msg)
        value = self._readable(msg.obj_id, "fetching it").value
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"object {msg.obj_id} is not a tensor")
        self._pop_after_reply = msg.obj_id
        return value

    @handles(SendToPeer)
    def _send_to_peer(self, msg: SendToPeer) -> None:
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

    @handles(ConnectPeer)
    def _connect_peer(self, msg: ConnectPeer) -> None:
        self._control = True
        if msg.peer == self.id:
            raise ValueError(f"worker {self.id!r} cannot be its own peer")
        link = self._link_factory(msg.peer, msg.address, self.client)
        self.add_peer_link(msg.peer, link)

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
        end = None if timeout is None else time.monotonic() + timeout
        for t in list(self.program_threads):
            t.join(None if end is None else max(end - time.monotonic(), 0.0))
        self.program_threads = [t for t in self.program_threads if t.is_alive()]

    def clear(self) -> None:
        """Forget every object and zero the counters (the client asked for a fresh start)."""
        with self._lock:
            self.store.clear()
            self.function_state.clear()
            self.stats = WorkerStats()
