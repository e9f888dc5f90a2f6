"""One connection to a network worker: a channel, an ordered queue, a sender thread.

The caller encodes a message and queues it; the sender thread sends the queue in order,
many messages per ``Exec`` call, with the ids the client expects peers to deliver and
the deletes of dropped pointers. Replies resolve the futures of requests; errors of
posted messages are kept (:attr:`Connection.deferred`) until a synchronising call
raises them. The connections of one client share a
:class:`~pointers.network.context.ClientContext`, which numbers their messages and orders
their errors.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any

import grpc

from pointers.errors import PartyUnavailable, PointerError
from pointers.network.calls import SYNC_ITEM, Answers, Flight, Item
from pointers.network.context import ClientContext
from pointers.network.framing import (
    encode_envelope,
)
from pointers.network.lease import LEASE
from pointers.network.transport import EXEC, INSPECT, STALE, SYNC, Call, not_sent, rpc_error
from pointers.wire.messages import Delete, encode_message

_BATCH_FRAMES = 2048  # messages per call at most
_DELETE_BATCH = 64  # deletes of dropped pointers travel in batches (as in process)
_SYNC_DELETES = 4096  # deletes that may ride in a sync (more: a call of their own first)


class SendHold:
    """Connections whose posted commands wait together (see :func:`hold_sends`)."""

    __slots__ = ("_conns", "_lock")

    def __init__(self, conns: list[Connection]) -> None:
        self._conns = conns
        self._lock = threading.Lock()

    def start(self) -> None:
        for c in self._conns:
            with c._cond:
                c._holds.append(self)

    def release(self) -> None:
        """End the hold on every connection (idempotent): held posts leave at once."""
        with self._lock:
            conns, self._conns = self._conns, []
        for c in conns:
            with c._cond:
                if self in c._holds:
                    c._holds.remove(self)
                c._cond.notify()


@contextlib.contextmanager
def hold_sends(workers: Iterable[Any]) -> Iterator[None]:
    """Inside the block, the commands posted to the network workers among ``workers``
    wait in their queues; at its end they leave together, one call per worker (a protocol
    step's commands then cost one client -> worker latency, not one per command). A
    request or inspection sent to any of them inside ends the hold at once (a reply is
    awaited, and it may depend on what is held); so does a queue that reaches half the
    message size limit. Other workers are ignored.

    Measured with added latency (docs/benchmarks.md), holding each op of ``mpc``'s
    protocols made them slower, not faster: the sender thread already sends what queued
    up while its previous call was in flight, and holding delays the dealer's and the
    parties' first commands until the client has posted the whole op. So nothing in the
    library holds; it is for a caller whose posting is quick next to the latency."""
    conns = [c for w in workers if isinstance(c := getattr(w, "_conn", None), Connection)]
    if not conns:
        yield
        return
    hold = SendHold(conns)
    hold.start()
    try:
        yield
    finally:
        hold.release()


class Connection(Answers):
    """One channel, one ordered queue, one sender thread. Holds no reference to the
    :class:`NetworkWorker`, so dropping the worker closes the connection. Its messages
    are numbered by ``context`` (see :class:`~pointers.network.context.ClientContext`).

    Calls that carry commands only (nothing awaits an answer) leave without waiting for
    the answer of the call before, up to :data:`PIPELINE` in flight: the worker runs the
    calls of a connection in the order they left (each names its place, ``order``), so a
    protocol's next step reaches the parties while they still wait on their peers for
    the last one, instead of one latency after. A call that awaits an answer (a ``get``,
    an inspection) leaves once every call before it was answered, so errors are ordered
    as before. (A served worker runs commands, peer deliveries and inspections on three
    thread pools, so calls waiting for their turn never hold the threads that deliveries
    and lease renewals need; ``PIPELINE = 0`` turns pipelining off.)"""

    PIPELINE = 4  # command-only calls in flight at once (0: one call at a time)
    PIPELINE_AFTER = 0.005  # seconds a call is in flight before the next one may leave
    # pipelining only pays where the network's share of a call's round trip is large: on
    # loopback (about 0.5 ms) overlapping calls made ops 5-20% slower, so calls overlap
    # once the least transit time of the last 16 calls (round trip minus the time the
    # worker reports it spent) is at least this many seconds
    PIPELINE_MIN_TRANSIT = 0.002

    def __init__(
        self,
        worker_id: str,
        address: str,
        channel: grpc.Channel,
        metadata: Any,
        timeout: float,
        max_message_bytes: int,
        deadline: float | None = None,
        *,
        context: ClientContext,
    ) -> None:
        self.worker_id, self.address = worker_id, address
        self.context = context
        self.channel = channel
        self.metadata = metadata
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self._exec = Call(channel, EXEC)
        # calls that carry a sync have their own reconnection retry (a sync right after a
        # worker restarted waits for the channel, even if commands failed a moment ago)
        self._sync_exec = Call(channel, EXEC)
        self._inspect = Call(channel, INSPECT)
        # hellos and lease renewals: a method of their own (a served worker answers it on a
        # pool of its own); Inspect for a worker without it
        self._control = channel.unary_unary(LEASE)
        self._plain_inspect = channel.unary_unary(INSPECT)
        self._control_missing = False
        self._queue: deque[Item] = deque()
        self._cond = threading.Condition()
        self._closed = False
        self._running: int | None = None  # the number of the first message in flight
        self.deferred: tuple[BaseException, int] | None = None  # first failed post, its seq
        self.deletes: list[int] = []
        self.expects: list[tuple[str, int]] = []
        self.epoch: str | None = None
        self.progress = time.monotonic()  # when the sender last started or finished a call
        self.failures = 0  # calls that failed in transport (the worker may have restarted)
        self.deadline = deadline
        self._holds: list[SendHold] = []  # open holds: posts wait in the queue
        self._urgent = 0  # queued requests and inspections (they end every hold)
        self._queued_bytes = 0
        self.calls = 0  # Exec calls made (each carries a batch of commands)
        # calls of commands only that left before the answer of the one before (oldest
        # first): (gRPC future, its items, its frame count, its announcements)
        self._flight: deque[Flight] = deque()
        self._token = os.urandom(8).hex()  # names this connection's order of calls
        self._order = 0
        self._sent_at = 0.0  # when the last call left
        self._transits: deque[float] = deque(maxlen=16)  # network time of recent calls
        self.transit = 0.0  # the least of them (0: none measured yet)
        context.register(self)
        self._thread = threading.Thread(
            target=self._run, name=f"pointers-send-{worker_id}", daemon=True
        )
        self._thread.start()

    # -- caller side ---------------------------------------------------------------------
    def submit(self, item: Item) -> None:
        with self._cond:
            if self._closed:
                raise PointerError(f"the connection to worker {self.worker_id!r} is closed")
            if not self._queue:
                self.progress = time.monotonic()
            item.seq = self.context.tick()  # under the lock: the queue is in number order
            self._queue.append(item)
            self._queued_bytes += item.size
            urgent = item.future is not None
            if urgent:
                self._urgent += 1
            holds = list(self._holds) if urgent else []
            self._cond.notify()
        for hold in holds:  # a reply is awaited: what is held with it must leave now
            hold.release()

    def _held(self) -> bool:
        """Whether the queue waits for a hold to end (called with the lock held)."""
        return (
            bool(self._holds)
            and not self._urgent
            and self._queued_bytes < self.max_message_bytes // 2
        )

    def busy_before(self, seq: int) -> bool:
        """Whether a message numbered below ``seq`` is still queued or in flight here."""
        with self._cond:
            running = self._running
            if running is not None and running < seq:
                return True
            return bool(self._queue) and self._queue[0].seq < seq

    def inspect_direct(
        self, info: dict[str, Any], timeout: float, wait_for_ready: bool = False
    ) -> dict[str, Any]:
        """A hello or a lease renewal, outside the queue (the ``Lease`` method)."""
        data = encode_envelope(info, [])
        try:
            try:
                resp = self._control_call()(
                    data, timeout=timeout, metadata=self.metadata, wait_for_ready=wait_for_ready
                )
            except grpc.RpcError as e:
                if not self._unimplemented(e):
                    raise
                resp = self._plain_inspect(
                    data, timeout=timeout, metadata=self.metadata, wait_for_ready=wait_for_ready
                )
        except grpc.RpcError as e:
            raise rpc_error(e, self.worker_id, self.address, "a hello") from None
        return self._inspect_reply(resp)

    def renew_lease(self, timeout: float) -> Any:
        """Renew this session's lease at the worker without waiting for the answer: a gRPC
        future that ends within ``timeout`` seconds (see :mod:`pointers.network.lease`)."""
        future = self._control_call().future(
            encode_envelope({"what": "lease"}, []), timeout=timeout, metadata=self.metadata
        )

        def done(f: Any) -> None:
            try:
                f.result()
            except grpc.RpcError as e:
                self._unimplemented(e)
            except Exception:  # noqa: S110 - the next call reports an unreachable worker
                pass

        future.add_done_callback(done)
        return future

    def _control_call(self) -> Any:
        return self._plain_inspect if self._control_missing else self._control

    def _unimplemented(self, e: grpc.RpcError) -> bool:
        """Whether the worker has no ``Lease`` method (then hellos and renewals go by
        ``Inspect`` from now on)."""
        code = e.code() if hasattr(e, "code") else None
        if code == grpc.StatusCode.UNIMPLEMENTED:
            self._control_missing = True
            return True
        return False

    def close(self, timeout: float = 5.0) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify()
        if threading.current_thread() is not self._thread:  # (a pointer freed by the sender)
            self._thread.join(timeout)
        self.channel.close()

    # -- sender thread -------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._landed():
                    if self._closed or (
                        self._queue
                        and not self._held()
                        and not self._gather()
                        # a full pipeline waits for its oldest call, not for all of them
                        # (a batch formed now would wait until every call landed)
                        and len(self._flight) < max(self.PIPELINE, 1)
                    ):
                        break
                    self._cond.wait(self._gather() or None)
                if self._landed():
                    head_call: Flight | None = self._flight[0]
                else:
                    head_call = None
            if head_call is not None:  # answers are taken in the order the calls left
                self._land(wait=True)
                continue
            with self._cond:
                if not self._queue and self._closed:
                    break
                if not self._queue:
                    continue
                batch: list[Item] = []
                size = 0
                while self._queue:
                    head = self._queue[0]
                    if head.what is not None and head.what != SYNC_ITEM:
                        break
                    if batch and (
                        len(batch) >= _BATCH_FRAMES
                        or size + head.size > self.max_message_bytes // 2
                    ):
                        break
                    if (
                        head.future is not None
                        and head.what != SYNC_ITEM
                        and not head.reads
                        and batch
                        and self._flight
                    ):
                        # a request waits for the calls in flight (errors stay ordered):
                        # the commands before it leave now, pipelined, not with it later
                        break
                    batch.append(self._queue.popleft())
                    size += head.size
                    if head.future is not None:
                        self._urgent -= 1
                    if head.what == SYNC_ITEM:  # a sync ends its batch (it answers for it)
                        break
                inspect = None
                if not batch and self._queue:
                    inspect = self._queue.popleft()
                    self._urgent -= inspect.future is not None
                self._queued_bytes -= size + (inspect.size if inspect is not None else 0)
                if self._running is None:
                    self._running = batch[0].seq if batch else getattr(inspect, "seq", None)
                # the deletes that may travel with this batch: those of pointers dropped
                # before it left the queue, whose commands are all in it or sent before
                # (a pointer is dropped after the commands that use it were posted); none
                # while commands posted earlier still wait in the queue
                ready_deletes = 0 if self._queue else len(self.deletes)
            self.progress = time.monotonic()
            # commands only (no answer awaited, nothing to inspect) leave without waiting for
            # the calls still in flight (at most PIPELINE); the worker runs them in order
            # (and a sync: its answer is taken after the answers of the calls before it)
            synced = bool(batch) and batch[-1].what == SYNC_ITEM
            pipelined = (
                inspect is None
                and bool(batch)
                and all(it.future is None or it.what == SYNC_ITEM or it.reads for it in batch)
            )
            try:
                if (
                    pipelined
                    and len(self._flight) < self.PIPELINE
                    and self.transit >= self.PIPELINE_MIN_TRANSIT
                ):
                    bulk = ready_deletes if synced or ready_deletes >= _DELETE_BATCH else 0
                    self._send_batch(batch, bulk, pipelined=True)
                    continue
                while self._flight:  # an answer is awaited: everything before it lands first
                    self._land(wait=True)
                if (
                    not batch
                    and inspect is not None
                    and inspect.what == "stats"
                    and not self.expects
                    and len(self.deletes) <= _SYNC_DELETES
                ):
                    # a sync with no commands before it: the deletes ride in the
                    # inspection (one call, not two; the worker runs them first)
                    _, ids = self._take_pending(ready_deletes)
                    if ids:
                        inspect.info = {**(inspect.info or {}), "deletes": ids}
                elif batch or (inspect is not None and inspect.flush):
                    # deletes travel as in process: before an answer is awaited, or in bulk
                    with_deletes = (
                        (inspect is not None and inspect.flush)
                        or any(it.future is not None for it in batch)
                        or len(self.deletes) >= _DELETE_BATCH
                    )
                    self._send_batch(batch, ready_deletes if with_deletes else 0)
                if inspect is not None:
                    self._send_inspect(inspect)
            except BaseException as e:  # never let the sender die silently
                for it in batch + ([inspect] if inspect is not None else []):
                    if it.future is not None and not it.future._event.is_set():
                        it.future.fail(e)
            self.progress = time.monotonic()
            with self._cond:
                self._running = None
            self.context.settled()
        while self._flight:
            self._land(wait=True)
        if self.deletes:  # closing: release what dropped pointers still hold (best effort)
            try:
                self._send_batch([], len(self.deletes))
            except Exception:  # noqa: S110 - the worker may be gone already
                pass

    def _gather(self) -> float:
        """Seconds to let commands gather before the next call leaves while another is in
        flight (0: it may leave now). Called with the lock held. A worker that answers
        within :data:`PIPELINE_AFTER` gets the next commands in one call with its answer
        (as many as queued meanwhile: fewer, larger calls); one that takes longer (it
        waits for its peers, or the link is slow) gets them without waiting for it."""
        if not self._flight:
            return 0.0
        left = self._sent_at + self.PIPELINE_AFTER - time.monotonic()
        return left if left > 0 else 0.0

    def _landed(self) -> bool:
        """Whether the oldest call in flight has its answer (called with the lock held)."""
        return bool(self._flight) and self._flight[0].call.done()

    def _land(self, wait: bool) -> None:
        """Take the answer of the oldest call in flight (waiting for it if ``wait``)."""
        flight = self._flight[0]
        call, sent, nframes, expects, sync = (
            flight.call,
            flight.sent,
            flight.nframes,
            flight.expects,
            flight.sync,
        )
        if not wait and not call.done():
            return
        try:
            resp: bytes | None = call.result()
            error: grpc.RpcError | None = None
        except grpc.RpcError as e:
            resp, error = None, e
            if sync is not None and not_sent(e):
                # a sync that never reached the worker (down, or just restarted): sent once
                # more, waiting for the channel (Call's retry), as the first of its order
                # (the calls after it were not sent either, or wait for this one); calls
                # of commands only fail at once, so the error reaches the client quickly
                info = {**flight.info, "order": [*flight.info["order"][:2], 0]}
                try:
                    resp = self._sync_exec(
                        encode_envelope(info, flight.frames),
                        timeout=self.timeout,
                        metadata=self.metadata,
                    )
                    error = None
                except grpc.RpcError as again:
                    error = again
        except Exception as e:  # (cancelled at close)
            resp, error = None, None
            lost = PartyUnavailable(f"a call to {self.worker_id!r}: {e}")
            self._fail_all(sent, lost)
            if sync is not None:
                sync.future.fail(lost)  # type: ignore[union-attr]
        with self._cond:
            self._flight.popleft()
            self._running = self._flight[0].first_seq if self._flight else None
        if resp is not None or error is not None:
            self._answer(sent, nframes, expects, resp, error, sync, flight.sent_at)
        self.progress = time.monotonic()
        self.context.settled()

    def _take_pending(self, ndeletes: int) -> tuple[list[list[Any]], list[int]]:
        """Expected deliveries (always) and the first ``ndeletes`` deletes of dropped
        pointers."""
        expects: dict[str, list[int]] = {}
        n = len(self.expects)
        if n:
            taken = self.expects[:n]
            del self.expects[:n]
            for peer, obj_id in taken:
                expects.setdefault(peer, []).append(obj_id)
        deletes: list[int] = []
        if ndeletes:
            n = min(ndeletes, len(self.deletes))
            if n:
                deletes = self.deletes[:n]
                del self.deletes[:n]
        return [[p, ids] for p, ids in expects.items()], deletes

    def _send_batch(self, batch: list[Item], ndeletes: int, pipelined: bool = False) -> None:
        expects, deletes = self._take_pending(ndeletes)
        frames: list[Any] = []
        sent: list[Item] = []
        sync: Item | None = None  # a sync: the worker's answer to it rides in the reply
        raised = self.context.raised
        for it in batch:
            if it.what == SYNC_ITEM:
                assert it.future is not None
                held = self.take_deferred()
                if held is not None:  # an earlier post failed: the sync reports it
                    it.future.fail(*held)
                else:
                    sync = it
                continue
            if it.future is not None:
                held = self.take_deferred()
                if held is not None:  # an earlier post failed: report it, do not run this
                    it.future.fail(*held)
                    continue
            it.stale = it.seq < raised
            flags = (SYNC if it.future is not None else 0) | (STALE if it.stale else 0)
            assert it.frame is not None
            frames.append((flags, it.frame[0], it.frame[1]))
            sent.append(it)
        if deletes:
            header, _ = encode_message(Delete(deletes))
            frames.append((STALE, header, []))
        if not frames and not expects and sync is None:
            return
        info: dict[str, Any] = {"expect": expects} if expects else {}
        if sync is not None:
            info["sync"] = True
            programs = (sync.info or {}).get("programs")
            if programs is not None:  # it first waits for the client's programs there
                info["programs"] = programs
        if self.deadline is not None:
            info["deadline"] = self.deadline
        # the calls' order: one that leaves while others are in flight runs after them
        self._order += 1
        # (1: it must run after call number - 1, still in flight when this one left)
        info["order"] = [self._token, self._order, 1 if pipelined and self._flight else 0]
        self.calls += 1
        data = encode_envelope(info, frames)
        self._sent_at = time.monotonic()
        if pipelined:
            # the worker runs it after the calls in flight, however long they run: its own
            # timeout counts from the end of theirs (with none in flight, from now)
            with self._cond:
                before = self._flight[-1].expires if self._flight else self._sent_at
            timeout = self.timeout + max(before - self._sent_at, 0.0)
            call = self._exec.future(data, timeout=timeout, metadata=self.metadata)
            first = sent[0].seq if sent else (sync.seq if sync is not None else 0)
            with self._cond:
                self._flight.append(
                    Flight(
                        call,
                        sent,
                        len(frames),
                        expects,
                        sync,
                        info,
                        frames if sync is not None else [],  # (kept only to resend a sync)
                        first,
                        self._sent_at,
                        self._sent_at + timeout,
                    )
                )
            call.add_done_callback(self._wake)
            return
        try:
            resp: bytes | None = (self._exec if sync is None else self._sync_exec)(
                data, timeout=self.timeout, metadata=self.metadata
            )
            error: grpc.RpcError | None = None
        except grpc.RpcError as e:
            resp, error = None, e
        self._answer(sent, len(frames), expects, resp, error, sync, self._sent_at)

    def _wake(self, _call: Any) -> None:
        with self._cond:
            self._cond.notify()

    def _send_inspect(self, it: Item) -> None:
        assert it.future is not None and it.what is not None
        try:
            info = {"what": it.what, **(it.info or {})}
            resp = self._inspect(
                encode_envelope(info, []), timeout=self.timeout, metadata=self.metadata
            )
            it.future.set(self._inspect_reply(resp))
        except grpc.RpcError as e:
            self.failures += 1
            it.future.fail(rpc_error(e, self.worker_id, self.address, "an inspection"))
        except PointerError as e:
            it.future.fail(e)
