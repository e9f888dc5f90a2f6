"""``python -m benchmarks --security``: the malicious mode beside the semi-honest one (its
side-by-side table, its option errors), and ``python -m benchmarks.detection`` (randomized
deviations: every one that changes a value is caught)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import detection
from benchmarks.__main__ import main
from pointers.worker.faults import ALLOW_ENV


def test_security_both_prints_the_side_by_side_table(
    capsys: pytest.CaptureFixture, tmp_path: Path
) -> None:
    out_json = tmp_path / "rows.json"
    argv = ["--security", "both", "--workloads", "W1,W3", "--sizes", "64", "--repeat", "1"]
    assert main([*argv, "--no-progress", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "W1 mul (malicious)" in out and "W3 lt (malicious)" in out
    table = out[out.index("malicious against semi-honest") :].splitlines()
    assert [line.split()[0] for line in table[2:4]] == ["W1", "W3"]
    rows = json.loads(out_json.read_text())["rows"]
    modes = {(r["workload"], r["security"]): r for r in rows}
    assert set(modes) == {(w, s) for w in ("W1", "W3") for s in ("semi-honest", "malicious")}
    # the malicious mode's comparison: the opening of c, the 6 levels, the top bit's xor,
    # the output's opening and the MAC check's 4 rounds
    assert modes[("W3", "malicious")]["rounds"] == 13
    assert modes[("W3", "malicious")]["mismatches"] == 0
    for w in ("W1", "W3"):
        assert (
            modes[(w, "malicious")]["max_bytes_per_party"]
            > modes[(w, "semi-honest")]["max_bytes_per_party"]
        )


def test_security_option_errors(capsys: pytest.CaptureFixture) -> None:
    for argv, why in [
        (["--security", "malicious", "--comparison", "fss"], "FSS mode is semi-honest"),
        (["--security", "malicious", "--workloads", "W7"], "not W7"),
        (["--security", "both", "--workloads", "W5", "--plan"], "no --plan"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main([*argv, "--list"])
        assert exc.value.code == 2
        assert why in capsys.readouterr().err
    # without --workloads: the ones the malicious mode runs
    assert main(["--security", "malicious", "--quick", "--list"]) == 0
    ids = capsys.readouterr().out.split()
    assert {i.split("-")[0] for i in ids} == set(detection_workloads())


def detection_workloads() -> tuple[str, ...]:
    from benchmarks.security import MALICIOUS_WORKLOADS

    return MALICIOUS_WORKLOADS


def test_detection_catches_every_deviation_that_changes_a_value(
    capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ALLOW_ENV, "1")  # (the tool sets it; restored after the test)
    assert detection.main(["--trials", "16", "--seed", "7"]) == 0
    out = capsys.readouterr().out
    assert "16 trials (seed 7)" in out and "undetected 0" in out
    assert "(100.0%)" in out
