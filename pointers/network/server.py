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
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from pointers.errors import PartyUnavailable
from pointers.network.certs import (
    PARTY,
    Credentials,
    certificate_role,
    check_party_certificate,
    load_credentials,
)
from pointers.network.config import ServerConfig, plugin_functions
from pointers.network.dataplane import DataLink, DataPlaneServer
from pointers.network.framing import (
    FrameError,
    decode_envelope,
    encode_envelope,
    info_field,
    is_error_header,
)
from pointers.network.limits import warm_meta
from pointers.network.peers import DeliveryFailed
from pointers.network.quotas import CallShares, FairProgramPool
from pointers.network.served import ServedWorker
from pointers.network.sessions import Sessions
from pointers.network.transport import (
    IDENTITY_METADATA,
    SERVER_KEEPALIVE_OPTIONS,
    SERVICE,
    STALE,
    SYNC,
    bind_address,
)
from pointers.wire import serde
from pointers.wire.messages import Delete, ErrorReply, Reply, decode_message, encode_message
from pointers.worker.faults import with_faults

_OK_NONE, _ = encode_message(Reply(None))
_SKIPPED, _ = encode_message(
    ErrorReply("Skipped", "not run: an earlier command of the same batch failed")
)
CONTROL_THREADS = 4  # threads of the Lease method's pool (hellos and lease renewals)


class WorkerServer(Sessions):
    """A :class:`ServedWorker` per client session behind one gRPC server: the control
    service (its ``Exec``, ``Deliver``, ``Inspect`` and ``Lease`` methods) over its
    sessions (:class:`~pointers.network.sessions.Sessions`) and peers
    (:class:`~pointers.network.peers.PeerLinks`)."""

    def __init__(
        self,
        config: ServerConfig,
        functions: Mapping[str, Callable[..., Any]] | None = None,
    ) -> None:
        self.config = config
        self.id = config.worker_id
        self.functions = with_faults(
            plugin_functions() if functions is None else functions, config.faults
        )
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
        self._init_peers()  # channels, data links, link counts (PeerLinks)
        self._lock = threading.Lock()
        self._server: grpc.Server | None = None
        self._pools: list[futures.ThreadPoolExecutor] = []
        self.post_pool = self._post_pool()
        self.port: int | None = None
        # the data plane (on unless serve --no-data-plane; never without TLS): its listener
        self.data_plane: DataPlaneServer | None = None

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
            if info.get("ask") == "room":  # a paused sender (flow control, PeerLink)
                return self._room(ns, who, info)
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
            pause = self._store_delivery(ns, who, msg, serde.nbytes(header, buffers))
            return encode_envelope({"pause": True} if pause else {}, [(0, _OK_NONE, [])])
        except Exception as e:
            h, b = encode_message(ErrorReply(type(e).__name__, str(e)))
            return encode_envelope({}, [(0, h, b)])

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
    exit_when_stopped: bool = False,
) -> None:
    """Serve until SIGINT/SIGTERM (or, with ``watch_stdin``, until standard input
    closes); prints one line with the address once listening.

    ``exit_when_stopped`` (``python -m pointers serve``): then end the process at once.
    Handlers still running are abandoned rather than waited for: the interpreter joins
    gRPC's handler threads at exit, so one call waiting out its ``--deadline`` (600 s for
    the transformer benchmarks) kept a stopped worker, and the gigabytes it held, alive
    that long after its launcher had died."""
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
    if exit_when_stopped:
        sys.stdout.flush()
        os._exit(0)


__all__ = ["WorkerServer", "serve"]
