"""In-process workers that run their commands concurrently, each in its own thread.

By default a :class:`~pointers.worker.base.VirtualWorker` runs every command in the caller's
thread, one after the other, whoever it is for. Real parties run side by side; inside
``with pt.concurrently(alice, bob, carol):`` in-process workers do too. Each listed
``VirtualWorker`` gets a *lane*: a thread that runs the commands posted to that worker in
the order they were posted, while the client goes on posting. Torch kernels and AES release
the GIL, so parties' work on large tensors overlaps on several cores.

Semantics stay those of running the commands one by one in posting order:

* each worker runs its own commands in order;
* an object a worker delivers to a peer (``copy_to``, ``move``) is *promised* at the peer
  when the command is posted, so a peer command that uses it waits for it to arrive (only
  a program that was valid one command at a time is accepted, and for those the waits end:
  a delivery precedes its use in posting order);
* a command that needs a reply (``get``, meta inference, ``search``) first waits until
  every lane of the block is idle, then runs as usual;
* the first failure (in posting order) is raised when the block ends or at the next
  command that needs a reply; the commands posted after it are skipped (deletes still run)
  and every promise still open is failed, so nothing waits for a delivery that will not
  come.

Workers that are not ``VirtualWorker`` (network workers already run in their own
processes), workers made with ``VirtualWorker(..., concurrent=False)`` and workers already
inside a block are left as they are.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import weakref
from collections import deque
from collections.abc import Iterable
from typing import Any

import torch

from pointers.errors import RemoteError
from pointers.wire.messages import (
    Delete,
    ErrorReply,
    Message,
    SendToPeer,
    decode_message,
    encode_message,
)

__all__ = ["ConcurrentBlock", "concurrently", "release_idle_lanes"]


LANE_IDLE_SECONDS = 2.0  # a lane's thread ends after this long without a block


class _LiveLanes:
    """The lanes whose thread may still run, stopped at interpreter exit before daemon
    threads are frozen (a thread frozen inside torch aborts the process). The exit hook is
    registered when the first lane starts, not at import. Bookkeeping of threads only."""

    def __init__(self) -> None:
        self._lanes: weakref.WeakSet[_Lane] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._hooked = False

    def add(self, lane: _Lane) -> None:
        with self._lock:
            if not self._hooked:
                atexit.register(self.stop_all)
                self._hooked = True
            self._lanes.add(lane)

    def stop_all(self) -> None:
        with self._lock:
            lanes = list(self._lanes)
        for lane in lanes:
            lane.stop()

    def stop_idle(self) -> None:
        with self._lock:
            lanes = list(self._lanes)
        for lane in lanes:
            lane.stop_if_idle()


_LIVE_LANES = _LiveLanes()


class _Lane:
    """A worker's thread for concurrent blocks: runs the commands posted to that worker, in
    order. It outlives a block (the next block reuses it, with its warm allocator arena)
    and ends after :data:`LANE_IDLE_SECONDS` without one."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.block: ConcurrentBlock | None = None
        # (posting order, header, buffers, message class) of each command to run
        self.items: deque[tuple[int, bytes, list[Any], type]] = deque()
        self.pending = 0  # posted and not yet finished
        self.alive = True
        self.stopping = False
        self.cond = threading.Condition()
        self.thread = threading.Thread(
            target=self._loop, name=f"pointers-lane-{worker.id}", daemon=True
        )
        self.thread.start()
        _LIVE_LANES.add(self)

    def stop(self) -> None:
        """End the thread once it has run what was posted (used at interpreter exit)."""
        with self.cond:
            self.block = None
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=10)

    def stop_if_idle(self) -> None:
        """End the thread now if no block holds the lane (else leave it running)."""
        with self.cond:
            if self.block is not None or self.items or not self.alive:
                return
            self.stopping = True
            self.cond.notify_all()
        self.thread.join(timeout=10)

    def claim(self, block: ConcurrentBlock) -> bool:
        with self.cond:
            if not self.alive or self.stopping:
                return False
            self.block = block
            return True

    def release(self) -> None:
        with self.cond:
            self.block = None
            self.cond.notify_all()

    def put(self, seq: int, header: bytes, buffers: list[Any], kind: type) -> None:
        with self.cond:
            self.items.append((seq, header, buffers, kind))
            self.pending += 1
            self.cond.notify_all()

    def wait_idle(self) -> None:
        with self.cond:
            while self.pending:
                self.cond.wait()

    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.items:
                    if not self.stopping:
                        if self.block is not None:
                            self.cond.wait()
                            continue
                        woken = self.cond.wait(LANE_IDLE_SECONDS)
                        if woken or self.block is not None or self.items:
                            continue
                    self.alive = False  # stopped, or idle too long without a block
                    self.worker = None
                    return
                seq, header, buffers, kind = self.items.popleft()
                block = self.block
            assert block is not None
            try:
                self._run(block, seq, header, buffers, kind)
            except BaseException as e:  # noqa: BLE001 - handle_frames never raises; be safe
                block.fail(seq, e)
            finally:
                with self.cond:
                    self.pending -= 1
                    self.cond.notify_all()

    def _run(
        self,
        block: ConcurrentBlock,
        seq: int,
        header: bytes,
        buffers: list[Any],
        kind: type,
    ) -> None:
        worker = self.worker
        if block.failed and kind is not Delete:
            return  # skipped: its promises were failed with the block
        if kind is SendToPeer:  # delivered without holding this worker's lock
            try:
                msg = decode_message(header, buffers)
                assert isinstance(msg, SendToPeer)
                worker.send_to_peer_unlocked(msg)
            except Exception as e:
                block.fail(seq, RemoteError(worker.id, type(e).__name__, str(e)))
            return
        rh, rb = worker.handle_frames(header, buffers, donated=True)
        if rb or rh != block.ok_reply:
            reply = decode_message(rh, rb)
            if isinstance(reply, ErrorReply):
                block.fail(seq, RemoteError(worker.id, reply.kind, reply.message))


class ConcurrentBlock:
    """The state of one ``with concurrently(...)`` block (see the module docstring)."""

    def __init__(self, workers: Iterable[Any], ok_reply: bytes) -> None:
        from pointers.worker.base import VirtualWorker

        seen: set[int] = set()
        self.workers = []
        for w in workers:
            if (
                isinstance(w, VirtualWorker)
                and w.concurrent
                and w._block is None
                and id(w) not in seen
            ):
                seen.add(id(w))
                self.workers.append(w)
        self.ok_reply = ok_reply
        self.lanes: dict[int, _Lane] = {}
        self.seq = itertools.count()
        self.lock = threading.Lock()
        self.failed = False
        self.error: tuple[int, BaseException] | None = None
        self.reported = False
        self.promised: list[tuple[Any, int]] = []

    # -- lifecycle -------------------------------------------------------------------
    def __enter__(self) -> ConcurrentBlock:
        for w in self.workers:
            lane = w._lane
            if lane is None or not lane.claim(self):
                lane = w._lane = _Lane(w)
                lane.claim(self)
            self.lanes[id(w)] = lane
            w._block = self
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            # objects dropped during the block are freed now rather than a batch later: big
            # temporaries would otherwise pile up and every run touch fresh memory
            for w in self.workers:
                w.flush_deletes()
            self.wait_idle()
        finally:
            for w in self.workers:
                w._block = None
            for lane in self.lanes.values():
                lane.release()
            self._release_promises()
        if exc_type is None:
            self.raise_error()

    # -- client side -----------------------------------------------------------------
    def post(self, worker: Any, msg: Message) -> None:
        """Queue ``msg`` for ``worker``'s lane (called by ``VirtualWorker._exchange``)."""
        header, buffers = encode_message(msg)
        # the lane decodes later: take a snapshot of the caller's tensors now
        buffers = [b.clone() if isinstance(b, torch.Tensor) else b for b in buffers]
        if type(msg) is SendToPeer:
            peer = worker.peer_link(msg.peer)
            if peer is not None and hasattr(peer, "_block"):  # an in-process peer
                # registered before any command that uses it is queued (no lock needed:
                # that command's lane reads the promise after this)
                peer.store.promise([msg.new_id], patient=True)
                with self.lock:
                    self.promised.append((peer, msg.new_id))
        seq = next(self.seq)
        self.lanes[id(worker)].put(seq, header, buffers, type(msg))

    def wait_idle(self) -> None:
        """Wait until every lane has run everything posted to it."""
        for lane in self.lanes.values():
            lane.wait_idle()

    def barrier(self) -> None:
        """Wait for the lanes, then raise the block's first failure (once)."""
        self.wait_idle()
        self.raise_error()

    def raise_error(self) -> None:
        if self.error is not None and not self.reported:
            self.reported = True
            raise self.error[1]

    # -- lane side -------------------------------------------------------------------
    def fail(self, seq: int, error: BaseException) -> None:
        with self.lock:
            if self.error is None or seq < self.error[0]:
                self.error = (seq, error)
            first = not self.failed
            self.failed = True
            promised = list(self.promised) if first else []
        why = f"an earlier command failed: {error}"
        for peer, obj_id in promised:
            peer.store.fail_promises([obj_id], why)

    def _release_promises(self) -> None:
        by_store: dict[int, tuple[Any, list[int]]] = {}
        for peer, obj_id in self.promised:
            by_store.setdefault(id(peer), (peer, []))[1].append(obj_id)
        for peer, ids in by_store.values():
            peer.store.release_promises(ids)
        self.promised = []


def release_idle_lanes() -> None:
    """End now every lane thread that no block is using (each ends by itself after
    :data:`LANE_IDLE_SECONDS` without a block). A lane holds its worker: until its thread
    ends, a dropped worker and everything in its store stay in memory. The next block
    of a worker starts a new lane."""
    _LIVE_LANES.stop_idle()


def concurrently(*workers: Any) -> ConcurrentBlock:
    """``with concurrently(alice, bob, carol):`` runs the in-process workers' commands
    concurrently, one thread per worker, with the results of running them one by one.

    Worth it for commands on large tensors; for small ones the threads' hand-offs cost
    more than they save. Network workers and workers already in a block are unaffected.
    """
    from pointers.worker.base import OK_NONE

    return ConcurrentBlock(workers, OK_NONE)
