"""PySyft 0.2 users feel at home (issue 16): the names and behaviours its tutorials rely on.

Each ``test_part_*`` is one PySyft 0.2 tutorial part, in our own words and code (digits
where the tutorial used MNIST), asserting what the tutorial states.
"""

import pytest
import torch
from torch import nn, optim

import pointers as pt

pt.hook(torch)


# -- the two bugs -------------------------------------------------------------------------


def test_send_keeps_requires_grad_and_get_brings_the_grad(bob):
    x = torch.tensor([1.0, 2.0], requires_grad=True).send(bob)
    y = torch.tensor([3.0, 4.0], requires_grad=True).send(bob)
    assert x.requires_grad and y.requires_grad
    z = (x + y).sum()
    z.backward()
    x = x.get()
    assert x.requires_grad
    assert torch.equal(x.grad, torch.ones(2))
    assert torch.equal(x.detach(), torch.tensor([1.0, 2.0]))


def test_send_without_requires_grad_stays_without(bob):
    x = torch.tensor([1.0, 2.0]).send(bob)
    assert not x.requires_grad
    assert not x.get().requires_grad


def test_module_moves_after_a_backward(bob, alice):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    model.send(bob)
    loss = model(torch.ones(3, 2).send(bob)).sum()
    loss.backward()
    opt.step()
    model.send(alice)  # a second send moves it: once failed with ObjectGoneError
    assert model.weight.location.id == alice.id
    assert model.weight.grad.location.id == alice.id
    opt.zero_grad()
    model(torch.ones(3, 2).send(alice)).sum().backward()
    opt.step()
    model.get()
    assert torch.equal(model.weight.grad, torch.full((1, 2), 3.0))
    assert not isinstance(model.weight, pt.PointerTensor)


# -- names PySyft users type ----------------------------------------------------------------


def test_local_worker_objects_owner_location(bob):
    hook = pt.hook(torch)
    assert hook.local_worker is pt.local_worker
    assert pt.local_worker.is_client_worker and not bob.is_client_worker
    assert "Tensor.send" in hook or "Module.copy" in hook or isinstance(hook, list)
    x = torch.tensor([1.0, 2.0]).send(bob)
    assert x.owner is pt.local_worker
    assert x.location is bob
    assert x.id_at_location in bob._objects
    assert torch.equal(bob._objects[x.id_at_location], torch.tensor([1.0, 2.0]))
    with pytest.raises(TypeError):
        bob._objects[x.id_at_location] = torch.zeros(2)  # a read-only view


def test_module_copy_and_move(bob, alice):
    torch.manual_seed(0)
    model = nn.Linear(2, 1)
    local_copy = model.copy()
    assert local_copy is not model and torch.equal(local_copy.weight, model.weight)
    expected = model.weight.detach().clone()
    model.send(bob)
    remote_copy = model.copy()
    assert remote_copy.weight.location.id == bob.id
    assert remote_copy.weight.id_at_location != model.weight.id_at_location
    model.move(alice)
    assert model.weight.location.id == alice.id
    assert torch.equal(remote_copy.get().weight.detach(), expected)
    assert torch.equal(model.get().weight.detach(), expected)


def _mpc_workers(make_worker):
    return make_worker("alice"), make_worker("bob"), make_worker("carol")


def test_shared_copy_max_and_protocol_names(make_worker):
    mpc = pytest.importorskip("mpc")
    alice, bob, carol = _mpc_workers(make_worker)
    x = torch.tensor([[1.0, 5.0], [3.0, 2.0]]).share(alice, bob, crypto_provider=carol)
    assert torch.equal(x.copy().get(), torch.tensor([[1.0, 5.0], [3.0, 2.0]]))
    values, indices = x.max(dim=0).get()
    assert torch.equal(values, torch.tensor([3.0, 5.0]))
    assert torch.equal(indices, torch.tensor([1, 0]))
    for protocol in ("fss", "snn"):
        y = torch.tensor([1.0, -2.0]).share(alice, bob, crypto_provider=carol, protocol=protocol)
        assert (y > 0).get().tolist() == [True, False]
    with pytest.raises(mpc.MPCError, match="protocol='spdz'"):
        torch.tensor([1.0]).share(alice, bob, crypto_provider=carol, protocol="spdz")


# -- fixed precision ------------------------------------------------------------------------


def test_fix_precision_round_trip():
    x = torch.tensor([1.5, -2.25, 0.001])
    f = x.fix_precision(precision_fractional=3)
    assert isinstance(f, pt.FixedPrecisionTensor) and f.frac_bits == 10
    assert f.dtype == torch.int64
    assert torch.allclose(f.float_precision(), x, atol=1e-3)
    assert torch.equal(torch.tensor([0.5]).fix_precision().float_precision(), torch.tensor([0.5]))
    with pytest.raises(TypeError, match="float tensor"):
        torch.tensor([1, 2]).fix_precision()


def test_fix_precision_share_and_back(make_worker):
    pytest.importorskip("mpc")
    alice, bob, carol = _mpc_workers(make_worker)
    x = torch.tensor([1.5, -2.0]).fix_precision().share(alice, bob, crypto_provider=carol)
    assert x.frac_bits == 16
    y = torch.tensor([2.0, 0.5]).fix_precision().share(alice, bob, crypto_provider=carol)
    assert torch.allclose((x * y).get().float_precision(), torch.tensor([3.0, -1.0]), atol=1e-3)
    model = nn.Linear(2, 1).fix_precision(precision_fractional=4)
    expected = model(torch.ones(1, 2)).detach()
    model.share(alice, bob, crypto_provider=carol)
    assert model.weight.frac_bits == 14
    x = torch.ones(1, 2).fix_precision(precision_fractional=4)
    out = model(x.share(alice, bob, crypto_provider=carol)).get().float_precision()
    assert torch.allclose(out, expected, atol=1e-2)
    opt = optim.SGD(model.parameters(), lr=0.1)
    assert opt.fix_precision() is opt
