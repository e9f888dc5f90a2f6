"""Ownership, errors, stats, search, move/copy, hook: the pointer layer's contract."""

import gc

import pytest
import torch
import torch.nn.functional as F

import pointers as pt
from pointers.wire.messages import ExecuteOp, encode_message
from pointers.wire.serde import Ref


def test_pointer_metadata(alice):
    x = torch.randn(3, 4, dtype=torch.float64)
    p = pt.send(x, alice)
    assert isinstance(p, torch.Tensor) and isinstance(p, pt.PointerTensor)
    assert p.location is alice and p.location.id == "alice"
    assert p.shape == (3, 4) and p.dtype == torch.float64
    assert p.id_at_location in alice.objects
    assert torch.equal(alice.objects[p.id_at_location], x)


def test_objects_view_is_read_only(alice):
    pt.send(torch.ones(2), alice)
    with pytest.raises(TypeError):
        alice.objects[123] = torch.ones(1)  # type: ignore[index]


def test_get_removes_and_second_get_raises(alice):
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    assert torch.equal(p.get(), torch.tensor([1.0, 2.0]))
    assert len(alice.objects) == 0
    with pytest.raises(pt.ObjectGoneError, match="already retrieved"):
        p.get()
    with pytest.raises(pt.ObjectGoneError):
        p + 1


def test_send_copies_the_value(alice):
    x = torch.zeros(3)
    p = pt.send(x, alice)
    x += 5  # the sender's later writes do not reach the worker
    assert torch.equal(p.get(), torch.zeros(3))


def test_dropping_pointers_frees_remote_objects_no_leak(alice):
    p = pt.send(torch.randn(5), alice)
    before = len(alice.objects)
    for _ in range(1000):
        q = (p * 2 + 1).abs()
        del q
    gc.collect()
    assert len(alice.objects) == before
    del p
    gc.collect()
    assert len(alice.objects) == 0


def test_mixing_two_workers_names_both(alice, bob):
    a, b = pt.send(torch.ones(2), alice), pt.send(torch.ones(2), bob)
    with pytest.raises(pt.LocationMismatchError, match="'alice'.*'bob'"):
        a + b
    with pytest.raises(pt.LocationMismatchError, match="alice.*bob"):
        torch.cat([a, b])


@pytest.mark.parametrize(
    "read",
    [
        lambda p: p.item(),
        lambda p: bool(p),
        lambda p: p.tolist(),
        lambda p: float(p),
        lambda p: int(p),
        lambda p: p.numpy(),
        lambda p: torch.equal(p, p),
    ],
)
def test_reading_values_requires_get(alice, read):
    p = pt.send(torch.tensor([1.5]), alice)
    with pytest.raises(pt.ValueRequiresGetError, match=r"\.get\(\)"):
        read(p)


def test_repr_never_fetches(alice):
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    before = alice.stats.messages_received
    text = repr(p) + str(p) + f"{p}"
    assert "alice" in text and "(2,)" in text and "1." not in text
    assert alice.stats.messages_received == before


def test_local_operand_travels_as_constant(alice):
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    assert torch.equal((p + torch.tensor([10.0, 20.0])).get(), torch.tensor([11.0, 22.0]))
    assert torch.equal((2.5 * pt.send(torch.ones(2), alice)).get(), torch.full((2,), 2.5))


def test_inplace_into_local_tensor_refused(alice):
    p = pt.send(torch.ones(2), alice)
    local = torch.zeros(2)
    with pytest.raises(pt.PointerError, match="local tensor"):
        local.add_(p)


def test_move_and_copy(alice, bob):
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    c = p.copy()
    assert c.id_at_location != p.id_at_location and c.location is alice
    m = p.move(bob)
    assert m.location is bob
    assert torch.equal(m.get(), torch.tensor([1.0, 2.0]))
    with pytest.raises(pt.ObjectGoneError):
        p.get()
    assert torch.equal(c.get(), torch.tensor([1.0, 2.0]))
    assert len(alice.objects) == 0 and len(bob.objects) == 0
    assert alice.stats.peer_messages_sent == 1


def _stored_data_ptrs(worker):
    return [t.data_ptr() for t in worker.objects.values()]


def test_in_process_move_hands_the_memory_over_and_copies_otherwise():
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    alice.introduce(bob)
    alice.introduce(carol)
    p = pt.send(torch.arange(1000), alice)
    (before,) = _stored_data_ptrs(alice)
    m = p.move(bob)  # nothing else refers to the tensor at alice: no copy
    assert _stored_data_ptrs(bob) == [before] and len(alice.objects) == 0
    m.add_(1)
    assert torch.equal(m.get(), torch.arange(1000) + 1)

    q = pt.send(torch.arange(1000), alice)
    v = q.view(10, 100)  # a view at alice keeps the memory in use: the move copies
    (kept,) = set(_stored_data_ptrs(alice))
    moved = q.move(carol)
    assert _stored_data_ptrs(carol) != [kept]
    moved.add_(1)  # alice's view is unaffected
    assert torch.equal(v.get(), torch.arange(1000).view(10, 100))
    assert torch.equal(moved.get(), torch.arange(1000) + 1)

    r = pt.send(torch.arange(1000), alice)
    c = r.copy_to(bob)  # a copy never shares memory
    c.add_(1)
    assert torch.equal(r.get(delete=False), torch.arange(1000))
    # lent (both sides promise to only read it, as for an opening): the same memory
    (held,) = set(_stored_data_ptrs(alice))
    lent = r.copy_to(carol, lend=True)
    assert held in _stored_data_ptrs(carol)
    assert torch.equal((lent + r.copy_to(carol)).get(), 2 * torch.arange(1000))


def test_tags_and_search():
    x = torch.tensor([1.0, 2.0, 3.0])
    dev = pt.VirtualWorker("device_1", data=(pt.tag(x, "input_data"), torch.zeros(1)))
    found = dev.search("input_data")
    assert len(found) == 1 and found[0].location is dev
    assert torch.equal((found[0] * 2).get(), x * 2)
    assert dev.search("nothing") == []
    with pytest.raises(TypeError):
        dev.search()


def test_stats_count_messages_and_bytes(alice):
    s0 = alice.stats.snapshot()
    p = pt.send(torch.zeros(1000, dtype=torch.float64), alice)
    s1 = alice.stats.snapshot()
    assert s1.messages_received == s0.messages_received + 1
    assert s1.bytes_received - s0.bytes_received >= 8000
    p.get()
    s2 = alice.stats.snapshot()
    assert s2.messages_sent == s1.messages_sent + 1
    assert s2.bytes_sent - s1.bytes_sent >= 8000


def test_worker_reports_errors_cleanly(alice):
    header, buffers = encode_message(ExecuteOp("builtins::eval.default", [], {}, [1], False))
    rh, rb = alice.handle_frames(header, buffers)
    assert b"NotAllowedError" in rh
    rh, _ = alice.handle_frames(b"\x93garbage", [])
    assert b"DecodeError" in rh
    with pytest.raises(pt.RemoteError, match="no object"):
        alice.request(ExecuteOp("aten::abs.default", [Ref(424242)], {}, [7], False))


def test_from_file_refused(alice):
    msg = ExecuteOp("aten::from_file.default", ["/etc/passwd"], {}, [1], False)
    with pytest.raises(pt.RemoteError, match="NotAllowedError"):
        alice.request(msg)


def test_autograd_through_pointers(alice):
    w_local = torch.randn(3, 2, requires_grad=True)
    x = torch.randn(4, 3)
    F.relu(x @ w_local).sum().backward()
    expected = w_local.grad.clone()

    w = torch.nn.Parameter(pt.send(w_local.detach(), alice))
    loss = F.relu(pt.send(x, alice) @ w).sum()
    loss.backward()
    assert isinstance(w.grad, pt.PointerTensor)
    assert torch.allclose(w.grad.get(), expected)


def test_hook_adds_only_missing_methods():
    import torch as torch_module

    before = {n: getattr(torch_module.Tensor, n) for n in ("add", "abs", "share_memory_")}
    pt.hook(torch_module)
    pt.hook(torch_module)  # twice is fine
    for n, f in before.items():
        assert getattr(torch_module.Tensor, n) is f
    assert hasattr(torch_module.Tensor, "send") and hasattr(torch_module.nn.Module, "send")
    alice = pt.VirtualWorker("alice")
    p = torch.ones(2).send(alice)
    assert torch.equal(p.get(), torch.ones(2))
    with pytest.raises(pt.PointerError, match="local"):
        torch.ones(1).get()


def test_pointer_cannot_be_pickled(alice):
    import pickle

    with pytest.raises(pt.PointerError):
        pickle.dumps(pt.send(torch.ones(1), alice))


def test_send_rejects_non_tensors(alice):
    with pytest.raises(TypeError, match="tensor"):
        pt.send([1, 2], alice)


def test_get_all_fetches_every_value(alice, bob):
    p, q = pt.send(torch.arange(3.0), alice), pt.send(torch.ones(2), bob)
    a, b = pt.get_all([p, q], delete=False)
    assert torch.equal(a, torch.arange(3.0)) and torch.equal(b, torch.ones(2))
    a.add_(1)  # the values are the caller's own copies
    a, b = pt.get_all([p, q])  # delete=True, as get()
    assert torch.equal(a, torch.arange(3.0)) and torch.equal(b, torch.ones(2))
    with pytest.raises(pt.ObjectGoneError):
        p.get()
    with pytest.raises(TypeError, match="PointerTensors"):
        pt.get_all([torch.ones(1)])
