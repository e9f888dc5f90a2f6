"""Smoke run of every benchmark workload at a tiny size: the workloads build, run, agree
with plaintext, and report rounds and bytes. The real sizes run with ``make bench``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

try:
    from benchmarks import workloads as wl
except ImportError:  # a bare `pytest` run without the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import workloads as wl

TINY = {"W1": 100, "W2": 8, "W3": 100, "W4": 100, "W5": 1, "W6": 100, "P1": 10, "P2": 10}


@pytest.mark.parametrize("workload", ["W1", "W2", "W3", "W4", "W5"])
def test_protocol_workload(workload: str) -> None:
    row = wl.measure(workload, TINY[workload], repeat=1)
    assert not wl.failures(row)
    assert row["median_s"] > 0 and row["plain_s"] > 0 and row["ratio"] > 0
    assert row["rounds"] > 0
    assert set(row["bytes_per_party"]) == {"alice", "bob"}
    assert min(row["bytes_per_party"].values()) > 0
    assert row["max_bytes_per_party"] == max(row["bytes_per_party"].values())
    assert row["dealer_bytes"] > 0
    assert row["client_messages"] > 0
    assert row["client_bytes_sent"] > 0
    assert row["dealer_s"] > 0
    assert workload in wl.format_row(row)


def test_comparison_is_revealed_and_exact() -> None:
    w = wl.w3_lt(100)
    out = w.run()  # W3 reveals the 0/1 result inside the timed run
    assert out.shape == (100,) and set(out.to(int).unique().tolist()) <= {0, 1}
    assert w.check()["mismatches"] == 0


def test_round_trip_workload() -> None:
    row = wl.measure("W6", TINY["W6"], repeat=1)
    assert not wl.failures(row)
    # share + reconstruct: no protocol rounds, nothing between the parties, the client
    # sends the shares and fetches them back
    assert row["rounds"] == 0 and row["max_bytes_per_party"] == 0
    assert row["client_messages"] >= 4
    assert row["client_bytes_sent"] >= 2 * 100 * 8


@pytest.mark.parametrize("workload", ["P1", "P2"])
def test_pointer_overhead(workload: str) -> None:
    row = wl.measure(workload, TINY[workload], repeat=3)
    assert not wl.failures(row)
    assert row["median_s"] > 0 and row["plain_s"] > 0
    assert row["messages_per_op"] >= 1
    assert row["bytes_per_message"] > 0
    assert "overhead_us" in row
    assert workload in wl.format_table([row])


def test_cases_cover_the_workload_sizes() -> None:
    ids = {c.id for c in wl.MPC_CASES}
    assert {
        "W1-mul-1e5",
        "W1-mul-1e6",
        "W2-matmul-256x256",
        "W3-lt-1e4",
        "W3-lt-1e5",
        "W3-lt-1e6",
        "W4-relu-1e5",
        "W4-relu-1e6",
        "W5-lenet-b1",
        "W5-lenet-b64",
        "W6-roundtrip-1e6",
    } <= ids
    assert all(c.rounds >= 5 for c in wl.MPC_CASES)
    assert {c.id for c in wl.MPC_CASES if c.big} == {
        "W1-mul-1e6",
        "W3-lt-1e6",
        "W4-relu-1e6",
        "W5-lenet-b64",
    }
