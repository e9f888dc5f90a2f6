"""Integrity, identity, peers, leases and faults of real ``python -m pointers serve``
processes (issue 12): what a certificate holder of the deployment's CA cannot do to
another client's namespace, and how the workers' state follows the clients' lives."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from network_fixtures import Cluster

import pointers as pt
from pointers.network.certs import load_credentials
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.transport import DELIVER, open_channel
from pointers.wire.messages import ErrorReply, Store, decode_message, encode_message

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("lifecycle"), ["alice", "bob"], ["client", "other"])
    c.start()
    yield c
    c.stop()


def _deliver(cluster: Cluster, as_identity: str, worker: str, info: dict, frames: list) -> Any:
    """One raw Deliver call to ``worker`` with the certificate of ``as_identity``."""
    channel = open_channel(
        cluster.address(worker),
        worker_id=worker,
        credentials=load_credentials(cluster.certs, as_identity),
        max_message_bytes=1 << 20,
    )
    try:
        resp = channel.unary_unary(DELIVER)(encode_envelope(info, frames), timeout=10)
    finally:
        channel.close()
    _, out = decode_envelope(resp)
    return decode_message(out[0][1], out[0][2])


def test_a_peer_delivers_only_into_ids_announced_for_it(cluster):
    alice, bob = cluster.fresh("alice"), cluster.fresh("bob")
    x = pt.send(torch.tensor([1.0, 2.0]), bob)  # the client's own object at bob
    moved = pt.send(torch.ones(2), alice).move(bob)  # bob now accepts alice's deliveries
    alice.sync()  # the move is pipelined: wait until alice delivered
    before = sorted(bob.objects)
    assert before == sorted([x.id_at_location, moved.id_at_location])

    def deliver(obj_id: int) -> Any:
        store = encode_message(Store(obj_id, torch.full((2,), 666.0), [], ""))
        return _deliver(
            cluster, "alice", "bob", {"client": "client", "from": "alice"}, [(0, *store)]
        )

    # overwrite the client's own object, or one alice already delivered: refused
    for target in (x.id_at_location, moved.id_at_location):
        reply = deliver(target)
        assert isinstance(reply, ErrorReply) and reply.kind == "NotAllowedError"
        assert "did not announce" in reply.message
    # an id nobody announced is kept aside, outside the namespace
    fresh_id = bob.new_id()
    assert not isinstance(deliver(fresh_id), ErrorReply)
    assert sorted(bob.objects) == before
    assert torch.equal(x.get(), torch.tensor([1.0, 2.0]))
    assert torch.equal(moved.get(), torch.ones(2))
    # announced for another sender than alice: not alice's to fill
    bob._conn.expects.append(("carol", fresh_id))
    assert fresh_id not in bob.objects
