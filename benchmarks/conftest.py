"""Benchmark configuration: the ``big`` marker, ``--mpc-parties N``, one torch thread, and a
results table printed at the end of the run (the rows the benchmark tests measured)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from benchmarks.workloads import RESULTS, format_table


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--mpc-parties",
        type=int,
        default=2,
        help="computing parties for the MPC benchmarks, 2..5 (default 2, as docs/workloads.md)",
    )


@pytest.fixture
def parties(request: pytest.FixtureRequest) -> int:
    n = request.config.getoption("--mpc-parties")
    if not 2 <= n <= 5:
        raise pytest.UsageError(f"--mpc-parties must be 2..5, got {n}")
    return n


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "big: the 1e6-element and batch-64 cases (deselect with -m 'not big')"
    )


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    torch.set_num_threads(1)
    yield


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not RESULTS:
        return
    terminalreporter.section("MPC benchmark results (per run; bytes = max over parties)")
    for line in format_table(RESULTS, wide=True).splitlines():
        terminalreporter.write_line(line)
