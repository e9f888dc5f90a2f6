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


def test_comparison_thresholds_trade_rounds(capsys: pytest.CaptureFixture, tmp_path: Path) -> None:
    """--two-round-up-to and --three-round-up-to set MPCConfig's thresholds for every
    session: a comparison of 64 elements by digit look-ups by default, by the 3-round carry
    tree without them, the 4-round one without either; each row says what it set."""
    got = {}
    for name, extra in [
        ("default", []),
        ("tree", ["--two-round-up-to", "none"]),
        ("four", ["--two-round-up-to", "0", "--three-round-up-to", "2^0"]),
    ]:
        out_json = tmp_path / f"{name}.json"
        argv = ["--workloads", "W3", "--sizes", "64", "--repeat", "1", "--no-progress"]
        assert main([*argv, *extra, "--json", str(out_json)]) == 0
        (row,) = json.loads(out_json.read_text())["rows"]
        assert row["mismatches"] == 0
        got[name] = row
    out = capsys.readouterr().out
    assert "W3 lt (2r<=none)" in out and "W3 lt (2r<=0, 3r<=2^0)" in out
    assert "two_round_up_to" not in got["default"]
    assert got["tree"]["two_round_up_to"] is None
    assert (got["four"]["two_round_up_to"], got["four"]["three_round_up_to"]) == (0, 1)
    rounds = [got[n]["rounds"] for n in ("default", "tree", "four")]
    assert rounds[1] == rounds[0] + 1 and rounds[2] == rounds[1] + 1, rounds


def test_comparison_threshold_option_errors(capsys: pytest.CaptureFixture) -> None:
    from benchmarks.security import parse_threshold

    assert [parse_threshold(t) for t in ("none", "2^13", "0", " 4096 ")] == [None, 8192, 0, 4096]
    for text, why in [
        ("2^x", "not a count"),
        ("lots", "not a count"),
        ("-1", "not negative"),
        ("2^63", "0 to 62"),
        ("2^-1", "0 to 62"),
    ]:
        with pytest.raises(SystemExit) as exc:
            main(["--two-round-up-to", text, "--list"])
        assert exc.value.code == 2
        assert why in capsys.readouterr().err, text
