"""pytest-benchmark tests of the pointer layer's per-op overhead.

P1 times ``p + p`` on a 10-element tensor at a VirtualWorker (the op is posted, no reply
value awaited) against the same local ``t + t``; P2 adds the ``.get()`` round trip. The
extra info holds the overhead per op in microseconds and the bytes per message.
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.workloads import (
    POINTER_CASES,
    RESULTS,
    Case,
    failures,
    finish,
    format_row,
    profile,
    timings,
)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in POINTER_CASES])
def test_pointer_overhead(benchmark: Any, case: Case) -> None:
    w = case.build()
    benchmark.group = "pointers"
    benchmark(w.run)
    row = finish(profile(w), timings(benchmark, w.run))
    benchmark.extra_info.update(row)
    RESULTS.append(row)
    print("\n" + format_row(row))
    assert not failures(row), failures(row)
