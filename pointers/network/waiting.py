"""The object store of a client namespace at a served worker: :class:`WaitingStore`.

Commands arrive on the client's connection while peer deliveries travel separately, so a
command may reach this worker before an object a peer delivers to it. The client announces
the ids it expects from each peer (the ``expect`` field of its envelopes), and a running
program (``mpc.plan``, see :mod:`pointers.worker.program`) promises the ids it or its peers
will produce; a lookup of such an id waits, bounded by the deadline, and then fails with
:class:`~pointers.errors.PartyUnavailable`. An id nobody announced fails at once, as in
process. Deliveries take the store's own lock, never the namespace's (a
:class:`NamespaceLock`): a worker delivers while it runs a command (under its lock), so two
workers delivering to each other at once must not wait on each other's locks.

Imports :mod:`pointers.network.limits` (what it counts) and lower layers only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

from pointers.errors import LimitExceeded, NotAllowedError, PartyUnavailable, UnknownObjectError
from pointers.network.limits import (
    MAX_REASON,
    CountedStore,
    footprint,
    held_size,
    storage_of,
    tag_bytes,
)
from pointers.network.nslock import NamespaceLock as NamespaceLock  # (re-exported)
from pointers.worker.sealing import is_owners_data
from pointers.worker.store import Entry

_MISSING: Any = object()
_LOCKED_IDS = 4096  # ids announced or promised per hold of a store's lock
HOLD_SECONDS = 300.0  # how long a delivery that arrived before its announcement is kept aside
# how long a namespace must have run nothing (no command or program holding its lock, no
# wait begun) before it counts as stalled: a stalled namespace takes every delivery, so
# that flow control (max_held, below) can never hold back what its progress needs
STALL_SECONDS = 1.0


class WaitingStore(CountedStore):
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
        max_held: int | None = None,
    ) -> None:
        super().__init__(owner, max_bytes=max_bytes, max_objects=max_objects)
        self.deadline = deadline
        # flow control: while the deliveries held before their announcement and those
        # stored and not read yet take more than max_held bytes (None: no bound), a
        # delivery's answer asks its sender to pause (receive() returns True); the sender
        # then asks room() before each later delivery here (pointers.network.peers.PeerLink)
        self.max_held = max_held
        self.held_bytes = 0  # bytes of the deliveries held before their announcement
        self.unread_bytes = 0  # bytes of the deliveries stored and not read yet
        self._unread: dict[int, int] = {}  # their ids -> bytes
        self._waiting_on: dict[str | None, int] = {}  # lookups waiting, by peer (None: promised)
        self.closed: str | None = None  # why this namespace is gone (its lease expired)
        self.note = ""  # added to "no object" errors (an earlier session's lease expired)
        self.lock = lock
        # deliveries that came before their announcement (the client's expect travels on
        # another connection), by id then peer: (value or failure reason, sealed, failed,
        # when); and in the order they came (to expire them, CountedStore._held_order), so
        # that every operation on them costs O(1) per id, never a scan of all of them
        # under the store's lock
        self._held: dict[int, dict[str, tuple[Any, Any, bool, float]]] = {}
        # deliveries refused since the client's last sync (reported then, see
        # ServedWorker.take_lost): never dropped silently
        self._refused: list[str] = []
        self._refused_more = 0  # refusals beyond the ones kept
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
        key, storage = storage_of(value)
        own = 0 if type(value) is torch.Tensor else footprint(value)
        own += tag_bytes(tags, description) if tags or description else 0
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
            if self._unread:
                self._read(obj_id)
            self.bytes += own + self._ref(key, storage)
            if old is not None:
                self.bytes -= old.nbytes + self._unref(old.storage)
            self._announced.pop(obj_id, None)
            if self._promised:
                self._promised.pop(obj_id, None)
            if self._waiters:
                self._cond.notify_all()

    def receive(self, peer: str, obj_id: int, value: Any, sealed: Any = False) -> bool:
        """A peer delivered ``value`` for ``obj_id`` (``sealed``: protocol material).

        Only an id the client announced for ``peer`` (or a program promised) is written;
        a delivery that comes before its announcement is kept aside (counted against the
        limit, :data:`HOLD_SECONDS` at most) until the announcement names this peer; any
        other delivery is refused and leaves the namespace as it was. True: the sender
        should pause (the deliveries held here passed :attr:`max_held`, see :meth:`room`)."""
        with self._cond:
            if not self._may_deliver(peer, obj_id):
                self._hold(peer, obj_id, value, sealed, False)
                return self._over_held(0, peer)
            self._unavailable.pop(peer, None)
            self._expected.pop(obj_id, None)
            self._failed.pop(obj_id, None)
            if self._dropped.pop(obj_id, _MISSING) is not _MISSING:
                return False  # its pointer died before the object arrived
            try:
                self.put(obj_id, value, sealed=sealed)
            except LimitExceeded as e:
                self._announced.pop(obj_id, None)
                self._failed[obj_id] = str(e)
                self._cond.notify_all()
                raise
            if self.max_held is not None:  # (counted until a command or program reads it)
                size = held_size(value)
                self._unread[obj_id] = size
                self.unread_bytes += size
                return self._over_held(0, peer)
            return False

    # -- flow control ----------------------------------------------------------------
    def stalled(self) -> bool:
        """Whether this namespace runs nothing and has run nothing for
        :data:`STALL_SECONDS`: no command or program holds its lock, and none took it, let
        it go or began waiting for a delivery since. Its progress then waits for something
        from outside (a delivery, or the client's next call), so it takes deliveries over
        :attr:`max_held`: back-pressure never holds back what would let it go on."""
        lock = self.lock
        if lock is None or lock.held:
            return False
        return time.monotonic() - lock.active_at >= STALL_SECONDS

    def _read(self, obj_id: int) -> None:
        """(With the lock held.) A delivery stored here was read (or replaced, or
        dropped): it no longer counts against :attr:`max_held`."""
        size = self._unread.pop(obj_id, None)
        if size is not None:
            self.unread_bytes -= size

    def _over_held(self, size: int, peer: str) -> bool:
        """(With the lock held.) Whether ``peer`` should wait before it delivers ``size``
        more bytes here: the deliveries held before their announcement and those stored
        and not read yet would pass :attr:`max_held` (one is always let in when there are
        none), while the namespace is busy (not :meth:`stalled`) and waits for nothing
        from ``peer`` (a lookup waiting for an id announced from it, or promised)."""
        bound = self.max_held
        pending = self.held_bytes + self.unread_bytes
        if bound is None or self.closed is not None or not pending or pending + size <= bound:
            return False
        waiting = self._waiting_on
        return not (waiting.get(peer) or waiting.get(None) or self.stalled())

    def room(self, peer: str, obj_id: int, size: int = 0) -> bool:
        """Whether ``peer``, which was asked to pause, may deliver ``obj_id`` (``size``
        bytes) now: yes while a command or program here waits for anything from ``peer``
        (or for a promised id), while the namespace is stalled, or when the bound leaves
        room for it (see :meth:`_over_held`)."""
        with self._cond:
            self._expire_held(time.monotonic())
            return not self._over_held(size, peer)

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
        """The deliveries refused since the last call (one message), and forget them
        (held deliveries that expired are dropped, and reported, first)."""
        with self._cond:
            self._expire_held(time.monotonic())
            if not self._refused:
                return None
            more, self._refused_more = self._refused_more, 0
            refused, self._refused = self._refused, []
        tail = f"; and {more} more" if more else ""
        return "; ".join(refused) + tail

    def _expire_held(self, now: float) -> None:
        """(With the lock held.) Drop the deliveries held longer than :data:`HOLD_SECONDS`
        without their announcement, the oldest first (O(1) each), each reported at the
        client's next sync (:meth:`take_refused`), never silently."""
        order = self._held_order
        while order:
            key, when = next(iter(order.items()))
            if now - when <= HOLD_SECONDS:
                break
            held = self._unhold(*key)
            if held is not None and not held[2]:  # (a failure notice goes unreported)
                self._refuse(
                    key[0],
                    key[1],
                    f"it came {HOLD_SECONDS:g} s ago and the client never announced it: dropped",
                )

    def _hold(self, peer: str, obj_id: int, value: Any, sealed: Any, failed: bool) -> None:
        now = time.monotonic()
        order = self._held_order
        self._expire_held(now)
        if self.closed is not None:
            raise PartyUnavailable(self.closed, None)
        size = held_size(value)
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
        self.held_bytes += size

    def _unhold(self, peer: str, obj_id: int) -> tuple[Any, Any, bool, float] | None:
        by_peer = self._held.get(obj_id)
        held = by_peer.pop(peer, None) if by_peer is not None else None
        if held is not None:
            if not by_peer:
                del self._held[obj_id]
            self._held_order.pop((peer, obj_id), None)
            size = held_size(held[0])
            self.bytes -= size
            self.held_bytes -= size
        return held

    def _unhold_all(self, obj_id: int) -> dict[str, tuple[Any, Any, bool, float]]:
        by_peer = self._held.pop(obj_id, None)
        if not by_peer:
            return {}
        for peer, held in by_peer.items():
            self._held_order.pop((peer, obj_id), None)
            size = held_size(held[0])
            self.bytes -= size
            self.held_bytes -= size
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
            if self._unread:
                self._read(obj_id)
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
            self.held_bytes = 0
            self.unread_bytes = 0
            self._unread.clear()
            self.kept = 0
            self._cond.notify_all()

    # -- reads -------------------------------------------------------------------------
    def get(self, obj_id: int) -> Any:
        e = self._entries.get(obj_id)
        if e is None:
            e = self._wait(obj_id)
        if obj_id in self._unread:
            with self._cond:
                self._read(obj_id)
        return e.value

    def entry(self, obj_id: int) -> Entry:
        e = self._entries.get(obj_id)
        if e is None:
            e = self._wait(obj_id)
        if obj_id in self._unread:
            with self._cond:
                self._read(obj_id)
        return e

    def forget(self, obj_id: int) -> Entry:
        with self._cond:
            if self._unread:
                self._read(obj_id)
            return super().forget(obj_id)

    def _wait(self, obj_id: int) -> Entry:
        end = time.monotonic() + self.deadline
        lock = self.lock
        if lock is not None:  # (the wait's start counts as activity: see stalled)
            lock.active_at = time.monotonic()
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
                    # (what it waits for: see _over_held)
                    on = None if obj_id in self._promised else self._expected.get(obj_id)
                    waiting = self._waiting_on
                    waiting[on] = waiting.get(on, 0) + 1
                    try:
                        if lock is not None:  # let the producer run meanwhile
                            depth = lock.suspend()
                        self._cond.wait(left)
                    finally:
                        self._waiters -= 1
                        if waiting[on] > 1:
                            waiting[on] -= 1
                        else:
                            del waiting[on]
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
        return [
            i for i, e in items if wanted <= e.tags and (not e.sealed or is_owners_data(e.sealed))
        ]

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
