"""pytest-benchmark tests of the MPC workloads W1-W6 (docs/workloads.md) and max-pool (W7).

Each test shares its inputs, times ``run()`` with ``benchmark.pedantic`` (one warm-up
round), then records plaintext time, ratio, rounds, bytes and correctness in
``benchmark.extra_info`` and in the table printed at the end. Select with ``-k W3`` or
``-k 1e5``; skip the slow cases with ``-m 'not big'``; ``--mpc-parties 3`` for 3 parties.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from benchmarks.workloads import (
    MPC_CASES,
    RESULTS,
    Case,
    failures,
    finish,
    format_row,
    profile,
    timings,
)

# (W14-W16, minutes per case at full size, run only from `python -m benchmarks --workloads`)
CASES = [
    pytest.param(c, id=c.id, marks=[pytest.mark.big] if c.big else [])
    for c in MPC_CASES
    if not c.explicit
]


@pytest.mark.parametrize("case", CASES)
def test_mpc(benchmark: Any, case: Case, parties: int) -> None:
    w = replace(case, parties=parties).build()
    benchmark.group = f"{w.id}-{w.op}"
    benchmark.pedantic(w.run, rounds=case.repeats, warmup_rounds=1, iterations=1)
    row = finish(profile(w), timings(benchmark, w.run))
    benchmark.extra_info.update(row)
    RESULTS.append(row)
    print("\n" + format_row(row, wide=True))
    assert not failures(row), failures(row)
