"""Real worker processes on loopback for the network tests.

A :class:`Cluster` writes a development CA and certificates into a temporary directory,
starts one ``python -m pointers serve`` process per worker id on a free port (``--port 0``;
the process prints its address), and kills every process it started when stopped.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pointers as pt
from pointers.network.certs import create_certs

ROOT = Path(__file__).resolve().parent.parent
_ADDRESS = re.compile(r"serving on (\S+) ")
STARTUP_TIMEOUT = 180.0  # seconds; torch imports slowly on a busy machine


class ServerProcess:
    """One ``python -m pointers serve`` process."""

    def __init__(self, worker_id: str, certs: Path, log: Path, args: Iterable[str] = ()) -> None:
        self.worker_id, self.certs, self.log = worker_id, certs, log
        self.args = list(args)
        self.proc: subprocess.Popen[str] | None = None
        self.address: str | None = None
        self._lines: list[str] = []
        self._ready = threading.Event()

    def start(self, port: int = 0) -> None:
        cmd = [
            sys.executable,
            "-m",
            "pointers",
            "serve",
            "--id",
            self.worker_id,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--certs",
            str(self.certs),
            "--torch-threads",
            "1",
            "--threads",
            "16",
            "--watch-stdin",  # the process ends with this one, even if it is killed
            *self.args,
        ]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
        self._ready.clear()
        self.address = None
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, args=(self.proc,), daemon=True).start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        with open(self.log, "a") as log:
            for line in proc.stdout:
                log.write(line)
                log.flush()
                self._lines.append(line)
                m = _ADDRESS.search(line)
                if m and not self._ready.is_set():
                    self.address = m.group(1)
                    self._ready.set()
        self._ready.set()  # the process ended

    def wait_ready(self, timeout: float = STARTUP_TIMEOUT) -> str:
        if not self._ready.wait(timeout) or self.address is None:
            self.kill()
            tail = "".join(self._lines[-20:])
            raise RuntimeError(f"worker {self.worker_id!r} did not start:\n{tail}")
        return self.address

    @property
    def port(self) -> int:
        assert self.address is not None
        return int(self.address.rpartition(":")[2])

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, as a crash would (no clean shutdown)."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def terminate(self) -> None:
        """Ask for a clean shutdown (SIGTERM); :meth:`stop` waits for it."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()

    def stop(self) -> None:
        self.terminate()
        if self.proc is not None:
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
            if self.proc.stdin is not None:
                self.proc.stdin.close()

    def restart(self) -> str:
        """Start again on the same port (a restarted worker: same address, empty store)."""
        port = self.port
        self.kill()
        for _ in range(20):
            self.start(port)
            try:
                return self.wait_ready()
            except RuntimeError:
                if "cannot listen" not in "".join(self._lines[-5:]):
                    raise
                time.sleep(0.5)  # the port is still held for a moment
        raise RuntimeError(f"worker {self.worker_id!r} could not restart on port {port}")


class Cluster:
    """Worker processes sharing one development CA; ``connect`` gives NetworkWorkers."""

    def __init__(
        self,
        root: Path,
        worker_ids: Iterable[str],
        clients: Iterable[str] = ("client",),
        args: Iterable[str] = (),
    ) -> None:
        self.root = Path(root)
        self.certs = self.root / "certs"
        self.worker_ids = list(worker_ids)
        create_certs(self.certs, [*self.worker_ids, *clients])
        self.servers = {
            w: ServerProcess(w, self.certs, self.root / f"{w}.log", args) for w in self.worker_ids
        }
        self._connections: list[pt.NetworkWorker] = []

    def start(self) -> Cluster:
        for s in self.servers.values():
            s.start()
        try:
            for s in self.servers.values():
                s.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def address(self, worker_id: str) -> str:
        address = self.servers[worker_id].address
        assert address is not None
        return address

    def connect(self, worker_id: str, identity: str = "client", **kwargs: Any) -> pt.NetworkWorker:
        w = pt.connect(
            worker_id, self.address(worker_id), certs=self.certs, identity=identity, **kwargs
        )
        self._connections.append(w)
        return w

    def fresh(self, worker_id: str, **kwargs: Any) -> pt.NetworkWorker:
        """A new connection to a worker whose namespace for this client is emptied."""
        w = self.connect(worker_id, **kwargs)
        w.reset()
        return w

    def close_connections(self) -> None:
        conns, self._connections = self._connections, []
        for w in conns:
            w.close()

    def stop(self) -> None:
        self.close_connections()
        for s in self.servers.values():
            s.terminate()
        for s in self.servers.values():
            s.stop()
