"""Peer links: how a served worker delivers protocol data to its peers, and takes theirs.

* :class:`PeerLink`: one session's deliveries to one peer, posted without waiting for the
  answer (over gRPC, or over the data plane for a large tensor when both workers serve
  one, :mod:`pointers.network.dataplane`), bounded in bytes in flight;
* :class:`PeerLinks`: the part of :class:`~pointers.network.server.WorkerServer` that
  dials peers (a channel opens only once the server there proved to hold the party
  certificate of the peer the client named), counts the sessions' links per channel, and
  takes peers' deliveries into the session that accepted them.

Imports the data plane, the wire helpers (certs, framing, transport), the served namespace
(:mod:`pointers.network.served`) and lower layers; never :mod:`pointers.network.server`.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import torch

from pointers.errors import NotAllowedError, PartyUnavailable, PointerError
from pointers.network.certs import PARTY, Credentials, check_identity
from pointers.network.config import ServerConfig
from pointers.network.dataplane import (
    PAUSED,
    THRESHOLD,
    DataLink,
    DataPlaneServer,
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
from pointers.network.served import ServedWorker
from pointers.network.transport import (
    DELIVER,
    Call,
    PeerRefused,
    PeerUnreachable,
    bind_address,
    check_party,
    not_sent,
    open_channel,
    rpc_error,
    split_address,
)
from pointers.wire.messages import ErrorReply, Reply, Store, decode_message, encode_message
from pointers.worker.base import Frames

DATA_PLANE_RETRY = 5.0  # s a worker delivers over gRPC after failing to open a data link,
DATA_PLANE_RETRY_MAX = 120.0  # doubled at each failure in a row, up to this


@dataclass
class _NoLink:
    """No data link to a peer: deliver over gRPC until ``until`` (infinite while one is
    being opened); ``wait``: the time last waited after a failure."""

    until: float
    wait: float = 0.0


_OK_NONE, _ = encode_message(Reply(None))

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
        self, server: PeerLinks, peer: str, address: str, client: str, session: str = ""
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
        self.server.release_link(self.peer, self.address)


class PeerLinks:
    """The peers of a :class:`~pointers.network.server.WorkerServer` (a base class of
    it): the channels it dials, the data links it opens, and the deliveries it takes.
    The server's ``_lock`` guards the channels, the link counts and ``_peers``."""

    id: str
    config: ServerConfig
    credentials: Credentials | None
    call_metadata: Any
    data_plane: DataPlaneServer | None
    post_pool: futures.ThreadPoolExecutor
    _lock: threading.Lock
    _namespaces: dict[tuple[str, str], ServedWorker]
    _peers: set[str]

    def _init_peers(self) -> None:
        """The peer state of a new server (called by its ``__init__``)."""
        self._channels: dict[tuple[str, str], Any] = {}
        self._checking: dict[tuple[str, str], threading.Lock] = {}  # peers being checked
        self._check_failed: dict[tuple[str, str], tuple[float, str]] = {}  # when, why
        self._link_count: dict[tuple[str, str], int] = {}  # open sessions' links per channel
        # the data links to peers by (peer, address), or until when to deliver without
        self._data_links: dict[tuple[str, str], DataLink | _NoLink] = {}
        self._data_lock = threading.Lock()

    def peer_call(self, peer: str, address: str) -> Any:
        """The delivery call to ``peer`` at ``address``. A channel is opened only once
        the server there proved to be the party certificate of ``peer``
        (:meth:`_check_peer`): a peer that did not, or could not be reached, gets nothing
        (no channel, no session token, no object), and the next delivery checks again."""
        key = (peer, address)
        with self._lock:
            entry = self._channels.get(key)
            if entry is not None:
                return entry[1]
            checking = self._checking.setdefault(key, threading.Lock())
        with checking:  # one check per peer at a time; the others take its outcome
            with self._lock:
                entry = self._channels.get(key)
                failed = self._check_failed.get(key)
            if entry is None and failed is not None and time.monotonic() - failed[0] < 1.0:
                raise PartyUnavailable(failed[1], peer)
            if entry is None:
                try:
                    self._check_peer(peer, address)
                except PartyUnavailable as e:
                    with self._lock:
                        if len(self._check_failed) >= 1024:
                            self._check_failed.clear()
                        self._check_failed[key] = (time.monotonic(), str(e))
                    raise
                finally:
                    with self._lock:
                        self._checking.pop(key, None)
                channel = open_channel(
                    address,
                    worker_id=peer,
                    credentials=self.credentials,
                    max_message_bytes=self.config.max_message_bytes,
                )
                with self._lock:
                    entry = self._channels.setdefault(key, (channel, Call(channel, DELIVER)))
                if entry[0] is not channel:
                    channel.close()
        return entry[1]

    def data_link(self, peer: str, address: str) -> DataLink | None:
        """The data connection to ``peer`` at ``address``, opened at the first delivery
        once the gRPC channel's check passed (:meth:`peer_call`): the peer tells its data
        port over that channel, and the connection must present the party certificate of
        ``peer`` (:meth:`DataLink.connect`). None (deliver over gRPC) when this worker or
        the peer serves no data plane, while one is being opened, or for a while after
        opening one failed (:data:`DATA_PLANE_RETRY` seconds, doubled at each failure in
        a row up to :data:`DATA_PLANE_RETRY_MAX`)."""
        if self.data_plane is None or self.credentials is None:
            return None
        key = (peer, address)
        with self._data_lock:
            link = self._data_links.get(key)
            if isinstance(link, DataLink) and link.broken is None:
                return link
            if isinstance(link, _NoLink) and time.monotonic() < link.until:
                return None
            wait = link.wait if isinstance(link, _NoLink) else 0.0
            dialing = self._data_links[key] = _NoLink(math.inf, wait)
        # opened without the lock: meanwhile, deliveries to other peers do not wait for
        # this one (a data port a firewall drops takes the whole connect timeout), and
        # this peer's go over gRPC
        new: DataLink | None = None
        try:
            call = self.peer_call(peer, address)
            ask = encode_envelope({"from": self.id, "ask": "data-port"}, [])
            info, _ = decode_envelope(
                call.blocking(ask, timeout=self.config.deadline, metadata=self.call_metadata)
            )
            port = info_field(info, "data_port", int, 0)
            if not port:
                raise PartyUnavailable(f"{peer!r} serves no data plane", peer)
            host, _ = split_address(address)
            new = DataLink.connect(
                bind_address(host, port),
                peer,
                credentials=self.credentials,
                cert_dir=self.config.certs or "",
                owner=self.id,
                timeout=min(self.config.deadline, 5.0),
            )
        except (PointerError, grpc.RpcError, OSError, ValueError):
            pass  # (the gRPC path reports what is wrong with the peer)
        with self._data_lock:
            if self._data_links.get(key) is dialing and self.data_plane is not None:
                if new is not None:
                    self._data_links[key] = new
                    return new
                wait = min(max(2 * wait, DATA_PLANE_RETRY), DATA_PLANE_RETRY_MAX)
                self._data_links[key] = _NoLink(time.monotonic() + wait, wait)
                return None
        if new is not None:  # the server stopped, or the peer's last session ended
            new.close()
        return None

    def _check_peer(self, peer: str, address: str) -> None:
        """Before anything is sent to ``peer`` at ``address``: the server there must
        present the party certificate of ``peer`` (role URI ``role:party``, CN ``peer``),
        checked here after a TLS handshake of its own; the channel opened afterwards asks
        TLS for the same certificate at every connection (``party_name``). Raises
        :class:`PartyUnavailable` otherwise (with the reason when the deployment
        configured its peers, ``serve --peer``; one uniform message for a client-given
        address, whose network this worker does not describe)."""
        if self.credentials is None:  # --insecure: identities on trust, loopback only
            return
        certs = Path(self.config.certs or "")
        try:
            check_party(
                address,
                peer,
                ca=self.credentials.ca,
                cert_file=certs / f"{self.id}.pem",
                key_file=certs / f"{self.id}.key",
                timeout=min(self.config.deadline, 5.0),
            )
        except (PeerRefused, PeerUnreachable) as e:
            refused = isinstance(e, PeerRefused)
            if refused:
                print(
                    f"pointers: worker {self.id!r} refused to deliver to {peer!r} at "
                    f"{address}: {e}",
                    file=sys.stderr,
                    flush=True,
                )
            if self.config.peers:
                rule = "; a worker delivers only to the party certificate of its peer"
                raise PartyUnavailable(
                    f"worker {self.id!r} will not deliver to its peer {peer!r} at "
                    f"{address}: {e}{rule if refused else ''}",
                    peer,
                ) from None
            raise PartyUnavailable(
                f"worker {self.id!r} could not deliver to its peer {peer!r} at {address} "
                f"(unreachable, or not that worker: a worker delivers only to a server "
                f"that presents the party certificate of {peer!r})",
                peer,
            ) from None

    def _link(self, peer: str, address: str, client: str, session: str = "") -> PeerLink:
        check_identity(peer)
        if self.config.peers:  # dial only what the deployment configured
            configured = dict(self.config.peers).get(peer)
            if configured is None:
                raise NotAllowedError(
                    f"worker {self.id!r} dials only its configured peers (serve --peer): "
                    f"{sorted(dict(self.config.peers))}, not {peer!r}"
                )
            address = configured
        else:
            split_address(address)
        link = PeerLink(self, peer, address, client, session)
        with self._lock:
            key = (peer, address)
            self._link_count[key] = self._link_count.get(key, 0) + 1
        return link

    def release_link(self, peer: str, address: str) -> None:
        """A session's link to ``peer`` at ``address`` closed: the channel goes with the
        last one (a session that ended leaves no connection open behind it)."""
        key = (peer, address)
        with self._lock:
            left = self._link_count.get(key, 0) - 1
            if left > 0:
                self._link_count[key] = left
                return
            self._link_count.pop(key, None)
            entry = self._channels.pop(key, None)
        if entry is not None:
            entry[0].close()
        with self._data_lock:
            data = self._data_links.pop(key, None)
        if isinstance(data, DataLink):
            data.close()

    # -- deliveries from peers -------------------------------------------------------------
    @staticmethod
    def _party(who: str, role: str | None) -> None:
        if role is not None and role != PARTY:
            raise NotAllowedError(
                f"identity {who!r} holds a {role} certificate: only a party delivers"
            )

    def _delivery_namespace(self, who: str, role: str | None, info: dict[str, Any]) -> ServedWorker:
        """The namespace a delivery from ``who`` (its certificate's identity and role)
        goes into, from the delivery's ``info`` (client, from, session): only a party
        delivers, as itself, into the session of a client that accepted it. The same
        checks for a gRPC delivery and a data-plane frame (before its body is read)."""
        self._party(who, role)
        client = info_field(info, "client", str, None)
        source = info_field(info, "from", str, None)
        if client is None or source is None:
            raise FrameError("a delivery names its client and its source worker")
        if source != who:
            raise NotAllowedError(f"identity {who!r} cannot deliver as {source!r}")
        session = info_field(info, "session", str, "")
        ns = self._namespaces.get((client, session))
        if ns is None or source not in ns.accepted:
            raise NotAllowedError(
                f"client {client!r} has not asked worker {self.id!r} to accept "
                f"deliveries from {source!r}"
            )
        if who not in self._peers:
            with self._lock:
                self._peers.add(who)
        return ns

    @staticmethod
    def _store_delivery(ns: ServedWorker, who: str, msg: Any, nbytes: int) -> bool:
        """Store a peer's decoded delivery under the namespace's rules (announced ids,
        sealed labels, the storage limit), and count it. True: the sender should pause
        (flow control, see :class:`PeerLink`)."""
        if type(msg) is not Store:
            raise NotAllowedError(f"a peer may only deliver objects, not {msg.KIND!r}")
        pause = ns.store.receive(who, msg.obj_id, msg.value, msg.sealed)
        stats = ns.stats  # as a VirtualWorker counts what its peers hand it
        stats.messages_received += 1
        stats.bytes_received += nbytes
        stats.messages_sent += 1
        stats.bytes_sent += len(_OK_NONE)
        return pause

    @staticmethod
    def _room(ns: ServedWorker, who: str, info: dict[str, Any]) -> bytes:
        """The answer to a paused sender's question (``ask: room``): may ``id`` come now."""
        obj_id = info_field(info, "id", int, 0)
        size = info_field(info, "size", int, 0)
        return encode_envelope({"room": ns.store.room(who, obj_id, max(size, 0))}, [])
