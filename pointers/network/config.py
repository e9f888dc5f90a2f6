"""How a worker is served: :class:`ServerConfig` (addresses, credentials, limits) and the
worker functions installed packages declare (:func:`plugin_functions`).

Imports :mod:`pointers.network.certs` and :mod:`pointers.network.transport` only.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import Any

from pointers.network.certs import check_identity
from pointers.network.transport import DEFAULT_MAX_MESSAGE, is_loopback, split_address

ENTRY_POINT_GROUP = "pointers.worker_functions"
DATA_PLANE_ENV = "POINTERS_DATA_PLANE"  # "0": serve without the data plane (gRPC only)
MAX_HELD_ENV = "POINTERS_MAX_HELD_MB"  # the default of ServerConfig.max_held_bytes, in MiB
MAX_HELD_MB = 256


def _max_held_default() -> int | None:
    """``POINTERS_MAX_HELD_MB`` (MiB; ``0``: no bound), else :data:`MAX_HELD_MB`."""
    raw = os.environ.get(MAX_HELD_ENV, "").strip()
    try:
        mb = float(raw) if raw else float(MAX_HELD_MB)
    except ValueError:
        raise ValueError(f"{MAX_HELD_ENV} must be a number of MiB, not {raw!r}") from None
    return int(mb * (1 << 20)) or None


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
    # flow control of peer deliveries (pointers.network.waiting.WaitingStore.room): once
    # the deliveries a session holds before the client announced them take more than this,
    # a busy session asks their senders to pause (None: no bound); from the environment
    # (POINTERS_MAX_HELD_MB, default 256 MiB, 0: none) since serve has no flag for it
    max_held_bytes: int | None = field(default_factory=_max_held_default)
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
    # bulk deliveries over persistent TLS sockets (pointers.network.dataplane), on by
    # default; off with serve --no-data-plane or POINTERS_DATA_PLANE=0 in the environment
    # (then every delivery goes over gRPC); never with --insecure
    data_plane: bool = field(default_factory=lambda: os.environ.get(DATA_PLANE_ENV) != "0")
    data_port: int = 0  # the data plane's TCP port (0: a free one, told to peers over gRPC)
    # a model owner's policy for the values it shares from here: its approvals and its
    # registered values (serve --offer FILE; pointers.worker.policy.Policy), the same
    # object on every session's namespace
    offer: Any = field(default=None, compare=False, hash=False)
    # data owners (pointers.worker.owners.DataPolicy): as a party, the deployment's listed
    # owners, the least number an aggregate spans and the bound on each weight (serve
    # --owner, --min-owners, --max-weight); as an owner's worker, its data (serve --data)
    data_owners: Any = field(default=None, compare=False, hash=False)
    # for the tests of the malicious mode only: functions of this worker that deviate
    # (serve --fault; pointers.worker.faults, refused unless POINTERS_ALLOW_FAULTS=1)
    faults: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        check_identity(self.worker_id)
        for owner in getattr(self.data_owners, "owners", ()):
            check_identity(owner)
            if owner == self.worker_id or owner in dict(self.peers):
                raise ValueError(
                    f"{owner!r} is this worker or one of its --peer workers: a computing "
                    "party or the dealer is never a data owner (--owner)"
                )
        for party in getattr(self.offer, "approvals", {}):
            check_identity(party)
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
        if self.max_held_bytes is not None and self.max_held_bytes < 1:
            raise ValueError("max_held_bytes must be positive (None: no bound)")
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
