"""The seed scenario: federated-style remote training of nn.Linear on two workers."""

import gc

import pytest
import torch
from torch import nn, optim

import pointers as pt


def _train(remote: bool, workers=None, epochs: int = 2):
    torch.manual_seed(0)
    data = torch.tensor([[0, 0], [0, 1.0], [1, 0], [1, 1.0]], requires_grad=True)
    target = torch.tensor([[0], [0], [1], [1.0]], requires_grad=True)
    model = nn.Linear(2, 1)
    if remote:
        bob, alice = workers
        datasets = [
            (pt.send(data[0:2], bob), pt.send(target[0:2], bob)),
            (pt.send(data[2:], alice), pt.send(target[2:], alice)),
        ]
    else:
        datasets = [(data[0:2], target[0:2]), (data[2:], target[2:])]
    opt = optim.SGD(params=model.parameters(), lr=0.1)
    losses = []
    for _ in range(epochs):
        for d, t in datasets:
            if remote:
                pt.send(model, d.location)
            opt.zero_grad()
            pred = model(d)
            loss = ((pred - t) ** 2).sum()
            loss.backward()
            opt.step()
            if remote:
                pt.get(model)
            losses.append(float(loss.get() if remote else loss.detach()))
    return model, losses


def test_seed_scenario_matches_local_training():
    bob, alice = pt.VirtualWorker("bob"), pt.VirtualWorker("alice")
    remote_model, remote_losses = _train(True, (bob, alice), epochs=2)
    local_model, local_losses = _train(False, epochs=2)
    assert remote_losses[-1] < remote_losses[0] or remote_losses[-2] < remote_losses[1]
    for a, b in zip(remote_model.parameters(), local_model.parameters()):
        assert type(a) is nn.Parameter
        assert torch.allclose(a, b, atol=1e-6)
    assert remote_losses == local_losses
    gc.collect()
    assert len(bob.objects) == 0 and len(alice.objects) == 0


def test_seed_scenario_with_hook_methods():
    pt.hook(torch)
    bob, alice = pt.VirtualWorker("bob"), pt.VirtualWorker("alice")
    torch.manual_seed(1)
    data = torch.tensor([[0, 0], [0, 1.0], [1, 0], [1, 1.0]])
    target = torch.tensor([[0], [0], [1], [1.0]])
    datasets = [
        (data[0:2].send(bob), target[0:2].send(bob)),
        (data[2:].send(alice), target[2:].send(alice)),
    ]
    model = nn.Linear(2, 1)
    opt = optim.SGD(params=model.parameters(), lr=0.1)
    losses = []
    for _ in range(10):
        for d, t in datasets:
            model.send(d.location)
            opt.zero_grad()
            loss = ((model(d) - t) ** 2).sum()
            loss.backward()
            opt.step()
            model.get()
            losses.append(loss.get().item())
    assert losses[-1] < losses[0] / 2
    assert model.weight.grad is not None and type(model.weight.grad) is torch.Tensor


def test_module_moves_between_workers_and_optimizer_keeps_params(alice, bob):
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    params_before = [id(p) for p in model.parameters()]
    pt.send(model, alice)
    assert all(p.location is alice for p in model.parameters())
    pt.send(model, bob)
    assert all(p.location is bob for p in model.parameters())
    assert len(alice.objects) == 0
    pt.get(model)
    assert [id(p) for p in model.parameters()] == params_before
    assert all(type(p) is nn.Parameter for p in model.parameters())
    assert len(bob.objects) == 0


def _small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 2, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * 3 * 3, 3),
    )


def _train_cnn(make_opt, worker=None, steps: int = 3):
    torch.manual_seed(0)
    model = _small_cnn()
    x, y = torch.randn(4, 1, 8, 8), torch.tensor([0, 1, 2, 1])
    opt = make_opt(model.parameters())
    if worker is not None:
        pt.send(model, worker)
        x, y = pt.send(x, worker), pt.send(y, worker)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.get() if worker is not None else loss.detach()))
    if worker is not None:
        pt.get(model)
    return model, losses


@pytest.mark.parametrize(
    "make_opt",
    [
        lambda p: optim.SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3),
        lambda p: optim.Adam(p, lr=0.01),
        lambda p: optim.AdamW(p, lr=0.01, amsgrad=True),
    ],
    ids=["sgd-momentum", "adam", "adamw-amsgrad"],
)
def test_remote_cnn_training_with_stateful_optimizers_matches_local(alice, make_opt):
    """Conv2d, ReLU, MaxPool2d, Linear and cross-entropy, trained at the worker with
    optimizers that keep remote state (momentum buffers, Adam moments): every op autograd
    and the optimizer send is on the worker's allow-list, and the result is the local one."""
    remote_model, remote_losses = _train_cnn(make_opt, alice)
    local_model, local_losses = _train_cnn(make_opt)
    assert remote_losses == pytest.approx(local_losses, rel=1e-5)
    assert remote_losses[-1] < remote_losses[0]
    for a, b in zip(remote_model.parameters(), local_model.parameters()):
        assert type(a) is nn.Parameter
        assert torch.allclose(a, b, atol=1e-5)


def test_a_model_with_tied_weights_is_sent_once_and_stays_tied() -> None:
    """A language model's input and output embeddings are one Parameter: sending the model
    sends it once (it was sent twice, and the second send failed), and it stays tied."""
    lm = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    lm[1].weight = lm[0].weight
    w = pt.VirtualWorker("tied")
    pt.send(lm, w)
    assert lm[0].weight is lm[1].weight
    assert isinstance(lm[0].weight, pt.PointerTensor)
    assert len(w.store.view()) == 1
