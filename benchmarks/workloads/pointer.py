"""The pointer per-op overhead (P1, P2): one op on a pointer at one worker, without and
with fetching the result."""

from __future__ import annotations

import torch

import pointers as pt
from benchmarks.workloads.workers import WorkerFactory
from benchmarks.workloads.workload import Workload, _gen, _max_abs_err


def pointer_add(n: int = 10, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """P1: ``p + p`` on a pointer to an n-element tensor at a VirtualWorker vs ``t + t``.

    The op is sent without waiting for a value (the result stays at the worker), so this is
    the per-op cost of the pointer layer: dispatch, shape inference, encoding, decoding and
    running the op at the worker.
    """
    t = torch.randn(n, generator=_gen())
    alice = (factory or pt.VirtualWorker)("alice")
    p = pt.send(t, alice)
    del parties  # one worker: the pointer layer alone
    return Workload(
        "P1",
        "ptr-add",
        str(n),
        run=lambda: p + p,
        plain=lambda: t + t,
        check=lambda: {"max_abs_err": _max_abs_err((p + p).get(), t + t)},
        workers=[alice],
        kind="pointer",
        elements=n,
        shape=(n,),
    )


def pointer_add_get(
    n: int = 10, parties: int = 2, factory: WorkerFactory | None = None
) -> Workload:
    """P2: ``(p + p).get()``: one op plus the request/reply round trip that fetches it."""
    t = torch.randn(n, generator=_gen())
    alice = (factory or pt.VirtualWorker)("alice")
    p = pt.send(t, alice)

    def run() -> torch.Tensor:
        return (p + p).get()

    del parties
    return Workload(
        "P2",
        "ptr-add-get",
        str(n),
        run=run,
        plain=lambda: t + t,
        check=lambda: {"max_abs_err": _max_abs_err(run(), t + t)},
        workers=[alice],
        kind="pointer",
        elements=n,
        shape=(n,),
    )
