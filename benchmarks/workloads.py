"""The benchmark workloads of ``WORKLOADS.md`` (W1-W6), max-pooling (W7) and secure
aggregation (W8), both from issue 6, and the pointer per-op overhead (P1, P2).

Each builder (``w1_mul(n)``, ..., ``w7_maxpool(n, parties=3)``) makes fresh workers (2 to 5
computing parties plus a crypto provider) with its ``factory`` (a name -> worker callable:
``pt.VirtualWorker`` by default; ``python -m benchmarks --network`` passes one that connects
to served worker processes), builds and shares its inputs (before any timer, unless the
workload says otherwise) and returns a :class:`Workload`:

* ``run()``: the secure op, what the timer measures. Only W3 (the comparison result is
  revealed as 0/1) and W6 (share + reconstruct) reconstruct anything inside it.
* ``plain()``: the same op in plaintext torch, for the ratio.
* ``check()``: one more secure run, reconstructed and compared with plaintext: max abs error,
  or the number of mismatches for comparisons (exact agreement is expected).

:func:`measure` times a workload (one warm-up, then ``repeat`` runs) and :func:`profile`
records the rest: plaintext time, rounds and bytes of one run under ``mpc.stats()``, the
time spent inside the crypto provider and the correctness check.
"""

from __future__ import annotations

import copy
import math
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import mpc
import mpc.registry
import pointers as pt
from mpc.config import MPCConfig
from mpc.math.encoding import encode

FRAC_BITS = 16
SEED = 0

# Rows measured in this process (the benchmark tests append here; conftest prints them).
RESULTS: list[dict[str, Any]] = []


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


# --------------------------------------------------------------------------- helpers


def size_label(n: int) -> str:
    """1e5 for 100000, 256 for 256: powers of ten are written as 1eK."""
    if n >= 1000:
        k = round(math.log10(n))
        if 10**k == n:
            return f"1e{k}"
    return str(n)


def size_of(workload: str, n: int) -> str:
    """The printable size of a workload: "256x256" for W2, "b64" for W5, else "1e5"."""
    if workload == "W2":
        return f"{n}x{n}"
    if workload in ("W5", "W12"):
        return f"b{n}"
    if workload in FUNCTION_SIZES:
        return FUNCTION_SIZES[workload](n)
    return size_label(n)


# Computing parties, in order (2 to 5 of them), and the crypto provider.
PARTY_NAMES = ("alice", "bob", "dan", "erin", "frank")
DEALER_NAME = "carol"
# The sessions' config (``python -m benchmarks --comparison fss`` sets the FSS comparison;
# None: the default config)
CONFIG: MPCConfig | None = None


# Makes the worker of a name: ``pt.VirtualWorker`` (the default, in process), or a fresh
# connection to a served worker (``python -m benchmarks --network``).
WorkerFactory = Callable[[str], Any]


def _parties(
    n: int = 2, factory: WorkerFactory | None = None, dealer: bool = True
) -> tuple[list[Any], Any]:
    """``n`` fresh computing parties (alice, bob, dan, erin, frank) and a crypto provider
    (None with ``dealer=False``), made by ``factory`` (default ``pt.VirtualWorker``)."""
    if not 2 <= n <= len(PARTY_NAMES):
        raise ValueError(f"parties must be 2..{len(PARTY_NAMES)}, got {n}")
    make = factory or pt.VirtualWorker
    return [make(name) for name in PARTY_NAMES[:n]], make(DEALER_NAME) if dealer else None


def worker_names(workload: str, parties: int = 2) -> list[str]:
    """The workers a workload uses (what ``--network`` must serve)."""
    if workload.startswith("P"):
        return [PARTY_NAMES[0]]
    names = list(PARTY_NAMES[:parties])
    if workload == "W8":
        return names + [f"client{k}" for k in range(SECAGG_CLIENTS)]
    return names + [DEALER_NAME]


def pool_shape(n: int) -> tuple[int, int, int, int]:
    """An (N, C, H, W) shape with about ``n`` elements for the max-pool workload.

    H = W is the largest even side whose square divides ``n`` (C = n / H^2, N = 1), so a
    power of ten gives exactly n elements: 1e4 -> (1, 1, 100, 100), 1e5 -> (1, 10, 100, 100),
    1e6 -> (1, 1, 1000, 1000). Without such a side: (1, 1, 2, n // 2).
    """
    if n < 4:
        raise ValueError(f"max-pool needs at least 4 elements, got {n}")
    side = math.isqrt(n) // 2 * 2
    while side >= 2:
        if n % (side * side) == 0:
            return (1, n // (side * side), side, side)
        side -= 2
    return (1, 1, 2, n // 2)


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


def lenet() -> nn.Module:
    """The LeNet-like model of WORKLOADS.md (W5), initialised from a fixed seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Sequential(
            nn.Conv2d(1, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(256, 100),
            nn.ReLU(),
            nn.Linear(100, 10),
        ).eval()


# --------------------------------------------------------------------------- workloads


def _binary(
    wid: str,
    op: str,
    size: str,
    a: torch.Tensor,
    b: torch.Tensor,
    secure: Callable,
    plain: Callable,
    parties: int,
    elements: int,
    factory: WorkerFactory | None = None,
) -> Workload:
    ws, carol = _parties(parties, factory)
    x = mpc.share(a, *ws, crypto_provider=carol, config=CONFIG)
    y = mpc.share(b, *ws, crypto_provider=carol, config=CONFIG)

    def check() -> dict[str, Any]:
        return {"max_abs_err": _max_abs_err(secure(x, y).get(), plain(a, b))}

    return Workload(
        wid,
        op,
        size,
        run=lambda: secure(x, y),
        plain=lambda: plain(a, b),
        check=check,
        workers=ws,
        dealer=carol,
        elements=elements,
        shape=tuple(a.shape),
    )


def w1_mul(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W1: private x private elementwise multiply (with truncation), n elements."""
    g = _gen()
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    # materialize(): apply the truncation now (it is otherwise deferred to the next op)
    return _binary(
        "W1",
        "mul",
        size_label(n),
        a,
        b,
        lambda x, y: (x * y).materialize(),
        lambda x, y: x * y,
        parties,
        n,
        factory,
    )


def w2_matmul(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W2: private x private matmul, (n x n) @ (n x n); throughput counts the n^2 entries."""
    g = _gen()
    a, b = torch.randn(n, n, generator=g), torch.randn(n, n, generator=g)
    return _binary(
        "W2",
        "matmul",
        f"{n}x{n}",
        a,
        b,
        lambda x, y: (x @ y).materialize(),
        lambda x, y: x @ y,
        parties,
        n * n,
        factory,
    )


def w3_lt(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W3: private < private comparison, the result revealed as 0/1 (inside the timer).

    Correctness is exact agreement with the comparison of the fixed-point encodings (values
    closer than 2^-16 may compare differently from the floats; that is the encoding, not
    the protocol).
    """
    g = _gen()
    a, b = torch.randn(n, generator=g), torch.randn(n, generator=g)
    ws, carol = _parties(parties, factory)
    x = mpc.share(a, *ws, crypto_provider=carol, config=CONFIG)
    y = mpc.share(b, *ws, crypto_provider=carol, config=CONFIG)
    ref = encode(a, FRAC_BITS) < encode(b, FRAC_BITS)

    def run() -> torch.Tensor:
        return _reveal(x < y)

    def check() -> dict[str, Any]:
        out = run()
        return {
            "mismatches": int((out.to(torch.bool) != ref).sum()),
            "float_mismatches": int((out.to(torch.bool) != (a < b)).sum()),
        }

    return Workload(
        "W3",
        "lt",
        size_label(n),
        run=run,
        plain=lambda: a < b,
        check=check,
        workers=ws,
        dealer=carol,
        elements=n,
        shape=(n,),
        revealed=True,
    )


def w4_relu(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W4: ReLU of a private tensor of n elements."""
    g = _gen()
    a = torch.randn(n, generator=g)
    ws, carol = _parties(parties, factory)
    x = mpc.share(a, *ws, crypto_provider=carol, config=CONFIG)
    positive = encode(a, FRAC_BITS) > 0

    def check() -> dict[str, Any]:
        out = _reveal(torch.relu(x))
        return {
            "max_abs_err": _max_abs_err(out, torch.relu(a)),
            "sign_mismatches": int(((out > 0) != positive).sum()),
        }

    return Workload(
        "W4",
        "relu",
        size_label(n),
        run=lambda: torch.relu(x),
        plain=lambda: torch.relu(a),
        check=check,
        workers=ws,
        dealer=carol,
        elements=n,
        shape=(n,),
    )


def _shared_inference(
    model: nn.Module, inp: torch.Tensor, parties: int, factory: WorkerFactory | None
) -> tuple[list[Any], Any, nn.Module, Any, Callable[[], Any], Callable[[], torch.Tensor]]:
    """Model and input both shared in one session (W5, W13): the workers, the dealer, the
    shared model and input, and the encrypted and plaintext forward passes (no autograd)."""
    ws, carol = _parties(parties, factory)
    shared_model = mpc.share(copy.deepcopy(model), *ws, crypto_provider=carol, config=CONFIG)
    x = mpc.share(inp, session=_session_of(shared_model))

    def run() -> Any:
        with torch.no_grad():
            return shared_model(x)

    def plain() -> torch.Tensor:
        with torch.no_grad():
            return model(inp)

    return ws, carol, shared_model, x, run, plain


def w5_lenet(batch: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W5: encrypted inference, model and input both private (LeNet-like, 28x28 input);
    throughput counts images."""
    inp = torch.rand(batch, 1, 28, 28, generator=_gen())
    ws, carol, shared_model, x, run, plain = _shared_inference(lenet(), inp, parties, factory)

    def check() -> dict[str, Any]:
        out, ref = run().get(), plain()
        return {
            "max_abs_err": _max_abs_err(out, ref),
            "argmax_mismatches": int((out.argmax(1) != ref.argmax(1)).sum()),
        }

    return Workload(
        "W5",
        "lenet",
        f"b{batch}",
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        elements=batch,
        shape=tuple(inp.shape),
        fn=shared_model,
        inputs=(x,),
    )


def w6_roundtrip(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W6: share + reconstruct round trip of n elements (both inside the timer).

    The session (parties introduced, dealer seeds) is set up once, before the timer.
    """
    a = torch.randn(n, generator=_gen())
    ws, carol = _parties(parties, factory)
    session = mpc.Session(ws, carol)

    def run() -> torch.Tensor:
        return mpc.share(a, session=session).get()

    return Workload(
        "W6",
        "roundtrip",
        size_label(n),
        run=run,
        plain=lambda: a.clone(),
        check=lambda: {"max_abs_err": _max_abs_err(run(), a)},
        workers=ws,
        dealer=carol,
        elements=n,
        shape=(n,),
        revealed=True,
    )


def w7_maxpool(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W7: ``F.max_pool2d(x, 2)`` on a private (N, C, H, W) tensor of about n elements
    (shape from :func:`pool_shape`); the result stays shared.

    Each 2x2 window is reduced by a pairwise tree of secure max (two levels of 7 rounds).
    Correctness: max abs error vs plaintext, and exact agreement with max-pooling the
    fixed-point encodings.
    """
    shape = pool_shape(n)
    a = torch.randn(*shape, generator=_gen())
    ws, carol = _parties(parties, factory)
    x = mpc.share(a, *ws, crypto_provider=carol, config=CONFIG)
    ref = F.max_pool2d(encode(a, FRAC_BITS).double(), 2)

    def check() -> dict[str, Any]:
        out = _reveal(F.max_pool2d(x, 2))
        return {
            "max_abs_err": _max_abs_err(out, F.max_pool2d(a, 2)),
            # the max of encodings, decoded, must come back exactly
            "mismatches": int((encode(out, FRAC_BITS).double() != ref).sum()),
        }

    return Workload(
        "W7",
        "maxpool",
        size_label(math.prod(shape)),
        run=lambda: F.max_pool2d(x, 2),
        plain=lambda: F.max_pool2d(a, 2),
        check=check,
        workers=ws,
        dealer=carol,
        elements=math.prod(shape),
        shape=shape,
    )


SECAGG_CLIENTS = 5  # data workers whose updates W8 aggregates


def w8_secagg(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W8: secure aggregation (``mpc.SecureAggregator``) of 5 data workers' updates of n
    elements each, weighted by example counts 10, 20, ..., 50; only the weighted mean is
    revealed (to the client, inside the timer). Throughput counts the 5 n update elements.

    The computing parties are the aggregators; the aggregation is linear, so there is no
    crypto provider. Each data worker shares its own update and sends one share to each
    aggregator (its upload is in ``upload_bytes_per_client``; the aggregators send each
    other nothing, so ``bytes_per_party`` is 0).
    """
    g = _gen()
    updates = [torch.randn(n, generator=g) * 0.01 for _ in range(SECAGG_CLIENTS)]
    counts = [10 * (k + 1) for k in range(SECAGG_CLIENTS)]
    ws, _ = _parties(parties, factory, dealer=False)
    make = factory or pt.VirtualWorker
    clients = [make(f"client{k}") for k in range(SECAGG_CLIENTS)]
    sent = [(pt.send(u, c), k) for u, c, k in zip(updates, clients, counts)]
    aggregator = mpc.SecureAggregator(ws)

    def plain() -> torch.Tensor:
        return torch.stack([k * u for u, k in zip(updates, counts)]).sum(0) / sum(counts)

    def fresh() -> list[tuple[Any, int]]:
        # a round's updates: an owner shares each value once (its release rule), so every
        # run aggregates new tensors (copies made at the data workers: one command each)
        return [(p.clone(), k) for p, k in sent]

    return Workload(
        "W8",
        "secagg",
        size_label(n),
        run=lambda: aggregator.aggregate(fresh()),
        plain=plain,
        check=lambda: {"max_abs_err": _max_abs_err(aggregator.aggregate(fresh()), plain())},
        workers=ws,
        dealer=None,
        elements=SECAGG_CLIENTS * n,
        shape=(SECAGG_CLIENTS, n),
        clients=clients,
        revealed=True,
    )


def _w12_loss(out: Any, y: Any, batch: int) -> Any:
    """WORKLOADS.md's loss, -(log_softmax(out) * y).sum() / batch; squared error where
    log_softmax on shared values is not there yet (issue 13)."""
    if torch.ops.aten._log_softmax.default in mpc.registry.OPS:
        return -(F.log_softmax(out, dim=1) * y).sum() / batch
    d = out - y
    return (d * d).sum() / batch


def w12_train(batch: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W12: one encrypted training step (forward, loss, backward, SGD lr 0.1 update) of the
    MLP 64-128-10 on a batch of digits (scaled by 1/16, one-hot labels shared too); the
    weights and the data stay shared. Throughput counts examples."""
    from mpc.examples.digits import load_digits_split

    images = load_digits_split()[0][:batch].reshape(batch, 64)
    labels = load_digits_split()[1][:batch]
    onehot = F.one_hot(labels, 10).float()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
    ws, carol = _parties(parties, factory)

    def step(m: nn.Module, x: Any, y: Any) -> Any:
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        opt.zero_grad()
        loss = _w12_loss(m(x), y, batch)
        loss.backward()
        opt.step()
        return loss

    shared_model = mpc.share(copy.deepcopy(model), *ws, crypto_provider=carol, config=CONFIG)
    session = _session_of(shared_model)
    x, y = mpc.share(images, session=session), mpc.share(onehot, session=session)
    plain_model = copy.deepcopy(model)

    def check() -> dict[str, Any]:
        enc = mpc.share(copy.deepcopy(model), session=session)
        ref = copy.deepcopy(model)
        loss_err = abs(float(step(enc, x, y).get()) - float(step(ref, images, onehot).detach()))
        errs = [
            _max_abs_err(_reveal(p), q.detach()) for p, q in zip(enc.parameters(), ref.parameters())
        ]
        return {"max_abs_err": max(errs), "loss_abs_err": loss_err}

    lsm = torch.ops.aten._log_softmax.default in mpc.registry.OPS
    return Workload(
        "W12",
        "train",
        f"b{batch}",
        run=lambda: step(shared_model, x, y),
        plain=lambda: step(plain_model, images, onehot),
        check=check,
        workers=ws,
        dealer=carol,
        notes="" if lsm else "loss: squared error (log_softmax on shared values: issue 13)",
        elements=batch,
        shape=(batch, 64),
    )


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


OPS = {
    "W1": "mul",
    "W2": "matmul",
    "W3": "lt",
    "W4": "relu",
    "W5": "lenet",
    "W6": "roundtrip",
    "W7": "maxpool",
    "W12": "train",
    "P1": "ptr-add",
    "P2": "ptr-add-get",
}
WORKLOADS: dict[str, Callable[..., Workload]] = {
    "W1": w1_mul,
    "W2": w2_matmul,
    "W3": w3_lt,
    "W4": w4_relu,
    "W5": w5_lenet,
    "W6": w6_roundtrip,
    "W7": w7_maxpool,
    "W12": w12_train,
    "P1": pointer_add,
    "P2": pointer_add_get,
}
# W8 needs mpc.SecureAggregator (secure aggregation for federated averaging).
if hasattr(mpc, "SecureAggregator"):
    OPS["W8"] = "secagg"
    WORKLOADS["W8"] = w8_secagg
# What a workload's size counts (the unit of ``--sizes``) and what its throughput counts.
SIZE_UNIT = {
    "W1": "elements",
    "W2": "n (n x n matrices; throughput counts the n^2 output entries)",
    "W3": "elements",
    "W4": "elements",
    "W5": "batch (throughput counts images)",
    "W6": "elements",
    "W7": "input elements (N, C, H, W) as pool_shape() picks",
    "W8": f"elements per update ({SECAGG_CLIENTS} updates; throughput counts all of them)",
    "W12": "batch (throughput counts examples)",
    "P1": "elements",
    "P2": "elements",
}
# Workloads whose size is not an element count: a bare ``--sizes`` list leaves them alone.
NOT_ELEMENTS: tuple[str, ...] = ("W2", "W5", "W12")


@dataclass(frozen=True)
class Case:
    """One (workload, size) of the benchmark; ``big`` cases are skipped by ``-m 'not big'``."""

    workload: str
    size: int
    big: bool = False
    repeats: int = 5  # timed runs in the pytest-benchmark tests
    parties: int = 2  # computing parties (the crypto provider comes on top)
    # runs only when its workload is named (``--workloads W14``): minutes per case (W14-W16)
    explicit: bool = False
    tiny: bool = False  # W14-W16: the tiny model configs (``--hf-tiny``, the smoke test)

    def build(self, factory: WorkerFactory | None = None) -> Workload:
        """The workload, its workers made by ``factory`` (default ``pt.VirtualWorker``)."""
        if self.tiny:
            return WORKLOADS[self.workload](
                self.size, parties=self.parties, factory=factory, tiny=True
            )
        return WORKLOADS[self.workload](self.size, parties=self.parties, factory=factory)

    @property
    def id(self) -> str:
        """``-k`` friendly: "W1-mul-1e5", "W2-matmul-256x256", "W5-lenet-b64"."""
        size = size_of(self.workload, self.size)
        return f"{self.workload}-{OPS[self.workload]}-{'tiny-' if self.tiny else ''}{size}"


# The sizes of WORKLOADS.md (W7, max-pool, is issue 6's addition). W6 at 1e6 takes a few
# tens of ms, so it is not "big".
MPC_CASES: list[Case] = [
    Case("W1", 10**5, repeats=10),
    Case("W1", 10**6, big=True),
    Case("W2", 256, repeats=10),
    Case("W3", 10**4, repeats=10),
    Case("W3", 10**5, repeats=10),
    Case("W3", 10**6, big=True),
    Case("W4", 10**5, repeats=10),
    Case("W4", 10**6, big=True),
    Case("W5", 1, repeats=10),
    Case("W5", 64, big=True),
    Case("W6", 10**6, repeats=10),
    Case("W7", 10**5, repeats=10),
    Case("W7", 10**6, big=True),
    Case("W12", 64, repeats=5),
]
if "W8" in WORKLOADS:
    MPC_CASES += [Case("W8", 10**5, repeats=10), Case("W8", 10**6, big=True)]
POINTER_CASES: list[Case] = [Case("P1", 10), Case("P2", 10)]


# --------------------------------------------------------------------------- measuring


def _time_calls(
    fn: Callable[[], Any],
    inner: int,
    sync: Callable[[], Any] | None = None,
    after: Callable[[], Any] | None = None,
) -> float:
    """Seconds per call of ``fn``, over ``inner`` back-to-back calls (then ``sync()``,
    inside the timer: waiting until network workers ran them; ``after()`` outside it)."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    if sync is not None:
        sync()
    elapsed = time.perf_counter() - t0
    if after is not None:
        after()
    return elapsed / inner


def _calibrate(fn: Callable[[], Any], target: float, sync: Callable[[], Any] | None = None) -> int:
    """How many calls make one timing sample last about ``target`` seconds (at least 1)."""
    once = _time_calls(fn, 1, sync)
    if once >= target:
        return 1
    inner = max(1, int(target / max(once, 1e-7)))
    per = _time_calls(fn, inner, sync)  # refine: the first call is often slower
    return max(1, int(target / max(per, 1e-9)))


def time_plain(fn: Callable[[], Any], repeat: int = 5, target: float = 0.01) -> float:
    """Median seconds per call of a (usually fast) plaintext op, looped to ``target`` s."""
    fn()
    inner = _calibrate(fn, target)
    return statistics.median(_time_calls(fn, inner) for _ in range(max(repeat, 3)))


class _DealerTimer:
    """Adds up the time the crypto provider spends serving messages (its material work).

    Wraps the worker's ``handle_frames`` for the duration of a ``with`` block (an instance
    attribute, removed on exit). The dealer's work happens inline in this engine, not in a
    separate offline phase, so this is the dealer share of the online time.
    """

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # CPU time of the serving thread (less sensitive to load)

    def __enter__(self) -> _DealerTimer:
        if not isinstance(self.worker, pt.VirtualWorker):
            self.worker = None  # nothing to time here: no dealer, or a served one
            self.seconds = self.cpu_seconds = math.nan
            return self
        inner = self.worker.handle_frames

        def timed(header: bytes, buffers: list[Any], **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(header, buffers, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu_seconds += time.thread_time() - c0

        setattr(self.worker, "handle_frames", timed)  # noqa: B010 - (a method, patched on purpose)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.worker is not None:
            del self.worker.handle_frames


def _worker_totals(workers: list[Any]) -> dict[str, int]:
    keys = ("messages_received", "bytes_received", "bytes_sent", "peer_bytes_sent")
    return {k: sum(getattr(w.stats, k) for w in workers) for k in keys}


def profile(w: Workload, repeat: int = 5) -> dict[str, Any]:
    """Everything but the secure timing: plaintext time, communication of one run, the
    crypto provider's time in that run, and correctness."""
    info: dict[str, Any] = {
        "workload": w.id,
        "op": w.op,
        "size": w.size,
        "name": w.name,
        "parties": len(w.workers) if w.kind == "mpc" else 1,
        "elements": w.elements,
        "shape": list(w.shape),
    }
    info["plain_s"] = time_plain(w.plain, repeat)
    if w.kind == "mpc":
        everyone = w.everyone
        before = _worker_totals(everyone)
        clients_before = [c.stats.snapshot() for c in w.clients]
        c0 = time.process_time()
        with _DealerTimer(w.dealer) as dt, mpc.stats() as s:
            w.run()
            w.sync()
        run_cpu = time.process_time() - c0
        after = _worker_totals(everyone)
        info.update(
            rounds=s.rounds,
            bytes_per_party=dict(s.bytes_per_party),
            max_bytes_per_party=s.max_bytes_per_party,
            dealer_bytes=s.dealer_bytes,
            client_messages=s.client_messages,
            # what the client sent to the workers (peer deliveries are counted by the peer
            # that sent them, so they are taken out)
            client_bytes_sent=(after["bytes_received"] - before["bytes_received"])
            - (after["peer_bytes_sent"] - before["peer_bytes_sent"]),
            dealer_s=dt.seconds,
            dealer_cpu_s=dt.cpu_seconds,
            # this process's CPU time in that run (in process: every party and the dealer)
            run_cpu_s=run_cpu if w.in_process else math.nan,
        )
        if w.clients:
            info["upload_bytes_per_client"] = max(
                after_c.peer_bytes_sent - before_c.peer_bytes_sent
                for before_c, after_c in zip(clients_before, (c.stats for c in w.clients))
            )
    else:
        (worker,) = w.workers
        calls = 200
        before = worker.stats.snapshot()
        for _ in range(calls):
            w.run()
        w.sync()
        after = worker.stats.snapshot()
        msgs = after.messages_received - before.messages_received
        info.update(
            messages_per_op=msgs / calls,
            bytes_per_message=(after.bytes_received - before.bytes_received) / max(msgs, 1),
            reply_bytes_per_message=(after.bytes_sent - before.bytes_sent) / max(msgs, 1),
        )
    info.update(w.check())
    if w.track_rss:
        info["peak_rss_bytes"] = peak_rss()
    return info


def finish(
    info: dict[str, Any], times: list[float], cpu_times: list[float] | None = None
) -> dict[str, Any]:
    """Add the secure timing (seconds per run) and the ratio to a :func:`profile` row;
    ``cpu_times`` (process CPU seconds per run) adds ``cpu_median_s``."""
    if cpu_times:
        # all parties run in this process on one torch thread, so this is the work of the
        # whole protocol; it grows much less than wall time when other processes load the CPU
        info["cpu_median_s"] = statistics.median(cpu_times)
    info["median_s"] = statistics.median(times)
    info["min_s"] = min(times)
    info["max_s"] = max(times)
    info["runs"] = len(times)
    info["ratio"] = info["median_s"] / info["plain_s"] if info["plain_s"] > 0 else math.inf
    if info.get("elements"):
        info["elements_per_s"] = info["elements"] / info["median_s"]
    if "messages_per_op" in info:
        info["overhead_us"] = (info["median_s"] - info["plain_s"]) * 1e6
    return info


def measure(
    workload: str | Workload,
    size: int | None = None,
    repeat: int = 5,
    parties: int = 2,
    progress: Callable[[], Any] | None = None,
    factory: WorkerFactory | None = None,
    cpu_clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Warm up once, time ``repeat`` runs (perf_counter; median/min/max), time the
    plaintext op, and record rounds, bytes, client messages and correctness of one run.

    ``workload`` is an id ("W1".."W8", "P1", "P2") with ``size`` (and ``parties``, 2 to 5
    computing parties; ``factory`` makes the workers, default ``pt.VirtualWorker``), or a
    built Workload. Sub-millisecond ops (the pointer cases) are looped so each sample lasts
    ~10 ms; times are per call. ``progress`` is called after the warm-up, after each timed
    run and after the profiling run (``repeat + 2`` calls).

    On network workers (any worker that is not a ``VirtualWorker``) each timed sample ends
    with :meth:`Workload.sync` inside the timer (commands are pipelined: without it the
    timer would stop before the workers did the work), or, for a run that reveals its
    result (``Workload.revealed``), right after the timer; their ``cpu`` column needs
    ``cpu_clock``, CPU seconds of every process involved (see :func:`processes_cpu`).
    """
    torch.set_num_threads(1)
    tick = progress or (lambda: None)
    if isinstance(workload, str):
        if size is None:
            raise TypeError("measure() needs a size with a workload id")
        w = WORKLOADS[workload](size, parties=parties, factory=factory)
    else:
        w = workload
    local = w.in_process
    sync = None if local else w.sync
    after = None
    if sync is not None and w.revealed:  # the result in hand ends the run (see Workload)
        sync, after = None, sync
    w.run()  # warm-up
    w.sync()
    tick()
    inner = _calibrate(w.run, 0.01, sync) if w.kind == "pointer" else 1
    times, cpu_times = [], []
    clock = cpu_clock or time.process_time
    start = clock()
    for _ in range(repeat):
        c0 = clock()
        times.append(_time_calls(w.run, inner, sync, after))
        cpu_times.append((clock() - c0) / inner)
        tick()
    if cpu_clock is not None:  # (other processes' CPU comes in ticks of 10 ms: the mean)
        cpu_times = [(clock() - start) / (repeat * inner)]
    row = finish(profile(w, repeat), times, cpu_times if local or cpu_clock else None)
    tick()
    return row


def processes_cpu(pids: list[int]) -> Callable[[], float]:
    """A clock of CPU seconds (user + system, every thread) of this process and of the
    processes ``pids`` together (Linux: /proc/PID/stat; elsewhere this process only)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def other(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def clock() -> float:  # (this process's own to the ns: the others' come in ticks)
        return time.process_time() + sum(other(p) for p in pids)

    return clock


# Max abs error allowed vs plaintext (fixed point with 16 fractional bits: 2^-17 per
# encoding, one ulp per truncation, accumulated over the 256-term dot products of W2).
TOLERANCE = {
    "W1": 1e-3,
    "W2": 1e-2,
    "W4": 1e-3,
    "W5": 1e-2,
    "W6": 1e-4,
    "W7": 1e-4,
    "W8": 1e-4,
    "W12": 1e-3,
    "P1": 0.0,
    "P2": 0.0,
}
# Mean abs error allowed vs plaintext, where a workload reports it (W14-W16).
MEAN_TOLERANCE: dict[str, float] = {}
# Counts that must be zero (exact agreement); others (float_mismatches: the encoding's
# rounding, argmax_mismatches: near-ties of logits) are reported only.
EXACT = ("mismatches", "sign_mismatches", "goals_missed")


def failures(row: dict[str, Any]) -> list[str]:
    """What is wrong with a measured row's correctness (empty when it is correct)."""
    out = []
    tol = TOLERANCE.get(row["workload"])
    if "max_abs_err" in row and tol is not None and not row["max_abs_err"] <= tol:
        out.append(f"{row['name']}: max abs error {row['max_abs_err']:.3g} > {tol:g}")
    mean_tol = MEAN_TOLERANCE.get(row["workload"])
    if "mean_abs_err" in row and mean_tol is not None and not row["mean_abs_err"] <= mean_tol:
        out.append(f"{row['name']}: mean abs error {row['mean_abs_err']:.3g} > {mean_tol:g}")
    for key in EXACT:
        if row.get(key, 0) != 0:
            out.append(f"{row['name']}: {row[key]} {key.replace('_', ' ')}")
    return out


def timings(benchmark: Any, fn: Callable[[], Any]) -> list[float]:
    """Per-call times pytest-benchmark recorded; with --benchmark-disable it records none,
    so time one call here."""
    data = getattr(getattr(getattr(benchmark, "stats", None), "stats", None), "data", None)
    if data:
        return list(data)
    return [_time_calls(fn, 1)]


# --------------------------------------------------------------------------- reporting


def _fmt_time(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_err(row: dict[str, Any]) -> str:
    parts = []
    if "max_abs_err" in row:
        parts.append(f"err {row['max_abs_err']:.1e}")
    if "mean_abs_err" in row:
        parts.append(f"mean err {row['mean_abs_err']:.1e}")
    for key, short in (
        ("mismatches", "mism"),
        ("sign_mismatches", "sign-mism"),
        ("argmax_mismatches", "argmax-mism"),
        ("goals_missed", "goals-missed"),
    ):
        if key in row:
            parts.append(f"{short} {row[key]}")
    if "upload_bytes_per_client" in row:
        parts.append(f"upload/client {_fmt_bytes(row['upload_bytes_per_client'])}")
    if row.get("peak_rss_bytes") is not None:
        parts.append(f"peak RSS {_fmt_bytes(row['peak_rss_bytes'])}")
    return ", ".join(parts)


def _fmt_rate(r: float | None) -> str:
    if r is None or not math.isfinite(r):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.2f} {unit}"
    return f"{r:.1f}"


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None or not math.isfinite(r) else f"{r:.0f}x"


# (header, width, cell) of the MPC table; "wide" columns only with wide=True.
_MPC_COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str], bool]] = [
    ("workload", 12, lambda r: f"{r['workload']} {r['op']}", False),
    ("size", 8, lambda r: str(r["size"]), False),
    ("median", 10, lambda r: _fmt_time(r.get("median_s")), False),
    ("cpu", 10, lambda r: _fmt_time(r.get("cpu_median_s")), False),
    ("min", 10, lambda r: _fmt_time(r.get("min_s")), True),
    ("max", 10, lambda r: _fmt_time(r.get("max_s")), True),
    ("elem/s", 9, lambda r: _fmt_rate(r.get("elements_per_s")), False),
    ("plaintext", 10, lambda r: _fmt_time(r["plain_s"]), False),
    ("ratio", 8, lambda r: _fmt_ratio(r.get("ratio")), False),
    ("rounds", 6, lambda r: str(r["rounds"]), False),
    ("bytes/party", 11, lambda r: _fmt_bytes(r["max_bytes_per_party"]), False),
    ("dealer B", 10, lambda r: _fmt_bytes(r["dealer_bytes"]), True),
    ("msgs", 6, lambda r: str(r["client_messages"]), True),
    ("dealer t*", 10, lambda r: _fmt_time(r["dealer_s"]), False),
    ("client B", 10, lambda r: _fmt_bytes(r["client_bytes_sent"]), True),
]
CPU_NOTE = (
    "cpu: median process CPU time per run (every party runs in this process, one torch "
    "thread): the protocol's work, much less sensitive than wall time to other load."
)
DEALER_NOTE = (
    "* dealer t: time inside the crypto provider's message handler during one extra run "
    "(the one that counts rounds and bytes). There is no separate offline phase yet: the "
    "dealer works inline, so this is part of the online time, not in addition to it."
)
NETWORK_NOTE = (
    "network: every worker is its own process; each timed run ends with a sync of every "
    "worker (commands are pipelined), inside the timer, except a run that reveals its "
    "result to the client (W3, W6, W8): its timer stops when the value is in hand, and the "
    "sync follows outside it. cpu: CPU time per run of all the "
    "processes together (this client and every worker process, all threads; the mean of "
    "the timed runs; on C cores a run takes at least cpu / C). dealer t: not measured."
)
ELEMENTS_NOTE = (
    "elem/s: elements per second of the median (W2: output entries, W5: images, W8: the "
    "elements of all updates)."
)
POINTER_HEADER = (
    f"{'workload':<20} {'pointer op':>10} {'local op':>10} {'overhead':>10} "
    f"{'msgs/op':>8} {'B/msg':>7} {'reply B/msg':>11}  correctness"
)


def _mpc_columns(wide: bool) -> list[tuple[str, int, Callable[[dict[str, Any]], str], bool]]:
    return [c for c in _MPC_COLUMNS if wide or not c[3]]


def mpc_header(wide: bool = False) -> str:
    cols = _mpc_columns(wide)
    first, *rest = cols
    return " ".join(
        [f"{first[0]:<{first[1]}}"] + [f"{h:>{w}}" for h, w, _, _ in rest] + [" correctness"]
    )


def format_row(row: dict[str, Any], wide: bool = False) -> str:
    """One line of the results table (MPC or pointer layout, chosen by the row's keys);
    ``wide`` adds min, max, dealer bytes, client messages and client bytes."""
    if "messages_per_op" in row:
        return (
            f"{row['name']:<20} {_fmt_time(row.get('median_s')):>10} "
            f"{_fmt_time(row['plain_s']):>10} {row.get('overhead_us', math.nan):>8.1f}us "
            f"{row['messages_per_op']:>8.3f} {row['bytes_per_message']:>7.0f} "
            f"{row['reply_bytes_per_message']:>11.0f}  {_fmt_err(row)}"
        )
    first, *rest = _mpc_columns(wide)
    cells = [f"{first[2](row):<{first[1]}}"] + [f"{cell(row):>{w}}" for _, w, cell, _ in rest]
    return " ".join(cells + [" " + _fmt_err(row)])


def format_table(rows: list[dict[str, Any]], wide: bool = False) -> str:
    """The results table: MPC rows (with the notes on elem/s and the dealer time), then
    the pointer rows in their own layout."""
    mpc_rows = [r for r in rows if "messages_per_op" not in r]
    ptr_rows = [r for r in rows if "messages_per_op" in r]
    out = []
    if mpc_rows:
        header = mpc_header(wide)
        out += [header, "-" * len(header)] + [format_row(r, wide) for r in mpc_rows]
        if any("cpu_median_s" in r for r in mpc_rows):
            out.append(CPU_NOTE)
        out += [ELEMENTS_NOTE, DEALER_NOTE]
    if ptr_rows:
        if out:
            out.append("")
        out += [POINTER_HEADER, "-" * len(POINTER_HEADER)] + [format_row(r) for r in ptr_rows]
    if any(r.get("workers") == "network" for r in rows):
        out.append(NETWORK_NOTE)
    return "\n".join(out)


def format_markdown(rows: list[dict[str, Any]]) -> str:
    """The MPC rows as a Markdown table (the columns of :func:`format_table`)."""
    cols = _mpc_columns(False)
    lines = [
        "| " + " | ".join([h for h, _, _, _ in cols] + ["correctness"]) + " |",
        "|" + "---|" * (len(cols) + 1),
    ]
    for r in rows:
        if "messages_per_op" not in r:
            lines.append("| " + " | ".join([c(r) for _, _, c, _ in cols] + [_fmt_err(r)]) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- functions
# W9-W11 and W13 (issue 13): non-linear functions and the transformer encoder layer.


def _function_workload(
    wid: str,
    op: str,
    size: str,
    inp: torch.Tensor,
    fn: Callable[[Any], Any],
    parties: int,
    factory: WorkerFactory | None,
) -> Workload:
    """One function of a private float32 tensor, checked against float64 torch."""
    ws, carol = _parties(parties, factory)
    x = mpc.share(inp, *ws, crypto_provider=carol, config=CONFIG)
    ref = fn(inp.double())

    def check() -> dict[str, Any]:
        return {"max_abs_err": _max_abs_err(fn(x).get(), ref)}

    return Workload(
        wid,
        op,
        size,
        run=lambda: fn(x),
        plain=lambda: fn(inp),
        check=check,
        workers=ws,
        dealer=carol,
        elements=inp.numel(),
        shape=tuple(inp.shape),
    )


def w9_sigmoid(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W9: ``torch.sigmoid`` of a private tensor of n elements, x = 4 randn (float64 check)."""
    inp = torch.randn(n, generator=_gen()) * 4
    return _function_workload("W9", "sigmoid", size_label(n), inp, torch.sigmoid, parties, factory)


SOFTMAX_COLUMNS = 100  # W10: softmax over the last dim of (rows, 100)


def w10_softmax(rows: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W10: ``torch.softmax(x, -1)`` of a private (rows, 100) tensor, x = 2 randn."""
    inp = torch.randn(rows, SOFTMAX_COLUMNS, generator=_gen()) * 2
    return _function_workload(
        "W10",
        "softmax",
        f"{rows}x{SOFTMAX_COLUMNS}",
        inp,
        lambda t: torch.softmax(t, -1),
        parties,
        factory,
    )


def w11_functions(n: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W11: the function table of issue 13 (exp, log, reciprocal on +-U(0.01, 100), sqrt,
    rsqrt, sigmoid, tanh, GELU both forms, SiLU, softmax over 100, a / b), each on its own
    range at n elements, one after the other in one run (rounds and bytes are the sum).

    ``check`` gives each function's max absolute and max relative error against float64
    torch and its goal; ``goals_missed`` counts the functions that miss theirs.
    """
    from benchmarks.function_accuracy import CASES

    ws, carol = _parties(parties, factory)
    cases = []
    for name, _, draw, fn, kind, goal in CASES:
        xs = draw(n, _gen())
        xs = xs if isinstance(xs, tuple) else (xs,)
        shared = [mpc.share(v.float(), *ws, crypto_provider=carol, config=CONFIG) for v in xs]
        cases.append((name, fn, xs, shared, kind, goal))

    def run() -> list[Any]:
        return [fn(*shared) for _, fn, _, shared, _, _ in cases]

    def plain() -> list[Any]:
        return [fn(*(v.float() for v in xs)) for _, fn, xs, _, _, _ in cases]

    def check() -> dict[str, Any]:
        per: dict[str, dict[str, float | bool]] = {}
        for (name, fn, xs, _, kind, goal), out in zip(cases, run()):
            ref = fn(*xs)
            err = (out.get().double() - ref).abs()
            rel = float((err / ref.abs().clamp_min(1e-300)).max())
            per[name] = {"max_abs_err": float(err.max()), "max_rel_err": rel, "goal": goal}
            per[name]["meets_goal"] = (per[name]["max_" + kind + "_err"]) <= goal
        return {"functions": per, "goals_missed": sum(not v["meets_goal"] for v in per.values())}

    return Workload(
        "W11",
        "functions",
        size_label(n),
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        elements=n * len(cases),
        shape=(len(cases), n),
    )


def transformer_layer() -> nn.Module:
    """WORKLOADS.md's W13 model, initialised from a fixed seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True).eval()


def w13_transformer(seq: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W13: encrypted inference of one unmodified ``nn.TransformerEncoderLayer(64, 4, 256)``
    on a (1, seq, 64) input (WORKLOADS.md: seq 32); weights and input shared."""
    inp = torch.randn(1, seq, 64, generator=_gen())
    ws, carol, shared_layer, x, run, plain = _shared_inference(
        transformer_layer(), inp, parties, factory
    )
    return Workload(
        "W13",
        "transformer",
        f"1x{seq}x64",
        run=run,
        plain=plain,
        check=lambda: {"max_abs_err": _max_abs_err(run().get(), plain())},
        workers=ws,
        dealer=carol,
        elements=seq,
        shape=tuple(inp.shape),
        fn=shared_layer,
        inputs=(x,),
    )


FUNCTION_SIZES: dict[str, Callable[[int], str]] = {
    "W10": lambda rows: f"{rows}x{SOFTMAX_COLUMNS}",
    "W13": lambda seq: f"1x{seq}x64",
}


def _add_function_workloads() -> None:
    """Register W9-W11 and W13 beside the others (ids, builders, size units, cases)."""
    for wid, op, build, unit in (
        ("W9", "sigmoid", w9_sigmoid, "elements"),
        ("W10", "softmax", w10_softmax, f"rows (softmax over {SOFTMAX_COLUMNS} columns)"),
        ("W11", "functions", w11_functions, "elements per function"),
        ("W13", "transformer", w13_transformer, "sequence length (d_model 64)"),
    ):
        OPS[wid], WORKLOADS[wid], SIZE_UNIT[wid] = op, build, unit
    MPC_CASES.extend(
        [
            Case("W9", 10**5, repeats=5),
            Case("W10", 1000, repeats=5),
            Case("W11", 10**5, repeats=5),
            Case("W13", 32, repeats=5),
        ]
    )
    TOLERANCE.update({"W9": 5e-4, "W10": 5e-4, "W13": 5e-3})


_add_function_workloads()
NOT_ELEMENTS = (*NOT_ELEMENTS, "W10", "W13")


# --------------------------------------------------------------------------- transformers
# W14-W16 (issue 23): unmodified Hugging Face models at their real size, every party, the
# crypto provider and the plaintext reference in this one process. Minutes per case, so
# they run only when named (``--workloads W14``); ``tiny=True`` (``--hf-tiny``, the smoke
# test) builds 2-layer, 64-wide models with a vocabulary of 99 instead.

TINY_BERT: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
}
TINY_GPT2: dict[str, Any] = {
    "vocab_size": 99,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def reset_peak_rss() -> bool:
    """Start counting this process's peak resident memory afresh (Linux:
    ``/proc/self/clear_refs``); False where that is not possible (the peak is then the
    process's peak since it started)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """Peak resident memory of this process in bytes, since :func:`reset_peak_rss`
    (``VmHWM``; elsewhere ``ru_maxrss``, since the process started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None


def hf_model(kind: str, tiny: bool = False) -> Any:
    """WORKLOADS.md's W14 (``kind="bert"``: ``BertModel(BertConfig())``) or W15/W16 model
    (``"gpt2"``: ``GPT2LMHeadModel(GPT2Config())``), random weights after
    ``torch.manual_seed(0)``; nothing is downloaded. ``tiny``: the tiny configs above."""
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        if kind == "bert":
            bert = transformers.BertConfig(**TINY_BERT) if tiny else transformers.BertConfig()
            return transformers.BertModel(bert).eval()
        gpt2 = transformers.GPT2Config(**TINY_GPT2) if tiny else transformers.GPT2Config()
        return transformers.GPT2LMHeadModel(gpt2).eval()


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    err = (out.double() - ref.double()).abs()
    return {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean())}


def _hf_shared(
    kind: str, tiny: bool, parties: int, factory: WorkerFactory | None
) -> tuple[Any, Any, list[Any], Any]:
    """The plaintext model and a shared copy of it (the weights shared from here: the
    benchmark is the model owner), the parties and the crypto provider. Starts the peak
    memory count first."""
    reset_peak_rss()
    model = hf_model(kind, tiny)
    ws, carol = _parties(parties, factory)
    return (
        model,
        mpc.share(copy.deepcopy(model), *ws, crypto_provider=carol, config=CONFIG),
        ws,
        carol,
    )


def _prefill(
    wid: str,
    kind: str,
    seq: int,
    parties: int,
    factory: WorkerFactory | None,
    tiny: bool,
) -> Workload:
    """W14 (BERT, last hidden state) and W15 (GPT-2 prefill, logits): one forward over a
    ``(1, seq)`` prompt of private ids. The ids' owner shares them as one-hot rows
    (``mpc.hf.share_one_hot``, before the timer, as every input); the timed run looks them
    up (the one-hot rows times the shared embedding table) and runs the model."""
    from mpc.hf import private_embeddings, share_one_hot

    model, shared, ws, carol = _hf_shared(kind, tiny, parties, factory)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, seq), generator=_gen())
    onehot = share_one_hot(ids, shared)

    def output(out: Any) -> Any:
        return out.last_hidden_state if kind == "bert" else out.logits

    def run() -> Any:
        with torch.no_grad():
            return output(shared(inputs_embeds=private_embeddings(shared, onehot)))

    def plain() -> torch.Tensor:
        with torch.no_grad():
            return output(model(input_ids=ids))

    ref = plain()

    def check() -> dict[str, Any]:
        return _errors(run().get(), ref)

    return Workload(
        wid,
        OPS[wid],
        ("tiny-" if tiny else "") + size_of(wid, seq),
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        notes="ids private (one-hot rows from their owner), weights private",
        elements=seq,
        shape=(1, seq),
        track_rss=True,
    )


def w14_bert(
    seq: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W14: ``BertModel`` at BERT-base shape (``tiny``: 2 layers, width 64) on ``seq``
    private token ids, weights private; the last hidden state stays shared. Throughput
    counts tokens."""
    return _prefill("W14", "bert", seq, parties, factory, tiny)


def w15_gpt2(
    seq: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W15: ``GPT2LMHeadModel`` at GPT-2 small shape, one forward over a prompt of ``seq``
    private ids (prefill); the logits stay shared. Throughput counts tokens."""
    return _prefill("W15", "gpt2", seq, parties, factory, tiny)


def _cache_state(cache: Any) -> list[tuple[Any, Any]]:
    return [(layer.keys, layer.values) for layer in cache.layers]


def _restore_cache(cache: Any, state: list[tuple[Any, Any]]) -> None:
    """Put a ``DynamicCache`` back to the keys and values it held (a step appends to them
    by concatenation, so the tensors saved before it are untouched): every timed step
    then follows the same prompt."""
    for layer, (keys, values) in zip(cache.layers, state):
        layer.keys, layer.values = keys, values


def w16_decode(
    prompt: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W16: one greedy decoding step of GPT-2 small with the KV cache after a ``prompt``-
    token private prompt (``mpc.hf.greedy_generate``'s step). Before the timer: the
    prompt's prefill on shares (the cache holds shared keys and values) and its next
    token, revealed to the client. Timed: the client shares that token as a one-hot row,
    the model runs one position with the cache, the argmax of the logits is taken on
    shares and only the next token is revealed. The cache is put back to the prompt's
    before each step. Correctness: the step's logits against float32 and the token."""
    from transformers import DynamicCache

    from mpc.hf import private_embeddings

    model, shared, ws, carol = _hf_shared("gpt2", tiny, parties, factory)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=_gen())
    cache = DynamicCache(config=shared.config)
    plain_cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = shared(inputs_embeds=private_embeddings(shared, ids), past_key_values=cache)
        token = out.logits[:, -1].argmax(-1, keepdim=True).get()  # what the client learns
        model(input_ids=ids, past_key_values=plain_cache)
    del out
    state, plain_state = _cache_state(cache), _cache_state(plain_cache)

    def step() -> Any:
        _restore_cache(cache, state)
        with torch.no_grad():
            return shared(
                inputs_embeds=private_embeddings(shared, token),
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1]

    def run() -> torch.Tensor:
        return step().argmax(-1, keepdim=True).get()

    def plain() -> torch.Tensor:
        _restore_cache(plain_cache, plain_state)
        with torch.no_grad():
            logits = model(input_ids=token, past_key_values=plain_cache, use_cache=True).logits
        return logits[:, -1]

    ref = plain()

    def check() -> dict[str, Any]:
        logits = step()
        got = logits.argmax(-1, keepdim=True).get()
        return {
            **_errors(logits.get(), ref),
            "token_mismatches": int((got != ref.argmax(-1, keepdim=True)).sum()),
        }

    return Workload(
        "W16",
        "decode",
        ("tiny-" if tiny else "") + size_of("W16", prompt),
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        notes="one token after the prompt; KV cache shared; only the token revealed",
        elements=1,
        shape=(1, 1),
        revealed=True,
        track_rss=True,
    )


def _add_hf_workloads() -> None:
    """Register W14-W16 when ``transformers`` is installed (the ``[hf]`` extra); their
    full-size cases run only when named."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return
    for wid, op, build, unit, fmt in (
        ("W14", "bert", w14_bert, "sequence length (BERT-base)", "s{}"),
        ("W15", "gpt2", w15_gpt2, "prompt length (GPT-2 small prefill)", "s{}"),
        ("W16", "decode", w16_decode, "prompt length before the step (GPT-2 small)", "p{}"),
    ):
        OPS[wid], WORKLOADS[wid], SIZE_UNIT[wid] = op, build, unit
        FUNCTION_SIZES[wid] = fmt.format
    MPC_CASES.extend(
        [
            Case("W14", 128, explicit=True),
            Case("W15", 128, explicit=True),
            Case("W16", 32, explicit=True),
        ]
    )
    # the bounds for tiny configs (5e-2 max, 5e-3 mean) hold at full size too
    TOLERANCE.update({"W14": 5e-2, "W15": 5e-2, "W16": 5e-2})
    MEAN_TOLERANCE.update({"W14": 5e-3, "W15": 5e-3, "W16": 5e-3})


_add_hf_workloads()
NOT_ELEMENTS = (*NOT_ELEMENTS, "W14", "W15", "W16")
