"""Client sessions and their leases at served workers.

A served worker keeps one namespace (objects, counters, peer links, programs) per client
*session*, not per certificate identity: two processes using the same client certificate
never see, nor ``reset()``, each other's objects. A session is named by a random token
that every call of the client carries in its gRPC metadata (:data:`SESSION_METADATA`);
the connections of one :class:`~pointers.network.context.ClientContext` in one process
share it (the same token at every worker, so that peers deliver into the right namespace
at each other).

Each namespace lives under a lease (``serve --lease``, default 60 s): a worker frees every
object of a session that made no call for that long. While a client runs, a daemon thread
here renews its leases (a ``Lease`` call on each open connection every quarter
of the lease the worker announced in its hello), so an idle but living client keeps its
objects, and a client that dies, or closes without dropping its pointers, loses them
within a lease. Each connection is renewed on its own, with a timeout the client chooses
(:data:`RENEW_TIMEOUT`): a slow or hostile worker never delays the renewals of the others.
"""

from __future__ import annotations

import atexit
import os
import re
import threading
import time
import weakref
from typing import Any, Protocol

from pointers.network.context import ClientContext
from pointers.network.transport import SERVICE


class Connection(Protocol):
    """What the heartbeat asks of a connection (the real class, in
    :mod:`pointers.network.connection`, imports this module): a renewal of its lease
    that does not wait for the answer."""

    def renew_lease(self, timeout: float) -> Any: ...


SESSION_METADATA = "pointers-session"
SESSION_RE = re.compile(r"[0-9a-f]{32}")
MIN_HEARTBEAT = 0.25  # seconds between two renewals of one connection's lease, at least
MAX_HEARTBEAT = 60.0  # ... and at most (whatever lease a worker announces)
RENEW_TIMEOUT = 5.0  # seconds a renewal may take (the client's choice, not the worker's)
# hellos and renewals travel on a method of their own, which a served worker answers on a
# pool of its own: they never queue behind another session's calls
LEASE = f"/{SERVICE}/Lease"


def session_of(context: ClientContext) -> str:
    """The session token of ``context`` in this process (a new one after a fork), kept on
    the context itself (``context.session``)."""
    pid = os.getpid()
    with context.lock:
        known = context.session
        if known is None or known[0] != pid:
            known = context.session = (pid, os.urandom(16).hex())
        return known[1]


def check_session(token: str) -> str:
    """A session token is 32 lowercase hex digits (128 random bits)."""
    if not isinstance(token, str) or not SESSION_RE.fullmatch(token):
        raise ValueError("a session token is 32 lowercase hex digits")
    return token


class _Renewal:
    """One connection's renewals: its pace, when the last one left, the one in flight."""

    __slots__ = ("conn", "interval", "last", "future")

    def __init__(self, conn: Connection, interval: float) -> None:
        self.conn = weakref.ref(conn)
        self.interval = interval
        self.last = time.monotonic()
        self.future: Any = None


class _Heartbeat:
    """One daemon thread that renews the leases of every open connection of this process.

    Each renewal leaves as a gRPC future with a timeout this client chooses
    (:data:`RENEW_TIMEOUT`, whatever the worker announced), and the thread never waits for
    its answer: a slow or hostile worker holds only its own renewal (the next one of that
    connection leaves once it was answered or timed out), never another connection's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: dict[int, _Renewal] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0
        self._stop = threading.Event()
        self._hooked = False

    def watch(self, conn: Connection, lease: float) -> None:
        interval = min(max(lease / 4, MIN_HEARTBEAT), MAX_HEARTBEAT)
        key = id(conn)
        with self._lock:
            self._watched[key] = _Renewal(conn, interval)
            if self._thread is None or self._pid != os.getpid() or not self._thread.is_alive():
                self._pid = os.getpid()
                self._thread = threading.Thread(
                    target=self._run, name="pointers-lease", daemon=True
                )
                self._thread.start()
                if not self._hooked:  # stop before interpreter exit freezes daemon threads
                    self._hooked = True
                    atexit.register(self.stop)

    def stop(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5.0)

    def _due(self) -> list[tuple[Connection, _Renewal]]:
        now = time.monotonic()
        out: list[tuple[Connection, _Renewal]] = []
        with self._lock:
            for key, renewal in list(self._watched.items()):
                conn = renewal.conn()
                if conn is None or getattr(conn, "_closed", False):
                    del self._watched[key]
                elif now - renewal.last >= renewal.interval:
                    pending = renewal.future
                    if pending is not None and not pending.done():
                        continue  # (its worker has not answered yet: it holds only this)
                    renewal.last = now
                    out.append((conn, renewal))
        return out

    def _run(self) -> None:
        while not self._stop.is_set():
            for conn, renewal in self._due():
                try:
                    renewal.future = conn.renew_lease(RENEW_TIMEOUT)
                except Exception:  # noqa: S110 - the next call reports an unreachable worker
                    renewal.future = None
                del conn
            self._stop.wait(MIN_HEARTBEAT)


_HEARTBEAT = _Heartbeat()


def renew_leases(conn: Connection, hello: dict[str, Any]) -> None:
    """Keep ``conn``'s session alive at its worker while ``conn`` is open, at the pace the
    worker's hello asks for (no ``lease`` in the hello: a worker without leases)."""
    lease = hello.get("lease")
    if isinstance(lease, int | float) and not isinstance(lease, bool) and lease > 0:
        _HEARTBEAT.watch(conn, float(lease))


__all__ = ["LEASE", "SESSION_METADATA", "check_session", "renew_leases", "session_of"]
