"""The :class:`Workload` type and what every workload builder uses: the fixed-point
precision and seed, printable sizes, a seeded generator, revealing and comparing results,
and the shared model-and-input inference of W5 and W13."""

from __future__ import annotations

import copy
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

import mpc
import pointers as pt
from benchmarks.workloads import workers
from benchmarks.workloads.workers import WorkerFactory, _parties

FRAC_BITS = 16
SEED = 0


@dataclass
class Workload:
    """A prepared workload: inputs are built and shared, ``run`` is ready to time."""

    id: str  # "W1", ..., "P1"
    op: str  # short name of the op
    size: str  # printable size ("1e5", "256x256", "b64")
    run: Callable[[], Any]
    plain: Callable[[], Any]
    check: Callable[[], dict[str, Any]]
    workers: list[Any] = field(default_factory=list)  # VirtualWorkers or NetworkWorkers
    dealer: Any | None = None
    kind: str = "mpc"  # "mpc" or "pointer"
    notes: str = ""
    # what the throughput counts: elements of the input (W1, W3, W4, W6, W7), entries of
    # the product (W2), images (W5)
    elements: int = 0
    shape: tuple[int, ...] = ()
    # data workers that send to the parties (W8): their upload is recorded per run
    clients: list[Any] = field(default_factory=list)
    # the function of the shared inputs that ``run`` computes, for ``--plan`` (W5, W13):
    # ``mpc.plan(fn, *inputs)`` records it once, then each run is one plan call
    fn: Callable[..., Any] | None = None
    inputs: tuple[Any, ...] = ()
    programs: bool = False  # runs start programs at the workers (mpc.plan): sync waits
    # deal the crypto provider's material of the next n runs ahead (--preprocess: W16, W17
    # deal their next decoding steps; W5, W13 go through --plan's mpc.preprocess)
    preprocess: Callable[[int], None] | None = None
    # ``run`` ends by revealing its result to the client (``get()``: W3, W6, W8): the value
    # in hand means every step it depends on ran, so on network workers the timer stops
    # there and the sync (deletes of dropped pointers, deliveries acknowledged) follows
    # outside it, as a reveal ends CrypTen's timing; its CPU still counts
    revealed: bool = False
    # record the process's peak resident memory since the workload was built (W14-W16:
    # every party, the dealer and the plaintext model live in this one process)
    track_rss: bool = False

    @property
    def name(self) -> str:
        return f"{self.id}-{self.op}-{self.size}"

    @property
    def everyone(self) -> list[Any]:
        """Every worker of the workload: parties, crypto provider, data workers."""
        return self.workers + ([self.dealer] if self.dealer is not None else []) + self.clients

    @property
    def in_process(self) -> bool:
        """Whether every worker is a ``VirtualWorker`` (runs in this process)."""
        return all(isinstance(w, pt.VirtualWorker) for w in self.everyone)

    def sync(self) -> None:
        """Wait until every worker ran what it was sent (network workers pipeline their
        commands, so an op returns before the workers did it), and for the programs an
        ``mpc.plan`` call started there; nothing in process. The workers are waited for
        side by side (one client -> worker round trip, not one per worker)."""
        remote = [w for w in self.everyone if not isinstance(w, pt.VirtualWorker)]
        errors: list[BaseException] = []

        def one(w: Any) -> None:
            try:
                if self.programs:  # an mpc.plan call runs as programs at the workers:
                    w.sync(wait_programs=3600.0)  # waits for them too, in the same call
                else:
                    w.sync()
            except BaseException as e:  # raised below, in this thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(w,)) for w in remote[1:]]
        for t in threads:
            t.start()
        if remote:
            one(remote[0])
        for t in threads:
            t.join()
        if errors:
            raise errors[0]


def size_label(n: int) -> str:
    """1e5 for 100000, 256 for 256: powers of ten are written as 1eK."""
    if n >= 1000:
        k = round(math.log10(n))
        if 10**k == n:
            return f"1e{k}"
    return str(n)


def _gen(seed: int = SEED) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reveal(shared: Any) -> torch.Tensor:
    """The plaintext of a shared result (``get()``; torch's stubs type ops on shared
    tensors as plain Tensors)."""
    return shared.get()


def _session_of(model: nn.Module) -> Any:
    """The session of a shared model (its parameters are SharedTensors)."""
    return next(model.parameters()).session  # type: ignore[attr-defined]


def _max_abs_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    if out.numel() == 0:
        return 0.0
    return float((out.double() - ref.double()).abs().max())


def _shared_inference(
    model: nn.Module, inp: torch.Tensor, parties: int, factory: WorkerFactory | None
) -> tuple[list[Any], Any, nn.Module, Any, Callable[[], Any], Callable[[], torch.Tensor]]:
    """Model and input both shared in one session (W5, W13): the workers, the dealer, the
    shared model and input, and the encrypted and plaintext forward passes (no autograd)."""
    ws, carol = _parties(parties, factory)
    shared_model = mpc.share(
        copy.deepcopy(model), *ws, crypto_provider=carol, config=workers.CONFIG
    )
    x = mpc.share(inp, session=_session_of(shared_model))

    def run() -> Any:
        with torch.no_grad():
            return shared_model(x)

    def plain() -> torch.Tensor:
        with torch.no_grad():
            return model(inp)

    return ws, carol, shared_model, x, run, plain
