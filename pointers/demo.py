"""Remote training with pointers: the PySyft 0.2 seed scenario on in-process workers.

Run with ``python -m pointers.demo``.
"""

from __future__ import annotations

import torch
from torch import nn, optim

import pointers as pt


def main(epochs: int = 10) -> list[float]:
    pt.hook(torch)
    bob, alice = pt.VirtualWorker("bob"), pt.VirtualWorker("alice")
    torch.manual_seed(0)
    data = torch.tensor([[0, 0], [0, 1.0], [1, 0], [1, 1.0]])
    target = torch.tensor([[0], [0], [1], [1.0]])
    datasets = [
        (pt.send(data[0:2], bob), pt.send(target[0:2], bob)),
        (pt.send(data[2:], alice), pt.send(target[2:], alice)),
    ]
    model = nn.Linear(2, 1)
    opt = optim.SGD(params=model.parameters(), lr=0.1)
    losses = []
    print("Remote training of nn.Linear(2, 1) with data on 'bob' and 'alice':")
    for epoch in range(epochs):
        total = 0.0
        for d, t in datasets:
            pt.send(model, d.location)
            opt.zero_grad()
            loss = ((model(d) - t) ** 2).sum()
            loss.backward()
            opt.step()
            pt.get(model)
            total += loss.get().item()
        losses.append(total)
        print(f"  epoch {epoch + 1:2d}: loss {total:.4f}")
    print(f"messages: bob {bob.stats.messages_received}, alice {alice.stats.messages_received}")
    return losses


if __name__ == "__main__":
    main()
