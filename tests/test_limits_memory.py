"""Memory past the limits from one small message (issue 28, findings 1-6), as an attacker
sends it to served workers under ``--max-stored-mb 64``: every case is refused before it
allocates (the worker's peak RSS, VmHWM, moves by far less than the attack's size), or
counted against the session.

1. registered functions declare their size (``mpc.material.sizes``) and are refused
   before they run; 2. a plan's intermediates, ``fn::`` nodes and factory ops are sized;
3. a stored view counts the storage it keeps alive; 4. fetch replies are bounded before
   they are built; 5. data-dependent ops (a boolean mask's ``index``) are bounded by their
   inputs; 6. bookkeeping (``expect``, ``failed`` notices, nonce records, deliveries in
   flight) counts against the session.

The last test measures the peak of every registered step in process against what it
declares.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from network_fixtures import Cluster

import mpc
import pointers as pt
from mpc.protocols.sizes import SLACK
from pointers.network import ClientContext, ServerConfig, WorkerServer
from pointers.network.certs import create_certs
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.lease import session_of
from pointers.network.transport import DELIVER, EXEC, SYNC, open_channel
from pointers.plans.wire import MAGIC, VERSION
from pointers.wire.messages import (
    AcceptPeer,
    CallFunction,
    Delete,
    ErrorReply,
    ExecuteOp,
    Fetch,
    RunPlan,
    Store,
    StorePlan,
    decode_message,
    encode_message,
)
from pointers.wire.serde import Ref

pytestmark = pytest.mark.network

MB = 1 << 20
LIMIT = 64 * MB


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(
        tmp_path_factory.mktemp("limits"),
        ["alice", "bob", "carol"],
        args=["--max-stored-mb", "64", "--lease", "30"],
    )
    c.start()
    yield c
    c.stop()


def _peak(cluster: Cluster, worker: str) -> int:
    proc = cluster.servers[worker].proc
    assert proc is not None
    for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise RuntimeError("no VmHWM")


class Rise:
    """The rise of a worker's peak RSS over a block (printed, for the record)."""

    def __init__(self, cluster: Cluster, worker: str, what: str) -> None:
        self.cluster, self.worker, self.what = cluster, worker, what

    def __enter__(self) -> Rise:
        self.before = _peak(self.cluster, self.worker)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.grew = _peak(self.cluster, self.worker) - self.before
        print(f"\n{self.what}: peak RSS of {self.worker} rose {self.grew / MB:.1f} MiB")


def _connect(cluster: Cluster, *workers: str) -> Any:
    """Connections to ``workers`` in a session of their own (one context)."""
    ctx = ClientContext()
    conns = [cluster.connect(w, context=ctx) for w in workers]
    return conns[0] if len(conns) == 1 else conns


def _raw(cluster: Cluster, worker: str, identity: str, method: str) -> Any:
    channel = open_channel(
        cluster.address(worker),
        worker_id=worker,
        credentials=pt.network.load_credentials(cluster.certs, identity),
        max_message_bytes=256 * MB,
    )
    return channel, channel.unary_unary(method)


def _replies(resp: bytes) -> list[Any]:
    info, frames = decode_envelope(resp)
    assert "error" not in info, info
    return [decode_message(h, b) for _, h, b in frames]


def _call(w: pt.NetworkWorker, name: str, args: list[Any], n_out: int = 1) -> None:
    w.request(CallFunction(name, args, {}, [w.new_id() for _ in range(n_out)], False))


# -- 1. registered functions ------------------------------------------------------------


def test_registered_functions_are_sized_before_they_run(cluster):
    alice, bob, carol = _connect(cluster, "alice", "bob", "carol")
    x = mpc.share(torch.ones(4), alice, bob, crypto_provider=carol)
    for w in (alice, bob, carol):
        w.sync()  # (the seeds have arrived)
    seed = x.session.party_seeds[0].id_at_location  # alice's seed, from the dealer
    with Rise(cluster, "alice", "mpc.derive of 1 GiB") as r:
        with pytest.raises(pt.LimitExceeded, match="mpc.derive.*refused before running"):
            _call(alice, "mpc.derive", [Ref(seed), 1 << 40, 7, [1 << 27]])
    assert r.grew < 32 * MB
    with Rise(cluster, "alice", "share_from_seed, bilinear_public, share_update") as r:
        with pytest.raises(pt.LimitExceeded, match="mpc.share_from_seed"):
            _call(alice, "mpc.share_from_seed", [os.urandom(16), [1 << 27]])
        col = pt.send(torch.ones(8192, 1, dtype=torch.int64), alice)
        row = pt.send(torch.ones(1, 8192, dtype=torch.int64), alice)
        with pytest.raises(pt.LimitExceeded, match="mpc.bilinear_public"):
            args = [Ref(col.id_at_location), Ref(row.id_at_location), False, "matmul", {}]
            _call(alice, "mpc.bilinear_public", args)
        # sharing a remote tensor: 8 MiB of float16 in 5 shares of int64 is 320 MiB
        update = pt.send(torch.full((4 << 20,), 0.5, dtype=torch.float16), alice)
        with pytest.raises(pt.LimitExceeded, match="share_update"):
            args = [Ref(update.id_at_location), 16, 5, 2.0**40, 1, 2]
            _call(alice, "mpc.secagg.share_update", args, n_out=5)
    assert r.grew < 48 * MB
    # what fits runs, and is right
    assert torch.allclose((x * x).get(), torch.ones(4), atol=1e-3)
    cluster.close_connections()


# -- 2. plans ---------------------------------------------------------------------------


def _plan(nodes: list[Any], out: int, spec: list[Any]) -> list[Any]:
    return [MAGIC, VERSION, "attack", [spec], 0, [], nodes, [Ref(out)], False]


def test_plan_intermediates_fn_nodes_and_factories_are_sized(cluster):
    alice = _connect(cluster, "alice")
    x = pt.send(torch.ones(1), alice)
    # ones(2^26) -> sum -> + x: 256 MiB inside, 4 bytes out; the factory has no device
    nodes = [
        ["aten::ones.default", [[1 << 26]], {}],
        ["aten::sum.default", [Ref(1)], {}],
        ["aten::add.Tensor", [Ref(0), Ref(2)], {}],
    ]
    pid = alice.new_id()
    alice.request(StorePlan(pid, _plan(nodes, 3, [[1], "float32"])))
    with Rise(cluster, "alice", "plan ones(2^26) -> sum") as r:
        with pytest.raises(pt.LimitExceeded, match="plan 'attack', node 0"):
            alice.request(RunPlan(pid, [Ref(x.id_at_location)], [alice.new_id()], False))
    assert r.grew < 32 * MB
    # an fn:: node: (8192, 1) * (1, 8192) by broadcasting, 512 MiB of int64
    col = pt.send(torch.ones(8192, 1, dtype=torch.int64), alice)
    nodes = [
        ["aten::t.default", [Ref(0)], {}],
        ["fn::mpc.bilinear_public", [Ref(0), Ref(1), False, "mul", None], {}],
        ["aten::sum.default", [Ref(2)], {}],
    ]
    pid = alice.new_id()
    alice.request(StorePlan(pid, _plan(nodes, 3, [[8192, 1], "int64"])))
    with Rise(cluster, "alice", "plan fn::mpc.bilinear_public") as r:
        with pytest.raises(pt.LimitExceeded, match="fn::mpc.bilinear_public"):
            alice.request(RunPlan(pid, [Ref(col.id_at_location)], [alice.new_id()], False))
    assert r.grew < 32 * MB
    small = pt.send(torch.ones(8, 1, dtype=torch.int64), alice)
    nodes[0] = ["aten::t.default", [Ref(0)], {}]
    pid = alice.new_id()
    alice.request(StorePlan(pid, _plan(nodes, 3, [[8, 1], "int64"])))
    out = alice.new_id()
    alice.request(RunPlan(pid, [Ref(small.id_at_location)], [out], False))
    assert int(alice.request(Fetch(out, True))) == 64  # what fits runs
    cluster.close_connections()


# -- 3. views -----------------------------------------------------------------------------


def test_a_view_counts_the_storage_it_keeps_alive(cluster):
    alice = _connect(cluster, "alice")
    n = 12 << 20  # 48 MiB of float32
    views = []
    with Rise(cluster, "alice", "views of freed 48 MiB bases") as r:
        with pytest.raises(pt.LimitExceeded, match="refused before running"):
            for _ in range(40):
                big, view = alice.new_id(), alice.new_id()
                alice.request(ExecuteOp("aten::ones.default", [[n]], {}, [big], False))
                alice.request(
                    ExecuteOp("aten::slice.Tensor", [Ref(big), 0, 0, 1], {}, [view], False)
                )
                alice.request(Delete([big]))
                views.append(view)
    assert len(views) == 1  # the second base does not fit beside the first view (48 MiB)
    assert r.grew < 64 * MB
    cluster.close_connections()


# -- 4. replies -------------------------------------------------------------------------


def test_a_reply_is_bounded_before_it_is_built(cluster):
    channel, call = _raw(cluster, "bob", "client", EXEC)
    try:
        obj = 7_000_001
        h, b = encode_message(Store(obj, torch.ones(1 << 20), [], ""))  # 4 MiB
        assert _replies(call(encode_envelope({}, [(SYNC, h, b)]), timeout=60))[0].value is None
        fetch = encode_message(Fetch(obj, False))
        with Rise(cluster, "bob", "one Exec of 128 fetches of a 4 MiB tensor") as r:
            resp = call(encode_envelope({}, [(SYNC, *fetch)] * 128), timeout=120)
        replies = _replies(resp)
        refused = [m for m in replies if isinstance(m, ErrorReply)]
        assert refused and refused[0].kind == "LimitExceeded", refused[:1]
        assert all(m.kind in ("LimitExceeded", "Skipped") for m in refused)
        assert len(replies) - len(refused) <= 16  # 64 MiB of replies at most
        assert r.grew < 3 * LIMIT
        # the replies were sent: their bytes are free again
        assert _replies(call(encode_envelope({}, [(SYNC, *fetch)]), timeout=60))[0].value.numel()
    finally:
        channel.close()


# -- 5. data-dependent ops ----------------------------------------------------------------


def test_data_dependent_ops_are_bounded_by_their_inputs(cluster):
    alice = _connect(cluster, "alice")
    # a (1024, 1024) float32 tensor indexed by 64K rows and a boolean mask of its columns:
    # 512 KiB of indices, 256 MiB out (the meta device cannot size it: data-dependent)
    t = pt.send(torch.ones(1024, 1024), alice)
    mask = pt.send(torch.ones(1024, dtype=torch.bool), alice)
    rows = pt.send(torch.zeros(1 << 16, 1, dtype=torch.int64), alice)
    with Rise(cluster, "alice", "index.Tensor with a boolean mask") as r:
        with pytest.raises(pt.LimitExceeded, match="aten::index.Tensor"):
            args = [Ref(t.id_at_location), [Ref(rows.id_at_location), Ref(mask.id_at_location)]]
            alice.request(ExecuteOp("aten::index.Tensor", args, {}, [alice.new_id()], False))
    assert r.grew < 32 * MB
    small = pt.send(torch.arange(3.0), alice)
    m = pt.send(torch.tensor([True, False, True]), alice)
    out = alice.new_id()  # what fits runs (sized as if every element were set)
    args = [Ref(small.id_at_location), [Ref(m.id_at_location)]]
    alice.request(ExecuteOp("aten::index.Tensor", args, {}, [out], False))
    assert torch.equal(alice.request(Fetch(out, True)), torch.tensor([0.0, 2.0]))
    cluster.close_connections()


# -- 6. bookkeeping -----------------------------------------------------------------------


def test_announcements_and_failure_notices_count(cluster):
    alice, bob = _connect(cluster, "alice", "bob")
    channel, call = _raw(cluster, "bob", "client", EXEC)
    try:  # 3M announced ids (the old worker: +500 MiB)
        chunk = list(range(1 << 16))
        with Rise(cluster, "bob", "expect of 3M ids") as r:
            for k in range(48):
                items = [["alice", [i + (k << 16) for i in chunk]]]
                resp = call(encode_envelope({"expect": items}, []), timeout=60)
                info, _ = decode_envelope(resp)
                if "error" in info:
                    break
        assert info.get("error", [""])[0] == "LimitExceeded", info
        assert "announcing deliveries" in info["error"][1]
        assert r.grew < 2 * LIMIT
    finally:
        channel.close()
    # failure notices with 1 MB reasons from a party, for ids nobody announced
    bob.request(AcceptPeer("alice"))
    info = {"client": "client", "from": "alice", "session": session_of(bob._conn.context)}
    channel, deliver = _raw(cluster, "bob", "alice", DELIVER)
    try:
        with Rise(cluster, "bob", "300 failure notices of 1 MB") as r:
            for k in range(300):
                notice = {**info, "failed": [9_000_000 + k, "x" * MB]}
                resp = deliver(encode_envelope(notice, []), timeout=60)
        assert r.grew < 64 * MB
    finally:
        channel.close()
    del alice
    cluster.close_connections()


@pytest.fixture
def trio(tmp_path):
    """Three in-process served workers with a 1 MiB limit (their accounting is read here)."""
    create_certs(tmp_path, ["alice", "bob", "carol"], clients=["client"])
    servers = {
        w: WorkerServer(
            ServerConfig(w, certs=str(tmp_path), threads=8, deadline=1.5, max_stored_bytes=1 << 20)
        )  # fmt: skip
        for w in ("alice", "bob", "carol")
    }
    for s in servers.values():
        s.start()
    ctx = ClientContext()
    conns = {w: pt.connect(w, s.address, certs=tmp_path, context=ctx) for w, s in servers.items()}
    yield servers, conns
    for c in conns.values():
        c.close()
    for s in servers.values():
        s.stop(grace=None)


def test_nonce_records_count_against_the_session(trio):
    servers, w = trio
    x = mpc.share(torch.ones(2), w["alice"], w["bob"], crypto_provider=w["carol"])
    for c in w.values():
        c.sync()
    seed = x.session.party_seeds[0].id_at_location
    (ns,) = servers["alice"]._namespaces.values()
    alice = w["alice"]
    with pytest.raises(pt.LimitExceeded, match="mpc.derive"):
        for k in range(20_000):  # 192 bytes each: about 5,000 fit in 1 MiB
            alice.post(
                CallFunction("mpc.derive", [Ref(seed), (1 << 40) + k, 7, [1]], {}, [None], False)
            )
            if k % 500 == 499:
                alice.sync()
    assert ns.store.kept <= 1 << 20
    assert 2_000 < ns.store.kept // 192 < 6_000


def test_deliveries_in_flight_count_against_the_session(trio):
    servers, w = trio
    stall = threading.Event()

    def stalled(request: bytes, context: Any) -> bytes:  # a peer that never answers
        stall.wait(10)
        return encode_envelope({}, [])

    bob_server = servers["bob"]
    bob_server._deliver = stalled  # type: ignore[method-assign]
    # (the handler was bound at start: restart bob's gRPC server with the stalled one)
    bob_server.stop(grace=None)
    bob_server.start()
    alice = w["alice"]
    certs = bob_server.config.certs
    bob = pt.connect("bob", bob_server.address, certs=certs, context=alice._conn.context)
    x = pt.send(torch.ones(64 << 10), alice)  # 256 KiB
    alice.sync()
    peak = [0]
    (ns,) = servers["alice"]._namespaces.values()

    def watch() -> None:
        while not stall.is_set():
            links = list(ns._peer_links.values())
            peak[0] = max(peak[0], sum(getattr(k, "_queued_bytes", 0) for k in links))
            time.sleep(0.005)

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        copies = [x.copy_to(bob) for _ in range(6)]  # 1.5 MiB: the old worker, all in flight
        with pytest.raises((pt.LimitExceeded, pt.PartyUnavailable)):
            alice.sync()
    finally:
        stall.set()
        t.join()
    assert peak[0] + 256 * 1024 <= 1 << 20, peak[0]
    del copies
    bob.close()


# -- every registered step's peak against its declaration ---------------------------------


def _hwm() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) << 10
    raise RuntimeError("no VmHWM")


def _rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    raise RuntimeError("no VmRSS")


def measure_steps(n: int = 1 << 20) -> dict[str, Any]:
    """Run an mpc workload in process (products, a comparison, ReLU, a Fourier series,
    matmul, convolutions, secure aggregation) with every registered step wrapped: each
    call's peak (this process's VmHWM, reset through /proc/self/clear_refs before it)
    against its declaration. Run with a fixed mmap threshold (glibc), so that every large
    allocation is mapped and unmapped and the peak is the call's own."""
    import inspect

    from mpc.math.ring import measured_speeds
    from mpc.protocols.functions import FUNCTIONS
    from mpc.secure_aggregation import FUNCTIONS as SECAGG_FUNCTIONS
    from pointers.worker.functions import bind_arguments, function_size

    # the int64 products' speeds, measured once per process (about 13 MB for a moment,
    # mpc.math.ring.measured_speeds): not any one step's allocation
    measured_speeds(True)
    measured_speeds(False)
    seen: dict[str, list[int]] = {}
    over: list[str] = []

    def wrap(name: str, fn: Any) -> Any:
        spec = function_size(fn)
        assert spec is not None, name

        def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            peak, _ = spec.bytes(bind_arguments(fn, args, kwargs))
            # no cyclic collection inside the call: one that freed earlier garbage there
            # would lower the resident size under the peak's reset, and the call's own
            # allocations could then fit under it
            gc.disable()
            try:
                Path("/proc/self/clear_refs").write_text("5")
                base = _rss()
                out = fn(ctx, *args, **kwargs)
                grew = _hwm() - base
            finally:
                gc.enable()
            if grew > seen.get(name, [0, 0])[0]:
                seen[name] = [grew, peak]
            if grew > peak:
                over.append(f"{name}: {grew} > {peak}")
            return out

        run.__sealing__ = getattr(fn, "__sealing__", None)  # type: ignore[attr-defined]
        run.__size__ = spec  # type: ignore[attr-defined]
        run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
        return run

    for table in (FUNCTIONS, SECAGG_FUNCTIONS):  # (the tables mpc installs at the workers)
        for name, fn in list(table.items()):
            table[name] = wrap(name, fn)
    a, b, c, d = (pt.VirtualWorker(w, concurrent=False) for w in ("a", "b", "c", "d"))
    x = mpc.share(torch.rand(n), a, b, crypto_provider=c)
    y = mpc.share(torch.rand(n), a, b, crypto_provider=c)
    (x * y).get()  # beaver, truncation
    (x > y).get()  # the comparison's steps
    x.relu().get()  # selection
    pool = mpc.share(torch.rand(1, 4, 64, n // 256) - 0.5, a, b, crypto_provider=c)
    torch.nn.functional.max_pool2d(torch.relu(pool * pool), 2).get()  # fused, [G, 10]
    torch.sigmoid(x).get()  # a Fourier series
    torch.softmax(x.reshape(1024, n // 1024), -1).get()  # products of truncated values
    # an argmax alone over 2^16 entries a row: its index from the low bits (mpc.protocols.
    # low_bits: a dealt table of 2^16 words a row, 8 MiB); a max of few rows by ranks, and
    # the rank selection at a size its peaks are its own (2^17 entries of 4 bits: two dealt
    # tables of 16 words an entry, 32 MiB)
    torch.argmax(x.reshape(16, n // 16), -1).get()
    x[: 12 * 40].reshape(12, 40).amax(-1).get()
    from mpc.protocols.rank_select.run import select_rank_zero

    zeros = mpc.share(torch.zeros(1 << 17), a, b, crypto_provider=c)
    select_rank_zero(zeros.session, list(zeros.shares), list(zeros.shares), 4)
    # a series times a value (mpc.protocols.series_product: a decoding step's softmax
    # over few rows), at 2^18 elements: its dealer's 10 harmonics, 80 MiB
    from mpc.protocols.approx import Fx
    from mpc.protocols.fourier.run import EXP_SERIES
    from mpc.protocols.series_product.run import series_times

    neg = mpc.share(-torch.rand(1 << 18), a, b, crypto_provider=c)
    series_times(Fx(neg.session, list(neg.shares), 16), EXP_SERIES, list(neg.shares))
    # the comparison by digit look-ups at its default limit (2^13 compared values): the
    # bit of 8,192 elements (tables an element), 64 elements against 128 thresholds (zero
    # tests a compared value)
    from mpc.protocols import compare

    compare.msb(x.session, [s[: 1 << 13] for s in x.shares])
    compare.msb_thresholds(x.session, [s[:64] for s in x.shares], list(range(128)))
    # its selections (a layer norm's factor: a value a compared value), 16 x 512 compared
    # values and 64 selected values of 512 (their masked values 256 KiB: measured, the
    # larger of two calls: one measured 0.0 now and then)
    from mpc.protocols.digit_compare.run import digit_select

    few = [s[:512] for s in x.shares]
    picked = [[s.unsqueeze(0).expand(64, 512) for s in few]]
    picks = [k % 16 for k in range(64)]
    for _ in range(2):
        digit_select(x.session, few, list(range(16)), picks, lambda: (picked, []))
    # values truncated in their selection on the arithmetic last level (GELU's), 2^15
    from mpc.protocols.comparison.run import CarryRun

    half = [s[: 1 << 15] for s in x.shares]
    CarryRun(x.session, half, [half], bits=[16]).finish_select(False)
    # truncated values times a plain operand (a decoding step's scores over its cache:
    # mpc.generation.attention), 2^20 product elements
    from mpc.protocols.truncated_products.run import truncate_and_multiply

    # (the plain operand small, 4,096 elements: its mask step's two words an element
    # measure as none, one or two, so it is measured where its SLACK covers each)
    q = mpc.share(torch.rand(256, 1, 1, 64), a, b, crypto_provider=c)
    keys = mpc.share(torch.rand(1, 1, 64, 64), a, b, crypto_provider=c)
    for _ in range(2):
        truncate_and_multiply(
            [Fx(q.session, [t * (1 << 16) for t in q.shares], 32)], [16], [0.0], [(0, 0)],
            Fx(keys.session, list(keys.shares), 16), [0],
        )  # fmt: skip
    m = mpc.share(torch.rand(256, 256), a, b, crypto_provider=c)
    (m @ m).get()
    img = mpc.share(torch.rand(2, 3, 32, 32), a, b, crypto_provider=c)
    w = mpc.share(torch.rand(8, 3, 3, 3), a, b, crypto_provider=c)
    torch.nn.functional.conv2d(img, w).get()
    torch.nn.functional.conv2d(img, torch.rand(8, 3, 3, 3)).get()  # bilinear_public
    # and a public matmul, large enough that its peak is not lost in the allocator's noise
    # (the convolution's 0.5 MiB measured 0.3-0.5 MiB, a (4, 3, 64, 64) one's 4 MiB 3.0-3.9)
    (m @ torch.rand(256, 2048)).get()
    lin = torch.nn.Linear(1024, 1024)  # a model's weight: its instance, then a reuse
    mpc.share(lin, a, b, crypto_provider=c)
    for _ in range(2):
        lin(mpc.share(torch.rand(1024, 1024), a, b, crypto_provider=c)).get()
    # a product's operand truncated in the round of its product with the weight
    # (mpc.protocols.weights.steps.trunc_weight_product): one row of 1,024, the D_k B_kj 8 MiB
    for _ in range(2):
        left = mpc.share(torch.rand(1, 64), a, b, crypto_provider=c)
        lin(left @ mpc.share(torch.rand(64, 1024), a, b, crypto_provider=c)).get()
    from mpc.secure_aggregation import SecureAggregator

    agg = SecureAggregator([a, b], c)
    agg.aggregate([(pt.send(torch.rand(n), d), 1), (pt.send(torch.rand(n), c), 2)])
    return {"seen": seen, "over": over}


RESOLUTION = 1 << 20  # what the resident size resolves (see below)


@pytest.mark.slow
def test_every_step_allocates_at_most_what_it_declares():
    """Every registered step's measured peak (in a fresh process, 2^20 elements: 8 MiB a
    tensor) is at most what it declares, and what it declares is at most 1.5 times its
    largest measured peak (and two SLACKs: the small steps' declarations are their
    SLACK). A declaration of at most RESOLUTION is not checked for being loose: the
    kernel's resident-size counters are kept per CPU and summed in batches, so a call that
    touches half a MiB measures anything from 0 to its size (a selection's 0.5 MiB measured
    0.0 in two fresh processes in a row), and a loose declaration that small refuses nothing.

    A process's peak is noisy by a few hundred KiB either way (a lazily built cache inside
    a call, the allocator reusing what a call freed), so a check that fails is measured
    again in a second fresh process: the workload is deterministic, so a step over its
    declaration is over in both, and a step's largest measurement is the larger of the
    two runs'."""
    import json
    import subprocess
    import sys

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    code = "import json, test_limits_memory as t; print(json.dumps(t.measure_steps()))"

    def measure() -> tuple[dict[str, list[int]], set[str]]:
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
        )
        assert out.returncode == 0, out.stderr[-3000:]
        result = json.loads(out.stdout.strip().splitlines()[-1])
        return result["seen"], {line.split(":")[0] for line in result["over"]}

    def check(seen: dict[str, list[int]]) -> dict[str, tuple[float, float]]:
        return {
            k: (round(grew / MB, 1), round(peak / MB, 1))
            for k, (grew, peak) in seen.items()
            if peak > max(1.5 * grew + 2 * SLACK, RESOLUTION)
        }

    seen, over = measure()
    if over or check(seen):
        print("\nmeasured again:", sorted(over), check(seen))
        again, over_again = measure()
        over &= over_again
        for k, (grew, peak) in again.items():
            if grew > seen.get(k, [0, 0])[0]:
                seen[k] = [grew, peak]
    table = {k: (round(v[0] / MB, 1), round(v[1] / MB, 1)) for k, v in seen.items()}
    print("\nmeasured and declared peaks (MiB):", dict(sorted(table.items())))
    assert not over, sorted(over)
    assert len(table) >= 20, sorted(table)
    under = check(seen)
    assert not under, f"declared over 1.5 times the measured peak (MiB): {under}"
