"""``python -m pointers serve``: a worker served over gRPC with mutual TLS.

Every call is authenticated by the caller's certificate (its CN is the caller's
identity; a certificate not signed by the CA is refused in the TLS handshake). Rules:

* a client runs commands in its own namespace (its own store and counters), one per
  client *session* (:mod:`pointers.network.lease`): two processes with the same client
  certificate never see, nor reset, each other's objects; only the session can fetch or
  delete what it stored there;
* every namespace lives under a lease (``--lease``): one whose client made no call for
  that long (a living client renews it in the background) is freed, objects, programs,
  plans and tags included;
* a peer worker identity may only deliver objects, under its own identity and only into
  the namespace of a client that accepted deliveries from it; once it delivered here (and
  always for this worker's own identity) it may not run commands, fetch or inspect;
* a worker delivers only to a peer that proves to be the party the client named: before
  it opens a channel, a TLS handshake of its own must show the party certificate
  (``role:party``, CN = the peer's name) of that peer, and the channel asks TLS for that
  certificate's role-bound name at every connection (:meth:`WorkerServer.peer_call`);
* a delivery into this worker is refused unless the client announced its id for that
  peer (or a program promised it), and every refusal is reported at the client's next
  sync;
* ``--insecure`` (no TLS, identities taken on trust) binds loopback addresses only.

Worker functions beyond aten ops come from the entry-point group
``pointers.worker_functions`` (each entry point is a mapping of name -> function), so
``mpc`` reaches served workers without this package importing it.
"""

from __future__ import annotations

import ctypes
import gc
import os
import signal
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from concurrent import futures
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import grpc
import torch

from pointers.errors import LimitExceeded, NotAllowedError, PartyUnavailable, PointerError
from pointers.network.certs import (
    PARTY,
    Credentials,
    certificate_role,
    check_identity,
    check_party_certificate,
    load_credentials,
)
from pointers.network.dataplane import THRESHOLD, DataLink, DataPlaneServer, encode_frame_header
from pointers.network.framing import (
    FrameError,
    buffer_bytes,
    decode_envelope,
    encode_envelope,
    info_field,
)
from pointers.network.lease import SESSION_METADATA, check_session
from pointers.network.served import (
    ProgramPool,
    ProgramQueue,
    ServedWorker,
    is_error_header,
    warm_meta,
)
from pointers.network.transport import (
    DEFAULT_MAX_MESSAGE,
    DELIVER,
    IDENTITY_METADATA,
    SERVER_KEEPALIVE_OPTIONS,
    SERVICE,
    STALE,
    SYNC,
    Call,
    PeerRefused,
    PeerUnreachable,
    bind_address,
    check_party,
    is_loopback,
    not_sent,
    open_channel,
    rpc_error,
    split_address,
)
from pointers.wire import serde
from pointers.wire.messages import (
    Delete,
    ErrorReply,
    Reply,
    Store,
    decode_message,
    encode_message,
)
from pointers.worker.base import Frames

ENTRY_POINT_GROUP = "pointers.worker_functions"
DATA_PLANE_ENV = "POINTERS_DATA_PLANE"  # "1": serve with the data plane (benchmarks, tests)
DATA_PLANE_RETRY = 5.0  # s a worker delivers over gRPC after failing to open a data link
_OK_NONE, _ = encode_message(Reply(None))
_SKIPPED, _ = encode_message(
    ErrorReply("Skipped", "not run: an earlier command of the same batch failed")
)


@dataclass(frozen=True)
class ServerConfig:
    """How a worker is served. Sizes are bytes; ``max_stored_bytes`` is per client."""

    worker_id: str
    host: str = "127.0.0.1"
    port: int = 0
    certs: str | None = None
    insecure: bool = False
    deadline: float = 10.0
    max_message_bytes: int = DEFAULT_MAX_MESSAGE
    max_stored_bytes: int | None = 4 << 30
    threads: int = 32
    latency: float = 0.0  # seconds added to every call received (benchmarks: cost of rounds)
    # the peers this worker may dial, name -> address (serve --peer NAME=HOST:PORT); empty:
    # any address a client names, with one uniform error for every failure
    peers: tuple[tuple[str, str], ...] = ()
    lease: float = 60.0  # seconds without a call after which a session's objects are freed
    max_sessions: int = 16  # open sessions per client identity
    max_objects: int | None = 100_000  # objects per session
    programs_per_client: int = 4  # programs running at once, per session
    programs_per_worker: int = 32  # programs running at once, in the whole worker
    max_queued_programs: int = 256  # programs waiting to run, per session
    # bulk deliveries over persistent TLS sockets (pointers.network.dataplane), opt-in:
    # serve --data-plane, or POINTERS_DATA_PLANE=1 in the environment; never with --insecure
    data_plane: bool = field(default_factory=lambda: os.environ.get(DATA_PLANE_ENV) == "1")
    data_port: int = 0  # the data plane's TCP port (0: a free one, told to peers over gRPC)

    def __post_init__(self) -> None:
        check_identity(self.worker_id)
        if self.insecure:
            if self.certs is not None:
                raise ValueError("choose either --certs (mutual TLS) or --insecure, not both")
            if not is_loopback(self.host):
                raise ValueError(
                    f"--insecure serves without TLS or authentication and binds loopback "
                    f"addresses only (127.0.0.1, ::1, localhost), not {self.host!r}"
                )
        elif self.certs is None:
            raise ValueError("a served worker needs --certs DIR (or --insecure on loopback)")
        if not 0 <= self.port < 65536:
            raise ValueError(f"port must be in 0..65535, got {self.port}")
        if not 0 <= self.data_port < 65536:
            raise ValueError(f"data port must be in 0..65535, got {self.data_port}")
        if self.deadline <= 0:
            raise ValueError(f"deadline must be positive, got {self.deadline}")
        if self.max_message_bytes < 1024:
            raise ValueError("max_message_bytes must be at least 1024")
        if self.max_stored_bytes is not None and self.max_stored_bytes < 0:
            raise ValueError("max_stored_bytes must be non-negative")
        if self.threads < 4:
            raise ValueError("a served worker needs at least 4 threads")
        if not 1 <= self.lease <= 86400:
            raise ValueError(f"lease must lie in [1, 86400] seconds, got {self.lease}")
        if self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")
        if self.max_objects is not None and self.max_objects < 1:
            raise ValueError("max_objects must be at least 1")
        if min(self.programs_per_client, self.programs_per_worker, self.max_queued_programs) < 1:
            raise ValueError("the program limits must be at least 1")
        if not 0 <= self.latency <= 10:
            raise ValueError(f"latency must lie in [0, 10] seconds, got {self.latency}")
        for name, address in self.peers:
            check_identity(name)
            split_address(address)
            if name == self.worker_id:
                raise ValueError(f"worker {name!r} cannot be its own peer")


def plugin_functions() -> dict[str, Callable[..., Any]]:
    """The worker functions every installed package declares under
    ``pointers.worker_functions`` (``mpc`` declares its protocol steps there)."""
    out: dict[str, Callable[..., Any]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        table = ep.load()
        if not isinstance(table, Mapping):
            raise TypeError(f"entry point {ep.name!r} of {ENTRY_POINT_GROUP} is not a mapping")
        for name, fn in table.items():
            if not isinstance(name, str) or not callable(fn):
                raise TypeError(f"entry point {ep.name!r}: {name!r} is not a named function")
            out[name] = fn
    return out


RESEND_WAIT = 3.0  # seconds a delivery that was not sent waits for the peer's channel


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
    """

    MAX_QUEUED_BYTES = 512 * 1024 * 1024

    def __init__(
        self, server: WorkerServer, peer: str, address: str, client: str, session: str = ""
    ) -> None:
        self.server, self.peer, self.address, self.client = server, peer, address, client
        self.session = session
        self._cond = threading.Condition()
        self._queued_bytes = 0  # bytes of the deliveries in flight
        self._busy = 0  # deliveries in flight
        self._closed = False

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
                and self._queued_bytes + size > self.MAX_QUEUED_BYTES
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
            _, out = decode_envelope(reply)
            if len(out) != 1:
                raise FrameError("a delivery reply carries exactly one message")
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


CONTROL_THREADS = 4  # threads of the Lease method's pool (hellos and lease renewals)


class CallShares:
    """The threads of one handler pool (commands, or inspections), shared fairly among
    client identities.

    gRPC runs a call on a pool thread until it returns, and some calls wait (for a peer's
    delivery, for the calls of the connection before them, for the session's programs:
    up to an hour). So that one identity's waiting calls never hold the threads another
    client's calls need, a call that waits for the session's programs is taken only while
    its identity holds fewer than its *share* (a quarter of the pool), or while fewer than
    half the pool's threads run calls at all; any other such call is refused at once with
    :class:`~pointers.errors.LimitExceeded`, holding a thread for no more than that. One
    identity (all its sessions together) thus holds at most half of a pool, and every
    other identity always finds its share free."""

    def __init__(self, worker: str, pool: str, size: int) -> None:
        self.worker, self.pool, self.size = worker, pool, size
        self.share = max(1, size // 4)
        self.open = max(1, size // 2)
        self._lock = threading.Lock()
        self.running = 0
        self._held: dict[str, int] = {}

    def enter(self, who: str, what: str, waits: bool = True) -> None:
        """Take a thread for a call of ``who``; ``waits``: the call may wait long (for the
        session's programs), so it counts against the identity's share. Other calls (their
        commands run, or wait for their turn and their peers, within the deadline) are
        always taken: refusing them would fail a busy honest client's pipelined calls."""
        with self._lock:
            mine = self._held.get(who, 0)
            if waits and mine >= self.share and self.running >= self.open:
                raise LimitExceeded(
                    f"worker {self.worker!r} is busy: client {who!r} already has {mine} "
                    f"calls running or waiting here, its share of the {self.size} "
                    f"{self.pool} threads (serve --threads: a client identity holds at "
                    f"most {self.share} of them once {self.open} are in use); this call "
                    f"({what}) was not run: wait for the earlier ones (their programs, "
                    "their peers), then call again"
                )
            self._held[who] = mine + 1
            self.running += 1

    def leave(self, who: str) -> None:
        with self._lock:
            left = self._held.get(who, 1) - 1
            if left > 0:
                self._held[who] = left
            else:
                self._held.pop(who, None)
            self.running -= 1


class FairProgramPool(ProgramPool):
    """The worker's program slots (``--programs-per-worker``), shared fairly: a client
    identity holds at most half of them (all its sessions together; at least
    ``--programs-per-client``), and a program
    thread that finishes a program gives its slot to a session waiting for one before it
    runs the next program of its own (sessions take turns, one program each, instead of
    one session's queue keeping its slots for as long as it has programs)."""

    def __init__(self, per_worker: int, per_client: int, max_queued: int) -> None:
        super().__init__(per_worker, per_client, max_queued)
        self.per_owner = max(per_client, per_worker // 2)
        self._owner_of: weakref.WeakKeyDictionary[ProgramQueue, str] = weakref.WeakKeyDictionary()
        self._owned: dict[str, int] = {}  # program slots held per identity

    def own(self, q: ProgramQueue, owner: str) -> None:
        """``q`` is a session of client identity ``owner``."""
        with self.cond:
            self._owner_of[q] = owner

    def _schedule(self, q: ProgramQueue) -> None:
        owner = self._owner_of.get(q, "")
        while (
            q.jobs
            and q.running < self.per_client
            and self.running < self.per_worker
            and self._owned.get(owner, 0) < self.per_owner
        ):
            q.running += 1
            self.running += 1
            self._owned[owner] = self._owned.get(owner, 0) + 1
            threading.Thread(
                target=self._drain, args=(q,), name=f"program-{q.name}", daemon=True
            ).start()
        if q.jobs and q.running < self.per_client and q not in self._ready:
            self._ready.append(q)

    def _release(self, q: ProgramQueue) -> None:
        """A thread of ``q`` gives its slot back (with :attr:`cond` held); the sessions
        waiting for a slot are tried in turn."""
        owner = self._owner_of.get(q, "")
        q.running -= 1
        self.running -= 1
        left = self._owned.get(owner, 1) - 1
        if left > 0:
            self._owned[owner] = left
        else:
            self._owned.pop(owner, None)
        for _ in range(len(self._ready)):
            if self.running >= self.per_worker:
                break
            self._schedule(self._ready.popleft())
        self.cond.notify_all()

    def _another_waits(self, q: ProgramQueue) -> bool:
        """Whether a session other than ``q`` waits for a slot that ``q``'s would give it
        (with :attr:`cond` held)."""
        mine = self._owner_of.get(q, "")
        for r in self._ready:
            if r is q or not r.jobs or r.running >= self.per_client:
                continue
            owner = self._owner_of.get(r, "")
            if owner == mine or self._owned.get(owner, 0) < self.per_owner:
                return True
        return False

    def _drain(self, q: ProgramQueue) -> None:
        ran = False  # (a thread runs one program at least before it gives its slot away)
        while True:
            with self.cond:
                if not q.jobs:
                    self._release(q)
                    return
                if ran and self._ready and self._another_waits(q):
                    # another session waits for a slot: it goes first, this one queues
                    if q not in self._ready:
                        self._ready.append(q)
                    self._release(q)
                    return
                job = q.jobs.popleft()
            ran = True
            try:
                job()
            except Exception:  # noqa: S110 - a program reports its own failures
                pass


class WorkerServer:
    """A :class:`ServedWorker` per client session behind one gRPC server."""

    def __init__(
        self,
        config: ServerConfig,
        functions: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.config = config
        self.id = config.worker_id
        self.functions = dict(plugin_functions() if functions is None else functions)
        self.epoch = os.urandom(8).hex()  # tells clients when a worker was restarted
        self.credentials: Credentials | None = (
            None if config.insecure else load_credentials(config.certs or "", config.worker_id)
        )
        if self.credentials is not None:
            try:
                own = certificate_role(self.credentials.cert)
            except ValueError as e:
                raise ValueError(f"the certificate of worker {self.id!r}: {e}") from None
            if own != (self.id, PARTY):
                raise ValueError(
                    f"worker {self.id!r} needs a party certificate for {self.id!r}, not one "
                    f"for {own[0]!r} with role {own[1]!r} (`python -m pointers certs DIR "
                    f"{self.id}`)"
                )
            try:  # (clients and peers reach it by its role-bound name)
                check_party_certificate(self.credentials.cert, self.id)
            except ValueError as e:
                raise ValueError(f"the certificate of worker {self.id!r}: {e}") from None
        self.call_metadata = ((IDENTITY_METADATA, self.id),) if config.insecure else None
        # (client identity, session token) -> its namespace
        self._namespaces: dict[tuple[str, str], ServedWorker] = {}
        self._expired: dict[tuple[str, str], float] = {}  # recently expired sessions: when
        self.programs = FairProgramPool(
            config.programs_per_worker, config.programs_per_client, config.max_queued_programs
        )
        # the threads of the command and inspection pools, shared among client identities
        self.shares = {k: CallShares(self.id, k, config.threads) for k in ("exec", "inspect")}
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()
        # identities that may only deliver: this worker's own, and every identity that
        # delivered here as a peer worker (a client can only ever add itself)
        self._peers: set[str] = {self.id}
        self._channels: dict[tuple[str, str], Any] = {}
        self._checking: dict[tuple[str, str], threading.Lock] = {}  # peers being checked
        self._check_failed: dict[tuple[str, str], tuple[float, str]] = {}  # when, why
        self._link_count: dict[tuple[str, str], int] = {}  # open sessions' links per channel
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._pools: list[futures.ThreadPoolExecutor] = []
        self.post_pool = self._post_pool()
        self.port: int | None = None
        # the data plane (serve --data-plane; never without TLS): its listener, and the
        # data links to peers by (peer, address), or when opening one last failed
        self.data_plane: DataPlaneServer | None = None
        self._data_links: dict[tuple[str, str], DataLink | float] = {}
        self._data_lock = threading.Lock()

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> int:
        cfg = self.config
        if cfg.max_stored_bytes is not None:
            warm_meta()  # ops are sized on the meta device before they run
        # three pools, so that calls of one kind never wait for threads the others hold:
        # client commands (an Exec may wait for peers' deliveries, or for its turn behind
        # the connection's earlier calls), peer deliveries (short: they only store), and
        # inspections (lease renewals, syncs). With one pool, commands waiting for
        # deliveries held every thread, the deliveries and renewals queued behind them,
        # and the leases of live sessions ran out (8 pipelining clients, 16 threads).
        # A fourth, small pool answers hellos and lease renewals (the Lease method): they
        # never wait, and must never queue behind calls that do. Commands and inspections
        # are shared fairly among client identities (CallShares): calls that wait (for
        # peers, for programs) never hold more than half of a pool while others need it.
        self._pools = [
            futures.ThreadPoolExecutor(max_workers=n, thread_name_prefix=f"pointers-{k}")
            for k, n in (
                ("exec", cfg.threads),
                ("deliver", cfg.threads),
                ("inspect", cfg.threads),
                ("lease", CONTROL_THREADS),
            )
        ]
        self.post_pool = self._post_pool()  # (a stopped server's was shut down)
        server = grpc.server(
            self._pools[0],
            options=[
                ("grpc.max_send_message_length", cfg.max_message_bytes),
                ("grpc.max_receive_message_length", cfg.max_message_bytes),
                ("grpc.so_reuseport", 0),
                *SERVER_KEEPALIVE_OPTIONS,
            ],
        )
        handlers = {
            "Exec": grpc.unary_unary_rpc_method_handler(self._exec),
            "Deliver": grpc.unary_unary_rpc_method_handler(_in_pool(self._deliver, self._pools[1])),
            "Inspect": grpc.unary_unary_rpc_method_handler(_in_pool(self._inspect, self._pools[2])),
            "Lease": grpc.unary_unary_rpc_method_handler(_in_pool(self._control, self._pools[3])),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        where = bind_address(cfg.host, cfg.port)
        try:
            if self.credentials is None:
                port = server.add_insecure_port(where)
            else:
                creds = grpc.ssl_server_credentials(
                    [(self.credentials.key, self.credentials.cert)],
                    root_certificates=self.credentials.ca,
                    require_client_auth=True,
                )
                port = server.add_secure_port(where, creds)
        except RuntimeError as e:
            raise OSError(f"cannot listen on {where}: {e}") from e
        if not port:
            raise OSError(f"cannot listen on {where} (in use?)")
        server.start()
        self._server, self.port = server, port
        if cfg.data_plane and self.credentials is not None:
            try:
                self.data_plane = DataPlaneServer(self, cfg.host, cfg.data_port)
            except OSError as e:
                server.stop(0)
                raise OSError(f"cannot listen for the data plane on {cfg.data_port}: {e}") from e
        self._stopping.clear()
        self._reaper = threading.Thread(target=self._reap, name="pointers-lease", daemon=True)
        self._reaper.start()
        return port

    def _post_pool(self) -> futures.ThreadPoolExecutor:
        """Threads that send the deliveries this worker posts to its peers and wait for
        their answers (see :meth:`PeerLink._send_posted`): four per command thread, so
        that deliveries held up by a slow peer (until its keepalive or the deadline
        gives up on it) rarely delay those to the others."""
        return futures.ThreadPoolExecutor(
            max_workers=4 * self.config.threads, thread_name_prefix="pointers-post"
        )

    @property
    def address(self) -> str:
        return bind_address(self.config.host, self.port or self.config.port)

    def stop(self, grace: float | None = 1.0) -> None:
        self._stopping.set()
        if self._server is not None:
            self._server.stop(grace).wait()
            self._server = None
        for pool in self._pools[1:]:  # (gRPC shuts down the one it was given)
            pool.shutdown(wait=False)
        self.post_pool.shutdown(wait=False)  # (posts in flight fail as the channels close)
        with self._lock:
            channels = list(self._channels.values())
            self._channels.clear()
        for channel, _ in channels:
            channel.close()
        if self.data_plane is not None:
            self.data_plane.stop()
            self.data_plane = None
        with self._data_lock:
            links = list(self._data_links.values())
            self._data_links.clear()
        for link in links:
            if isinstance(link, DataLink):
                link.close()

    def wait(self) -> None:
        if self._server is not None:
            self._server.wait_for_termination()

    # -- peers ---------------------------------------------------------------------------
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
        the peer serves no data plane, or opening one failed in the last few seconds."""
        if self.data_plane is None or self.credentials is None:
            return None
        key = (peer, address)
        with self._data_lock:
            link = self._data_links.get(key)
            if isinstance(link, DataLink) and link.broken is None:
                return link
            if isinstance(link, float) and time.monotonic() - link < DATA_PLANE_RETRY:
                return None
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
                new: DataLink | float = DataLink.connect(
                    bind_address(host, port),
                    peer,
                    credentials=self.credentials,
                    cert_dir=self.config.certs or "",
                    owner=self.id,
                    timeout=min(self.config.deadline, 5.0),
                )
            except (PointerError, grpc.RpcError, OSError, ValueError):
                new = time.monotonic()  # (the gRPC path reports what is wrong with the peer)
            self._data_links[key] = new
        return new if isinstance(new, DataLink) else None

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

    # -- namespaces and their leases -----------------------------------------------------
    def _enter(self, client: str, session: str) -> ServedWorker:
        """The namespace of ``(client, session)`` (made on its first call), marked busy
        until :meth:`_leave`: a namespace is never freed during a call of its client."""
        key = (client, session)
        with self._lock:
            ns = self._namespaces.get(key)
            if ns is None:
                cfg = self.config
                open_now = sum(1 for c, _ in self._namespaces if c == client)
                if open_now >= cfg.max_sessions:
                    # (how many sessions of this identity are open is theirs: not told)
                    raise LimitExceeded(
                        f"client {client!r} reached its limit of open sessions at worker "
                        f"{self.id!r} (serve --max-sessions); the sessions of clients that "
                        f"stopped are freed {cfg.lease:g} s after their last call (serve "
                        "--lease)"
                    )
                ns = ServedWorker(
                    self.id,
                    client,
                    functions=self.functions,
                    link_factory=self._link,
                    deadline=cfg.deadline,
                    max_stored_bytes=cfg.max_stored_bytes,
                    session=session,
                    max_objects=cfg.max_objects,
                    programs=self.programs,
                )
                if self._expired.pop(key, None) is not None:
                    ns.store.note = (
                        f" (this client's earlier objects here were freed when its session's "
                        f"lease expired: no call for {cfg.lease:g} s, serve --lease)"
                    )
                self.programs.own(ns.programs, client)  # (slots are shared per identity)
                self._namespaces[key] = ns
            ns.calls += 1
            ns.seen = time.monotonic()
        return ns

    def _leave(self, ns: ServedWorker) -> None:
        with self._lock:
            ns.calls -= 1
            ns.seen = time.monotonic()

    def _reap(self) -> None:
        """Free the namespaces whose lease expired (no call for ``config.lease`` s)."""
        lease = self.config.lease
        while not self._stopping.wait(min(lease / 8, 1.0)):
            now = time.monotonic()
            with self._lock:
                expired = [
                    (key, ns)
                    for key, ns in self._namespaces.items()
                    if not ns.calls and now - ns.seen > lease
                ]
                for key, _ in expired:
                    del self._namespaces[key]
                    self._expired[key] = now
                if len(self._expired) > 4096:  # remembered for the error message only
                    for key in list(self._expired)[:2048]:
                        del self._expired[key]
            for (client, session), ns in expired:
                idle = now - ns.seen
                try:
                    objects, nbytes = ns.close(
                        f"the session of client {client!r} at worker {self.id!r} expired "
                        f"(no call for {lease:g} s, serve --lease)"
                    )
                except Exception as e:  # never let the reaper die
                    print(f"pointers: freeing a session failed: {e!r}", file=sys.stderr)
                    continue
                _trim_heap()  # hand the freed memory back to the system where possible
                print(
                    f"pointers: worker {self.id!r}: the lease of client {client!r} session "
                    f"{session[:8] or '-'} expired ({idle:.1f} s without a call): freed "
                    f"{objects} objects, {nbytes} bytes",
                    file=sys.stderr,
                    flush=True,
                )

    def sessions(self) -> list[tuple[str, str]]:
        """The open client sessions, (identity, token)."""
        with self._lock:
            return list(self._namespaces)

    def stored_bytes(self) -> int:
        """The bytes all sessions count against their limits, together."""
        with self._lock:
            spaces = list(self._namespaces.values())
        return sum(ns.store.bytes for ns in spaces)

    # -- identity ------------------------------------------------------------------------
    def _caller(self, context: grpc.ServicerContext) -> tuple[str, str | None]:
        """The caller's identity and role (``party`` or ``client``; None when insecure),
        from its certificate: a malformed identity or a missing role is refused."""
        if self.config.insecure:
            for key, value in context.invocation_metadata() or ():
                if key == IDENTITY_METADATA and isinstance(value, str):
                    check_identity(value)
                    return value, None
            return "anonymous", None
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            raise NotAllowedError("no client certificate")
        try:
            return certificate_role(pems[0])
        except ValueError as e:
            raise NotAllowedError(f"worker {self.id!r} refuses the certificate: {e}") from None

    def _identity(self, context: grpc.ServicerContext) -> str:
        return self._caller(context)[0]

    @staticmethod
    def _session(context: grpc.ServicerContext) -> str:
        """The caller's session token ("" for a client that sends none: one namespace
        for all such clients of an identity)."""
        for key, value in context.invocation_metadata() or ():
            if key == SESSION_METADATA:
                try:
                    return check_session(value)
                except ValueError as e:
                    raise NotAllowedError(str(e)) from None
        return ""

    def _client_key(self, context: grpc.ServicerContext, what: str) -> tuple[str, str]:
        who, role = self._caller(context)
        if role == PARTY or who in self._peers:
            raise NotAllowedError(
                f"identity {who!r} is a peer worker of {self.id!r} (a party certificate): it "
                f"may deliver protocol messages but not {what}; a client connects with a "
                f"client certificate (`python -m pointers certs DIR --client NAME`, then "
                f"pointers.connect(..., identity=NAME))"
            )
        return who, self._session(context)

    def _client(self, context: grpc.ServicerContext, what: str) -> ServedWorker:
        """The caller's namespace, busy until :meth:`_leave`."""
        return self._enter(*self._client_key(context, what))

    # -- handlers ------------------------------------------------------------------------
    def _exec(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.config.latency:
            time.sleep(self.config.latency)
        start = time.monotonic()  # (after the simulated latency: it stands for the network)
        shares = self.shares["exec"]
        try:
            info, frames = decode_envelope(request)
            key = self._client_key(context, "run commands or fetch objects")
            shares.enter(key[0], "commands", waits="programs" in info)
        except Exception as e:
            return _error_envelope(e, self.epoch)
        try:
            try:
                ns = self._enter(*key)
            except Exception as e:
                return _error_envelope(e, self.epoch)
            try:
                return self._exec_in(ns, info, frames, start)
            finally:
                self._leave(ns)
        finally:
            shares.leave(key[0])

    def _exec_in(
        self, ns: ServedWorker, info: dict[str, Any], frames: list[Any], start: float = 0.0
    ) -> bytes:
        try:
            order = _call_order(info)
        except Exception as e:
            return _error_envelope(e, self.epoch)
        try:
            if order is not None:
                ns.wait_turn(*order)
            return self._exec_turn(ns, info, frames, start)
        except Exception as e:
            return _error_envelope(e, self.epoch)
        finally:
            if order is not None:
                ns.end_turn(order[0], order[1])

    def _exec_turn(
        self, ns: ServedWorker, info: dict[str, Any], frames: list[Any], start: float = 0.0
    ) -> bytes:
        try:
            lost = ns.take_lost(unreachable=False)  # earlier calls' refused deliveries
            if lost is not None:
                raise DeliveryFailed(lost)
            sync = info_field(info, "sync", bool, False)
            programs = info_field(info, "programs", (int, float), None)
            if programs is not None and not (sync and 0 <= programs <= 3600):
                raise FrameError("'programs' is a sync's wait in [0, 3600] seconds")
            deadline = info_field(info, "deadline", (int, float), None)
            if deadline is not None and not 0 < deadline <= 3600:
                raise FrameError(f"a deadline must lie in (0, 3600] seconds, got {deadline}")
            # a client may shorten the worker's deadline, not lengthen it (waits hold threads)
            cap = self.config.deadline
            ns.store.deadline = cap if deadline is None else min(float(deadline), cap)
            expects = info_field(info, "expect", list, None)
            if expects is not None:
                for item in expects:
                    if not (
                        isinstance(item, list)
                        and len(item) == 2
                        and isinstance(item[0], str)
                        and isinstance(item[1], list)
                        and all(type(i) is int for i in item[1])
                    ):
                        raise FrameError("malformed 'expect' field")
                    ns.store.expect(item[0], item[1])
        except Exception as e:
            return _error_envelope(e, self.epoch)
        replies: list[Any] = []
        failed = False
        for k, (tag, header, buffers) in enumerate(frames):
            if tag & SYNC and failed:
                replies.append((k, _SKIPPED, []))
                continue
            rh, rb = ns.handle_frames(header, buffers)  # never raises
            if rb or rh != _OK_NONE or tag & SYNC:  # every request is answered
                replies.append((k, rh, rb))
                if not tag & STALE and is_error_header(rh):
                    failed = True
        out: dict[str, Any] = {"epoch": self.epoch}
        if sync:  # the client's sync rode in this call: answered once the commands ran
            try:
                if programs is not None:  # (bounded) and the programs the client started
                    ns.wait_programs(float(programs))
                    ns.flush_deliveries(float(programs))
                out["stats"] = self._sync(ns)
            except Exception as e:
                out["sync_error"] = [type(e).__name__, str(e)]
        if start:  # how long the call took here: the client tells the network's share
            out["took"] = round(time.monotonic() - start, 6)
        try:
            return encode_envelope(out, replies)
        except Exception as e:
            return _error_envelope(e, self.epoch)

    def _deliver(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        if self.config.latency:
            time.sleep(self.config.latency)
        try:
            who, role = self._caller(context)
            info, frames = decode_envelope(request)
            if info.get("ask") == "data-port":  # a peer opening its data link
                self._party(who, role)
                port = self.data_plane.port if self.data_plane is not None else 0
                return encode_envelope({"data_port": port}, [])
            ns = self._delivery_namespace(who, role, info)
            failed = info_field(info, "failed", list, None)
            if failed is not None:
                if not (len(failed) == 2 and type(failed[0]) is int and isinstance(failed[1], str)):
                    raise FrameError("malformed 'failed' field")
                ns.store.delivery_failed(who, failed[0], failed[1])
                return encode_envelope({}, [(0, _OK_NONE, [])])
            if len(frames) != 1:
                raise FrameError("a delivery carries exactly one message")
            _, header, buffers = frames[0]
            msg = decode_message(header, buffers)
            self._store_delivery(ns, who, msg, serde.nbytes(header, buffers))
            return encode_envelope({}, [(0, _OK_NONE, [])])
        except Exception as e:
            h, b = encode_message(ErrorReply(type(e).__name__, str(e)))
            return encode_envelope({}, [(0, h, b)])

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
    def _store_delivery(ns: ServedWorker, who: str, msg: Any, nbytes: int) -> None:
        """Store a peer's decoded delivery under the namespace's rules (announced ids,
        sealed labels, the storage limit), and count it."""
        if type(msg) is not Store:
            raise NotAllowedError(f"a peer may only deliver objects, not {msg.KIND!r}")
        ns.store.receive(who, msg.obj_id, msg.value, msg.sealed)
        stats = ns.stats  # as a VirtualWorker counts what its peers hand it
        stats.messages_received += 1
        stats.bytes_received += nbytes
        stats.messages_sent += 1
        stats.bytes_sent += len(_OK_NONE)

    def _inspect(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        try:
            info, _ = decode_envelope(request)
            what = info_field(info, "what", str, None)
            if what in ("hello", "lease"):  # (older clients; see _control)
                return self._hello_or_lease(what, context)
            key = self._client_key(context, "inspect a namespace")
            shares = self.shares["inspect"]
            shares.enter(key[0], what or "", waits=what == "programs")
            try:
                ns = self._enter(*key)
                try:
                    return self._inspect_in(ns, what, info)
                finally:
                    self._leave(ns)
            finally:
                shares.leave(key[0])
        except Exception as e:
            return _error_envelope(e, self.epoch)

    def _control(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        """The ``Lease`` method: hellos and lease renewals only, on a pool of their own,
        so that they never queue behind another session's calls (which may wait)."""
        try:
            info, _ = decode_envelope(request)
            what = info_field(info, "what", str, None)
            if what not in ("hello", "lease"):
                raise FrameError(f"the Lease method answers hellos and renewals, not {what!r}")
            return self._hello_or_lease(what, context)
        except Exception as e:
            return _error_envelope(e, self.epoch)

    def _hello_or_lease(self, what: str, context: grpc.ServicerContext) -> bytes:
        if what == "hello":
            return encode_envelope(
                {
                    "worker": self.id,
                    "epoch": self.epoch,
                    "identity": self._identity(context),
                    "deadline": self.config.deadline,
                    "max_message_bytes": self.config.max_message_bytes,
                    "lease": self.config.lease,
                    "max_queued_programs": self.config.max_queued_programs,
                },
                [],
            )
        # a living client renews its session (pointers.network.lease)
        key = self._client_key(context, "renew a session")
        with self._lock:
            known = self._namespaces.get(key)
            if known is not None:
                known.seen = max(known.seen, time.monotonic())
        return encode_envelope({"epoch": self.epoch, "lease": self.config.lease}, [])

    @staticmethod
    def _sync(ns: ServedWorker) -> dict[str, Any]:
        """A client's sync: what its commands sent is delivered first, and a delivery
        that did not arrive is its error; then the namespace's counters."""
        ns.flush_deliveries(ns.store.deadline)
        lost = ns.take_lost()
        if lost is not None:
            if "PartyUnavailable" in lost:
                raise PartyUnavailable(lost, None)
            raise DeliveryFailed(lost)
        return dict(vars(ns.stats))

    def _inspect_in(self, ns: ServedWorker, what: str | None, info: dict[str, Any]) -> bytes:
        try:
            if what == "stats":  # (w.stats) as a sync, then the counters
                deletes = info_field(info, "deletes", list, None)
                if deletes is not None:  # the deletes of dropped pointers ride in a sync
                    if len(deletes) > MAX_SYNC_DELETES or not all(type(i) is int for i in deletes):
                        raise FrameError(
                            f"a sync's 'deletes' are at most {MAX_SYNC_DELETES} object ids"
                        )
                    # run as a command, uncounted like the inspection that carries them
                    # (in process, deletes wait and travel in batches of 64)
                    ns.run_locked(Delete(deletes))  # (unknown ids are ignored)
                out: dict[str, Any] = {"stats": self._sync(ns)}
            elif what == "ids":
                out = {"ids": ns.store.ids()}
            elif what == "reset":
                ns.clear()
                out = {}
            elif what == "programs":  # wait (bounded) for the programs this client started
                timeout = info_field(info, "timeout", (int, float), None)
                if timeout is None or not 0 <= timeout <= 3600:
                    raise FrameError("waiting for programs needs a timeout in [0, 3600] s")
                ns.wait_programs(float(timeout))
                ns.flush_deliveries(float(timeout))
                out = {}
            else:
                raise FrameError(f"unknown inspection {what!r}")
            out["epoch"] = self.epoch
            return encode_envelope(out, [])
        except Exception as e:
            return _error_envelope(e, self.epoch)


def _trim_heap() -> None:
    """glibc keeps freed small blocks for reuse; malloc_trim returns them to the system
    (a no-op elsewhere)."""
    gc.collect()  # request buffers caught in reference cycles (tracebacks) go now
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


MAX_SYNC_DELETES = 1 << 14  # object ids a sync may carry to delete
MALLOC_ARENAS = 2  # glibc malloc arenas of a served worker (see _limit_arenas)


def _limit_arenas() -> None:
    """glibc gives each thread that allocates its own malloc arena (up to 8 per core), and
    memory freed in an arena of one of the many gRPC threads mostly stays with the
    process: a worker then keeps about what each client sent it. With two arenas, freed
    memory returns (measured: RSS back to its baseline after each of 8 clients that sent
    32 MiB and left, instead of growing by about 33 MiB per client). An explicit
    MALLOC_ARENA_MAX wins; a no-op off glibc."""
    if sys.platform.startswith("linux") and "MALLOC_ARENA_MAX" not in os.environ:
        try:
            ctypes.CDLL("libc.so.6").mallopt(-8, MALLOC_ARENAS)  # M_ARENA_MAX
        except (OSError, AttributeError):
            pass


def _in_pool(
    handler: Callable[[bytes, grpc.ServicerContext], bytes], pool: futures.ThreadPoolExecutor
) -> Callable[[bytes, grpc.ServicerContext], bytes]:
    """``handler`` run on ``pool`` instead of the server's pool (gRPC's per-method pool:
    the ``experimental_thread_pool`` attribute of a method's behaviour, honoured by
    grpcio's synchronous server; were it ignored, the method would share the server's
    pool, as before)."""

    def behaviour(request: bytes, context: grpc.ServicerContext) -> bytes:
        return handler(request, context)

    behaviour.experimental_thread_pool = pool  # type: ignore[attr-defined]
    return behaviour


def _call_order(info: dict[str, Any]) -> tuple[str, int, bool] | None:
    """A call's ``order`` field: its connection's token, its number, and whether it left
    while the calls before it were in flight (then it runs after them)."""
    order = info_field(info, "order", list, None)
    if order is None:
        return None
    if not (
        len(order) == 3
        and isinstance(order[0], str)
        and 0 < len(order[0]) <= 64
        and type(order[1]) is int
        and 0 < order[1] < 1 << 62
        and order[2] in (0, 1)
    ):
        raise FrameError("malformed 'order' field")
    return order[0], order[1], bool(order[2])


def _error_envelope(e: Exception, epoch: str) -> bytes:
    return encode_envelope({"epoch": epoch, "error": [type(e).__name__, str(e)]}, [])


# ----------------------------------------------------------------------------------------
# python -m pointers serve
# ----------------------------------------------------------------------------------------


def serve(
    config: ServerConfig,
    *,
    ready: Callable[[WorkerServer], None] | None = None,
    watch_stdin: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM (or, with ``watch_stdin``, until standard input
    closes); prints one line with the address once listening."""
    _limit_arenas()  # before the server's threads allocate
    server = WorkerServer(config)
    server.start()
    mode = (
        "INSECURE: no TLS, no authentication, loopback only"
        if config.insecure
        else f"mutual TLS, CA {Path(config.certs or '') / 'ca.pem'}"
    )
    names = sorted(server.functions)
    print(
        f"pointers: worker {server.id!r} serving on {server.address} ({mode}); "
        f"{len(names)} worker functions; deadline {config.deadline:g} s; "
        f"lease {config.lease:g} s"
        + (f"; added latency {config.latency * 1000:g} ms per call" if config.latency else "")
        + (f"; data plane on port {server.data_plane.port}" if server.data_plane else ""),
        flush=True,
    )
    if ready is not None:
        ready(server)
    done = threading.Event()

    def _stop(signum: int, frame: Any) -> None:
        done.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    if watch_stdin:

        def _watch() -> None:
            while sys.stdin.buffer.read(4096):
                pass
            done.set()

        threading.Thread(target=_watch, name="pointers-stdin", daemon=True).start()
    while not done.wait(0.5):
        pass
    server.stop(grace=0.5)
    print(f"pointers: worker {server.id!r} stopped", file=sys.stderr, flush=True)


__all__ = ["PeerLink", "ServerConfig", "WorkerServer", "plugin_functions", "serve"]
