"""benchmarks.step_overhead: the program and the op-by-op chain give the chain's result,
and the command line prints both figures (their values are measured, not asserted)."""

from __future__ import annotations

import pytest

from benchmarks import step_overhead


def test_both_figures_are_measured(capsys: pytest.CaptureFixture[str]) -> None:
    assert step_overhead.main(["--steps", "20", "--repeat", "1"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("a program step: ") and "us a command" in out


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(SystemExit):
        step_overhead.main(["--steps", "0"])
