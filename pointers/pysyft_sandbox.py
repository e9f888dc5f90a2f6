"""PySyft 0.2's sandbox: ``pt.create_sandbox(globals())`` and ``pt.sandbox()``.

Six in-process workers with PySyft's usual names (bob, theo, jason, alice, andy, jon), each
holding a slice of two small datasets bundled with scikit-learn (nothing is downloaded):

* ``#digits``: the 8x8 handwritten digits (1797 images, float pixels 0..16, ``#data``,
  targets 0..9 as int64 ``#target``), standing in for PySyft's MNIST;
* ``#diabetes``: a regression set (442 rows, 10 features, ``#data``; float ``#target``),
  standing in for PySyft's Boston housing.

Every tensor is tagged (``#digits #data``, ``#digits #target``, ...), so
``worker.search("#digits", "#data")`` finds it. scikit-learn is an optional dependency
(``pip install tessera-mpc[demo]``).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch

from pointers.module import tag
from pointers.worker.base import VirtualWorker

WORKER_NAMES = ("bob", "theo", "jason", "alice", "andy", "jon")


def _datasets() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    try:
        from sklearn.datasets import load_diabetes, load_digits
    except ImportError as e:  # pragma: no cover - the dev and demo extras install it
        raise ImportError(
            "the sandbox's datasets come from scikit-learn: pip install scikit-learn"
        ) from e
    digits = load_digits()
    diabetes = load_diabetes()
    return {
        "#digits": (
            torch.tensor(digits.data, dtype=torch.float32),
            torch.tensor(digits.target, dtype=torch.int64),
        ),
        "#diabetes": (
            torch.tensor(diabetes.data, dtype=torch.float32),
            torch.tensor(diabetes.target, dtype=torch.float32),
        ),
    }


class Grid:
    """PySyft's ``grid`` of the sandbox (``sy.PrivateGridNetwork(*workers)``): a search
    over several workers at once."""

    def __init__(self, *workers: Any) -> None:
        self.workers = list(workers)

    def search(self, *query: str) -> dict[str, list[Any]]:
        """Worker id -> pointers to its tensors carrying every tag in ``query`` (workers
        without a match are left out), as PySyft's ``grid.search("#boston", "#data")``."""
        found = {w.id: w.search(*query) for w in self.workers}
        return {k: v for k, v in found.items() if v}

    def __repr__(self) -> str:
        return f"Grid({', '.join(w.id for w in self.workers)})"


def sandbox(names: tuple[str, ...] = WORKER_NAMES) -> SimpleNamespace:
    """The sandbox's workers (``.bob``, ``.alice``, ...; ``.workers`` in order), each
    holding its slice of every dataset, tagged; ``.datasets`` maps a tag to the full local
    (data, target) pair, for comparing with a plaintext run."""
    datasets = _datasets()
    per_worker: list[list[torch.Tensor]] = [[] for _ in names]
    for name, (data, target) in datasets.items():
        for i, (d, t) in enumerate(
            zip(data.chunk(len(names)), target.chunk(len(names)), strict=True)
        ):
            per_worker[i].append(tag(d.clone(), name, "#data", description=f"{name} data"))
            per_worker[i].append(tag(t.clone(), name, "#target", description=f"{name} target"))
    workers = [VirtualWorker(n, data=per_worker[i]) for i, n in enumerate(names)]
    return SimpleNamespace(
        workers=workers, datasets=datasets, grid=Grid(*workers), **dict(zip(names, workers))
    )


def create_sandbox(
    gbs: dict[str, Any], verbose: bool = True, download_data: bool = True
) -> SimpleNamespace:
    """PySyft's ``sy.create_sandbox(globals())``: puts ``torch``, ``nn``, ``F``, ``optim``,
    ``hook``, the six workers, ``workers`` and ``grid`` (:class:`Grid`) into ``gbs``;
    returns the :func:`sandbox`.
    ``download_data=False`` gives the workers without data (nothing is ever downloaded)."""
    import torch.nn.functional as F
    from torch import nn, optim

    from pointers.hook import hook

    box = sandbox() if download_data else _empty()
    gbs.update(torch=torch, nn=nn, F=F, optim=optim, hook=hook(torch), workers=box.workers)
    gbs.update(grid=box.grid)
    gbs.update({w.id: w for w in box.workers})
    if verbose:
        print(f"sandbox: workers {', '.join(w.id for w in box.workers)}")
    return box


def _empty() -> SimpleNamespace:
    workers = [VirtualWorker(n) for n in WORKER_NAMES]
    return SimpleNamespace(
        workers=workers, datasets={}, grid=Grid(*workers), **{w.id: w for w in workers}
    )
