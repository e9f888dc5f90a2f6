"""Federated averaging (FedAvg, McMahan et al. 2017) over pointers.

One round, for each worker k holding n_k examples::

    w_k  <- a copy of the global model w, sent to worker k
    w_k  <- E local epochs of SGD on worker k's batches          (pointer ops at worker k)
    u_k  =  [w_k - w ; mean local loss]  as one flat tensor       (computed at worker k)

then the server applies the example-weighted mean of the updates::

    w  <- w + server_lr * sum_k n_k * (w_k - w) / sum_k n_k

The client update returns the *delta* (trained minus initial weights, as in TFF's
``client_update``), computed at the worker. How the weighted mean of the deltas is formed
is the aggregator's business: :class:`PlainAggregator` fetches each delta (the server sees
every individual update); ``mpc.SecureAggregator`` secret-shares them from the workers so
that only the weighted mean is revealed.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch
from torch import nn

from pointers.federated.datasets import FederatedDataLoader, FederatedDataset, WorkerDataset
from pointers.module import send
from pointers.pointer_tensor import PointerTensor

__all__ = ["Aggregator", "FedAvgHistory", "PlainAggregator", "check_updates", "fedavg"]

Update = tuple[PointerTensor, int]  # (flat update at a worker, its number of examples)


@runtime_checkable
class Aggregator(Protocol):
    """Forms the example-weighted mean of the workers' flat updates.

    ``aggregate([(u_1, n_1), ..., (u_K, n_K)])`` receives one flat floating
    :class:`PointerTensor` per worker (all of the same length, each at its worker) and the
    public example counts, and returns ``sum_k n_k * u_k / sum_k n_k`` as a local tensor.
    """

    def aggregate(self, updates: Sequence[Update]) -> torch.Tensor: ...


def check_updates(updates: Sequence[Update]) -> tuple[int, torch.dtype, int]:
    """Validate an aggregator's input; returns (length, dtype, total examples)."""
    if not updates:
        raise ValueError("nothing to aggregate: no worker sent an update")
    length, dtype = None, None
    total = 0
    seen: set[str] = set()
    for u, n in updates:
        if not isinstance(u, PointerTensor):
            raise TypeError(f"an update must be a PointerTensor at its worker, got {type(u)}")
        if u.dim() != 1 or not u.dtype.is_floating_point:
            raise ValueError(
                f"an update must be a flat floating tensor, got shape {tuple(u.shape)} "
                f"and dtype {u.dtype}"
            )
        if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
            raise ValueError(f"example counts must be positive ints, got {n!r}")
        if length is None:
            length, dtype = u.shape[0], u.dtype
        elif u.shape[0] != length or u.dtype != dtype:
            raise ValueError(
                f"updates differ: {length} x {dtype} and {u.shape[0]} x {u.dtype} "
                f"(from {u.location.id!r})"
            )
        if u.location.id in seen:
            raise ValueError(f"two updates come from the same worker {u.location.id!r}")
        seen.add(u.location.id)
        total += n
    assert length is not None and dtype is not None
    return int(length), dtype, total


class PlainAggregator:
    """Fetches every worker's update and averages them at the server (in float64).

    Plain FedAvg: the server sees each worker's individual delta. Use
    ``mpc.SecureAggregator`` to reveal only their weighted mean.
    """

    def aggregate(self, updates: Sequence[Update]) -> torch.Tensor:
        _, dtype, total = check_updates(updates)
        acc = None
        for u, n in updates:
            term = u.get().to(torch.float64) * n
            acc = term if acc is None else acc + term
        assert acc is not None
        return (acc / total).to(dtype)

    def __repr__(self) -> str:
        return "PlainAggregator()"


@dataclass
class FedAvgHistory:
    """What :func:`fedavg` records.

    ``loss[r]``: round r's mean local training loss, averaged over the workers with weights
    n_k (each worker's loss is the mean over every example it trained on in that round;
    it travels inside the update, so a secure aggregator hides the per-worker values too).
    ``metrics[r]``: ``eval_fn(model)`` after round r, when given.
    """

    loss: list[float] = field(default_factory=list)
    metrics: list[Any] = field(default_factory=list)
    num_examples: dict[str, int] = field(default_factory=dict)

    @property
    def rounds(self) -> int:
        return len(self.loss)


def _state(model: nn.Module) -> list[tuple[torch.Tensor, bool]]:
    """The tensors FedAvg averages: floating parameters, then floating buffers (running
    statistics); each with whether it is a parameter."""
    out: list[tuple[torch.Tensor, bool]] = []
    for p in model.parameters():
        if p.dtype.is_floating_point:
            out.append((p, True))
    for b in model.buffers():
        if b.dtype.is_floating_point:
            out.append((b, False))
    return out


def _client_update(
    model: nn.Module,
    part: WorkerDataset,
    loader: FederatedDataLoader,
    epochs: int,
    make_optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer],
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> PointerTensor:
    """Train a copy of ``model`` at ``part``'s worker; returns the flat update there:
    the concatenated deltas (trained minus initial) and the mean training loss."""
    local = send(copy.deepcopy(model), part.location)
    initial = [t.detach().clone() for t, _ in _state(local)]  # copies made at the worker
    optimizer = make_optimizer(local.parameters())
    local.train()
    loss_sum: torch.Tensor | None = None
    seen = 0
    for _ in range(epochs):
        for data, target in loader.worker_batches(part.location):
            optimizer.zero_grad()
            loss = loss_fn(local(data), target)
            loss.backward()
            optimizer.step()
            b = int(data.shape[0])
            term = loss.detach() * b
            loss_sum = term if loss_sum is None else loss_sum + term
            seen += b
    if loss_sum is None:
        raise ValueError(f"worker {part.location.id!r} has no batch to train on")
    pieces = [(t.detach() - t0).reshape(-1) for (t, _), t0 in zip(_state(local), initial)]
    pieces.append((loss_sum / seen).reshape(1).to(pieces[0].dtype))
    return torch.cat(pieces)  # type: ignore[return-value]


def _check_positive(name: str, value: Any, kind: type) -> None:
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:  # type: ignore[operator]
        raise ValueError(f"{name} must be a positive {kind.__name__}, got {value!r}")


def fedavg(
    model: nn.Module,
    federated_dataset: FederatedDataset,
    *,
    rounds: int = 1,
    epochs: int = 1,
    lr: float = 0.1,
    batch_size: int = 32,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    shuffle: bool = True,
    drop_last: bool = False,
    seed: int = 0,
    aggregator: Aggregator | None = None,
    server_lr: float = 1.0,
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
    eval_fn: Callable[[nn.Module], Any] | None = None,
) -> tuple[nn.Module, FedAvgHistory]:
    """Train ``model`` by federated averaging on ``federated_dataset``; returns it and a history.

    Each round every worker trains a copy of the model for ``epochs`` local epochs of
    mini-batches (``batch_size``, shuffled at the worker with ``seed``; ``drop_last`` skips
    each worker's last incomplete batch) with
    ``optimizer(params)`` (default: ``torch.optim.SGD(params, lr)``, fresh each round) and
    ``loss_fn(output, target)`` (a batch-mean loss; default cross entropy). Its update, the
    delta of every floating parameter and buffer plus its mean loss, is computed at the
    worker; ``aggregator`` (default :class:`PlainAggregator`) forms the example-weighted mean,
    and the server adds ``server_lr`` times the mean delta to the parameters (buffers such as
    running statistics take the mean delta as is).

    ``model`` must be local (not sent anywhere); it is updated in place and returned.
    The same model, data, seed and settings give the same result.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"fedavg() trains an nn.Module, got {type(model).__name__}")
    if not isinstance(federated_dataset, FederatedDataset):
        raise TypeError(
            f"fedavg() needs a FederatedDataset, got {type(federated_dataset).__name__}"
        )
    if any(isinstance(t, PointerTensor) for t in [*model.parameters(), *model.buffers()]):
        raise ValueError("the model is at a worker; get() it back before fedavg()")
    _check_positive("rounds", rounds, int)
    _check_positive("epochs", epochs, int)
    _check_positive("server_lr", float(server_lr), float)
    if optimizer is None:
        _check_positive("lr", float(lr), float)
        lr_value = float(lr)

        def optimizer(params: Iterable[nn.Parameter]) -> torch.optim.Optimizer:
            return torch.optim.SGD(params, lr=lr_value)

    if loss_fn is None:
        loss_fn = nn.CrossEntropyLoss()
    if aggregator is None:
        aggregator = PlainAggregator()
    elif not callable(getattr(aggregator, "aggregate", None)):
        raise TypeError(f"aggregator must have an aggregate(updates) method, got {aggregator!r}")
    loader = FederatedDataLoader(
        federated_dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed
    )
    history = FedAvgHistory(num_examples=federated_dataset.num_examples)
    state = _state(model)
    for _ in range(rounds):
        updates = [
            (_client_update(model, part, loader, epochs, optimizer, loss_fn), len(part))
            for part in federated_dataset
        ]
        mean = aggregator.aggregate(updates)
        expected = sum(t.numel() for t, _ in state) + 1
        if not isinstance(mean, torch.Tensor) or isinstance(mean, PointerTensor):
            raise TypeError("the aggregator must return a local tensor")
        if tuple(mean.shape) != (expected,):
            raise ValueError(f"the aggregator returned shape {tuple(mean.shape)}, not {expected}")
        offset = 0
        with torch.no_grad():
            for t, is_param in state:
                k = t.numel()
                delta = mean[offset : offset + k].view(t.shape).to(t.dtype)
                t.add_(delta, alpha=float(server_lr) if is_param else 1.0)
                offset += k
        history.loss.append(float(mean[offset]))
        if eval_fn is not None:
            history.metrics.append(eval_fn(model))
    return model, history
