"""One client session's deliveries to one peer: :class:`PeerLink` (posted without waiting
for the answer, over gRPC or over the data plane for a large tensor, bounded in bytes in
flight, paused when the receiver asks: flow control), and :class:`DeliveryFailed`. Used by
:class:`~pointers.network.peers.PeerLinks`, which makes the links.

Imports the data plane, the wire helpers (framing, transport) and lower layers; never
:mod:`pointers.network.peers` or :mod:`pointers.network.server`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import torch

from pointers.errors import PartyUnavailable, PointerError
from pointers.network.dataplane import (
    PAUSED,
    THRESHOLD,
    DataLink,
    encode_frame_header,
)
from pointers.network.framing import (
    FrameError,
    buffer_bytes,
    decode_envelope,
    encode_envelope,
    info_field,
    is_error_header,
)
from pointers.network.transport import (
    not_sent,
    rpc_error,
)
from pointers.wire.messages import ErrorReply, Reply, decode_message, encode_message
from pointers.worker.base import Frames

OK_NONE, _ = encode_message(Reply(None))

RESEND_WAIT = 3.0  # seconds a delivery that was not sent waits for the peer's channel
ROOM_POLL = (0.02, 0.5)  # s between a paused link's questions for room: first, at most


class DeliveryFailed(PointerError):
    """An object this worker queued for a peer did not arrive (the peer refused it)."""


class PeerLink:
    """How one namespace delivers to one peer, over gRPC.

    Deliveries do not wait for the peer's answer (:meth:`post_frames`): the envelope is
    encoded at once (a snapshot: later writes to the tensor do not travel) and the call
    leaves at once on a thread of the server's post pool, which waits for its answer. The
    peer stores deliveries by id, in whatever order they come, so deliveries posted back
    to back cost one latency together, not one each: a party that opens values in a
    round sends to every peer and goes on with its own work, and the crypto provider's
    corrections leave one after the other without a latency each.
    A failure (the peer unreachable, or its refusal) goes to the ``on_failure`` callback
    of the delivery (the namespace reports a refusal to its client at its next call),
    and a peer that refused is told (``delivery_failed``, best effort) so that a command
    waiting there for the object fails at once instead of at its deadline.
    At most :data:`MAX_QUEUED_BYTES` are in flight per link; a delivery beyond waits for
    room.

    Flow control: the peer answers a delivery with a request to pause once this session's
    deliveries that it holds before their announcement, or stored and not read yet, take
    more than its bound (``ServerConfig.max_held_bytes``, see
    :meth:`~pointers.network.waiting.WaitingStore.room`). The link then asks the peer,
    before each later delivery and with a small gRPC call, whether it may deliver that id
    (every :data:`ROOM_POLL`), and the delivering command waits meanwhile (its lock set
    aside): a crypto provider that runs ahead of a slower party slows down instead of that
    party's memory growing. The peer makes room while a command of its session waits for
    anything from this worker, and while that session is stalled; the wait ends at the
    deadline in any case (the delivery then goes; the peer's storage limit still applies).
    """

    MAX_QUEUED_BYTES = 512 * 1024 * 1024
    # bytes in flight (not answered yet) for PRESSED_SECONDS after the peer last asked this
    # link to pause: its answers (the next request to pause) then come within this many
    # bytes, not after what the sockets' buffers hold (at least one delivery always goes)
    PRESSED_QUEUED_BYTES = 1 << 20
    PRESSED_SECONDS = 10.0

    def __init__(
        self,
        server: Any,
        peer: str,
        address: str,
        client: str,
        session: str = "",  # (PeerLinks)
    ) -> None:
        self.server, self.peer, self.address, self.client = server, peer, address, client
        self.session = session
        self._cond = threading.Condition()
        self._queued_bytes = 0  # bytes of the deliveries in flight
        self._busy = 0  # deliveries in flight
        self._closed = False
        self._paused = False  # the peer asked this session's deliveries to wait for room
        self._pressed_until = 0.0  # until when PRESSED_QUEUED_BYTES are in flight at most
        self.pauses = 0  # deliveries that waited for room (tests, benchmarks)

    def _encode(self, info: dict[str, Any], frames: list[Any]) -> bytes:
        head: dict[str, Any] = {"client": self.client, "from": self.server.id}
        if self.session:
            head["session"] = self.session
        return encode_envelope({**head, **info}, frames)

    def _send(self, data: bytes) -> Any:
        server = self.server
        call = server.peer_call(self.peer, self.address)
        try:
            resp = call(data, timeout=server.config.deadline, metadata=server.call_metadata)
        except grpc.RpcError as e:
            raise PartyUnavailable(self._unreachable(e), self.peer) from None
        _, out = decode_envelope(resp)
        if len(out) != 1:
            raise FrameError("a delivery reply carries exactly one message")
        return out[0]

    def _unreachable(self, e: grpc.RpcError) -> str:
        server = self.server
        if not server.config.peers:  # a client-given address: say nothing about it
            return (
                f"worker {server.id!r} could not deliver to its peer {self.peer!r} at "
                f"{self.address} (unreachable, or not that worker)"
            )
        err = rpc_error(e, self.peer, self.address, "a delivery")
        return f"worker {server.id!r} could not deliver to its peer: {err}"

    def _call(self, info: dict[str, Any], frames: list[Any]) -> Any:
        return self._send(self._encode(info, frames))

    def handle_frames(self, header: bytes, buffers: list[Any]) -> Frames:
        """A delivery that waits for the peer's answer."""
        _, rh, rb = self._call({}, [(0, header, buffers)])
        return rh, rb

    # -- deliveries that do not wait -----------------------------------------------------
    def post_frames(
        self,
        header: bytes,
        buffers: list[Any],
        obj_id: int,
        on_failure: Callable[[str], None] | None = None,
    ) -> None:
        """Send a delivery of ``obj_id`` (encoded now) without waiting for its answer;
        ``on_failure(reason)`` runs on a gRPC thread if it does not arrive. One tensor of
        at least :data:`~pointers.network.dataplane.THRESHOLD` bytes goes over the data
        plane when both workers serve one (written from the tensor's buffer before this
        returns)."""
        if (
            self.server.data_plane is not None
            and len(buffers) == 1
            and isinstance(buffers[0], torch.Tensor)
            and buffers[0].numel() * buffers[0].element_size() >= THRESHOLD
            and len(header) < 32 << 10
        ):
            data = self.server.data_link(self.peer, self.address)
            if data is not None:
                self._post_data(data, header, buffers[0], obj_id, on_failure)
                return
        self._post(self._encode({}, [(0, header, buffers)]), obj_id, on_failure)

    @property
    def paused(self) -> bool:
        """Whether the peer asked this session's deliveries to wait for room."""
        return self._paused

    def wait_room(self, obj_id: int, size: int) -> None:
        """The peer asked this session to pause: ask it (a small gRPC call, every
        :data:`ROOM_POLL`) whether ``obj_id`` (``size`` bytes) may come now, until it says
        yes, the link closes, or the deadline passes (then it goes anyway: the peer's
        limits still apply). A question that fails lets the delivery go (which reports
        the failure). The caller sets its namespace's lock aside meanwhile
        (:meth:`ServedWorker.deliver`)."""
        server = self.server
        self.pauses += 1
        end = time.monotonic() + server.config.deadline
        wait = ROOM_POLL[0]
        ask = self._encode({"ask": "room", "id": obj_id, "size": size}, [])
        while self._paused and not self._closed and time.monotonic() < end:
            try:
                call = server.peer_call(self.peer, self.address)
                reply = call.blocking(
                    ask,
                    timeout=min(server.config.deadline, 10.0),
                    metadata=server.call_metadata,
                )
                info, _ = decode_envelope(reply)
                if info_field(info, "room", bool, True):
                    break
            except Exception:  # noqa: BLE001 - the delivery itself reports what is wrong
                break
            time.sleep(min(wait, max(end - time.monotonic(), 0.0)))
            wait = min(2 * wait, ROOM_POLL[1])
        self._paused = False

    def _post_data(
        self,
        data: DataLink,
        header: bytes,
        tensor: torch.Tensor,
        obj_id: int,
        on_failure: Callable[[str], None] | None,
    ) -> None:
        """A delivery over the data plane: written now, answered on the link's reader."""
        info: dict[str, Any] = {"client": self.client, "from": self.server.id}
        if self.session:
            info["session"] = self.session
        head = encode_frame_header(info, obj_id, header, tensor)
        body = buffer_bytes(tensor)
        size = len(head) + len(body)
        self._reserve(size)
        try:
            self.server.peer_call(self.peer, self.address).pace(size)
        except BaseException:
            self._settle(size)
            raise

        def done(why: str | None) -> None:
            self._answered(size, obj_id, on_failure, why)

        data.send(head, body, done)

    def delivery_failed(self, obj_id: int, reason: str) -> None:
        """Tell the peer (after what is queued before) that ``obj_id`` will not come."""
        self._post(self._encode({"failed": [obj_id, reason[:2000]]}, []), None, None)

    def _post(
        self, data: bytes, obj_id: int | None, on_failure: Callable[[str], None] | None
    ) -> None:
        self._reserve(len(data))
        size = len(data)
        try:
            server = self.server
            call = server.peer_call(self.peer, self.address)
            call.pace(size)  # (a simulated link: the sender waits, as a socket would)
            server.post_pool.submit(self._send_posted, call, data, size, obj_id, on_failure)
        except BaseException:
            self._settle(size)
            raise

    def _reserve(self, size: int) -> None:
        """Wait for room for ``size`` bytes in flight on this link; count them."""
        with self._cond:
            while (
                self._queued_bytes
                and self._queued_bytes + size
                > (
                    self.PRESSED_QUEUED_BYTES
                    if time.monotonic() < self._pressed_until
                    else self.MAX_QUEUED_BYTES
                )
                and not self._closed
            ):
                self._cond.wait(1.0)
            if self._closed:
                raise PartyUnavailable(
                    f"worker {self.server.id!r}: this session's link to {self.peer!r} is closed",
                    self.peer,
                )
            self._queued_bytes += size
            self._busy += 1

    def _send_posted(
        self,
        call: Any,
        data: bytes,
        size: int,
        obj_id: int | None,
        on_failure: Callable[[str], None] | None,
    ) -> None:
        """Send a posted delivery and take its answer, on a thread of the server's post
        pool: a blocking call there costs about half the CPU of a gRPC future answered
        on a callback (grpcio starts a polling thread for futures whenever none is in
        flight on the channel: at every delivery, when they do not overlap). A delivery
        that was never sent (the channel to a restarted peer not connected yet) is sent
        once more, waiting for the channel."""
        server = self.server
        why: str | None = None
        try:
            try:
                reply = call.blocking(
                    data, timeout=server.config.deadline, metadata=server.call_metadata
                )
            except grpc.RpcError as e:
                if not not_sent(e):
                    raise
                reply = call.blocking(
                    data,
                    timeout=min(server.config.deadline, RESEND_WAIT),
                    metadata=server.call_metadata,
                    wait_for_ready=True,
                )
            info, out = decode_envelope(reply)
            if len(out) != 1:
                raise FrameError("a delivery reply carries exactly one message")
            if info.get("pause") is True:
                why = PAUSED
            _, rh, rb = out[0]
            if is_error_header(rh):
                err = decode_message(rh, rb)
                why = (
                    f"{err.kind}: {err.message}"
                    if isinstance(err, ErrorReply)
                    else "the peer answered with an error"
                )
        except grpc.RpcError as e:
            why = f"PartyUnavailable: {self._unreachable(e)}"
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        self._answered(size, obj_id, on_failure, why)

    def _answered(
        self,
        size: int,
        obj_id: int | None,
        on_failure: Callable[[str], None] | None,
        why: str | None,
    ) -> None:
        """A delivery in flight was answered (``why``: None, or why it failed): report a
        failure, tell a peer that refused it, and free its room on the link."""
        server = self.server
        if why == PAUSED:  # delivered; the peer asks the next ones to wait for room
            self._paused = True
            self._pressed_until = time.monotonic() + self.PRESSED_SECONDS
            why = None
        try:
            if why is not None and obj_id is not None:
                if on_failure is not None:
                    on_failure(why)
                if not why.startswith("PartyUnavailable"):  # a peer that answered: tell it
                    notice = self._encode({"failed": [obj_id, why[:2000]]}, [])
                    server.peer_call(self.peer, self.address).future(
                        notice, timeout=server.config.deadline, metadata=server.call_metadata
                    )
        except Exception:  # noqa: S110 - reporting is best effort; the sender goes on
            pass
        finally:
            self._settle(size)

    def _settle(self, size: int) -> None:
        with self._cond:
            self._busy -= 1
            self._queued_bytes -= size
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every delivery in flight was answered (False: ``timeout`` ran out)."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._busy:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        """The session ended: later deliveries are refused (those in flight finish), and
        the channel to the peer is closed once no open session's link uses it."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
        self.server.release_link(self.peer, self.address, self.client)
