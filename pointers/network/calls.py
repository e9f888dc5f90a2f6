"""What a client connection queues, and how a call's answer resolves it.

* :class:`Item`: one queued message (a command, a request awaiting its :class:`Future`,
  a sync, or an inspection), numbered by the connection's
  :class:`~pointers.network.context.ClientContext`;
* :class:`Flight`: a call of commands that left before the answer of the one before it
  (pipelining, :class:`~pointers.network.connection.Connection`);
* :class:`Answers`: the part of a connection that resolves a call's items from its answer
  (or its transport error), keeps the first error of a posted message until a
  synchronising call raises it (:attr:`Answers.deferred`), and turns a worker's error
  reports into exceptions.

Imports the context, the framing and the transport; never
:mod:`pointers.network.connection`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

import grpc

from pointers.errors import DecodeError, LimitExceeded, PartyUnavailable, PointerError, RemoteError
from pointers.network.context import ClientContext
from pointers.network.framing import FrameError, decode_envelope, info_field, is_error_header
from pointers.network.transport import rpc_error
from pointers.wire.messages import ErrorReply, decode_message

# a sync (NetworkWorker.sync): it rides in an Exec call, pipelined like commands, and the
# worker answers it after the call's commands ran and their deliveries were answered
SYNC_ITEM = "sync"


class Future:
    """The reply to one request. ``origin`` is the number of the message whose error it
    carries: the request's own, or an earlier post's that failed before it."""

    __slots__ = ("_event", "value", "error", "origin")

    def __init__(self) -> None:
        self._event = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.origin: int | None = None

    def set(self, value: Any) -> None:
        self.value = value
        self._event.set()

    def fail(self, error: BaseException, origin: int | None = None) -> None:
        self.error = error
        self.origin = origin
        self._event.set()

    def wait(self, conn: Answers) -> Any:
        """The result; gives up only when the sender made no progress for the timeout."""
        while not self._event.wait(0.5):
            idle = time.monotonic() - conn.progress
            if idle > conn.timeout + 5.0:
                raise PartyUnavailable(
                    f"worker {conn.worker_id!r} at {conn.address} did not answer for {idle:.0f} s",
                    conn.worker_id,
                )
        if self.error is not None:
            raise self.error
        return self.value


class Item:
    """One queued unit: a message frame (``future`` set when a reply is awaited) or an
    inspection (``what``)."""

    __slots__ = ("frame", "size", "future", "what", "info", "flush", "seq", "stale", "reads")

    def __init__(
        self,
        frame: tuple[bytes, list[bytes]] | None,
        future: Future | None,
        what: str | None = None,
        flush: bool = False,
        info: dict[str, Any] | None = None,
    ) -> None:
        self.frame = frame
        self.size = 0 if frame is None else len(frame[0]) + sum(len(b) for b in frame[1])
        self.future = future
        self.what = what
        self.info = info  # more fields of an inspection
        self.flush = flush
        # a request that only reads (a fetch that keeps the object): it may leave while
        # calls before it are in flight; its value counts only if none of them failed
        self.reads = False
        self.seq = 0  # numbered by the connection's context when queued
        self.stale = False  # posted before an error the caller has seen: ignore its error


class Flight:
    """A call of commands that left before the answer of the call before it: its gRPC
    future, its items, how many frames it carried, its announcements, the sync that rode
    in it, (with a sync) what it was made of, to send it again if it never reached the
    worker, and when its gRPC deadline ends (``expires``, on ``time.monotonic``)."""

    __slots__ = (
        "call",
        "sent",
        "nframes",
        "expects",
        "sync",
        "info",
        "frames",
        "first_seq",
        "sent_at",
        "expires",
    )

    def __init__(
        self,
        call: Any,
        sent: list[Item],
        nframes: int,
        expects: list[list[Any]],
        sync: Item | None,
        info: dict[str, Any],
        frames: list[Any],
        first_seq: int,
        sent_at: float,
        expires: float = math.inf,
    ) -> None:
        self.call, self.sent, self.nframes, self.expects = call, sent, nframes, expects
        self.sync, self.info, self.frames, self.first_seq = sync, info, frames, first_seq
        self.sent_at, self.expires = sent_at, expires


class Answers:
    """How a :class:`~pointers.network.connection.Connection` (a subclass) takes the
    answers of its calls. Its attributes are set by the connection's ``__init__``."""

    worker_id: str
    address: str
    context: ClientContext
    timeout: float
    progress: float  # when the sender last started or finished a call
    deferred: tuple[BaseException, int] | None  # first failed post, its seq
    expects: list[tuple[str, int]]
    epoch: str | None
    failures: int  # calls that failed in transport (the worker may have restarted)
    transit: float  # the least network time of recent calls (0: none measured yet)
    _transits: deque[float]

    def take_deferred(self) -> tuple[BaseException, int] | None:
        """The pending error of a posted message and the message's number, unless an error
        raised since covers it."""
        deferred, self.deferred = self.deferred, None
        if deferred is None or deferred[1] < self.context.raised:
            return None
        return deferred

    def _note_transit(self, seconds: float) -> None:
        """One call's network time (its round trip less the worker's own time)."""
        self._transits.append(max(seconds, 0.0))
        self.transit = min(self._transits)

    def _answer(
        self,
        sent: list[Item],
        nframes: int,
        expects: list[list[Any]],
        resp: bytes | None,
        rpc_failure: grpc.RpcError | None,
        sync: Item | None = None,
        sent_at: float | None = None,
    ) -> None:
        """Resolve the items of one call from its answer (or its transport error); a
        ``sync`` that rode in the call gets the worker's answer to it, after the items.
        ``sent_at``: when the call left (its network time is noted from the answer)."""
        rinfo, failure = self._answer_items(sent, nframes, expects, resp, rpc_failure, sent_at)
        if sync is None:
            return
        assert sync.future is not None
        if isinstance(failure, grpc.RpcError):  # the call's transport error
            sync.future.fail(rpc_error(failure, self.worker_id, self.address, "a sync"))
            return
        if failure is not None:  # a malformed answer, or an error for the whole call
            sync.future.fail(failure)
            return
        try:
            error = info_field(rinfo, "sync_error", list, None)
        except FrameError as e:
            sync.future.fail(self.malformed(e))
            return
        if error is not None:
            sync.future.fail(self.info_error(error))
        elif not isinstance(rinfo.get("stats"), dict):
            sync.future.fail(self.malformed("it did not answer the sync"))
        else:
            sync.future.set(rinfo)

    def _answer_items(
        self,
        sent: list[Item],
        nframes: int,
        expects: list[list[Any]],
        resp: bytes | None,
        rpc_failure: grpc.RpcError | None,
        sent_at: float | None = None,
    ) -> tuple[dict[str, Any], BaseException | None]:
        """Resolve the items; returns the answer's info and, if the whole call failed,
        why (its transport error as gRPC raised it, or the error the items got)."""
        try:
            if rpc_failure is not None:
                raise rpc_failure
            assert resp is not None
            rinfo, replies = decode_envelope(resp)
            self._note_epoch(rinfo)
            took = rinfo.get("took")
            if sent_at is not None and isinstance(took, int | float):
                self._note_transit(time.monotonic() - sent_at - float(took))
            batch_error = info_field(rinfo, "error", list, None)
            answered = _answers(replies, nframes)
        except grpc.RpcError as e:
            self.failures += 1
            # the announcements may not have arrived: they travel again with the next call
            # (an id announced twice is harmless; one never announced is refused a delivery)
            self.expects[:0] = [(peer, i) for peer, ids in expects for i in ids]
            self._fail_all(sent, rpc_error(e, self.worker_id, self.address, "a command"))
            return {}, e
        except FrameError as e:
            malformed = self.malformed(e)
            self._fail_all(sent, malformed)
            return {}, malformed
        if batch_error is not None:
            failed = self.info_error(batch_error)
            self._fail_all(sent, failed)
            return {}, failed
        pending: tuple[BaseException, int] | None = None  # first failed post not reported
        for k, it in enumerate(sent):
            reply = answered.get(k)
            if reply is None:  # a post that succeeded; the worker answers every request
                if it.future is not None:
                    it.future.fail(self.malformed("it left out the answer to a request"))
                continue
            if not is_error_header(reply[0]):
                if it.future is not None:
                    held = pending or (self.take_deferred() if it.reads else None)
                    if held is not None:  # a read that left before an earlier post failed:
                        it.future.fail(*held)  # as if it had waited (it is not reported)
                        pending = None
                    else:
                        it.future.set(reply)
                continue
            try:
                err = decode_message(reply[0], reply[1])
                if not isinstance(err, ErrorReply):
                    raise DecodeError(f"an error answer holds a {err.KIND!r} message")
            except DecodeError as e:
                error: PointerError = self.malformed(e)
                skipped = False
            else:
                error = self.remote_error(err.kind, err.message)
                skipped = err.kind == "Skipped"
            if it.future is not None:
                if skipped and pending is not None:
                    it.future.fail(*pending)  # the post that failed before it
                else:
                    it.future.fail(error)
                pending = None
            elif not it.stale and pending is None:
                pending = (error, it.seq)
        if pending is not None and self.deferred is None:
            self.deferred = pending
        return rinfo, None

    def _fail_all(self, sent: list[Item], error: BaseException) -> None:
        pending: int | None = None  # a post after the batch's last request (which reports it)
        for it in sent:
            if it.future is not None:
                # (its origin: the first post before it that the same failure took down)
                it.future.fail(error, pending)
                pending = None
            elif not it.stale and pending is None:
                pending = it.seq
        if pending is not None and self.deferred is None:
            self.deferred = (error, pending)

    def _inspect_reply(self, resp: bytes) -> dict[str, Any]:
        try:
            info, _ = decode_envelope(resp)
            error = info_field(info, "error", list, None)
        except FrameError as e:
            raise self.malformed(e) from None
        self._note_epoch(info)
        if error is not None:
            raise self.info_error(error)
        return info

    def _note_epoch(self, info: dict[str, Any]) -> None:
        epoch = info.get("epoch")
        if isinstance(epoch, str):
            self.epoch = epoch

    def malformed(self, why: Any) -> DecodeError:
        """The error for a reply that breaks the protocol (a worker's bug, or a hostile
        worker): the call fails with it, the client goes on."""
        return DecodeError(
            f"worker {self.worker_id!r} at {self.address} sent a malformed reply: {why}"
        )

    def info_error(self, error: list[Any]) -> PointerError:
        """The error an envelope's ``error`` field reports: ``[kind, message]``."""
        if len(error) < 2 or not isinstance(error[0], str) or not isinstance(error[1], str):
            return self.malformed("its error field is not [kind, message]")
        return self.remote_error(error[0], error[1])

    def remote_error(self, kind: Any, message: Any) -> PointerError:
        kind, message = str(kind), str(message)
        if kind == "PartyUnavailable":
            return PartyUnavailable(f"worker {self.worker_id!r} reports: {message}")
        if kind == "LimitExceeded":
            return LimitExceeded(f"worker {self.worker_id!r}: {message}")
        return RemoteError(self.worker_id, kind, message)


def _answers(replies: list[Any], sent: int) -> dict[int, tuple[Any, list[Any]]]:
    """The answers of a reply envelope by the index of the frame they answer; each frame
    is answered at most once, and only frames that were sent."""
    answered: dict[int, tuple[Any, list[Any]]] = {}
    for k, header, buffers in replies:
        if not 0 <= k < sent or k in answered:
            raise FrameError(f"an answer to frame {k} of {sent} (out of range or twice)")
        answered[k] = (header, buffers)
    return answered
