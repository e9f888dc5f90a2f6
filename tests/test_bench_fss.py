"""``python -m benchmarks --comparison fss|both`` (issue 25): the FSS mode runs the
workloads that compare, ``both`` prints the crossover table, and FSS refuses 3 parties;
the crossover arithmetic of benchmarks/crossover.py."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

try:
    from benchmarks import crossover
except ImportError:  # a bare `pytest` run without the repository root on sys.path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks import crossover


def _row(mode: str, rounds: int, sent: int, dealer: int, cpu: float, dealer_s: float) -> dict:
    return {
        "workload": "W3",
        "size": "1e3",
        "comparison": mode,
        "rounds": rounds,
        "max_bytes_per_party": sent,
        "dealer_bytes": dealer,
        "median_s": cpu * 2,
        "cpu_median_s": cpu,
        "dealer_s": dealer_s * 2,
        "dealer_cpu_s": dealer_s,
        "parties": 2,
    }


def test_crossover_latency() -> None:
    d = _row("default", 4, 21_000, 62_000, 0.010, 0.002)
    f = _row("fss", 1, 8_000, 3_048_000, 0.020, 0.015)
    # keys ahead: per party (0.010 - 0.002) / 2 vs (0.020 - 0.015) / 2: FSS is faster at
    # any latency
    assert crossover.crossover_latency(d, f, None, inline=False) == 0.0
    # inline, 100 Mbit/s: parties' time and the dealer's, (0.0175 - 0.006) + bytes, / 3
    want = (0.0175 - 0.006 + (3_056_000 - 83_000) * 8 / 100e6) / 3
    got = crossover.crossover_latency(d, f, 100.0, inline=True)
    assert got is not None and math.isclose(got, want)
    assert crossover.crossover_latency(d, _row("fss", 4, 1, 1, 0.0, 0.0), None, False) is None
    table = crossover.crossover_table([d, f])
    assert "W3" in table and "4/1" in table and "any" in table
    assert crossover.crossover_table([d, f], markdown=True).startswith("| workload")


def test_cli_fss_and_both(capsys: pytest.CaptureFixture) -> None:
    from benchmarks.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(["--comparison", "fss", "--parties", "3", "--list"])
    assert exc.value.code == 2
    assert "--comparison fss is for 2 parties" in capsys.readouterr().err
    argv = ["--comparison", "both", "--workloads", "W3,W4", "--sizes", "64", "--repeat", "1"]
    assert main([*argv, "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "W3 lt (fss)" in out and "W4 relu (fss)" in out
    assert "crossover: one-way latency" in out
