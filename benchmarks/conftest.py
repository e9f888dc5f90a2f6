"""Benchmark configuration: the ``big`` marker, one torch thread, and a results table
printed at the end of the run (the rows the benchmark tests measured)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from benchmarks.workloads import RESULTS, format_table


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
    for line in format_table(RESULTS).splitlines():
        terminalreporter.write_line(line)
