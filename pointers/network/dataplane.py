"""The data plane: bulk peer deliveries over persistent, mutually authenticated TLS sockets.

gRPC stays the control plane (commands, fetches, leases, small deliveries, failure
notices). A delivery of one tensor of at least :data:`THRESHOLD` bytes from a worker
serving a data plane (the default; ``serve --no-data-plane`` or ``POINTERS_DATA_PLANE=0``
turns it off) to a peer that serves one too travels instead as one frame on a TLS
connection (stdlib :mod:`ssl`, OpenSSL) that the pair keeps open:

    b"PTD1" | u32 big-endian H | msgpack header (H bytes) | body (the tensor's raw bytes)

The header is a map: ``client``, ``from``, ``session`` (as a gRPC delivery's envelope),
``id`` (the object), ``dtype``, ``shape``, ``nbytes`` and ``msg``: the ``Store`` message's
own header (:func:`pointers.wire.messages.encode_message`, the sealed label included).
The receiver checks the header (:func:`decode_frame_header`: sizes, types, the dtype, the
shape against the byte length, the message limit) and the delivery rules (the same code
as a gRPC delivery: the caller's party certificate, the client's session, its accepted
peers, then the announced ids and the storage limit when it stores) *before* it allocates
anything; only then does it allocate the tensor and ``recv_into`` its bytes. A frame cut
off mid-way is dropped (never stored) and the connection closed.

The receiver answers every frame, in order, with a small ack (``u32 L | msgpack None`` or
``[kind, message]``): the sender does not wait for it (a delivery returns once its bytes
are written, so later writes to the tensor do not travel), a reader thread takes the acks
and reports refusals as a gRPC delivery's answer would. A connection that broke, or that
answers nothing for :data:`ANSWER_TIMEOUT` seconds while frames wait for their acks,
fails them all (``PartyUnavailable``) and is opened again at the next delivery.

Who may connect: the listening side requires a CA-signed certificate (TLS) with the role
``role:party`` (a client certificate is refused after the handshake, before a byte of a
frame is read); the dialing side asks TLS for the peer's role-bound name and checks the
certificate presented is the party certificate of the peer it means, as
:func:`~pointers.network.transport.check_party` does, before it writes anything.
"""

from __future__ import annotations

import collections
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import msgpack
import torch

from pointers.errors import LimitExceeded, PartyUnavailable, PointerError
from pointers.network.certs import (
    PARTY,
    Credentials,
    certificate_role,
    check_party_certificate,
    party_name,
)
from pointers.network.data_frames import (
    MAGIC,
    MAX_FRAME_HEADER,
    PREFIX,
    DataFrame,
    decode_frame_header,
    encode_frame_header,
)
from pointers.network.framing import FrameError
from pointers.network.transport import split_address
from pointers.wire.messages import Store, decode_message


class WorkerServer(Protocol):
    """What the data plane uses of the worker's server (pointers.network.server imports
    this module, never the other way round): its identity, configuration and
    credentials, and the delivery rules the gRPC path applies too."""

    id: str
    config: Any
    credentials: Any

    def _delivery_namespace(self, who: str, role: str | None, info: dict[str, Any]) -> Any: ...

    @staticmethod
    def _store_delivery(ns: Any, who: str, msg: Any, nbytes: int) -> bool: ...


ACK = struct.Struct(">I")
THRESHOLD = 64 << 10  # a delivery's tensor bytes from which it takes the data plane
# a frame's body over the message limit is read and dropped, and refused to its sender, up
# to this many times the limit (beyond: the connection is closed)
DRAIN_FACTOR = 4
MAX_ACK = 8 << 10  # bytes of an ack
SOCKET_BUFFER = 4 << 20  # SO_SNDBUF / SO_RCVBUF of a data connection
ANSWER_TIMEOUT = 5.0  # s without an ack while frames wait: the connection is dead
HANDSHAKE_TIMEOUT = 5.0
MAX_CONNECTIONS = 256  # data connections a worker accepts at once
_DRAIN = 1 << 20

Done = Callable[[str | None], None]  # a delivery's answer: None, or why it failed
# a delivery's answer when it was stored and the receiver asks the sender to pause (flow
# control: pointers.network.peers.PeerLink); its ack is msgpack ``True``
PAUSED = "paused"


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SOCKET_BUFFER)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _context(credentials: Credentials, server_side: bool, cert_dir: str, who: str) -> Any:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server_side else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED  # the CA's signature (and the key usage)
    if not server_side:
        ctx.check_hostname = False  # (the names are checked from the certificate)
    ctx.load_verify_locations(cadata=credentials.ca.decode())
    ctx.load_cert_chain(f"{cert_dir}/{who}.pem", f"{cert_dir}/{who}.key")
    ctx.set_alpn_protocols(["pointers-data/1"])
    return ctx


def recv_exact(sock: Any, view: memoryview) -> None:
    """Fill ``view`` from ``sock`` (EOFError when the connection ends first)."""
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if not k:
            raise EOFError("the connection closed in the middle of a frame")
        got += k


# -- the receiving side ------------------------------------------------------------------
class DataPlaneServer:
    """Accepts data connections for a :class:`WorkerServer` and stores their frames
    through the server's delivery rules (``_delivery_namespace``, ``_store_delivery``)."""

    def __init__(self, server: WorkerServer, host: str, port: int) -> None:
        assert server.credentials is not None
        self.server = server
        self._ctx = _context(server.credentials, True, server.config.certs or "", server.id)
        self._listener = socket.create_server((host, port), backlog=64)
        self.port: int = self._listener.getsockname()[1]
        self.frames = 0  # frames stored (what tests and benchmarks look at)
        self._stopping = threading.Event()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="pointers-data", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop accepting, and end every connection. Each socket is shut down here and
        closed by the thread that uses it: a socket closed under a thread still in its
        TLS object would free the descriptor number while OpenSSL still reads it (a new
        connection taking that number would lose bytes to the old thread)."""
        self._stopping.set()
        with self._lock:
            socks = [self._listener, *self._open]
        for s in socks:
            _shutdown(s)

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                raw, _ = self._listener.accept()
            except OSError:
                break
            if self._stopping.is_set():
                _close(raw)
                break
            if not self._slots.acquire(blocking=False):
                _close(raw)
                continue
            threading.Thread(
                target=self._serve, args=(raw,), name="pointers-data-in", daemon=True
            ).start()
        _close(self._listener)

    def _serve(self, raw: socket.socket) -> None:
        sock: Any = raw
        try:
            _tune(raw)
            raw.settimeout(HANDSHAKE_TIMEOUT)
            with self._lock:
                self._open.add(raw)
            if self._stopping.is_set():
                return
            sock = self._ctx.wrap_socket(raw, server_side=True)  # (takes raw's descriptor)
            with self._lock:
                self._open.discard(raw)
                self._open.add(sock)
            if self._stopping.is_set():
                return
            der = sock.getpeercert(binary_form=True)
            who, role = certificate_role(ssl.DER_cert_to_PEM_cert(der).encode())
            if role != PARTY:
                self._log(f"refused a data connection from {who!r}: a {role} certificate")
                return
            self._frames(sock, who)
        except (OSError, ValueError, EOFError, PointerError) as e:  # (a bad frame: closed)
            if not self._stopping.is_set():
                self._log(f"closed a data connection: {type(e).__name__}: {e}")
        finally:
            with self._lock:
                self._open.discard(raw)
                self._open.discard(sock)
            _close(sock)
            self._slots.release()

    def _log(self, text: str) -> None:
        print(f"pointers: worker {self.server.id!r}: {text}", file=sys.stderr, flush=True)

    def _frames(self, sock: Any, who: str) -> None:
        server = self.server
        cfg = server.config
        prefix = bytearray(PREFIX.size)
        pview = memoryview(prefix)
        done_at: float | None = None  # when the last frame's bytes were all in
        while not self._stopping.is_set():
            # --latency-ms (benchmarks) delays each frame from its arrival, as it does each
            # gRPC call, so frames sent back to back are delayed together: a frame already
            # waiting when the last one was handled arrived by the time that one was in
            queued = done_at is not None and bool(
                cfg.latency and (sock.pending() or select.select([sock], [], [], 0)[0])
            )
            sock.settimeout(None)  # an idle connection waits for its next frame
            first = sock.recv_into(pview[:1], 1)
            if not first:
                return  # closed between frames
            arrived = done_at if queued and done_at is not None else time.monotonic()
            sock.settimeout(max(cfg.deadline, ANSWER_TIMEOUT))  # a frame comes whole
            recv_exact(sock, pview[1:])
            magic, hlen = PREFIX.unpack(prefix)
            if magic != MAGIC:
                raise FrameError(f"not a data frame (magic {bytes(magic)!r})")
            if hlen > MAX_FRAME_HEADER:
                raise FrameError(f"a frame header of {hlen} bytes exceeds {MAX_FRAME_HEADER}")
            head = bytearray(hlen)
            recv_exact(sock, memoryview(head))
            # (a body past DRAIN_FACTOR times the limit: closed; up to it, drained and refused)
            limit = cfg.max_message_bytes
            frame = decode_frame_header(bytes(head), DRAIN_FACTOR * limit)  # (raises: closed)
            try:
                ns = server._delivery_namespace(who, PARTY, frame.info)
                store = ns.store
                over = None
                if frame.nbytes > limit:
                    over = (
                        f"exceeds worker {server.id!r}'s message limit of {limit} bytes (serve "
                        "--max-message-mb)"
                    )
                elif store.max_bytes is not None and store.used() + frame.nbytes > store.max_bytes:
                    over = (
                        f"would take client {frame.client!r}'s storage at worker "
                        f"{server.id!r} over its limit of {store.max_bytes} bytes (serve "
                        "--max-stored-mb)"
                    )
                if over is not None:
                    refused = LimitExceeded(
                        f"a delivery of object {frame.obj_id} ({frame.nbytes} bytes) {over}"
                    )
                    try:  # a command here waiting for it fails now, not at the deadline
                        store.delivery_failed(who, frame.obj_id, f"LimitExceeded: {refused}")
                    except Exception:  # noqa: S110 - best effort: the sender reports it too
                        pass
                    raise refused
            except Exception as e:  # refused before any allocation: skip its body
                _drain(sock, frame.nbytes)
                _ack(sock, e)
                continue
            value = torch.empty(frame.shape, dtype=frame.dtype)
            try:
                if frame.nbytes:
                    recv_exact(sock, memoryview(value.view(-1).view(torch.uint8).numpy()))  # type: ignore[arg-type]
            except BaseException:
                del value  # a half-received frame is never stored; tell the waiting side
                try:
                    ns.store.delivery_failed(
                        who,
                        frame.obj_id,
                        f"PartyUnavailable: the data connection from {who!r} broke in the "
                        "middle of the object",
                    )
                except Exception:  # noqa: S110 - best effort: the deadline still holds
                    pass
                raise
            done_at = time.monotonic()
            if cfg.latency:
                time.sleep(max(0.0, arrived + cfg.latency - done_at))
            error: Exception | None = None
            pause = False
            try:
                if frame.dtype is torch.bool:  # only 0 and 1 are booleans
                    value.view(torch.uint8).ne_(0)
                msg = decode_message(frame.msg, [value], copy=False)
                if type(msg) is Store and msg.obj_id != frame.obj_id:
                    raise FrameError("a frame's object id differs from its message's")
                pause = server._store_delivery(ns, who, msg, len(frame.msg) + frame.nbytes)
                self.frames += 1
            except Exception as e:
                error = e
            _ack(sock, error, pause)


def _ack(sock: Any, error: Exception | None, pause: bool = False) -> None:
    """Answer a frame: ``None`` (stored), ``True`` (stored; pause, see :data:`PAUSED`) or
    ``[kind, message]`` (refused)."""
    answer: Any = pause or None
    body = msgpack.packb(
        answer if error is None else [type(error).__name__, str(error)[:2000]], use_bin_type=True
    )
    sock.sendall(ACK.pack(len(body)) + body)


def _drain(sock: Any, n: int) -> None:
    scratch = memoryview(bytearray(min(n, _DRAIN) or 1))
    while n:
        k = sock.recv_into(scratch, min(n, len(scratch)))
        if not k:
            raise EOFError("the connection closed in the middle of a frame")
        n -= k


def _shutdown(sock: socket.socket) -> None:
    """End a connection (or wake a listener) without freeing its descriptor."""
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


def _close(sock: Any) -> None:
    try:
        sock.close()
    except OSError:
        pass


# -- the sending side --------------------------------------------------------------------
class DataLink:
    """A worker's data connection to one peer (shared by every session's deliveries to it).

    :meth:`send` writes a frame on the caller's thread (the lock serialises the writers,
    and the reader: one thread at a time touches the TLS object) and returns once its
    bytes are written; a reader thread takes the acks, in order, and calls each frame's
    ``done``. A broken connection fails what waits for an ack and every later send."""

    def __init__(self, sock: Any, peer: str, owner: str) -> None:
        self.sock, self.peer, self.owner = sock, peer, owner
        self._lock = threading.Lock()
        self._pending: collections.deque[Done] = collections.deque()
        self._progress = time.monotonic()  # the last ack (or the first frame after none)
        self.broken: str | None = None
        self._reader = threading.Thread(target=self._read, name="pointers-data-ack", daemon=True)
        self._reader.start()

    @classmethod
    def connect(
        cls,
        address: str,
        peer: str,
        *,
        credentials: Credentials,
        cert_dir: str,
        owner: str,
        timeout: float,
    ) -> DataLink:
        """Dial ``address`` and check it presents the party certificate of ``peer``
        (nothing is written before): raises ``PartyUnavailable`` otherwise."""
        host, port = split_address(address)
        ctx = _context(credentials, False, cert_dir, owner)
        try:
            raw = socket.create_connection((host, port), timeout=timeout)
            _tune(raw)
            sock = ctx.wrap_socket(raw, server_hostname=party_name(peer))
            der = sock.getpeercert(binary_form=True)
        except (OSError, ssl.SSLError) as e:
            raise PartyUnavailable(
                f"worker {owner!r} could not open a data connection to {peer!r}: {e}", peer
            ) from None
        try:
            if not der:
                raise ValueError("it presented no certificate")
            check_party_certificate(ssl.DER_cert_to_PEM_cert(der).encode(), peer)
        except ValueError as e:
            _close(sock)
            print(
                f"pointers: worker {owner!r} refused the data connection to {peer!r} at "
                f"{address}: {e}",
                file=sys.stderr,
                flush=True,
            )
            raise PartyUnavailable(
                f"worker {owner!r} will not deliver to {peer!r} at {address}: {e}", peer
            ) from None
        return cls(sock, peer, owner)

    def send(self, head: bytes, body: Any, done: Done) -> None:
        """Write one frame (``head`` from :func:`encode_frame_header`, then ``body``);
        ``done`` gets its answer later, or now when the connection is broken."""
        failed: list[Done] = []
        with self._lock:
            why = self.broken
            if why is None:
                try:
                    self.sock.settimeout(ANSWER_TIMEOUT)  # (per write: a hung peer fails)
                    self.sock.sendall(head)
                    if len(body):
                        self.sock.sendall(body)
                    if not self._pending:
                        self._progress = time.monotonic()
                    self._pending.append(done)
                    return
                except (OSError, ValueError) as e:
                    why = f"the data connection to {self.peer!r} broke: {e}"
                    failed = self._break(why)
        done(f"PartyUnavailable: worker {self.owner!r} could not deliver to {self.peer!r}: {why}")
        self._fail(failed)

    def _break(self, why: str) -> list[Done]:
        """(With the lock held.) Mark the link broken; the answers to fail."""
        self.broken = why
        failed = list(self._pending)
        self._pending.clear()
        _close(self.sock)
        return failed

    def _fail(self, failed: list[Done]) -> None:
        why = f"PartyUnavailable: worker {self.owner!r} could not deliver to {self.peer!r}: "
        for done in failed:
            try:
                done(why + (self.broken or "the data connection broke"))
            except Exception:  # noqa: S110 - reporting is best effort
                pass

    def close(self) -> None:
        with self._lock:
            failed = self._break("closed") if self.broken is None else []
        self._fail(failed)

    def _read(self) -> None:
        buf = bytearray()
        chunk = bytearray(64 << 10)
        cview = memoryview(chunk)
        while True:
            try:
                ready, _, _ = select.select([self.sock], [], [], 0.5)
            except (OSError, ValueError):
                ready = []
            answers: list[tuple[Done, str | None]] = []
            failed: list[Done] = []
            with self._lock:
                if self.broken is not None:
                    return
                try:
                    if ready or self.sock.pending():
                        self.sock.settimeout(0)
                        while True:
                            try:
                                k = self.sock.recv_into(cview)
                            except (ssl.SSLWantReadError, ssl.SSLWantWriteError, BlockingIOError):
                                break
                            if not k:
                                raise EOFError("the peer closed the data connection")
                            buf += cview[:k]
                    while len(buf) >= ACK.size:
                        (n,) = ACK.unpack_from(buf)
                        if n > MAX_ACK:
                            raise FrameError(f"an ack of {n} bytes")
                        if len(buf) < ACK.size + n:
                            break
                        answer = msgpack.unpackb(bytes(buf[ACK.size : ACK.size + n]))
                        del buf[: ACK.size + n]
                        if not self._pending:
                            raise FrameError("an ack for no frame")
                        why = (
                            None
                            if answer is None
                            else PAUSED
                            if answer is True
                            else f"{answer[0]}: {answer[1]}"
                        )
                        answers.append((self._pending.popleft(), why))
                        self._progress = time.monotonic()
                    if self._pending and time.monotonic() - self._progress > ANSWER_TIMEOUT:
                        raise TimeoutError(
                            f"no answer for {ANSWER_TIMEOUT:g} s (hung, stopped, or cut off)"
                        )
                except Exception as e:  # (ssl errors, EOF, a malformed ack, a timeout)
                    failed = self._break(f"{type(e).__name__}: {e}")
            for done, why in answers:
                try:
                    done(why)
                except Exception:  # noqa: S110 - reporting is best effort
                    pass
            if failed or self.broken is not None:
                self._fail(failed)
                return


__all__ = [
    "THRESHOLD",
    "DataFrame",
    "DataLink",
    "DataPlaneServer",
    "decode_frame_header",
    "encode_frame_header",
]
