"""The function workloads of issue 13 (W9 sigmoid, W10 softmax, W11 the function table,
W13 the transformer encoder layer) at tiny sizes: they build, run, agree with float64
torch within the issue's goals, and report rounds and bytes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    from benchmarks import workloads as wl
except ImportError:  # a bare `pytest` run without the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import workloads as wl


@pytest.mark.parametrize(("workload", "size"), [("W9", 200), ("W10", 4), ("W13", 4)])
def test_function_workload(workload: str, size: int) -> None:
    row = wl.measure(workload, size, repeat=1)
    assert not wl.failures(row)
    assert row["max_abs_err"] <= wl.TOLERANCE[workload]
    assert row["rounds"] > 0 and row["max_bytes_per_party"] > 0 and row["dealer_bytes"] > 0
    assert set(row["bytes_per_party"]) == {"alice", "bob"}
    assert workload in wl.format_row(row)


def test_function_table_workload_reports_every_function() -> None:
    row = wl.measure("W11", 100, repeat=1)
    assert not wl.failures(row)
    funcs = row["functions"]
    assert {"exp", "log", "reciprocal", "sqrt", "rsqrt", "sigmoid", "tanh", "gelu"} <= set(funcs)
    assert {"silu", "softmax over 100", "a / b"} <= set(funcs)
    for name, f in funcs.items():
        assert f["meets_goal"], name
        assert 0 <= f["max_abs_err"] and 0 <= f["max_rel_err"]
    assert row["goals_missed"] == 0
    assert "goals-missed 0" in wl.format_row(row)


def test_a_missed_goal_is_a_failure() -> None:
    row = {"workload": "W11", "name": "W11-functions-100", "goals_missed": 1}
    assert wl.failures(row) == ["W11-functions-100: 1 goals missed"]


def test_function_case_ids() -> None:
    ids = {c.id for c in wl.MPC_CASES}
    assert {
        "W9-sigmoid-1e5",
        "W10-softmax-1000x100",
        "W11-functions-1e5",
        "W13-transformer-1x32x64",
    } <= ids
