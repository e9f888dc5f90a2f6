"""Load (issue 12): 8 concurrent clients against 3 served workers for a minute.

Each client is a thread with its own :class:`~pointers.network.ClientContext` (its own
session at every worker): four with their own certificate identity, four sharing one
identity. Each loops over share / multiply / compare / add / get, and a plain pointer op,
with every result checked against plaintext torch, rotating which worker is the crypto
provider; every fourth round on vectors of 1e4 to 1e5 elements. Passes with 0 errors, 0 wrong results, and each worker process's resident
memory back within 10% of its baseline (measured after a warm-up round of the same
clients) once the clients closed and their leases ran out.

``LOAD_SECONDS`` (environment) shortens or lengthens the run; the default is 60.
"""

from __future__ import annotations

import gc
import os
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from network_fixtures import Cluster

import mpc
import pointers as pt
from mpc.math.encoding import encode
from pointers.network import ClientContext
from pointers.network.connection import Connection

pytestmark = [pytest.mark.network, pytest.mark.slow]

WORKERS = ("alice", "bob", "carol")
CLIENTS = 8
OWN_IDENTITIES = tuple(f"load{i}" for i in range(4))  # clients 0-3
SHARED_IDENTITY = "loadshared"  # clients 4-7: one certificate, four sessions
LEASE_S = 3.0
SECONDS = float(os.environ.get("LOAD_SECONDS", "60"))
WARM_UP_S = 20.0
RSS_SLACK = 0.10


@dataclass
class Tally:
    rounds: int = 0
    checks: int = 0
    wrong: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for process {pid}")


def _identity(k: int) -> str:
    return OWN_IDENTITIES[k] if k < len(OWN_IDENTITIES) else SHARED_IDENTITY


def _client(cluster: Cluster, k: int, until: float, tally: Tally, min_rounds: int = 1) -> None:
    """One client: its own context (session), connections, and checked loop."""
    gen = torch.Generator().manual_seed(1000 + k)
    ctx = ClientContext()
    conns: list[pt.NetworkWorker] = []
    try:
        conns = [
            pt.connect(
                w,
                cluster.address(w),
                certs=cluster.certs,
                identity=_identity(k),
                context=ctx,
            )
            for w in WORKERS
        ]
        r = 0
        while r < min_rounds or time.monotonic() < until:
            # rotate the roles: every worker is a party and the crypto provider in turn
            d = (k + r) % 3
            dealer = conns[d]
            parties = [conns[(d + 1) % 3], conns[(d + 2) % 3]]
            # mostly small vectors (many rounds), every fourth one large (the allocator's
            # large-block paths: 1e4 to 1e5 elements, 80 to 800 KB per share)
            hi = 100_001 if r % 4 == 3 else 33
            n = int(torch.randint(1 if hi == 33 else 10_000, hi, (1,), generator=gen))
            x = (torch.rand(n, generator=gen, dtype=torch.float64) - 0.5) * 200
            y = (torch.rand(n, generator=gen, dtype=torch.float64) - 0.5) * 200
            y[0] = x[0]  # an equal pair: the comparison's edge
            a = mpc.share(x, *parties, crypto_provider=dealer)
            b = mpc.share(y, *parties, crypto_provider=dealer)
            got = {
                "mul": (a * b).get(),
                "lt": (a < b).get(),
                "add": (a + b).get(),
                "mul_public": (a * 0.5).get(),
            }
            p = pt.send(x, conns[r % 3])
            got["pointer"] = ((p * 3) - 1).get()
            unit = 2.0**-16
            want_lt = encode(x, 16) < encode(y, 16)
            ok = {
                "mul": bool(((got["mul"] - x * y).abs() <= (x.abs() + y.abs() + 2) * unit).all()),
                "lt": torch.equal(got["lt"].bool(), want_lt),
                "add": bool(((got["add"] - (x + y)).abs() <= 2 * unit).all()),
                "mul_public": bool(((got["mul_public"] - 0.5 * x).abs() <= 2 * unit).all()),
                "pointer": torch.equal(got["pointer"], x * 3 - 1),
            }
            tally.checks += len(ok)
            for name, good in ok.items():
                if not good:
                    tally.wrong.append(f"client {k} round {r} {name}: x={x} y={y} got={got[name]}")
            del a, b, p
            r += 1
            tally.rounds += 1
    except Exception:
        tally.errors.append(f"client {k} ({_identity(k)}): {traceback.format_exc()}")
    finally:
        for c in conns:
            try:
                c.close()
            except Exception:
                tally.errors.append(f"client {k} closing: {traceback.format_exc()}")


def _run_clients(cluster: Cluster, seconds: float, min_rounds: int) -> list[Tally]:
    until = time.monotonic() + seconds
    tallies = [Tally() for _ in range(CLIENTS)]
    threads = [
        threading.Thread(
            target=_client, args=(cluster, k, until, tallies[k], min_rounds), name=f"load-{k}"
        )
        for k in range(CLIENTS)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 300)
        assert not t.is_alive(), f"{t.name} did not finish"
    gc.collect()  # the clients' sessions, shares and seeds: their deletes go at close
    return tallies


def _settled_rss(cluster: Cluster, wait: float) -> dict[str, int]:
    """Each worker's RSS once the clients' leases ran out (and the store was freed)."""
    time.sleep(wait)
    return {w: _rss_kib(cluster.servers[w].proc.pid) for w in WORKERS}  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: Any) -> Any:
    root = Path(tmp_path_factory.mktemp("load"))
    c = Cluster(
        root,
        WORKERS,
        clients=(*OWN_IDENTITIES, SHARED_IDENTITY),
        args=["--lease", f"{LEASE_S:g}"],
    )
    c.start()
    yield c
    c.stop()


def test_eight_clients_for_a_minute(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # calls overlap as on a slow link (on loopback the client would not pipeline): the
    # workers' waiting calls must not starve deliveries or lease renewals
    monkeypatch.setattr(Connection, "PIPELINE_MIN_TRANSIT", 0.0)
    # warm-up: the same load for a while (the workers' thread pools, channels, and the
    # allocator's per-thread arenas reach their working size), then the baseline
    warm = _run_clients(cluster, WARM_UP_S, min_rounds=4)  # a large round each, at least
    assert [e for t in warm for e in t.errors] == []
    baseline = _settled_rss(cluster, LEASE_S * 2 + 2)

    start = time.monotonic()
    tallies = _run_clients(cluster, SECONDS, min_rounds=1)
    elapsed = time.monotonic() - start
    peak = {w: _rss_kib(cluster.servers[w].proc.pid) for w in WORKERS}  # type: ignore[union-attr]
    after = _settled_rss(cluster, LEASE_S * 2 + 2)

    rounds = sum(t.rounds for t in tallies)
    checks = sum(t.checks for t in tallies)
    errors = [e for t in tallies for e in t.errors]
    wrong = [w for t in tallies for w in t.wrong]
    print(
        f"\nload: {CLIENTS} clients, {elapsed:.1f} s, {rounds} rounds, {checks} checked "
        f"results, {len(errors)} errors, {len(wrong)} wrong; per client rounds "
        f"{[t.rounds for t in tallies]}"
    )
    for w in WORKERS:
        print(
            f"load: {w} RSS baseline {baseline[w] / 1024:.1f} MiB, right after the clients "
            f"{peak[w] / 1024:.1f} MiB, settled {after[w] / 1024:.1f} MiB "
            f"({(after[w] / baseline[w] - 1) * 100:+.1f}%)"
        )
    assert errors == [], "\n".join(errors[:5])
    assert wrong == [], "\n".join(wrong[:5])
    assert all(t.rounds >= 1 for t in tallies)
    for w in WORKERS:
        assert after[w] <= baseline[w] * (1 + RSS_SLACK), (
            f"worker {w}: RSS {after[w]} KiB after the clients closed, baseline {baseline[w]} KiB"
        )
