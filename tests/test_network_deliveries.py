"""Peer deliveries that do not wait for the peer's answer (issue 15).

A served worker queues what it delivers to a peer and goes on (``PeerLink.post_frames``):
deliveries posted back to back travel together, a copy is a snapshot taken when it is
posted, and a delivery the peer refuses is reported to the client (at the sender's next
sync) and to the peer (a command waiting there fails at once, not at its deadline).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

import pointers as pt
from pointers.network import ServerConfig, WorkerServer, create_certs
from pointers.network.certs import load_credentials
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.transport import EXEC, SYNC, open_channel
from pointers.wire.messages import ExecuteOp, Fetch, Store, decode_message, encode_message
from pointers.wire.serde import Ref

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice", "bob"], clients=["client"])
    return d


@pytest.fixture
def served(certs):
    started: list[WorkerServer] = []
    conns: list[pt.NetworkWorker] = []

    def start(worker_id: str, **config) -> pt.NetworkWorker:
        s = WorkerServer(ServerConfig(worker_id, certs=str(certs), threads=16, **config), {})
        s.start()
        started.append(s)
        w = pt.connect(s.id, s.address, certs=certs, identity="client")
        conns.append(w)
        return w

    yield start
    for w in conns:
        w.close()
    for s in started:
        s.stop(grace=None)


def test_deliveries_posted_back_to_back_travel_together(served):
    latency = 0.5
    alice = served("alice")
    bob = served("bob", latency=latency)  # every call bob receives waits 0.5 s first
    values = [torch.full((1000,), float(i)) for i in range(6)]
    at_alice = [pt.send(v, alice) for v in values]
    alice.sync()
    start = time.monotonic()
    moved = [p.move(bob) for p in at_alice]
    alice.sync()  # returns once alice's deliveries arrived
    took = time.monotonic() - start
    # one after the other they would take 6 latencies (3 s); queued, they overlap
    assert took < 3 * latency, took
    for v, p in zip(values, moved):
        assert torch.equal(p.get(), v)


def test_a_copy_is_the_value_when_it_was_posted(served):
    alice, bob = served("alice"), served("bob", latency=0.3)
    x = pt.send(torch.arange(5.0), alice)
    far = x.copy_to(bob)  # delivered while alice goes on (bob takes 0.3 s to accept it)
    x.add_(100)  # an in-place write right after the copy was posted
    assert torch.equal(x.get(), torch.arange(5.0) + 100)
    assert torch.equal(far.get(), torch.arange(5.0))


def test_a_refused_delivery_is_reported_to_both_sides_at_once(served):
    deadline = 30.0
    alice = served("alice")
    bob = served("bob", max_stored_bytes=64 * 1024, deadline=deadline)
    big = pt.send(torch.ones(100_000), alice)  # 800 kB: over bob's 64 kB limit
    small = pt.send(torch.ones(4), alice)
    alice.sync()
    far = big.move(bob)
    start = time.monotonic()
    # bob refuses it and is told it will not come: its wait fails now, not in 30 s
    with pytest.raises(pt.PointerError, match="limit"):
        far.get()
    assert time.monotonic() - start < deadline / 2
    # alice's client learns it at the next sync there, with what bob said
    with pytest.raises(pt.RemoteError, match="could not deliver object .* to its peer 'bob'"):
        alice.sync()
    alice.sync()  # reported once
    # the move failed: alice holds the object again, and stays usable
    assert len(alice.objects) == 2
    assert torch.equal(small.copy_to(bob).get(), torch.ones(4))


def test_a_delivery_to_a_dead_peer_does_not_hang_the_sender(served, certs):
    alice = served("alice")
    bob_server = WorkerServer(ServerConfig("bob", certs=str(certs), threads=8), {})
    bob_server.start()
    bob = pt.connect("bob", bob_server.address, certs=certs, identity="client")
    try:
        x = pt.send(torch.ones(3), alice)
        assert torch.equal(x.copy_to(bob).get(), torch.ones(3))
        bob_server.stop(grace=None)
        start = time.monotonic()
        with pytest.raises(pt.PartyUnavailable, match="bob"):
            # (the client may see bob gone first, else alice's queued delivery fails)
            x.copy_to(bob)
            alice.sync()
        assert time.monotonic() - start < 15
        assert torch.equal(x.get(), torch.ones(3))  # alice goes on
    finally:
        bob.close()


# -- the order of pipelined calls, as a hostile client would send them --------------------


def _raw_exec(certs, server: WorkerServer):
    channel = open_channel(
        server.address,
        worker_id=server.id,
        credentials=load_credentials(certs, "client"),
        max_message_bytes=1 << 20,
    )
    call = channel.unary_unary(EXEC)

    def send(order, *msgs, flags=0, timeout=30):
        frames = []
        for m in msgs:
            header, buffers = encode_message(m)
            frames.append((flags, header, buffers))
        info = {} if order is None else {"order": order}
        return decode_envelope(call(encode_envelope(info, frames), timeout=timeout))

    return channel, send


@pytest.fixture
def raw_alice(certs):
    server = WorkerServer(ServerConfig("alice", certs=str(certs), threads=32, deadline=2.0), {})
    server.start()
    channel, send = _raw_exec(certs, server)
    yield send
    channel.close()
    server.stop(grace=None)


@pytest.mark.parametrize(
    "order",
    [["t", -1, 1], ["", 1, 1], ["t", 1, 2], ["t" * 65, 1, 0], ["t", 1], "t", ["t", 1.5, 0]],
)
def test_a_malformed_call_order_is_refused(raw_alice, order):
    info, _ = raw_alice(order, Store(1, torch.ones(1), [], "", False))
    assert info["error"][0] == "FrameError" and "order" in info["error"][1]


def test_pipelined_calls_run_in_their_order_whatever_order_they_arrive_in(raw_alice):
    raw_alice(["conn", 1, 0], Store(5, torch.zeros(1), [], "", False))
    late = threading.Thread(
        target=raw_alice, args=(["conn", 3, 1], Store(5, torch.full((1,), 3.0), [], "", False))
    )
    late.start()  # call 3 arrives first and waits for call 2
    time.sleep(0.3)
    raw_alice(["conn", 2, 1], Store(5, torch.full((1,), 2.0), [], "", False))
    late.join(10)
    _, replies = raw_alice(["conn", 4, 0], Fetch(5, False), flags=SYNC)
    assert torch.equal(decode_message(replies[0][1], replies[0][2]).value, torch.full((1,), 3.0))
    # a call numbered before one that already ran is refused, not run out of place
    info, _ = raw_alice(["conn", 3, 1], Store(5, torch.zeros(1), [], "", False))
    assert "came after call" in info["error"][1]


def test_calls_cannot_wait_far_ahead_or_in_numbers(raw_alice):
    raw_alice(["conn", 1, 0], Store(5, torch.zeros(1), [], "", False))
    start = time.monotonic()
    info, _ = raw_alice(["conn", 100, 1], Store(6, torch.zeros(1), [], "", False))
    assert "at most 16 calls may be in flight" in info["error"][1]
    assert time.monotonic() - start < 1.0  # refused at once, no thread held
    # calls that wait for a predecessor that never comes: bounded in number and in time
    results: list = []

    def waiting(k: int) -> None:
        results.append(raw_alice([f"c{k}", 50, 1], Store(100 + k, torch.zeros(1), [], "", False)))

    threads = [threading.Thread(target=waiting, args=(k,)) for k in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    errors = [info["error"] for info, _ in results if "error" in info]
    assert len(results) == 20
    assert any(e[0] == "LimitExceeded" for e in errors)
    assert time.monotonic() - start < 10.0  # the others ran after the 2 s deadline


def test_inspections_are_answered_while_every_command_thread_waits(certs):
    """Commands, deliveries and inspections have their own thread pools: calls waiting
    for their turn hold every command thread, and a lease renewal, a hello and a peer's
    delivery are still served at once (with one pool they queued behind the waiting
    calls, and the leases of live sessions ran out)."""
    server = WorkerServer(ServerConfig("alice", certs=str(certs), threads=4, deadline=3.0), {})
    server.start()
    channel, send = _raw_exec(certs, server)
    client = pt.connect("alice", server.address, certs=certs, identity="client")
    try:
        send(["conn", 1, 0], Store(5, torch.zeros(1), [], "", False))
        waiting = [
            threading.Thread(
                target=send, args=([f"w{k}", 9, 1], Store(10 + k, torch.zeros(1), [], "", False))
            )
            for k in range(4)  # as many as the command threads: each waits for call 8
        ]
        for t in waiting:
            t.start()
        time.sleep(0.5)  # every command thread now waits for a call that never comes
        start = time.monotonic()
        client._conn.inspect_direct({"what": "lease"}, timeout=2.0)
        client._conn.inspect_direct({"what": "hello"}, timeout=2.0)
        assert time.monotonic() - start < 1.0
        for t in waiting:
            t.join(10)
        # the waits ended at the deadline; the worker serves commands again
        p = pt.send(torch.arange(3.0), client)
        assert torch.equal(p.get(), torch.arange(3.0))
    finally:
        client.close()
        channel.close()
        server.stop(grace=None)


def test_a_sync_carries_the_deletes_of_dropped_pointers(served):
    alice = served("alice")
    kept = pt.send(torch.ones(2), alice)
    dropped = pt.send(torch.zeros(2), alice)
    alice.sync()
    gone = dropped.id_at_location
    del dropped
    calls = alice._conn.calls
    alice.sync()
    assert alice._conn.calls == calls + 1  # no call of their own: they rode in the sync
    ids = set(alice.objects)
    assert gone not in ids and kept.id_at_location in ids


@pytest.mark.parametrize("deletes", ["1", [1.5], [1, "2"], list(range((1 << 14) + 1))])
def test_malformed_deletes_in_a_sync_are_refused(served, deletes):
    alice = served("alice")
    conn = alice._conn
    data = encode_envelope({"what": "stats", "deletes": deletes}, [])
    with pytest.raises(pt.PointerError, match="deletes"):  # (an inspection, not the Lease method)
        conn._inspect_reply(conn._plain_inspect(data, timeout=10.0, metadata=conn.metadata))
    alice.sync()  # the session goes on


LATENCY = 0.4  # seconds a slow worker waits before it handles each call


def _slow_alice(served):
    """alice with a delay of LATENCY per call received, holding ones(4) (synced)."""
    alice = served("alice", latency=LATENCY)
    p = pt.send(torch.ones(4), alice)
    alice.sync()
    return alice, p


def test_a_sync_costs_no_round_trip_after_the_commands(served):
    """The sync leaves pipelined behind the commands (the worker answers it once they
    ran): with a delay of L per call received, commands then a sync take about one L,
    not two (command call, then sync call)."""
    alice, p = _slow_alice(served)
    start = time.monotonic()
    q = p + 1
    alice.sync()
    elapsed = time.monotonic() - start
    assert elapsed < 1.6 * LATENCY, elapsed
    assert torch.equal(q.get(), torch.full((4,), 2.0))


def test_a_sync_reports_a_failed_command_before_it(served):
    alice = served("alice", latency=0.05)
    p = pt.send(torch.ones(4), alice)
    # posted commands: the failing one, then one more; the sync leaves pipelined after them
    alice.post(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [alice.new_id()], False))
    q = p + 1
    with pytest.raises(pt.RemoteError, match="no object with id 424242"):
        alice.sync()
    alice.sync()  # reported once
    assert torch.equal(q.get(), torch.full((4,), 2.0))  # the command after it ran


def test_get_all_fetches_side_by_side(served):
    """Values at two workers that each delay every call by L come back in about one L."""
    alice, bob = served("alice", latency=LATENCY), served("bob", latency=LATENCY)
    p, q = pt.send(torch.arange(3.0), alice), pt.send(torch.ones(2), bob)
    alice.sync()
    bob.sync()
    start = time.monotonic()
    a, b = pt.get_all([p, q])
    assert time.monotonic() - start < 1.6 * LATENCY
    assert torch.equal(a, torch.arange(3.0)) and torch.equal(b, torch.ones(2))


@pytest.mark.parametrize(
    "info",
    [{"programs": 1}, {"sync": True, "programs": -1}, {"sync": True, "programs": "1"}],
)
def test_a_malformed_sync_is_refused(certs, info):
    server = WorkerServer(ServerConfig("alice", certs=str(certs), threads=4), {})
    server.start()
    channel = open_channel(
        server.address,
        worker_id="alice",
        credentials=load_credentials(certs, "client"),
        max_message_bytes=1 << 20,
    )
    try:
        call = channel.unary_unary(EXEC)
        reply, _ = decode_envelope(call(encode_envelope(info, []), timeout=10))
        assert reply["error"][0] == "FrameError"
        reply, _ = decode_envelope(
            call(encode_envelope({"sync": True, "programs": 0.5}, []), timeout=10)
        )
        assert isinstance(reply["stats"], dict) and "error" not in reply
    finally:
        channel.close()
        server.stop(grace=None)


def test_a_read_leaves_behind_the_commands_and_keeps_their_errors_first(served):
    """A fetch that keeps the object (``get_all(..., delete=False)``, a shared value's
    ``get``) leaves while the commands before it are in flight: one L after them, not
    two; but if one of them failed, the read raises that error, as if it had waited."""
    alice, p = _slow_alice(served)
    start = time.monotonic()
    q = p + 1
    (value,) = pt.get_all([q], delete=False)
    assert time.monotonic() - start < 1.6 * LATENCY
    assert torch.equal(value, torch.full((4,), 2.0))
    alice.post(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [alice.new_id()], False))
    with pytest.raises(pt.RemoteError, match="no object with id 424242"):
        pt.get_all([p], delete=False)  # p exists: only the earlier post failed
    alice.sync()  # reported once
    assert torch.equal(p.get(), torch.ones(4))


def test_calls_overlap_only_where_the_network_is_slow(served):
    """The client measures each call's network time (round trip less the time the worker
    reports) and pipelines only when it is at least PIPELINE_MIN_TRANSIT."""
    slow = served("alice", latency=0.05)
    p = pt.send(torch.ones(2), slow)
    for _ in range(3):
        p = p + 1
        slow.sync()
    conn = slow._conn
    assert conn.transit >= 0.04 >= conn.PIPELINE_MIN_TRANSIT
    calls = conn.calls
    for _ in range(5):  # posted back to back: they leave while the first is in flight
        p = p + 1
    slow.sync()
    assert conn.calls - calls <= 3  # one call per command would be 6
    assert torch.equal(p.get(), torch.full((2,), 9.0))


def test_a_full_pipeline_waits_for_its_oldest_call_only(served, monkeypatch):
    """With PIPELINE calls in flight, the next batch of commands leaves as soon as the
    oldest call is answered, still overlapping the others; it used to wait until every
    call in flight was answered, which left a worker idle for a round trip in the middle
    of a long protocol (LeNet over 20 ms links lost a latency that way)."""
    slow = served("alice", latency=0.2)
    p = pt.send(torch.ones(2), slow)
    for _ in range(2):  # the client measures the link: slow enough to overlap calls
        p = p + 1
        slow.sync()
    conn = slow._conn
    assert conn.transit >= conn.PIPELINE_MIN_TRANSIT
    sent: list[tuple[bool, int]] = []
    original = type(conn)._send_batch

    def record(self, batch, ndeletes, pipelined=False):
        sent.append((pipelined, len(self._flight)))
        return original(self, batch, ndeletes, pipelined)

    monkeypatch.setattr(type(conn), "_send_batch", record)
    for _ in range(conn.PIPELINE + 2):  # one call each (spaced past the gathering time)
        p = p + 1
        time.sleep(2 * conn.PIPELINE_AFTER)
    slow.sync()
    assert len(sent) > conn.PIPELINE, sent  # (the last two may leave together)
    assert all(pipelined for pipelined, _ in sent), sent
    assert max(flying for _, flying in sent) == conn.PIPELINE - 1
    assert torch.equal(p.get(), torch.full((2,), 3.0 + conn.PIPELINE + 2))


def test_a_delivery_over_the_message_limit_is_refused_to_both_sides(served):
    """A peer's object over the receiver's --max-message-mb is read, dropped and refused
    with a reason both sides see (it used to close the data connection: the sender saw
    only an EOF), and the connection stays usable."""
    deadline = 30.0
    alice = served("alice")
    bob = served("bob", max_message_bytes=256 * 1024, deadline=deadline)
    big = pt.send(torch.ones(100_000), alice)  # 800 kB: over bob's 256 kB a message
    small = pt.send(torch.ones(4), alice)
    alice.sync()
    far = big.move(bob)
    start = time.monotonic()
    with pytest.raises(pt.PointerError, match="message limit"):
        far.get()
    assert time.monotonic() - start < deadline / 2
    with pytest.raises(pt.RemoteError, match="could not deliver object .* 'bob'.*message limit"):
        alice.sync()
    assert torch.equal(small.copy_to(bob).get(), torch.ones(4))
