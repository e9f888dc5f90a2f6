"""Served workers on this machine, started and stopped by one object: :class:`LocalCluster`.

A :class:`LocalCluster` writes a development CA and one certificate per identity into a
temporary directory, starts one ``python -m pointers serve`` process per worker on
127.0.0.1 with a free port (``--port 0``; each process prints the address it got) and
mutual TLS, hands out :class:`~pointers.network.client.NetworkWorker` connections, and
stops every process it started::

    with LocalCluster(["alice", "bob", "carol"], latency_ms=1) as cluster:
        alice = cluster.connect("alice")
        ...

No process outlives the cluster: :meth:`LocalCluster.stop` (called by ``with`` and by a
failed :meth:`LocalCluster.start`) sends SIGTERM and then SIGKILL; each server also runs
with ``--watch-stdin`` and its standard input is a pipe held by this process, so a server
ends when this process does, even if this process is killed outright. The servers run in
their own session, so a Ctrl-C at the terminal reaches only this process, whose
``finally``/``with`` then stops them in order.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pointers.network.certs import create_certs
from pointers.network.client import NetworkWorker, connect

_ADDRESS = re.compile(r"serving on (\S+) ")
# the directory that holds the ``pointers`` package: on the servers' PYTHONPATH, so they
# import this very copy even when it is not installed
_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])
STARTUP_TIMEOUT = 180.0  # seconds; importing torch is slow on a busy machine


class ServerProcess:
    """One ``python -m pointers serve`` process; its output goes to ``log``."""

    def __init__(self, worker_id: str, certs: Path, log: Path, args: Iterable[str] = ()) -> None:
        self.worker_id, self.certs, self.log = worker_id, Path(certs), Path(log)
        self.args = list(args)
        self.proc: subprocess.Popen[str] | None = None
        self.address: str | None = None
        self._lines: list[str] = []
        self._ready = threading.Event()

    def start(self, host: str = "127.0.0.1", port: int = 0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "pointers",
            "serve",
            "--id",
            self.worker_id,
            "--host",
            host,
            "--port",
            str(port),
            "--certs",
            str(self.certs),
            "--watch-stdin",  # ends with this process, even if this one is killed
            *self.args,
        ]
        path = os.pathsep.join(p for p in (_PACKAGE_PARENT, os.environ.get("PYTHONPATH")) if p)
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", PYTHONPATH=path)
        # a new event each start: the killed process's reader, which may reach its end
        # after this, sets only its own (a restart's wait read it as this start failing)
        self._ready = ready = threading.Event()
        self.address = None
        self.proc = subprocess.Popen(
            cmd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # Ctrl-C reaches the launcher only; it stops us
        )
        threading.Thread(
            target=self._read, args=(self.proc, ready), name=f"serve-{self.worker_id}", daemon=True
        ).start()

    def _read(self, proc: subprocess.Popen[str], ready: threading.Event) -> None:
        assert proc.stdout is not None
        with open(self.log, "a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                self._lines.append(line)
                m = _ADDRESS.search(line)
                if m and proc is self.proc and not ready.is_set():
                    self.address = m.group(1)
                    ready.set()
        # the process ended: wake a wait for it (a replaced process's event is no longer
        # waited on: a restart's new process has its own)
        ready.set()

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> str:
        """The address once the server listens; RuntimeError (with its output) if it
        ended or did not listen within ``timeout`` seconds."""
        if not self._ready.wait(timeout) or self.address is None:
            self.kill()
            tail = "".join(self._lines[-20:]).rstrip() or "(no output)"
            raise RuntimeError(f"worker {self.worker_id!r} did not start:\n{tail}")
        return self.address

    def output(self) -> str:
        return "".join(self._lines)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def terminate(self) -> None:
        """Ask for a clean shutdown (SIGTERM); :meth:`stop` waits for it."""
        if self.alive():
            assert self.proc is not None
            self.proc.terminate()

    def kill(self) -> None:
        if self.alive():
            assert self.proc is not None
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout`` seconds; waits for the process."""
        if self.proc is None:
            return
        self.terminate()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        if self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


class LocalCluster:
    """Worker processes on 127.0.0.1 sharing a temporary development CA.

    ``worker_ids`` are the served workers; ``clients`` the identities that connect to them
    (certificates are made for both). ``latency_ms`` is each server's ``--latency-ms``,
    ``torch_threads`` its ``--torch-threads``, ``server_args`` any further ``serve``
    options, ``worker_args`` options of one worker only (by id: e.g. a model owner's
    ``--offer FILE``). ``root`` is where the certificates and the servers' logs go (default: a new
    temporary directory, removed by :meth:`stop`).
    """

    def __init__(
        self,
        worker_ids: Iterable[str],
        *,
        clients: Iterable[str] = ("client",),
        latency_ms: float = 0.0,
        torch_threads: int = 1,
        server_args: Iterable[str] = (),
        worker_args: dict[str, list[str]] | None = None,
        root: str | os.PathLike[str] | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
    ) -> None:
        self.worker_ids = list(dict.fromkeys(worker_ids))
        if not self.worker_ids:
            raise ValueError("a cluster needs at least one worker")
        if not 0 <= latency_ms <= 10_000:
            raise ValueError(f"latency_ms must lie in [0, 10000], got {latency_ms}")
        self.clients = list(dict.fromkeys(clients))
        self.latency_ms = float(latency_ms)
        self.startup_timeout = startup_timeout
        self._own_root = root is None
        self.root = Path(tempfile.mkdtemp(prefix="pointers-cluster-") if root is None else root)
        self.certs = self.root / "certs"
        self.args = [
            "--latency-ms",
            f"{self.latency_ms:g}",
            "--torch-threads",
            str(torch_threads),
            *server_args,
        ]
        self.worker_args = {w: list(a) for w, a in (worker_args or {}).items()}
        unknown = sorted(set(self.worker_args) - set(self.worker_ids))
        if unknown:
            raise ValueError(f"worker_args names workers the cluster does not serve: {unknown}")
        self.servers: dict[str, ServerProcess] = {}
        self._connections: list[NetworkWorker] = []

    # -- lifecycle -----------------------------------------------------------------------
    def start(self) -> LocalCluster:
        """Write the certificates, start every server and wait until all listen."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            create_certs(self.certs, self.worker_ids, clients=self.clients)
            for w in self.worker_ids:
                args = [*self.args, *self.worker_args.get(w, [])]
                s = ServerProcess(w, self.certs, self.root / f"{w}.log", args)
                self.servers[w] = s
                s.start()
            deadline = time.monotonic() + self.startup_timeout
            for s in self.servers.values():
                s.wait_ready(max(1.0, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Close the connections, stop every server (SIGTERM, then SIGKILL) and remove the
        temporary directory. Safe to call more than once."""
        try:
            self.close_connections()
        finally:
            for s in self.servers.values():
                s.terminate()
            for s in self.servers.values():
                s.stop()
            if self._own_root:
                shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- workers -------------------------------------------------------------------------
    def address(self, worker_id: str) -> str:
        address = self.servers[worker_id].address
        if address is None:
            raise RuntimeError(f"worker {worker_id!r} is not serving")
        return address

    def connect(
        self, worker_id: str, identity: str = "client", fresh: bool = True, **kwargs: Any
    ) -> NetworkWorker:
        """A new connection to ``worker_id`` as ``identity``; ``fresh`` first empties that
        identity's namespace at the worker (objects and counters of earlier connections)."""
        w = connect(
            worker_id, self.address(worker_id), certs=self.certs, identity=identity, **kwargs
        )
        self._connections.append(w)
        if fresh:
            w.reset()
        return w

    def close_connections(self) -> None:
        """Close every connection :meth:`connect` made (each sends what it has queued)."""
        conns, self._connections = self._connections, []
        for w in conns:
            try:
                w.close()
            except Exception:  # noqa: S110 - closing is best effort; the servers stop anyway
                pass

    def pids(self) -> list[int]:
        return [s.proc.pid for s in self.servers.values() if s.proc is not None]

    def __repr__(self) -> str:
        where = ", ".join(f"{w}@{s.address}" for w, s in self.servers.items())
        return f"<LocalCluster {where} latency {self.latency_ms:g} ms>"


__all__ = ["LocalCluster", "ServerProcess"]
