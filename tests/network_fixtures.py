"""Real worker processes on loopback for the network tests.

A :class:`Cluster` writes a development CA and certificates into a temporary directory,
starts one ``python -m pointers serve`` process per worker id on a free port (``--port 0``;
the process prints its address), and kills every process it started when stopped.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pointers as pt
from pointers.network.certs import create_certs
from pointers.network.cluster import ServerProcess as _LibraryServer


class ServerProcess(_LibraryServer):
    """The library's ``python -m pointers serve`` launcher with the tests' defaults (one
    torch thread, 16 handler threads), started on loopback, and able to restart."""

    def __init__(self, worker_id: str, certs: Path, log: Path, args: Iterable[str] = ()) -> None:
        super().__init__(worker_id, certs, log, ["--torch-threads", "1", "--threads", "16", *args])

    def start(self, port: int = 0) -> None:  # type: ignore[override]
        super().start("127.0.0.1", port)

    @property
    def port(self) -> int:
        assert self.address is not None
        return int(self.address.rpartition(":")[2])

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
        worker_args: dict[str, list[str]] | None = None,
    ) -> None:
        """``args``: serve options of every worker; ``worker_args``: of one worker (a
        model owner's ``--offer FILE``)."""
        self.root = Path(root)
        self.certs = self.root / "certs"
        self.worker_ids = list(worker_ids)
        create_certs(self.certs, self.worker_ids, clients=clients)
        extra = worker_args or {}
        self.servers = {
            w: ServerProcess(w, self.certs, self.root / f"{w}.log", [*args, *extra.get(w, [])])
            for w in self.worker_ids
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
