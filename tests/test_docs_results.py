"""The results table of docs/benchmarks.md is what `python -m benchmarks.report` generates
from the committed results file, and the results file keeps rows of separate runs apart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import report, results


def test_the_docs_table_is_generated_from_the_committed_results_file():
    data = results.load(results.RESULTS)
    assert data["runs"], "benchmarks/results/latest.json holds no run"
    assert results.docs_table(results.DOCS) == results.render(data).strip(), (
        "docs/benchmarks.md is out of date: run `python -m benchmarks.report`"
    )
    assert report.main(["--check", "--no-plot"]) == 0


def test_every_committed_run_says_where_and_when_it_was_measured():
    for run in results.load(results.RESULTS)["runs"]:
        meta = run["meta"]
        for key in ("date", "commit", "cpu", "nproc", "load_before", "load_after", "command"):
            assert meta.get(key) is not None, (key, meta.get("command"))
        assert run["rows"]
        for row in run["rows"]:
            assert row["median_s"] > 0 and row["name"].startswith(row["workload"])


def _meta(command: str, **kw) -> dict:
    meta = {
        "date": "2026-01-01T00:00:00+00:00",
        "commit": "abc1234",
        "cpu": "test CPU",
        "nproc": 2,
        "load_before": [0.5, 0.5, 0.5],
        "load_after": [0.6, 0.5, 0.5],
        "command": command,
        "parties": 2,
        "repeat": 5,
    }
    return {**meta, **kw}


def _row(name: str, median: float, **kw) -> dict:
    workload, op, size = name.split("-", 2)
    row = {
        "workload": workload,
        "op": op,
        "size": size,
        "name": name,
        "elements": 10,
        "median_s": median,
        "cpu_median_s": median,
        "plain_s": 1e-6,
        "ratio": median / 1e-6,
        "elements_per_s": 10 / median,
        "rounds": 2,
        "max_bytes_per_party": 100,
        "dealer_s": 0.001,
        "max_abs_err": 1e-5,
    }
    return {**row, **kw}


def test_a_row_measured_again_replaces_the_old_one_in_its_setting_only():
    data = results.empty()
    results.add_run(data, _meta("first"), [_row("W1-mul-1e5", 0.01), _row("W3-lt-1e4", 0.02)])
    results.add_run(data, _meta("net", network=True), [_row("W1-mul-1e5", 0.05)])
    results.add_run(data, _meta("second"), [_row("W1-mul-1e5", 0.03)])
    commands = [run["meta"]["command"] for run in data["runs"]]
    assert commands == ["first", "net", "second"]
    first, net, second = data["runs"]
    assert [r["name"] for r in first["rows"]] == ["W3-lt-1e4"]  # W1 went to the new run
    assert [r["median_s"] for r in net["rows"]] == [0.05]  # another setting: kept
    results.add_run(data, _meta("third"), [_row("W3-lt-1e4", 0.04)])
    assert [run["meta"]["command"] for run in data["runs"]] == ["net", "second", "third"]


def test_a_row_with_the_comparison_thresholds_set_is_a_case_of_its_own():
    data = results.empty()
    results.add_run(data, _meta("default"), [_row("W16-decode-p32", 3.0)])
    set_ = {"two_round_up_to": 1 << 22, "three_round_up_to": 1 << 24}
    slow = _row("W16-decode-p32", 4.0, op="decode (2r<=2^22, 3r<=2^24)", **set_)
    results.add_run(data, _meta("thresholds"), [slow])
    assert [[r["median_s"] for r in run["rows"]] for run in data["runs"]] == [[3.0], [4.0]]
    results.add_run(data, _meta("again"), [_row("W16-decode-p32", 4.5, **set_)])
    assert [run["meta"]["command"] for run in data["runs"]] == ["default", "again"]


def test_the_table_names_each_rows_run_and_each_runs_machine_and_load():
    data = results.empty()
    results.add_run(data, _meta("python -m benchmarks"), [_row("W1-mul-1e5", 0.0125)])
    results.add_run(
        data,
        _meta("python -m benchmarks --workloads W14", commit="def5678"),
        [_row("W14-bert-s128", 40.0)],
    )
    text = results.render(data)
    lines = text.splitlines()
    w1 = next(line for line in lines if line.startswith("| W1 mul"))
    w14 = next(line for line in lines if line.startswith("| W14 bert"))
    assert "12.50 ms" in w1 and w1.endswith("| 1 |")
    assert "40.000 s" in w14 and w14.endswith("| 2 |")
    assert "1. `python -m benchmarks`: 2026-01-01 00:00:00 UTC, commit `abc1234`" in text
    assert "commit `def5678`" in text and "0.50 0.50 0.50 before" in text


def test_the_page_is_rewritten_between_its_markers_only(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(f"before\n\n{results.BEGIN}\n\nold table\n\n{results.END}\n\nafter\n")
    data = results.empty()
    results.add_run(data, _meta("python -m benchmarks"), [_row("W1-mul-1e5", 0.01)])
    assert results.rewrite_docs(data, page)
    text = page.read_text()
    assert text.startswith("before\n") and text.endswith("\nafter\n")
    assert "old table" not in text and "| W1 mul |" in text
    assert not results.rewrite_docs(data, page)  # a second time changes nothing
    page.write_text("no markers\n")
    with pytest.raises(ValueError, match="markers"):
        results.rewrite_docs(data, page)


def test_record_writes_a_file_that_loads_back(tmp_path: Path):
    path = tmp_path / "results.json"
    results.record(path, _meta("python -m benchmarks"), [_row("W1-mul-1e5", 0.01)])
    assert results.load(path)["runs"][0]["rows"][0]["name"] == "W1-mul-1e5"
    path.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a results file"):
        results.load(path)


def test_the_plot_is_drawn_from_the_results_file(tmp_path: Path):
    pytest.importorskip("matplotlib")
    out = report.plot_results(results.load(results.RESULTS), tmp_path / "plot.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_line_records_a_run_and_replaces_it_when_run_again(tmp_path: Path, capsys):
    from benchmarks.__main__ import main

    path = tmp_path / "results.json"
    argv = ["--workloads", "W1", "--sizes", "1e3", "--repeat", "1", "--no-progress"]
    assert main([*argv, "--record", str(path)]) == 0
    assert main([*argv, "--record", str(path)]) == 0
    (run,) = results.load(path)["runs"]  # the second run replaced the first's row
    assert run["meta"]["command"] == "python -m benchmarks " + " ".join(
        [*argv, "--record", str(path)]
    )
    assert run["meta"]["load_before"] is not None and run["meta"]["commit"]
    assert [r["name"] for r in run["rows"]] == ["W1-mul-1e3"]
    page = tmp_path / "page.md"
    page.write_text(f"{results.BEGIN}\n{results.END}\n")
    assert report.main([str(path), "--docs", str(page), "--no-plot"]) == 0
    assert "| W1 mul | 1e3 |" in page.read_text()
    assert report.main([str(path), "--docs", str(page), "--check"]) == 0


def test_the_table_shows_the_dealers_bytes_or_that_they_were_dealt_ahead():
    data = results.empty()
    inline = _row("W16-decode-p32", 3.0, dealer_bytes=353_600_000)
    results.add_run(data, _meta("inline"), [inline])
    ahead = _row("W16-decode-p32", 2.0, dealer_bytes=0, preprocess_s=2.5)
    results.add_run(data, _meta("ahead", preprocess=True), [ahead])
    lines = [line for line in results.render(data).splitlines() if line.startswith("| W16")]
    assert "| dealer B |" in results.render(data)
    assert "| 353.60 MB |" in lines[0] and "| ahead |" in lines[1]
