"""Network workers in their own processes (gRPC, mutual TLS): pointers, training, mpc.

The worker processes come from the session's ``network_cluster`` (alice, bob, carol, dave,
erin and frank on loopback). The pointer, plan, federated and mpc suites also run on them
through the ``worker_kind`` parametrisation in conftest.py; this module covers what is
specific to the network.
"""

from __future__ import annotations

import copy
import gc
import stat
import threading
import time

import pytest
import torch
import torch.nn.functional as F
from test_remote_training import _train
from torch import nn

import mpc
import pointers as pt
from pointers.__main__ import main as cli
from pointers.network import DEFAULT_CONTEXT, ClientContext
from pointers.network.certs import certificate_identity
from pointers.network.config import ServerConfig
from pointers.network.waiting import NamespaceLock, WaitingStore
from pointers.wire.messages import ExecuteOp, Fetch
from pointers.wire.serde import Ref

pytestmark = pytest.mark.network

U = 2.0**-16  # one unit of the fixed-point encoding


@pytest.fixture
def net(network_cluster):
    yield network_cluster
    network_cluster.close_connections()


@pytest.fixture
def trio(net):
    """Two parties and a crypto provider, each a fresh network worker."""
    return net.fresh("alice"), net.fresh("bob"), net.fresh("carol")


# ----------------------------------------------------------------------------- commands


def test_certs_command_writes_ca_and_identities(tmp_path, capsys):
    assert cli(["certs", str(tmp_path), "alice", "client"]) == 0
    for name in ("ca.pem", "ca.key", "alice.pem", "alice.key", "client.pem", "client.key"):
        assert (tmp_path / name).is_file()
    assert stat.S_IMODE((tmp_path / "alice.key").stat().st_mode) == 0o600
    assert certificate_identity((tmp_path / "alice.pem").read_bytes()) == "alice"
    ca = (tmp_path / "ca.pem").read_bytes()
    assert cli(["certs", str(tmp_path), "bob"]) == 0  # the CA is reused
    assert (tmp_path / "ca.pem").read_bytes() == ca
    assert cli(["certs", str(tmp_path), "not a name"]) == 2
    assert "DNS label" in capsys.readouterr().err


def test_insecure_mode_is_explicit_and_loopback_only(capsys):
    with pytest.raises(ValueError, match="loopback"):
        ServerConfig("alice", host="0.0.0.0", insecure=True)
    with pytest.raises(ValueError, match="--certs"):
        ServerConfig("alice")
    assert cli(["serve", "--id", "alice", "--host", "0.0.0.0", "--insecure"]) == 2
    assert "loopback" in capsys.readouterr().err
    with pytest.raises(ValueError, match="certs=DIR"):
        pt.connect("alice", "127.0.0.1:1")


# ----------------------------------------------------------------------------- pointers


def test_send_ops_get(net):
    alice = net.fresh("alice")
    assert isinstance(alice, pt.NetworkWorker) and alice.id == "alice"
    x = torch.randn(3, 4, dtype=torch.float64)
    p = pt.send(x, alice)
    q = (p @ p.T).relu() + 1
    assert torch.equal(q.get(), (x @ x.T).relu() + 1)
    assert torch.equal(p.get(delete=False), x) and len(alice.objects) == 1


def test_move_goes_party_to_party(net):
    alice, bob = net.fresh("alice"), net.fresh("bob")
    p = pt.send(torch.arange(5.0), alice)
    m = (p * 2).move(bob)
    assert m.location is bob
    assert torch.equal((m + 1).get(), torch.arange(5.0) * 2 + 1)
    assert alice.stats.peer_messages_sent == 1 and bob.stats.peer_messages_sent == 0
    del p, m
    gc.collect()
    assert len(alice.objects) == 0 and len(bob.objects) == 0


def test_errors_surface_at_the_next_sync_and_lose_nothing(net):
    alice = net.fresh("alice")
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    alice.post(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [alice.new_id()], False))
    with pytest.raises(pt.RemoteError, match="no object with id 424242") as info:
        p.get()  # the earlier post failed: the get is not run, the value stays
    assert info.value.worker == "alice" and info.value.kind == "UnknownObjectError"
    assert torch.equal(p.get(), torch.tensor([1.0, 2.0]))  # now it runs
    with pytest.raises(pt.ObjectGoneError):
        p.get()


def test_a_failed_call_raises_the_root_cause_held_by_another_connection(net):
    """alice's posted op fails, so her delivery to bob fails, so bob's get() fails: the
    caller gets alice's error (the root cause), not the follow-on 'could not deliver'."""
    alice, bob = net.fresh("alice"), net.fresh("bob")
    bad = alice.new_id()
    alice.post(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [bad], False))
    q = pt.PointerTensor.from_meta(alice, bad, (2,), (1,), torch.float32)
    moved = q.move(bob)
    with pytest.raises(pt.RemoteError, match="no object with id 424242") as info:
        (moved + 1).get()
    assert info.value.worker == "alice" and info.value.kind == "UnknownObjectError"
    alice.sync()  # reported once: nothing is raised again
    bob.sync()
    assert torch.equal(pt.send(torch.ones(2), bob).get(), torch.ones(2))


def test_separate_client_contexts_keep_their_errors_apart(net):
    alice = net.fresh("alice")
    bob = net.fresh("bob", context=ClientContext())
    assert alice._conn.context is DEFAULT_CONTEXT and bob._conn.context is not DEFAULT_CONTEXT
    alice.post(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [alice.new_id()], False))
    with pytest.raises(pt.RemoteError, match="no object with id 434343") as info:
        bob.request(Fetch(434343, False))  # its own error: alice's is in another context
    assert info.value.worker == "bob"
    with pytest.raises(pt.RemoteError, match="no object with id 424242"):
        alice.sync()  # not consumed by bob's error


def test_search_and_tags_are_per_client(net):
    alice = net.fresh("alice")
    p = pt.send(pt.tag(torch.ones(2), "input", description="d"), alice)
    found = alice.search("input")
    assert len(found) == 1 and torch.equal(found[0].get(delete=False), torch.ones(2))
    other = net.connect("alice", "mallory")
    assert other.search("input") == []
    assert found[0].id_at_location == p.id_at_location


def test_seed_scenario_remote_training_on_network_workers(net):
    bob, alice = net.fresh("bob"), net.fresh("alice")
    remote_model, remote_losses = _train(True, (bob, alice), epochs=2)
    local_model, local_losses = _train(False, epochs=2)
    assert remote_losses == local_losses
    for a, b in zip(remote_model.parameters(), local_model.parameters()):
        assert type(a) is nn.Parameter and torch.allclose(a, b, atol=1e-6)
    gc.collect()
    assert len(bob.objects) == 0 and len(alice.objects) == 0


def test_many_pipelined_ops_are_batched(net):
    alice = net.fresh("alice")
    p = pt.send(torch.zeros(10), alice)
    for _ in range(500):
        p = p + 1
    assert torch.equal(p.get(), torch.full((10,), 500.0))
    assert alice.stats.messages_received >= 501  # every op arrived, in far fewer calls


# ----------------------------------------------------------------------------- mpc


def _close(got, want, units):
    assert torch.allclose(got, want, rtol=0, atol=units * U), (got - want).abs().max()


def test_mpc_share_add_mul_compare_relu(trio):
    alice, bob, carol = trio
    x = torch.tensor([1.5, -2.25, 3.0, 0.0, -7.5])
    y = torch.tensor([2.0, 4.5, -1.0, 0.5, -7.0])
    a = mpc.share(x, alice, bob, crypto_provider=carol)
    b = mpc.share(y, alice, bob, crypto_provider=carol)
    with mpc.stats() as s:
        _close((a + b).get(), x + y, 1)
        _close((a * b).get(), x * y, 40)
        assert torch.equal((a > b).get(), x > y)
        _close(F.relu(a).get(), F.relu(x), 1)
    assert s.rounds > 0 and s.bytes_per_party["alice"] > 0
    assert s.dealer_bytes > 0  # the dealer shipped material party to party


def test_mpc_matches_in_process_accounting(trio):
    x = torch.randn(4, 5)
    w = torch.randn(5, 3)
    results = []
    for parties in (trio, [pt.VirtualWorker(n) for n in ("alice", "bob", "carol")]):
        a = mpc.share(x, parties[0], parties[1], crypto_provider=parties[2])
        b = mpc.share(w, parties[0], parties[1], crypto_provider=parties[2])
        with mpc.stats() as s:
            out = (a @ b).get()
        results.append((out, s.rounds, s.bytes_per_party))
    (net_out, net_rounds, net_bytes), (vw_out, vw_rounds, vw_bytes) = results
    assert torch.allclose(net_out, x @ w, atol=1e-3) and torch.allclose(vw_out, x @ w, atol=1e-3)
    assert net_rounds == vw_rounds and net_bytes == vw_bytes


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3)
        self.fc = nn.Linear(4 * 3 * 3, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def test_mpc_small_cnn_encrypted_inference(trio):
    alice, bob, carol = trio
    torch.manual_seed(0)
    model = SmallCNN().eval()
    img = torch.randn(2, 1, 8, 8)
    want = model(img)
    shared = mpc.share(copy.deepcopy(model), alice, bob, crypto_provider=carol)
    got = shared(mpc.share(img, alice, bob, crypto_provider=carol)).get()
    assert torch.allclose(got, want, atol=2e-3), (got - want).abs().max()
    assert torch.equal(got.argmax(1), want.argmax(1))


# ----------------------------------------------------------------------------- security


def test_certificate_from_another_ca_is_refused(net, tmp_path):
    cli(["certs", str(tmp_path), "client"])  # a different CA, same identity name
    with pytest.raises(pt.PartyUnavailable, match="TLS handshake"):
        pt.connect("alice", net.address("alice"), certs=tmp_path, identity="client")


def test_worker_must_present_its_own_certificate(net):
    with pytest.raises(pt.PartyUnavailable):  # bob's address does not serve alice
        pt.connect("alice", net.address("bob"), certs=net.certs, identity="client")


def test_peer_identity_may_deliver_but_not_run_or_fetch(trio, net):
    alice, bob, carol = trio
    a = mpc.share(torch.tensor([1.0, 2.0]), alice, bob, crypto_provider=carol)
    a = a * a  # alice delivers to bob: bob now knows alice as a peer worker
    secret = a.shares[1]  # bob's share of the product
    as_peer = net.connect("bob", identity="alice")  # alice's own worker certificate
    with pytest.raises(pt.RemoteError, match="peer worker"):
        as_peer.request(Fetch(secret.id_at_location, False))
    with pytest.raises(pt.RemoteError, match="peer worker"):
        pt.send(torch.ones(1), as_peer).get()
    assert torch.allclose(a.get(), torch.tensor([1.0, 4.0]))


def test_another_client_cannot_read_or_delete_your_objects(net):
    alice = net.fresh("alice")
    mallory = net.connect("alice", "mallory")
    p = pt.send(torch.tensor([42.0]), alice)
    with pytest.raises(pt.RemoteError, match="no object"):
        mallory.request(Fetch(p.id_at_location, True))
    assert p.id_at_location not in mallory.objects
    mallory.queue_delete(p.id_at_location)
    mallory.sync()
    assert torch.equal(p.get(), torch.tensor([42.0]))


# ----------------------------------------------------------------------------- plans


def test_a_waiting_lookup_sets_the_namespace_lock_aside():
    """A command (or a program's step) waiting for an object lets the namespace run the
    command that produces it; a promise nobody keeps ends in a bounded, clear error."""
    lock = NamespaceLock()
    store = WaitingStore("alice", deadline=5.0, max_bytes=None, lock=lock)
    store.promise([7])

    def produce() -> None:
        with lock:  # the namespace's next command: it needs the lock the waiter holds
            store.put(7, torch.ones(2))

    producer = threading.Thread(target=produce)
    with lock, lock:  # held twice, as by a served command
        producer.start()
        assert torch.equal(store.get(7), torch.ones(2))  # waits, with the lock set aside
    producer.join(5)  # (leaving the with blocks released the lock twice: it was restored)
    assert not producer.is_alive()
    store.deadline = 0.3
    store.promise([8])
    start = time.monotonic()
    with lock, pytest.raises(pt.PartyUnavailable, match="waited 0.3 s for object 8"):
        store.get(8)
    assert time.monotonic() - start < 3
    store.promise([9])
    store.fail_promises([9], "program failed: boom")
    with pytest.raises(pt.PartyUnavailable, match="program failed: boom"):
        store.get(9)
    with pytest.raises(pt.UnknownObjectError):
        store.get(10)  # nobody promised it: no wait


def test_plan_over_shared_values_runs_on_served_workers(trio):
    """One message per worker per call; the same result as op by op and as plaintext."""
    alice, bob, carol = trio
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).eval()
    images = torch.rand(4, 6)
    with torch.no_grad():
        expected = model(images)
    mpc.share(model, alice, bob, crypto_provider=carol)
    x = mpc.share(images, alice, bob, crypto_provider=carol)
    inference = mpc.plan(model, x)
    for _ in range(2):
        x2 = mpc.share(images, alice, bob, crypto_provider=carol)
        gc.collect()
        for w in trio:
            w.sync()  # earlier deletes travel now, not counted below
        with mpc.stats() as s:
            out = inference(x2)
            for w in trio:
                w.wait_programs()
        assert s.client_messages == 3
        got = out.get()
        op_by_op = model(x2).get()
        del out  # (else its deletes would travel, and count, in the next call's block)
        _close(got, expected, 200)
        _close(got, op_by_op, 200)
    assert alice.stats.peer_messages_sent > 0 and carol.stats.peer_messages_sent > 0


@pytest.mark.slow
def test_party_killed_before_a_plan_call_fails_within_the_deadline(net):
    deadline = 2.0
    alice, dave, carol = (net.fresh(w, deadline=deadline) for w in ("alice", "dave", "carol"))
    x = torch.tensor([1.0, -2.0, 3.0])
    a = mpc.share(x, alice, dave, crypto_provider=carol)
    relu_plan = mpc.plan(F.relu, a)
    _close(relu_plan(a).get(), F.relu(x), 40)
    b = mpc.share(-x, alice, dave, crypto_provider=carol)
    server = net.servers["dave"]
    try:
        dave.sync()
        server.kill()
        start = time.monotonic()
        with pytest.raises(pt.PartyUnavailable, match="dave"):
            relu_plan(b).get()  # alice's program waits for dave's deliveries, bounded
        assert time.monotonic() - start < deadline + 8.0
        alice.wait_programs(deadline + 5.0)  # nothing hangs at the survivors
        carol.wait_programs(deadline + 5.0)
        assert torch.equal(pt.send(torch.ones(2), alice).get(), torch.ones(2))
        bob = net.fresh("bob", deadline=deadline)
        c = mpc.share(x, alice, bob, crypto_provider=carol)
        _close(mpc.plan(F.relu, c)(c).get(), F.relu(x), 40)
    finally:
        server.restart()
        dave.sync()


# ----------------------------------------------------------------------------- faults


def test_party_killed_mid_multiply_fails_fast_and_the_rest_survives(net):
    deadline = 2.0
    alice, dave, carol = (net.fresh(w, deadline=deadline) for w in ("alice", "dave", "carol"))
    x, y = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([4.0, 5.0, 6.0])
    a = mpc.share(x, alice, dave, crypto_provider=carol)
    b = mpc.share(y, alice, dave, crypto_provider=carol)
    _close((a * b).get(), x * y, 40)
    server = net.servers["dave"]
    try:
        c = a * b  # posted: alice and dave run it while the client goes on
        server.kill()
        start = time.monotonic()
        with pytest.raises(pt.PartyUnavailable, match="dave"):
            (c * a).get()  # the next round needs dave's deliveries
        assert time.monotonic() - start < deadline + 8.0
        # the survivors stay usable
        assert torch.equal(pt.send(torch.ones(2), alice).get(), torch.ones(2))
        bob = net.fresh("bob", deadline=deadline)
        a2 = mpc.share(x, alice, bob, crypto_provider=carol)
        _close((a2 * a2).get(), x * x, 40)
        # a restarted worker: same address, empty store; the old connection recovers
        server.restart()
        dave.sync()  # what failed while it was down was reported with the error above
        with pytest.raises(pt.RemoteError, match="no object"):
            a.shares[1].get()  # the restart lost dave's share
        a3 = mpc.share(x, alice, dave, crypto_provider=carol)
        _close((a3 * a3).get(), x * x, 40)
    finally:
        if not server.alive():
            server.restart()
