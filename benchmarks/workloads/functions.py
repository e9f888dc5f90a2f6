"""W9-W11 and W13 (issue 13): non-linear functions of private tensors and the
transformer encoder layer."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import mpc
from benchmarks.workloads import workers
from benchmarks.workloads.workers import WorkerFactory, _parties
from benchmarks.workloads.workload import (
    SEED,
    Workload,
    _gen,
    _max_abs_err,
    _shared_inference,
    size_label,
)


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
    x = mpc.share(inp, *ws, crypto_provider=carol, config=workers.CONFIG)
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
        shared = [
            mpc.share(v.float(), *ws, crypto_provider=carol, config=workers.CONFIG) for v in xs
        ]
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
    """docs/workloads.md's W13 model, initialised from a fixed seed."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True).eval()


def w13_transformer(seq: int, parties: int = 2, factory: WorkerFactory | None = None) -> Workload:
    """W13: encrypted inference of one unmodified ``nn.TransformerEncoderLayer(64, 4, 256)``
    on a (1, seq, 64) input (docs/workloads.md: seq 32); weights and input shared."""
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
