"""CrypTen's ``crypten.optim``: torch's optimizers, each step made once for all ranks.

A shared model trains with torch's own optimizers (docs/encrypted-training.md); these add
CrypTen's ``grad_threshold`` and make ``step()`` and ``zero_grad()`` collectives, so the
ranks of ``run_multiprocess`` (each holding an optimizer over the same shared parameters)
step once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpc.crypten import _world


class Optimizer(torch.optim.Optimizer):
    """A torch optimizer whose ``step`` and ``zero_grad`` are made once for all ranks."""

    grad_threshold: float | None = None

    def step(self, closure: Callable[[], Any] | None = None) -> Any:  # type: ignore[override]
        if closure is not None:
            raise ValueError("closure is not supported (compute the loss, backward, then step)")

        def compute(_: Any) -> Any:
            t = self.grad_threshold
            if t is not None:
                with torch.no_grad():
                    for group in self.param_groups:
                        for p in group["params"]:
                            if p.grad is not None:
                                p.grad = p.grad * (p.grad * p.grad < t * t)
            return super(Optimizer, self).step()

        return _world.collective(f"{type(self).__name__}.step", compute)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _world.collective(
            f"{type(self).__name__}.zero_grad",
            lambda _: super(Optimizer, self).zero_grad(set_to_none),
        )


class SGD(Optimizer, torch.optim.SGD):
    """torch's SGD; ``grad_threshold`` (CrypTen's): gradient elements of magnitude at least
    this are zeroed before the step (one comparison per parameter; None: off)."""

    def __init__(
        self,
        params: Any,
        lr: float,
        momentum: float = 0,
        dampening: float = 0,
        weight_decay: float = 0,
        nesterov: bool = False,
        grad_threshold: float | None = None,
    ) -> None:
        torch.optim.SGD.__init__(
            self,
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )
        self.grad_threshold = grad_threshold


__all__ = ["Optimizer", "SGD"]
