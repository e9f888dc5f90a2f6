"""Peer deliveries that do not wait for the peer's answer (issue 15).

A served worker queues what it delivers to a peer and goes on (``PeerLink.post_frames``):
deliveries posted back to back travel together, a copy is a snapshot taken when it is
posted, and a delivery the peer refuses is reported to the client (at the sender's next
sync) and to the peer (a command waiting there fails at once, not at its deadline).
"""

from __future__ import annotations

import time

import pytest
import torch

import pointers as pt
from pointers.network import ServerConfig, WorkerServer, create_certs

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
