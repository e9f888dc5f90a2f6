"""Who runs a workload: the computing parties and the crypto provider (their names, the
factory that makes them, the sessions' config) and the data workers of W8."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pointers as pt
from mpc.config import MPCConfig

# Computing parties, in order (2 to 5 of them), and the crypto provider.
PARTY_NAMES = ("alice", "bob", "dan", "erin", "frank")
DEALER_NAME = "carol"
# The sessions' config (``python -m benchmarks --comparison fss`` sets the FSS comparison;
# None: the default config). The builders read it when they run, so set it here
# (``benchmarks.workloads.workers.CONFIG``): the package does not re-export it.
CONFIG: MPCConfig | None = None

SECAGG_CLIENTS = 5  # data workers whose updates W8 aggregates
OWNERS = {"W16": "owner16", "W17": "owner17"}  # the model owner's worker of W16, W17


# Makes the worker of a name: ``pt.VirtualWorker`` (the default, in process), or a fresh
# connection to a served worker (``python -m benchmarks --network``).
WorkerFactory = Callable[[str], Any]


def _parties(
    n: int = 2, factory: WorkerFactory | None = None, dealer: bool = True
) -> tuple[list[Any], Any]:
    """``n`` fresh computing parties (alice, bob, dan, erin, frank) and a crypto provider
    (None with ``dealer=False``), made by ``factory`` (default ``pt.VirtualWorker``)."""
    if not 2 <= n <= len(PARTY_NAMES):
        raise ValueError(f"parties must be 2..{len(PARTY_NAMES)}, got {n}")
    make = factory or pt.VirtualWorker
    return [make(name) for name in PARTY_NAMES[:n]], make(DEALER_NAME) if dealer else None


def worker_names(workload: str, parties: int = 2) -> list[str]:
    """The workers a workload uses (what ``--network`` must serve)."""
    if workload.startswith("P"):
        return [PARTY_NAMES[0]]
    names = list(PARTY_NAMES[:parties])
    if workload == "W8":
        return names + [f"client{k}" for k in range(SECAGG_CLIENTS)]
    if workload in OWNERS:  # generation: the model owner's worker too
        return names + [DEALER_NAME, OWNERS[workload]]
    return names + [DEALER_NAME]
