"""PySyft 0.2 users feel at home (issue 16): the names and behaviours its tutorials rely on.

Each ``test_part_*`` is one PySyft 0.2 tutorial part, in our own words and code (digits
where the tutorial used MNIST), asserting what the tutorial states.
"""

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
