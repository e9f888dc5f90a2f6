"""Sessions, leases and resource bounds of served workers (issue 12), against real
``python -m pointers serve`` processes where a lifecycle is concerned:

* every process of a client identity has its own namespace (its session): two never see,
  nor reset, each other's objects, and peers deliver into the right one;
* a client that is SIGKILLed, or closes without dropping its pointers, has its objects
  freed by the workers within the lease (``--lease``), and a new session of the same
  identity works at once; a living idle client keeps its objects (background renewal);
* programs, plans and tags count against ``--max-stored-mb``; ``--max-objects``;
* an op whose output would pass ``--max-stored-mb`` is refused before it allocates;
* RunProgram threads are bounded per client and per worker, and the deadline a client
  asks for is capped by the worker's.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from network_fixtures import Cluster

import mpc
import pointers as pt
from pointers.network import ClientContext, ServerConfig, WorkerServer
from pointers.network.certs import create_certs
from pointers.network.limits import footprint
from pointers.wire.messages import ExecuteOp, Fetch, RunProgram, StoreProgram, Tag
from pointers.wire.serde import Slot, SlotRef

pytestmark = pytest.mark.network

LEASE = 3.0  # seconds (the servers' --lease here)
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(
        tmp_path_factory.mktemp("leases"),
        ["alice", "bob", "carol"],
        ["client", "other"],
        args=["--lease", str(LEASE), "--max-sessions", "6", "--max-stored-mb", "256"],
    )
    c.start()
    yield c
    c.stop()


def _rss(pid: int, field: str = "VmRSS") -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) << 10
    raise RuntimeError(f"no {field} for process {pid}")


def _pid(cluster: Cluster, worker: str) -> int:
    proc = cluster.servers[worker].proc
    assert proc is not None
    return proc.pid


_FREED = re.compile(
    r"lease of client '(\w+)' session (\w+) expired .*freed (\d+) objects, (\d+) bytes"
)


def _freed(cluster: Cluster, worker: str) -> list[tuple[str, str, int, int]]:
    """The lease expiries a worker reported on its standard error, in order."""
    out = cluster.servers[worker].output()
    return [(m[1], m[2], int(m[3]), int(m[4])) for m in _FREED.finditer(out)]


_CHILD = textwrap.dedent(
    """
    import sys, time, torch, mpc, pointers as pt
    certs, a, b, c, n = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
    alice = pt.connect("alice", a, certs=certs, identity="client")
    bob = pt.connect("bob", b, certs=certs, identity="client")
    carol = pt.connect("carol", c, certs=certs, identity="client")
    for w in (alice, bob, carol):
        w.reset()  # its own session only: the test process's objects stay
    x = torch.arange(1 << 20, dtype=torch.float32) / 7
    probe = mpc.share(x, alice, bob, crypto_provider=carol)
    assert torch.allclose(probe.get(), x, atol=1e-3)  # shares work (get() frees the probe's)
    kept = [mpc.share(x + k, alice, bob, crypto_provider=carol) for k in range(n)]
    kept.append(pt.send(torch.ones(1 << 20), alice))  # and a plain tensor: they stay there
    for w in (alice, bob, carol):
        w.sync()
    print("READY", flush=True)
    time.sleep(600)
    """
)


def _child(cluster: Cluster, n: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    args = [cluster.address(w) for w in ("alice", "bob", "carol")]
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(cluster.certs), *args, str(n)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _wait_ready(proc: subprocess.Popen[str], timeout: float = 120.0) -> None:
    assert proc.stdout is not None
    end = time.monotonic() + timeout
    lines = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if line.strip() == "READY":
            return
    proc.kill()
    raise RuntimeError("the client process did not get ready:\n" + "".join(lines[-30:]))


@pytest.mark.slow
def test_a_killed_client_is_freed_within_the_lease(cluster):
    alice = cluster.connect("alice")  # this process's session: it must not be touched
    bob, carol = cluster.connect("bob"), cluster.connect("carol")
    warm = mpc.share(
        torch.arange(1 << 20, dtype=torch.float32) / (1 << 20), alice, bob, crypto_provider=carol
    )
    assert (warm + 1).get().shape == (1 << 20,)  # the code paths ran
    del warm
    mine = pt.send(torch.tensor([1.0, 2.0, 3.0]), alice)
    for w in (alice, bob, carol):
        w.sync()
    pid = _pid(cluster, "alice")
    before = _rss(pid)
    seen = len(_freed(cluster, "alice"))
    child = _child(cluster, 4)  # 4 shares of 8 MiB per party, 4 MiB plain: about 36 MiB
    try:
        _wait_ready(child)
        loaded = _rss(pid)
        assert loaded - before > 30 << 20, (before, loaded)
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
        killed = time.monotonic()
        while len(_freed(cluster, "alice")) == seen and time.monotonic() - killed < LEASE + 10:
            time.sleep(0.1)
        reclaim = time.monotonic() - killed
        events = _freed(cluster, "alice")[seen:]
        assert events, "alice never freed the dead client's session"
        client, _, objects, nbytes = events[0]
        assert client == "client" and objects >= 5 and nbytes >= 36 << 20
        assert reclaim < LEASE + 3.0, reclaim
        time.sleep(0.5)
        after = _rss(pid)
        assert after - before < 16 << 20, (before, loaded, after)  # (the issue asks 10 %)
        print(
            f"\nalice RSS {before >> 20} MiB -> {loaded >> 20} MiB with the client -> "
            f"{after >> 20} MiB {reclaim:.1f} s after SIGKILL (lease {LEASE:g} s; freed "
            f"{objects} objects, {nbytes} bytes)"
        )
    finally:
        if child.poll() is None:
            child.kill()
    # this process's own session, same identity, lived on with its object (the other
    # process's reset() and death did not touch it)
    assert torch.equal(mine.get(), torch.tensor([1.0, 2.0, 3.0]))
    # and a new session of the identity works at once (shares, dealer material, get), and
    # dead clients do not add up: after a second one, alice is back at the baseline again
    seen = len(_freed(cluster, "alice"))
    again = _child(cluster, 4)
    try:
        _wait_ready(again)
    finally:
        again.kill()
        again.wait(10)
    killed = time.monotonic()
    while len(_freed(cluster, "alice")) == seen and time.monotonic() - killed < LEASE + 10:
        time.sleep(0.1)
    time.sleep(0.5)
    second = _rss(pid)
    print(f"after a second killed client: {second >> 20} MiB")
    assert second - before < 16 << 20, (before, after, second)
    cluster.close_connections()


def test_two_sessions_of_one_identity_are_apart(cluster):
    ctx1, ctx2 = ClientContext(), ClientContext()
    a1, b1, c1 = (cluster.connect(w, context=ctx1) for w in ("alice", "bob", "carol"))
    a2, b2, c2 = (cluster.connect(w, context=ctx2) for w in ("alice", "bob", "carol"))
    p1 = pt.send(torch.tensor([1.0, 2.0]), a1)
    p1.tag("#mine")
    assert p1.id_at_location not in a2.objects
    assert a2.search("#mine") == []
    x, y = torch.tensor([1.5, -2.0, 3.25]), torch.tensor([-4.0, 0.5, 2.0])
    s1 = mpc.share(x, a1, b1, crypto_provider=c1)
    s2 = mpc.share(y, a2, b2, crypto_provider=c2)
    m1, m2 = s1 * s1, s2 * s2  # both in flight: each party delivers into the right session
    assert torch.allclose(m2.get(), y * y, atol=1e-3)
    assert torch.allclose(m1.get(), x * x, atol=1e-3)
    a2.reset()  # the other session's reset leaves ours alone
    b2.reset()
    assert len(a2.objects) == 0
    assert torch.equal(p1.get(), torch.tensor([1.0, 2.0]))
    assert torch.allclose((s1 * s1).get(), x * x, atol=1e-3)
    with pytest.raises(pt.RemoteError, match="no object"):
        s2.get()  # its own reset took its shares
    for w in (a1, b1, c1, a2, b2, c2):
        w.close()


def test_sessions_per_identity_are_capped(cluster):
    ctxs = [ClientContext() for _ in range(6)]
    conns = [cluster.connect("bob", identity="other", context=c) for c in ctxs]
    for w in conns:
        pt.send(torch.ones(1), w).get()  # each opened its session (6: the limit)
    extra = cluster.connect("bob", identity="other", context=ClientContext())
    with pytest.raises(pt.LimitExceeded, match="--max-sessions"):
        pt.send(torch.ones(1), extra).get()
    client = cluster.connect("bob", context=ClientContext())  # another identity: unaffected
    assert torch.equal(pt.send(torch.ones(2), client).get(), torch.ones(2))
    for w in conns:
        w.close()  # without dropping anything: freed a lease later
    time.sleep(LEASE + 2.0)
    assert torch.equal(pt.send(torch.ones(3), extra).get(), torch.ones(3))
    cluster.close_connections()


@pytest.mark.slow
def test_an_idle_living_client_keeps_its_objects(cluster):
    ctx = ClientContext()
    carol = cluster.connect("carol", context=ctx)
    p = pt.send(torch.arange(5.0), carol)
    carol.sync()
    time.sleep(2.5 * LEASE)  # no call of ours: only the background renewal
    assert torch.equal(p.get(), torch.arange(5.0))
    carol.close()


def test_a_closed_client_is_freed_and_told_so(cluster):
    ctx = ClientContext()
    carol = cluster.connect("carol", context=ctx)
    obj_id = pt.send(torch.ones(4), carol).id_at_location
    carol.sync()
    carol.close()  # its pointer was never dropped
    time.sleep(LEASE + 2.0)
    again = cluster.connect("carol", context=ctx)  # the same session, later
    with pytest.raises(pt.RemoteError, match="lease expired"):
        again.request(Fetch(obj_id, False))
    again.close()


def test_an_op_too_large_is_refused_before_it_allocates(cluster):
    alice = cluster.connect("alice", context=ClientContext())
    pid = _pid(cluster, "alice")
    peak = _rss(pid, "VmHWM")
    n = (3 << 30) // 4  # 3 GiB of float32, under a 256 MiB limit
    with pytest.raises(pt.LimitExceeded, match="refused before running"):
        alice.request(ExecuteOp("aten::ones.default", [[n]], {}, [alice.new_id()], False))
    col = pt.send(torch.ones(30_000, 1), alice)
    row = pt.send(torch.ones(1, 30_000), alice)
    with pytest.raises(pt.LimitExceeded, match="aten::(add|mul).*refused before running"):
        (col * row).get()  # 3.6 GB by broadcasting
    with pytest.raises(pt.LimitExceeded, match="aten::mm"):
        (col @ row).get()
    grew = _rss(pid, "VmHWM") - peak
    print(f"\npeak RSS of alice grew {grew >> 20} MiB while refusing 3 GiB and 3.6 GB outputs")
    assert grew < 64 << 20  # nothing of the size was ever allocated
    # what fits runs, and is right
    a, b = torch.randn(300, 1), torch.randn(1, 200)
    assert torch.allclose((pt.send(a, alice) * pt.send(b, alice)).get(), a * b)
    alice.close()


# ---------------------------------------------------- in-process servers (limits only)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice"], clients=["client"])
    return d


@pytest.fixture
def serve(certs):
    started: list[WorkerServer] = []
    conns: list[pt.NetworkWorker] = []

    def start(**config) -> tuple[WorkerServer, pt.NetworkWorker]:
        s = WorkerServer(ServerConfig("alice", certs=str(certs), threads=8, **config), {})
        s.start()
        started.append(s)
        w = pt.connect("alice", s.address, certs=certs, context=ClientContext())
        conns.append(w)
        return s, w

    yield start
    for w in conns:
        w.close()
    for s in started:
        s.stop(grace=None)


def _program(n_deletes: int) -> list:
    return [["delete", list(range(1000, 2000))] for _ in range(n_deletes)]


def test_programs_tags_and_counts_are_limited(serve):
    srv, alice = serve(max_stored_bytes=256 << 10, max_objects=8)
    big = _program(100)  # 100,000 ids: a few MiB as Python objects, 300 KB on the wire
    with pytest.raises(pt.LimitExceeded, match="over its limit of 262144 bytes"):
        alice.request(StoreProgram(alice.new_id(), big))
    small = alice.new_id()
    alice.request(StoreProgram(small, _program(1)))
    stored = srv.stored_bytes()
    assert stored >= footprint(_program(1)) > 30_000  # the program counts
    p = pt.send(torch.ones(2), alice)
    with pytest.raises(pt.LimitExceeded, match="tags and description"):
        alice.request(Tag(p.id_at_location, [f"#{k:06d}" * 100 for k in range(400)], ""))
    alice.request(Tag(p.id_at_location, ["#ok"], "fine"))
    assert srv.stored_bytes() == stored + 8 + len("#ok") + 64 + len("fine")
    kept = [pt.send(torch.ones(1), alice) for _ in range(6)]  # 8 objects: the limit
    alice.sync()
    with pytest.raises(pt.LimitExceeded, match="--max-objects"):
        pt.send(torch.ones(1), alice).get()
    del kept
    alice.sync()  # (the deletes of dropped pointers travel now)
    assert torch.equal(pt.send(torch.ones(1), alice).get(), torch.ones(1))


def _waiting_program(alice: pt.NetworkWorker) -> int:
    """A program whose one step waits for an object that nobody makes (the deadline)."""
    pid = alice.new_id()
    raw = [["op", "aten::abs.default", [SlotRef(0)], {}, [Slot(1)], False]]
    alice.request(StoreProgram(pid, raw))
    return pid


def _program_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name.startswith("program-"))


def test_program_threads_are_bounded_and_deadlines_capped(serve):
    srv, alice = serve(
        deadline=1.0, programs_per_client=2, programs_per_worker=3, max_queued_programs=3
    )
    pid = _waiting_program(alice)
    base = _program_threads()

    def run(w: pt.NetworkWorker, program: int) -> None:
        missing, out = w.new_id(), w.new_id()
        w.request(RunProgram(program, [missing, out], [missing]))

    start = time.monotonic()
    for _ in range(5):  # 2 run, 3 wait
        run(alice, pid)
    assert _program_threads() - base <= 2
    with pytest.raises(pt.LimitExceeded, match="programs waiting to run"):
        run(alice, pid)
    # another session (deadline 3600 s asked, the worker's 1 s given) shares the
    # worker's 3 program threads: one more runs, its others wait
    other = pt.connect(
        "alice", srv.address, certs=srv.config.certs, context=ClientContext(), deadline=3600
    )
    opid = _waiting_program(other)
    for _ in range(2):
        run(other, opid)
    assert _program_threads() - base <= 3
    alice.wait_programs(30.0)  # 5 programs of 1 s (the worker's deadline), 2 at a time
    took = time.monotonic() - start
    assert 2.5 < took < 15.0, took
    other.wait_programs(30.0)
    assert time.monotonic() - start < 20.0  # not 3600 s: the deadline was capped
    time.sleep(0.2)
    assert _program_threads() == base
    other.close()


def test_lease_options_are_checked(capsys):
    from pointers.__main__ import main

    for bad in (["--lease", "0"], ["--max-sessions", "0"], ["--programs-per-client", "0"]):
        assert main(["serve", "--id", "alice", "--insecure", "--port", "0", *bad]) == 2
        assert "must" in capsys.readouterr().err
    with pytest.raises(ValueError, match="lease"):
        ServerConfig("alice", insecure=True, lease=0.5)


def test_a_plan_too_large_is_refused_before_it_runs(serve):
    srv, alice = serve(max_stored_bytes=256 << 10)

    @pt.func2plan(args_shape=[(-1,)])
    def outer(x):
        return x.unsqueeze(1) * x.unsqueeze(0)

    remote = outer.send(alice)
    small = torch.arange(100.0)
    assert torch.equal(remote(pt.send(small, alice)).get(), torch.outer(small, small))
    before = srv.stored_bytes()
    with pytest.raises(pt.LimitExceeded, match="plan .*refused before running"):
        remote(pt.send(torch.ones(1000), alice)).get()  # 4 MB of output
    alice.sync()
    assert srv.stored_bytes() <= before + 4000  # (the 4 KB input, if not yet dropped)
