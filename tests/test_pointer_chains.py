"""Pointer chains (PySyft 0.2, issue 16): ``x.send(bob).send(alice)``, one-hop ``get()``,
``remote_get()``, ``move`` along the chain, and what a worker may not do as a client of
another (in-process workers; network workers refuse, see test_pysyft_compat.py)."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pointers as pt
from pointers.worker.chains import ChainError

pt.hook(torch)


@pytest.fixture
def bob():
    return pt.VirtualWorker("bob")


@pytest.fixture
def alice():
    return pt.VirtualWorker("alice")


def test_send_of_a_pointer_leaves_bob_a_pointer_to_alices_tensor(bob, alice):
    x = torch.tensor([1, 2, 3, 4, 5]).send(bob).send(alice)
    assert x.location is bob and x.chain_location is alice
    (held,) = bob._objects.values()
    assert isinstance(held, pt.PointerTensor) and held.location.id == "alice"
    (value,) = alice._objects.values()
    assert torch.equal(value, torch.tensor([1, 2, 3, 4, 5]))
    assert "then 'alice'" in repr(x)


def test_ops_on_a_chain_run_at_the_far_worker(bob, alice):
    x = torch.tensor([1, 2, 3, 4, 5]).send(bob).send(alice)
    y = x + x
    assert y.location is bob and y.chain_location is alice
    assert len(bob._objects) == 2 and len(alice._objects) == 2
    assert all(isinstance(v, pt.PointerTensor) for v in bob._objects.values())
    hop = y.get()  # one hop: the client's pointer to alice's tensor
    assert hop.location is alice and hop.chain_location is None
    assert len(bob._objects) == 1 and len(alice._objects) == 2
    assert torch.equal(hop.get(), torch.tensor([2, 4, 6, 8, 10]))
    assert len(alice._objects) == 1


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.floats(-1e3, 1e3, allow_nan=False), min_size=1, max_size=6),
    st.floats(-10, 10, allow_nan=False),
)
def test_chain_ops_match_plaintext(values, scalar):
    bob, alice = pt.VirtualWorker("bob"), pt.VirtualWorker("alice")
    t = torch.tensor(values)
    x = t.send(bob).send(alice)
    out = ((x * scalar + x).abs() - x.sum()).relu()
    expected = ((t * scalar + t).abs() - t.sum()).relu()
    assert torch.allclose(out.get().get(), expected)
    in_place = t.clone().send(bob).send(alice)
    in_place.add_(scalar)
    assert torch.allclose(in_place.get().get(), t + scalar)


def test_dropping_a_chain_deletes_both_hops(bob, alice):
    x = torch.tensor([1, 2, 3]).send(bob).send(alice)
    y = x * 2
    del x, y
    assert len(bob._objects) == 0  # bob's deletes first, then alice's (PySyft's order)
    assert len(alice._objects) == 0


def test_get_without_delete_keeps_bobs_pointer(bob, alice):
    x = torch.tensor([7.0]).send(bob).send(alice)
    peek = x.get(delete=False)
    assert peek.location is alice and torch.equal(peek.get(delete=False), torch.tensor([7.0]))
    del peek  # a borrowed pointer: dropping it deletes nothing
    assert len(alice._objects) == 1 and len(bob._objects) == 1
    assert torch.equal(x.get().get(), torch.tensor([7.0]))


def test_remote_get_brings_the_tensor_to_bob(bob, alice):
    x = torch.tensor([1, 2, 3, 4, 5]).send(bob).send(alice)
    assert x.remote_get() is x
    assert x.chain_location is None and x.location is bob
    assert len(alice._objects) == 0
    (value,) = bob._objects.values()
    assert torch.equal(value, torch.tensor([1, 2, 3, 4, 5]))
    assert torch.equal((x + 1).get(), torch.tensor([2, 3, 4, 5, 6]))
    with pytest.raises(ChainError, match="remote_get"):
        x.remote_get()


def test_move_collapses_the_chain(bob, alice):
    carol = pt.VirtualWorker("carol")
    x = torch.tensor([1.0, 2.0]).send(bob).send(alice)
    m = x.move(carol)
    assert m.location is carol and m.chain_location is None
    assert len(bob._objects) == 0 and len(alice._objects) == 0
    assert torch.equal(m.get(), torch.tensor([1.0, 2.0]))
    x = torch.tensor([3.0]).send(bob).send(alice)
    assert torch.equal(x.move(alice).get(), torch.tensor([3.0]))


def test_chain_refusals_are_clear(bob, alice):
    carol = pt.VirtualWorker("carol")
    x = torch.tensor([1.0, 2.0]).send(bob).send(alice)
    with pytest.raises(ChainError, match="more than two workers"):
        x.send(carol)
    with pytest.raises(ChainError, match="get\\(\\) one hop first"):
        x.copy_to(carol)
    with pytest.raises(ChainError, match="cannot be tagged"):
        x.tag("#mine")
    assert bob.search("#mine") == []
    with pytest.raises(pt.PointerError, match="already at 'bob'"):
        torch.tensor([1.0]).send(bob).send(bob)
    g = torch.tensor([1.0], requires_grad=True).send(bob)
    with pytest.raises(ChainError, match="requires grad"):
        g.send(alice)
    # nothing held at bob travels along the chain inside an op
    local = torch.tensor([10.0, 20.0]).send(bob)
    with pytest.raises(pt.RemoteError, match="never a tensor value"):
        (x + local).get()
    with pytest.raises(pt.RemoteError, match="never a tensor value"):
        (x + torch.ones(2)).get()
    assert torch.equal(x.get().get(), torch.tensor([1.0, 2.0]))


def test_a_worker_as_client_of_another_may_only_run_ops_fetch_and_delete(bob, alice):
    from pointers.wire.messages import CallFunction, Store
    from pointers.worker.chains import peer_client

    bob.introduce(alice)
    client = peer_client(bob, "alice")
    assert client is peer_client(bob, "alice")  # one per pair
    with pytest.raises(pt.NotAllowedError, match="'store'"):
        client.post(Store(client.new_id(), torch.ones(1), [], ""))
    with pytest.raises(pt.NotAllowedError, match="'call'"):
        client.post(CallFunction("anything", [], {}, [None], False))
    assert len(alice._objects) == 0


def test_chain_functions_refuse_objects_that_are_not_chains(bob, alice):
    from pointers.wire.messages import CallFunction
    from pointers.worker.chains import REMOTE_GET, UNLINK

    x = torch.tensor([1.0]).send(bob).send(alice)
    plain = torch.tensor([2.0]).send(bob)
    for name, args in (
        (UNLINK, [plain.id_at_location, False]),
        (REMOTE_GET, [plain.id_at_location]),
    ):
        with pytest.raises(pt.RemoteError, match="not a pointer to another worker"):
            bob.request(CallFunction(name, args, {}, [bob.new_id()], False))
    assert torch.equal(plain.get(), torch.tensor([2.0]))
    assert torch.equal(x.get().get(), torch.tensor([1.0]))


def test_chain_of_a_sealed_object_keeps_it_sealed(bob, alice):
    # a sealed object moved along a chain stays sealed: no hop can read it
    from pointers.wire.messages import Store

    sealed_id = bob.new_id()
    alice.introduce(bob)
    carol = pt.VirtualWorker("carol")
    carol.introduce(bob)
    carol.store.put(1, torch.tensor([42.0]), sealed=True)
    from pointers.wire.messages import SendToPeer

    carol.send_to_peer(SendToPeer(1, "bob", sealed_id, True))
    assert bob.store.is_sealed(sealed_id)
    ptr = pt.PointerTensor.from_meta(bob, sealed_id, (1,), (1,), torch.float32, owned=False)
    chained = ptr.send(alice)
    hop = chained.get()
    with pytest.raises(pt.RemoteError, match="sealed"):
        hop.get()
    with pytest.raises(pt.RemoteError):  # a client may not store a sealed object either
        bob.post(Store(bob.new_id(), torch.ones(1), [], "", True))


def test_fetching_a_hop_by_its_id_is_refused_and_keeps_the_chain(bob, alice):
    from pointers.wire.messages import Fetch

    x = torch.tensor([1.0, 2.0, 3.0]).send(bob).send(alice)
    (hop_id,) = bob._objects.keys()
    with pytest.raises(pt.RemoteError, match="NotAllowedError.*chain.s hop"):
        bob.request(Fetch(hop_id, True))
    assert hop_id in bob._objects  # not dropped by the refused fetch
    assert torch.equal(x.get().get(), torch.tensor([1.0, 2.0, 3.0]))
