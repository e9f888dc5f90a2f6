"""Federated data: a dataset split across workers, and a loader of pointer batches.

>>> import torch, pointers as pt
>>> from torch.utils.data import TensorDataset
>>> bob, alice = pt.VirtualWorker("bob"), pt.VirtualWorker("alice")
>>> ds = TensorDataset(torch.arange(10.0).reshape(5, 2), torch.arange(5))
>>> fed = pt.FederatedDataset.federate(ds, (bob, alice))
>>> fed.workers, len(fed), len(fed["bob"]), len(fed["alice"])
(['bob', 'alice'], 5, 3, 2)
>>> loader = pt.FederatedDataLoader(fed, batch_size=2)
>>> [(d.location.id, tuple(d.shape)) for d, t in loader]
[('bob', (2, 2)), ('alice', (2, 2)), ('bob', (1, 2))]

The client splits the data once and sends each worker its part (:func:`pointers.send`);
after that, every batch is cut *at the worker* by pointer ops (a slice, or an index with
a permutation the loader draws locally), so no example travels again.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from pointers.pointer_tensor import PointerTensor, send_tensor

__all__ = ["FederatedDataLoader", "FederatedDataset", "WorkerDataset", "split_sizes"]

Batch = tuple[torch.Tensor, torch.Tensor]  # (data, target) PointerTensors at one worker


class WorkerDataset:
    """One worker's part of a federated dataset: pointers to its examples and targets.

    ``data`` and ``targets`` live at the same worker and have the same first dimension
    (the number of examples).
    """

    def __init__(self, data: PointerTensor, targets: PointerTensor) -> None:
        for name, t in (("data", data), ("targets", targets)):
            if not isinstance(t, PointerTensor):
                raise TypeError(
                    f"WorkerDataset {name} must be a PointerTensor (send it to the worker "
                    f"first with pointers.send), got {type(t).__name__}"
                )
            if t.dim() == 0:
                raise ValueError(f"WorkerDataset {name} must have a first (example) dimension")
        if data.location is not targets.location:
            raise ValueError(
                f"data and targets live on different workers, {data.location.id!r} and "
                f"{targets.location.id!r}; one worker must hold both"
            )
        if data.shape[0] != targets.shape[0]:
            raise ValueError(
                f"data holds {data.shape[0]} examples but targets hold {targets.shape[0]} "
                f"at worker {data.location.id!r}; they must have the same length"
            )
        self.data = data
        self.targets = targets

    @property
    def location(self) -> Any:
        """The worker that holds this part."""
        return self.data.location

    def __len__(self) -> int:
        return int(self.data.shape[0])

    def __repr__(self) -> str:
        return (
            f"WorkerDataset(location={self.location.id!r}, examples={len(self)}, "
            f"data_shape={tuple(self.data.shape)}, targets_shape={tuple(self.targets.shape)})"
        )


def split_sizes(n: int, parts: int, fractions: Sequence[float] | None = None) -> list[int]:
    """How many of ``n`` examples each of ``parts`` workers receives.

    Without ``fractions`` the split is even (the first ``n % parts`` workers get one more).
    With ``fractions`` (non-negative, summing to 1) each worker gets ``floor(f * n)`` and the
    remainder goes to the largest fractional parts (ties: the earlier worker). Every worker
    must receive at least one example.
    """
    if parts <= 0:
        raise ValueError("cannot federate a dataset onto zero workers: pass at least one worker")
    if n <= 0:
        raise ValueError("cannot federate an empty dataset")
    if fractions is None:
        base, extra = divmod(n, parts)
        sizes = [base + (1 if i < extra else 0) for i in range(parts)]
    else:
        fr = [float(f) for f in fractions]
        if len(fr) != parts:
            raise ValueError(f"got {len(fr)} fractions for {parts} workers; give one per worker")
        if any(not f >= 0.0 for f in fr):  # also catches NaN
            raise ValueError(f"fractions must be non-negative numbers, got {list(fractions)}")
        if abs(sum(fr) - 1.0) > 1e-6:
            raise ValueError(f"fractions must sum to 1, got {list(fractions)} (sum {sum(fr)})")
        raw = [f * n for f in fr]
        sizes = [int(r) for r in raw]
        order = sorted(range(parts), key=lambda i: (-(raw[i] - sizes[i]), i))
        for i in order[: n - sum(sizes)]:
            sizes[i] += 1
    if min(sizes) < 1:
        raise ValueError(
            f"splitting {n} examples as {sizes} leaves a worker with no example; "
            "use fewer workers or larger fractions"
        )
    return sizes


def _as_tensors(dataset: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The (data, targets) tensors of a dataset (TensorDataset, map-style, or a pair)."""
    if isinstance(dataset, tuple | list) and len(dataset) == 2:
        data, targets = dataset
        if not isinstance(data, torch.Tensor) or not isinstance(targets, torch.Tensor):
            raise TypeError("a (data, targets) pair must hold two tensors")
    elif isinstance(dataset, TensorDataset):
        if len(dataset.tensors) != 2:
            raise ValueError(
                f"a TensorDataset to federate must hold (data, targets), got "
                f"{len(dataset.tensors)} tensors"
            )
        data, targets = dataset.tensors
    elif isinstance(dataset, Dataset) and hasattr(dataset, "__len__"):
        n = len(dataset)  # type: ignore[arg-type]
        if n == 0:
            raise ValueError("cannot federate an empty dataset")
        items = [dataset[i] for i in range(n)]
        if not all(isinstance(it, tuple | list) and len(it) == 2 for it in items):
            raise TypeError("each item of the dataset must be an (example, target) pair")
        data = torch.stack([torch.as_tensor(x) for x, _ in items])
        targets = torch.stack([torch.as_tensor(y) for _, y in items])
    else:
        raise TypeError(
            "federate() expects a torch Dataset of (example, target) pairs (e.g. a "
            f"TensorDataset) or a (data, targets) pair of tensors, got {type(dataset).__name__}"
        )
    if isinstance(data, PointerTensor) or isinstance(targets, PointerTensor):
        raise TypeError("federate() splits local data; these tensors are already remote")
    if data.dim() == 0 or targets.dim() == 0:
        raise ValueError("data and targets need a first (example) dimension")
    if data.shape[0] != targets.shape[0]:
        raise ValueError(
            f"data holds {data.shape[0]} examples but targets hold {targets.shape[0]}; "
            "they must have the same length"
        )
    return data, targets


def _check_workers(workers: Iterable[Any]) -> list[Any]:
    if isinstance(workers, str) or not isinstance(workers, Iterable):
        raise TypeError("workers must be a sequence of workers, e.g. (bob, alice)")
    out = list(workers)
    if not out:
        raise ValueError("cannot federate a dataset onto zero workers: pass at least one worker")
    ids = [getattr(w, "id", None) for w in out]
    if not all(isinstance(i, str) for i in ids):
        raise TypeError("workers must be workers (e.g. pointers.VirtualWorker)")
    if len(set(ids)) != len(ids):
        raise ValueError(f"workers must be distinct, got {ids}")
    return out


class FederatedDataset:
    """A dataset whose examples are split across workers, one :class:`WorkerDataset` each.

    ``len(fed)`` is the total number of examples; ``fed.workers`` lists the worker ids;
    ``fed["bob"]`` (or ``fed[bob]``) is bob's part; iterating yields the parts in order.
    """

    def __init__(self, datasets: Iterable[WorkerDataset]) -> None:
        parts = list(datasets)
        if not parts:
            raise ValueError("a federated dataset needs at least one worker's part")
        for p in parts:
            if not isinstance(p, WorkerDataset):
                raise TypeError(f"expected WorkerDataset parts, got {type(p).__name__}")
        ids = [p.location.id for p in parts]
        if len(set(ids)) != len(ids):
            raise ValueError(f"each worker may hold one part only, got {ids}")
        self.datasets: dict[str, WorkerDataset] = {p.location.id: p for p in parts}

    @classmethod
    def federate(
        cls,
        dataset: Any,
        workers: Iterable[Any],
        fractions: Sequence[float] | None = None,
    ) -> FederatedDataset:
        """Split ``dataset`` into contiguous parts and send part i to ``workers[i]``.

        ``dataset`` is a torch ``Dataset`` of (example, target) pairs (a ``TensorDataset``
        is used as is) or a ``(data, targets)`` pair of tensors. The split follows the
        dataset's order (shuffle it first if it is sorted); it is even unless ``fractions``
        gives each worker's share (see :func:`split_sizes`). Everything is checked before
        anything is sent.
        """
        ws = _check_workers(workers)
        data, targets = _as_tensors(dataset)
        sizes = split_sizes(int(data.shape[0]), len(ws), fractions)
        parts = []
        start = 0
        for w, k in zip(ws, sizes):
            d = send_tensor(data[start : start + k].contiguous(), w)
            t = send_tensor(targets[start : start + k].contiguous(), w)
            parts.append(WorkerDataset(d, t))
            start += k
        return cls(parts)

    @property
    def workers(self) -> list[str]:
        """The worker ids, in order."""
        return list(self.datasets)

    @property
    def locations(self) -> list[Any]:
        """The worker objects, in order."""
        return [p.location for p in self.datasets.values()]

    @property
    def num_examples(self) -> dict[str, int]:
        """Examples per worker id."""
        return {i: len(p) for i, p in self.datasets.items()}

    def __getitem__(self, worker: Any) -> WorkerDataset:
        key = worker if isinstance(worker, str) else getattr(worker, "id", None)
        try:
            return self.datasets[key]  # type: ignore[index]
        except KeyError:
            raise KeyError(
                f"no part of this federated dataset is at {key!r}; workers: {self.workers}"
            ) from None

    def __contains__(self, worker: object) -> bool:
        key = worker if isinstance(worker, str) else getattr(worker, "id", None)
        return key in self.datasets

    def __iter__(self) -> Iterator[WorkerDataset]:
        return iter(list(self.datasets.values()))

    def __len__(self) -> int:
        return sum(len(p) for p in self.datasets.values())

    def __repr__(self) -> str:
        return f"FederatedDataset({self.num_examples})"


class FederatedDataLoader:
    """Pointer batches ``(data, target)`` from a :class:`FederatedDataset`.

    Each batch lives at one worker (``data.location``) and is cut there: a slice, or with
    ``shuffle`` an index by a permutation drawn here from a ``torch.Generator`` (the
    permutation travels with the command; the data never moves).

    Order: by default the workers take turns, one batch each (round robin: bob's first
    batch, alice's first, bob's second, ...; a worker with fewer batches drops out when it
    runs out). With ``iter_per_worker=True`` all of the first worker's batches come before
    any of the second's. (PySyft 0.2's flag of that name yielded a dict of one batch per
    worker instead; :meth:`worker_batches` gives one worker's batches on their own.)

    ``seed`` makes shuffling reproducible: each worker gets its own generator, seeded from
    ``seed`` and the worker's position, so its permutations do not depend on the iteration
    order or on the other workers. Every iteration (epoch) draws a fresh permutation.
    ``len(loader)`` is the number of batches per epoch over all workers.
    """

    def __init__(
        self,
        federated_dataset: FederatedDataset,
        batch_size: int = 8,
        shuffle: bool = False,
        drop_last: bool = False,
        iter_per_worker: bool = False,
        seed: int | None = None,
    ) -> None:
        if not isinstance(federated_dataset, FederatedDataset):
            raise TypeError(
                f"expected a FederatedDataset, got {type(federated_dataset).__name__}; "
                "build one with FederatedDataset.federate(dataset, workers)"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise TypeError(f"seed must be an int or None, got {type(seed).__name__}")
        self.federated_dataset = federated_dataset
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.iter_per_worker = bool(iter_per_worker)
        self.seed = int.from_bytes(os.urandom(7), "little") if seed is None else seed
        master = torch.Generator().manual_seed(self.seed)
        self._generators: dict[str, torch.Generator] = {}
        for wid in federated_dataset.workers:
            sub = int(torch.randint(0, 2**62, (1,), generator=master))
            self._generators[wid] = torch.Generator().manual_seed(sub)

    def num_batches(self, worker: Any) -> int:
        """Batches per epoch at one worker (an id or a worker)."""
        n = len(self.federated_dataset[worker])
        if self.drop_last:
            return n // self.batch_size
        return -(-n // self.batch_size)

    def __len__(self) -> int:
        return sum(self.num_batches(w) for w in self.federated_dataset.workers)

    def _order(self, worker_id: str) -> torch.Tensor | None:
        if not self.shuffle:
            return None
        n = len(self.federated_dataset[worker_id])
        return torch.randperm(n, generator=self._generators[worker_id])

    def _batches(self, part: WorkerDataset, order: torch.Tensor | None) -> Iterator[Batch]:
        bs, n = self.batch_size, len(part)
        stop = n - n % bs if self.drop_last else n
        for start in range(0, stop, bs):
            end = min(start + bs, n)
            if order is None:
                yield part.data[start:end], part.targets[start:end]
            else:
                idx = order[start:end]
                yield part.data[idx], part.targets[idx]

    def worker_batches(self, worker: Any) -> Iterator[Batch]:
        """One epoch of one worker's batches (draws that worker's next permutation)."""
        part = self.federated_dataset[worker]
        return self._batches(part, self._order(part.location.id))

    def __iter__(self) -> Iterator[Batch]:
        parts = list(self.federated_dataset)
        # draw every permutation now, so the epoch is fixed whatever the consumer does
        iters = [self._batches(p, self._order(p.location.id)) for p in parts]
        if self.iter_per_worker:
            for it in iters:
                yield from it
            return
        active = list(iters)
        while active:
            still = []
            for it in active:
                batch = next(it, None)
                if batch is not None:
                    yield batch
                    still.append(it)
            active = still

    def __repr__(self) -> str:
        return (
            f"FederatedDataLoader(workers={self.federated_dataset.workers}, "
            f"batch_size={self.batch_size}, shuffle={self.shuffle}, "
            f"drop_last={self.drop_last}, iter_per_worker={self.iter_per_worker}, "
            f"batches={len(self)})"
        )
