"""The table of workloads: ids, ops, builders, size units and printable sizes, the cases
the benchmark runs, the workers each needs and the error each may make
(:func:`failures`). W8 is there where ``mpc.SecureAggregator`` is, W14-W16 where
``transformers`` is installed."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import mpc
from benchmarks.workloads.functions import (
    SOFTMAX_COLUMNS,
    w9_sigmoid,
    w10_softmax,
    w11_functions,
    w13_transformer,
)
from benchmarks.workloads.generation import GEN_OPS, GEN_SIZES, w16_decode, w17_decode
from benchmarks.workloads.hf import HF_OPS, HF_SIZES, w14_bert, w15_gpt2
from benchmarks.workloads.pointer import pointer_add, pointer_add_get
from benchmarks.workloads.protocol import (
    w1_mul,
    w2_matmul,
    w3_lt,
    w4_relu,
    w5_lenet,
    w6_roundtrip,
    w7_maxpool,
    w8_secagg,
    w12_train,
)
from benchmarks.workloads.workers import SECAGG_CLIENTS, WorkerFactory
from benchmarks.workloads.workload import Workload, size_label

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


def size_of(workload: str, n: int) -> str:
    """The printable size of a workload: "256x256" for W2, "b64" for W5, else "1e5"."""
    if workload == "W2":
        return f"{n}x{n}"
    if workload in ("W5", "W12"):
        return f"b{n}"
    if workload in FUNCTION_SIZES:
        return FUNCTION_SIZES[workload](n)
    return size_label(n)


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


# The sizes of docs/workloads.md (W7, max-pool, is issue 6's addition). W6 at 1e6 takes a few
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
EXACT = ("mismatches", "sign_mismatches", "goals_missed", "token_mismatches")


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


def _add_hf_workloads() -> None:
    """Register W14-W16 when ``transformers`` is installed (the ``[hf]`` extra); their
    full-size cases run only when named."""
    import importlib.util

    if importlib.util.find_spec("transformers") is None:
        return
    ops, sizes = {**HF_OPS, **GEN_OPS}, {**HF_SIZES, **GEN_SIZES}
    for wid, build, unit in (
        ("W14", w14_bert, "sequence length (BERT-base)"),
        ("W15", w15_gpt2, "prompt length (GPT-2 small prefill)"),
        ("W16", w16_decode, "prompt length before the step (GPT-2 small, held)"),
        ("W17", w17_decode, "prompt length before the step (SmolLM-135M shape, held)"),
    ):
        OPS[wid], WORKLOADS[wid], SIZE_UNIT[wid] = ops[wid], build, unit
        FUNCTION_SIZES[wid] = sizes[wid].format
    MPC_CASES.extend(
        [
            Case("W14", 128, explicit=True),
            Case("W15", 128, explicit=True),
            Case("W16", 32, explicit=True),
            Case("W17", 32, explicit=True),
        ]
    )
    # the bounds for tiny configs (5e-2 max, 5e-3 mean) hold at full size too
    TOLERANCE.update({"W14": 5e-2, "W15": 5e-2})
    MEAN_TOLERANCE.update({"W14": 5e-3, "W15": 5e-3})


_add_hf_workloads()
NOT_ELEMENTS = (*NOT_ELEMENTS, "W14", "W15", "W16", "W17")
