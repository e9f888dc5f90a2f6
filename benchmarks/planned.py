"""The benchmark's plan runs (``python -m benchmarks --plan [--preprocess]``): a workload
recorded once as an ``mpc.plan`` of its function, each timed run one plan call, and its
crypto-provider material dealt ahead."""

from __future__ import annotations

import time
from typing import Any

import mpc

#: the workloads that run as plans with --plan
PLAN_WORKLOADS = ("W5", "W13")


def as_plan(w: Any) -> float:
    """Make ``w`` run as an ``mpc.plan`` of its function (W5, W13): record the plan now
    (not timed by the benchmark) and return the seconds that took; each run is then one
    plan call, and the correctness check compares the plan's output with plaintext."""
    if w.fn is None:
        raise ValueError(f"workload {w.id} cannot run as a plan (no function of its inputs)")
    start = time.perf_counter()
    plan = mpc.plan(w.fn, *w.inputs)
    w.sync()
    recorded = time.perf_counter() - start
    inputs = w.inputs

    def run() -> Any:
        return plan(*inputs)

    def check() -> dict[str, Any]:
        out, ref = run().get(), w.plain()
        result: dict[str, Any] = {"max_abs_err": float((out - ref).abs().max())}
        if w.id == "W5":
            result["argmax_mismatches"] = int((out.argmax(1) != ref.argmax(1)).sum())
        return result

    w.run, w.check = run, check
    w.plan = plan
    w.op = f"{w.op} plan"
    w.programs = True  # each timed run's sync waits for the plan's programs
    return recorded


def preprocess_plan(w: Any, calls: int) -> float:
    """Deal the material of ``w``'s next ``calls`` runs now: plan calls
    (``mpc.preprocess``) or a generation's decoding steps (W16, W17); the seconds per
    run that took (dealer's work and deliveries, waited for)."""
    start = time.perf_counter()
    if w.preprocess is not None:
        w.preprocess(calls)
    else:
        mpc.preprocess(w.plan, calls)
    w.sync()
    return (time.perf_counter() - start) / calls
