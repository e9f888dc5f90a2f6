"""PySyft 0.2's sandbox: ``pt.create_sandbox(globals())`` and ``pt.sandbox()``.

Six in-process workers with PySyft's usual names (bob, theo, jason, alice, andy, jon), each
holding a slice of two small datasets bundled with scikit-learn (nothing is downloaded):

* ``#digits``: the 8x8 handwritten digits (1797 images, float pixels 0..16, ``#data``,
  targets 0..9 as int64 ``#target``), standing in for MNIST, also tagged ``#mnist``;
* ``#diabetes``: a regression set (442 rows, 10 features, ``#data``; float ``#target``),
  standing in for PySyft's Boston housing, also tagged as PySyft tagged Boston
  (``#boston``, ``#housing``, ``#boston_housing``).

Every tensor is tagged (``#digits #data``, ``#digits #target``, ...), so
``worker.search("#digits", "#data")`` and PySyft's ``grid.search("#boston", "#data")``
find it. The first search through the grid by PySyft's tag for a stand-in (``#boston``)
that finds it says which bundled data stands in (a :class:`StandInDataWarning`, once per
process and dataset). scikit-learn is
an optional dependency (``pip install tessera-mpc[demo]``).
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace
from typing import Any

import torch

from pointers.module import tag
from pointers.worker.base import VirtualWorker

WORKER_NAMES = ("bob", "theo", "jason", "alice", "andy", "jon")

#: a dataset's own tag -> the tags PySyft's sandbox gave what it stands in for
PYSYFT_TAGS = {
    "#digits": ("#mnist",),
    "#diabetes": ("#boston", "#housing", "#boston_housing"),
}
#: a dataset's own tag -> what it stands in for, and why (said on its first use)
STAND_INS = {
    "#digits": "scikit-learn's 8x8 digits (1797 images) stand in for MNIST (28x28, 70000 "
    "images), which cannot be downloaded here",
    "#diabetes": "scikit-learn's diabetes set (442 rows, 10 features, targets 25..346) "
    "stands in for Boston housing (506 rows, 13 features, targets 5..50), which is no longer "
    "in scikit-learn and cannot be downloaded here",
}
_said: set[str] = set()


class StandInDataWarning(UserWarning):
    """The sandbox's bundled data stand in for a dataset PySyft's sandbox downloaded."""


def _say_stand_in(query: tuple[Any, ...], found: dict[str, list[Any]]) -> None:
    """Say what stands in, the first time a search by PySyft's tag for it finds it."""
    asked = set(query[0]) if len(query) == 1 and isinstance(query[0], list | tuple) else set(query)
    for own, note in STAND_INS.items():
        if own in _said or not asked & set(PYSYFT_TAGS[own]):
            continue
        if any(own in getattr(p, "tags", ()) for ptrs in found.values() for p in ptrs):
            _said.add(own)
            warnings.warn(f"sandbox: {note} ({own})", StandInDataWarning, stacklevel=3)


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
    """PySyft's ``grid`` of the sandbox, and ``sy.PrivateGridNetwork(*workers)``: a search
    over several workers at once."""

    def __init__(self, *workers: Any) -> None:
        self.workers = list(workers)

    def search(self, *query: Any) -> dict[str, list[Any]]:
        """Worker id -> pointers to its tensors carrying every tag in ``query`` (workers
        without a match are left out), as PySyft's ``grid.search("#boston", "#data")``.
        The first search that finds a stand-in dataset says which (:data:`STAND_INS`)."""
        found = {w.id: w.search(*query) for w in self.workers}
        found = {k: v for k, v in found.items() if v}
        _say_stand_in(query, found)
        return found

    def __repr__(self) -> str:
        return f"Grid({', '.join(w.id for w in self.workers)})"


class Sandbox(SimpleNamespace):
    """What :func:`sandbox` returns (a namespace), shown briefly (a notebook displays it)."""

    def __repr__(self) -> str:
        workers = ", ".join(w.id for w in self.workers)
        return f"Sandbox(workers: {workers}; datasets: {', '.join(self.datasets) or 'none'})"


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
            tags = (name, *PYSYFT_TAGS[name])
            note = f" ({STAND_INS[name]})"
            per_worker[i].append(tag(d.clone(), *tags, "#data", description=f"{name} data{note}"))
            per_worker[i].append(
                tag(t.clone(), *tags, "#target", description=f"{name} target{note}")
            )
    workers = [VirtualWorker(n, data=per_worker[i]) for i, n in enumerate(names)]
    return Sandbox(
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
        for own, note in STAND_INS.items():
            if own in box.datasets:
                print(f"sandbox: {note} ({own} {' '.join(PYSYFT_TAGS[own])})")
    return box


def _empty() -> SimpleNamespace:
    workers = [VirtualWorker(n) for n in WORKER_NAMES]
    return Sandbox(workers=workers, datasets={}, grid=Grid(*workers), **{w.id: w for w in workers})


#: PySyft's name for a search over several workers (``sy.PrivateGridNetwork(*workers)``)
PrivateGridNetwork = Grid
