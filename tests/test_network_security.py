"""Authorisation and limits of served workers, with servers in this process (threads).

The rules: only a client that accepted a peer receives its deliveries; a peer may deliver
only objects and only as itself; messages and stored bytes are bounded.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import torch

import pointers as pt
from pointers.network import ServerConfig, WorkerServer
from pointers.network.certs import create_certs, load_credentials
from pointers.network.context import DEFAULT_CONTEXT
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.lease import session_of
from pointers.network.transport import DELIVER, open_channel
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ErrorReply,
    ExecuteOp,
    SendToPeer,
    Store,
    decode_message,
    encode_message,
)

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice", "bob", "eve"], clients=["client", "mallory"])
    return d


@pytest.fixture
def served(certs):
    started: list[WorkerServer] = []
    conns: list[pt.NetworkWorker] = []

    def start(worker_id: str, **config) -> WorkerServer:
        s = WorkerServer(ServerConfig(worker_id, certs=str(certs), threads=8, **config), {})
        s.start()
        started.append(s)
        return s

    def connect(server: WorkerServer, identity: str = "client", **kw) -> pt.NetworkWorker:
        w = pt.connect(server.id, server.address, certs=certs, identity=identity, **kw)
        conns.append(w)
        return w

    yield start, connect
    for w in conns:
        w.close()
    for s in started:
        s.stop(grace=None)


def _deliver(certs, as_identity: str, server: WorkerServer, info: dict, frames: list) -> Any:
    channel = open_channel(
        server.address,
        worker_id=server.id,
        credentials=load_credentials(certs, as_identity),
        max_message_bytes=1 << 20,
    )
    try:
        resp = channel.unary_unary(DELIVER)(encode_envelope(info, frames), timeout=10)
    finally:
        channel.close()
    _, out = decode_envelope(resp)
    return decode_message(out[0][1], out[0][2])


def test_deliveries_need_the_clients_consent(served):
    start, connect = served
    a_srv, b_srv = start("alice"), start("bob")
    alice, bob = connect(a_srv), connect(b_srv)
    p = pt.send(torch.ones(3), alice)
    # alice is told where bob is, but bob never accepted deliveries from alice
    alice.post(ConnectPeer("bob", b_srv.address))
    alice.post(SendToPeer(p.id_at_location, "bob", bob.new_id(), False))
    with pytest.raises(pt.RemoteError, match="has not asked worker 'bob' to accept"):
        alice.sync()
    # with consent (introduce) the same move works
    assert torch.equal(p.move(bob).get(), torch.ones(3))


def test_a_peer_delivers_only_objects_and_only_as_itself(served, certs):
    start, connect = served
    a_srv, b_srv = start("alice"), start("bob")
    alice, bob = connect(a_srv), connect(b_srv)
    pt.send(torch.ones(1), alice).move(bob)  # bob's client namespace accepts alice
    store = encode_message(Store(7, torch.ones(2), [], ""))
    # deliveries name the client's session (the client's namespace at bob)
    to = {"client": "client", "from": "alice", "session": session_of(DEFAULT_CONTEXT)}
    spoofed = _deliver(certs, "eve", b_srv, to, [(0, *store)])
    assert isinstance(spoofed, ErrorReply) and "cannot deliver as 'alice'" in spoofed.message
    op = encode_message(ExecuteOp("aten::abs.default", [], {}, [1], False))
    command = _deliver(certs, "alice", b_srv, to, [(0, *op)])
    assert isinstance(command, ErrorReply) and "may only deliver objects" in command.message
    other = _deliver(certs, "alice", b_srv, {**to, "session": "0" * 32}, [(0, *store)])
    assert isinstance(other, ErrorReply) and "has not asked" in other.message  # no such session
    ok = _deliver(certs, "alice", b_srv, to, [(0, *store)])
    assert not isinstance(ok, ErrorReply)
    assert 7 not in bob.objects  # kept aside until the client announces it from alice
    bob._conn.expects.append(("alice", 7))
    assert torch.equal(bob.objects[7], torch.ones(2))


def test_peer_identity_may_not_run_commands(served):
    start, connect = served
    a_srv, b_srv = start("alice"), start("bob")
    alice, bob = connect(a_srv), connect(b_srv)
    pt.send(torch.ones(1), alice).move(bob)
    alice.sync()  # the move is pipelined: wait until alice has delivered to bob
    as_alice = connect(b_srv, identity="alice")
    with pytest.raises(pt.RemoteError, match="peer worker"):
        as_alice.search("x")
    with pytest.raises(pt.RemoteError, match="peer worker"):
        len(as_alice.objects)


def test_message_size_limit(served):
    start, connect = served
    srv = start("alice", max_message_bytes=64 << 10)
    big = torch.zeros(32 << 10)  # 128 KiB
    alice = connect(srv)
    p = pt.send(big, alice)  # the client allows it, the worker does not
    with pytest.raises(pt.LimitExceeded, match="message size limit"):
        p.get()
    small = connect(srv, max_message_bytes=64 << 10)
    with pytest.raises(pt.LimitExceeded, match="exceeds the maximum message size"):
        pt.send(big, small)  # refused before anything moves
    assert torch.equal(pt.send(torch.ones(4), small).get(), torch.ones(4))


def test_stored_bytes_limit_per_client(served):
    start, connect = served
    srv = start("alice", max_stored_bytes=256 << 10)
    alice, other = connect(srv), connect(srv, identity="mallory")
    kept = [pt.send(torch.zeros(25 << 10), alice) for _ in range(2)]  # 2 x 100 KiB
    third = pt.send(torch.zeros(25 << 10), alice)
    with pytest.raises(pt.LimitExceeded, match="over its limit of 262144 bytes"):
        alice.sync()
    del third
    assert torch.equal(pt.send(torch.ones(25 << 10), other).get(), torch.ones(25 << 10))
    kept.pop().get()  # freeing room lets the client store again
    assert pt.send(torch.ones(25 << 10), alice).get().sum() == 25 << 10


def test_moved_objects_no_longer_count_against_the_limit(served):
    start, connect = served
    a_srv, b_srv = start("alice", max_stored_bytes=256 << 10), start("bob")
    alice, bob = connect(a_srv), connect(b_srv)
    for _ in range(3):  # 3 x 2 x 100 KiB pass through alice's 256 KiB
        moved = [pt.send(torch.zeros(25 << 10), alice).move(bob) for _ in range(2)]
        alice.sync()
        assert all(m.get().shape == (25 << 10,) for m in moved)
    assert len(alice.objects) == 0


def test_ops_over_the_limit_fail_cleanly(served):
    start, connect = served
    srv = start("alice", max_stored_bytes=64 << 10)
    alice = connect(srv)
    p = pt.send(torch.ones(4 << 10), alice)  # 16 KiB
    q = torch.cat([p, p, p, p, p])  # 80 KiB output
    with pytest.raises(pt.LimitExceeded):
        q.get()
    assert torch.equal((p + 1).get(), torch.full((4 << 10,), 2.0))


def test_insecure_workers_on_loopback(tmp_path):
    server = WorkerServer(ServerConfig("alice", insecure=True), {})
    server.start()
    try:
        w = pt.connect("alice", server.address, insecure=True, identity="client")
        assert torch.equal((pt.send(torch.ones(2), w) * 3).get(), torch.full((2,), 3.0))
        w.close()
        with pytest.raises(pt.PartyUnavailable):  # a TLS client cannot talk to it
            create_certs(tmp_path, ["alice"], clients=["client"])
            pt.connect("alice", server.address, certs=tmp_path, identity="client")
    finally:
        server.stop(grace=None)


def test_no_plaintext_to_a_tls_worker(served):
    start, _ = served
    srv = start("alice")
    channel = grpc.insecure_channel(srv.address)
    with pytest.raises(grpc.RpcError):
        channel.unary_unary("/pointers.Worker/Inspect")(b"", timeout=5)
    channel.close()


def test_a_client_cannot_lock_another_out(served):
    start, connect = served
    srv = start("alice")
    mallory, client = connect(srv, identity="mallory"), connect(srv)
    mallory.request(AcceptPeer("client"))  # only mallory's own namespace accepts "client"
    assert torch.equal(pt.send(torch.ones(2), client).get(), torch.ones(2))
