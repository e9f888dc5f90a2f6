"""The protocol workloads of docs/workloads.md: W1 mul, W2 matmul, W3 lt, W4 relu, W5
LeNet inference, W6 share + reconstruct, W12 one training step, with max-pooling (W7)
and secure aggregation (W8), both from issue 6."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

import mpc
import mpc.registry
import pointers as pt
from benchmarks.workloads import workers
from benchmarks.workloads.workers import SECAGG_CLIENTS, WorkerFactory, _parties
from benchmarks.workloads.workload import (
    FRAC_BITS,
    SEED,
    Workload,
    _gen,
    _max_abs_err,
    _reveal,
    _session_of,
    _shared_inference,
    size_label,
)
from mpc.math.encoding import encode


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


def lenet() -> nn.Module:
    """The LeNet-like model of docs/workloads.md (W5), initialised from a fixed seed."""
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
    x = mpc.share(a, *ws, crypto_provider=carol, config=workers.CONFIG)
    y = mpc.share(b, *ws, crypto_provider=carol, config=workers.CONFIG)

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
    x = mpc.share(a, *ws, crypto_provider=carol, config=workers.CONFIG)
    y = mpc.share(b, *ws, crypto_provider=carol, config=workers.CONFIG)
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
    x = mpc.share(a, *ws, crypto_provider=carol, config=workers.CONFIG)
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
        # materialize(): run the ReLU now (its comparison otherwise waits for its first
        # read, which a 2x2 max-pool may fuse into its own: mpc/ops/relu_pool.py)
        run=lambda: cast(mpc.SharedTensor, torch.relu(x)).materialize(),
        plain=lambda: torch.relu(a),
        check=check,
        workers=ws,
        dealer=carol,
        elements=n,
        shape=(n,),
    )


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
    x = mpc.share(a, *ws, crypto_provider=carol, config=workers.CONFIG)
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
    """docs/workloads.md's loss, -(log_softmax(out) * y).sum() / batch; squared error where
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

    shared_model = mpc.share(
        copy.deepcopy(model), *ws, crypto_provider=carol, config=workers.CONFIG
    )
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
