"""The connections a client can make a served worker open are bounded by the worker
(issue 39, finding 5).

The red team's flood: one call of 1,100 ``ConnectPeer`` + ``SendToPeer`` commands, each
naming the peer at another spelling of its address, took alice and bob to 1,025 open file
descriptors, and a new client could not reach bob. A delivery still in flight when its
session's link was replaced opened a channel that no link counted, and nothing closed it.
Now a channel exists only while an open session's link to its (peer, address) does, and
the sessions of one identity link the worker to a bounded number of (peer, address) pairs.
Real worker processes on loopback: the descriptors counted are theirs.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch
from network_fixtures import Cluster

import pointers as pt
from pointers.network import ClientContext
from pointers.network.peers import MAX_IDENTITY_PEERS
from pointers.wire.messages import ConnectPeer, SendToPeer

pytestmark = [
    pytest.mark.network,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts /proc/PID/fd"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory):
    c = Cluster(
        tmp_path_factory.mktemp("flood"),
        ["alice", "bob"],
        clients=("client", "mallory"),
        args=["--lease", "3"],
    )
    c.start()
    yield c
    c.stop()


def _fds(cluster: Cluster, worker: str) -> int:
    proc = cluster.servers[worker].proc
    assert proc is not None
    return len(os.listdir(f"/proc/{proc.pid}/fd"))


def _spelled(address: str, k: int) -> str:
    """Another spelling of ``address``: its port with ``k`` leading zeros."""
    host, _, port = address.rpartition(":")
    return f"{host}:{'0' * k}{port}"


def _settle(cluster: Cluster, base: dict[str, int], slack: int, seconds: float) -> dict[str, int]:
    """The descriptor counts once they are within ``slack`` of ``base`` (or at the end)."""
    end = time.monotonic() + seconds
    while True:
        now = {w: _fds(cluster, w) for w in base}
        if all(now[w] <= base[w] + slack for w in base) or time.monotonic() > end:
            return now
        time.sleep(0.25)


def test_a_connect_flood_in_one_call_opens_no_connections(cluster: Cluster) -> None:
    alice = cluster.connect("alice")
    bob = cluster.connect("bob")
    p = pt.send(torch.ones(3), alice)
    pt.send(torch.ones(1), bob).get()
    base = {w: _fds(cluster, w) for w in ("alice", "bob")}
    address = cluster.address("bob")
    for k in range(1, 1101):  # one call: ~700 KB of commands
        alice.post(ConnectPeer("bob", _spelled(address, k)))
        alice.post(SendToPeer(p.id_at_location, "bob", bob.new_id(), False))
    try:
        alice.sync()
    except pt.PointerError:
        pass  # bob refuses the deliveries (its client accepted none from alice)
    now = _settle(cluster, base, 8, 10.0)
    assert now["alice"] <= base["alice"] + 8 and now["bob"] <= base["bob"] + 8, (base, now)
    # a new client reaches bob
    other = cluster.connect("bob", identity="mallory", context=ClientContext())
    assert torch.equal(pt.send(torch.ones(2), other).get(), torch.ones(2))


def test_one_identity_links_a_bounded_number_of_peers(cluster: Cluster) -> None:
    """Across its sessions, one identity links a worker to at most MAX_IDENTITY_PEERS
    distinct (peer, address) pairs; a session's links go when its lease ends."""
    address = cluster.address("bob")
    first = cluster.connect("alice", identity="mallory", context=ClientContext())
    for k in range(MAX_IDENTITY_PEERS // 2):  # 32 peers of one session (each its own name)
        first.post(ConnectPeer(f"p{k}", _spelled(address, k + 1)))
    first.sync()
    second = cluster.connect("alice", identity="mallory", context=ClientContext())  # (the same)
    for k in range(MAX_IDENTITY_PEERS // 2):
        second.post(ConnectPeer(f"q{k}", _spelled(address, 100 + k)))
    second.sync()
    second.post(ConnectPeer("one-more", _spelled(address, 200)))
    with pytest.raises(pt.LimitExceeded, match="at most 64 distinct peer addresses"):
        second.sync()
    # another identity has its own room
    other = cluster.connect("alice", context=ClientContext())
    other.post(ConnectPeer("bob", _spelled(address, 200)))
    other.sync()
    # the first session ends (its lease: 3 s without a call); its links go with it
    first.close()
    deadline = time.monotonic() + 15
    while True:
        second.post(ConnectPeer("one-more", _spelled(address, 200)))
        try:
            second.sync()
            break
        except pt.LimitExceeded:
            assert time.monotonic() < deadline, "the ended session's links were never freed"
            time.sleep(0.5)
