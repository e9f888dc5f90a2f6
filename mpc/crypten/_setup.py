"""What ``crypten.init()`` sets up: the party workers, the crypto provider, one
:class:`mpc.Session` per world size, and the communication counters.

CrypTen's ranks are processes that each hold one share. Here a client (this process)
orchestrates workers that hold the shares: rank ``i`` of a world of ``k`` ranks is party
worker ``i`` of a ``k``-party session, and a crypto provider (the dealer, a worker of its
own that colludes with no party) deals the correlated randomness. The workers are
in-process :class:`pointers.VirtualWorker`s by default, served processes on this machine
with ``served=True`` (:class:`pointers.network.cluster.LocalCluster`), or workers the user
connected (``parties=[...]``, ``crypto_provider=...``).
"""

from __future__ import annotations

import atexit
from collections import Counter
from typing import Any

import pointers as pt
from mpc.accounting import Recorder
from mpc.config import MPCConfig
from mpc.session import MAX_PARTIES, Session


class Stats:
    """Communication since ``crypten.init()`` or the last reset, summed over calls."""

    def __init__(self) -> None:
        self.rounds = 0
        self.bytes_per_party: Counter[str] = Counter()
        self.dealer_bytes = 0
        self.client_messages = 0
        self.time = 0.0

    def add(self, rec: Recorder, seconds: float) -> None:
        self.rounds += rec.rounds
        self.bytes_per_party.update(rec.bytes_per_party)
        self.dealer_bytes += rec.dealer_bytes
        self.client_messages += rec.client_messages
        self.time += seconds


class Setup:
    """The workers and sessions of one ``crypten.init()``."""

    def __init__(
        self,
        parties: Any = None,
        crypto_provider: Any = None,
        served: bool = False,
        config: MPCConfig | None = None,
    ) -> None:
        self.config = config or MPCConfig()
        self.served = served
        self.default_size = 2
        self.given: list[Any] | None = None
        if isinstance(parties, int) and not isinstance(parties, bool):
            self.default_size = parties
        elif parties is not None:
            self.given = list(parties)
            if crypto_provider is None:
                raise ValueError(
                    "parties=[...] names the party workers: name the crypto provider too "
                    "(crypto_provider=worker), a worker that is none of the parties"
                )
            if served:
                raise ValueError("served=True starts its own workers: pass parties=[...] or served")
            self.default_size = len(self.given)
        if not 2 <= self.default_size <= MAX_PARTIES:
            raise ValueError(
                f"a world here has 2 to {MAX_PARTIES} parties (CrypTen's world size 1 has no "
                f"secret), got {self.default_size}"
            )
        self.dealer = crypto_provider
        self._virtual: list[pt.VirtualWorker] = []
        self._sessions: dict[int, Session] = {}
        self._clusters: dict[int, Any] = {}
        self.stats = Stats()
        if served:
            atexit.register(self.close)

    def max_size(self) -> int:
        return len(self.given) if self.given is not None else MAX_PARTIES

    def session(self, size: int) -> Session:
        """The session of a world of ``size`` ranks (made on first use, then kept)."""
        s = self._sessions.get(size)
        if s is not None and s.is_current():
            return s
        if not 2 <= size <= self.max_size():
            where = "the parties given to crypten.init" if self.given else "a world here"
            raise ValueError(f"world_size={size}: {where} allow(s) 2 to {self.max_size()} parties")
        if self.given is not None:
            s = Session(self.given[:size], self.dealer, self.config)
        elif self.served:
            s = Session(*self._served(size), self.config)
        else:
            while len(self._virtual) < size:
                self._virtual.append(pt.VirtualWorker(f"party{len(self._virtual)}"))
            if self.dealer is None:
                self.dealer = pt.VirtualWorker("dealer")
            s = Session(self._virtual[:size], self.dealer, self.config)
        self._sessions[size] = s
        return s

    def _served(self, size: int) -> tuple[list[Any], Any]:
        from pointers.network.cluster import LocalCluster

        ids = [f"party{i}" for i in range(size)]
        cluster = LocalCluster([*ids, "dealer"]).start()
        self._clusters[size] = cluster
        return [cluster.connect(i) for i in ids], cluster.connect("dealer")

    def party_ids(self, size: int) -> list[str]:
        return [p.id for p in self.session(size).parties]

    def close(self) -> None:
        """Stop the served workers this setup started (their shares go with them)."""
        self._sessions.clear()
        clusters, self._clusters = self._clusters, {}
        for c in clusters.values():
            c.stop()
