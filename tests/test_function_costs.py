"""docs/secret-sharing.md's table of the non-linear functions' rounds and bytes is what
``python -m benchmarks.function_costs`` measures (rounds and bytes are exact)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import function_costs

DOCS = Path(__file__).resolve().parent.parent / "docs" / "secret-sharing.md"


def _docs_rows() -> dict[str, str]:
    """The rows of the costs table (the one whose header names the default rounds; the
    docs hold other tables keyed by the same functions, the accuracy table among them)."""
    rows: dict[str, str] = {}
    inside = False
    for line in DOCS.read_text().splitlines():
        if line.startswith("| function | default rounds |"):
            inside = True
            continue
        if inside and not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if inside and cells[0] in function_costs.FUNCTIONS and len(cells) == 7:
            assert cells[0] not in rows, f"{cells[0]} twice in the costs table"
            rows[cells[0]] = line
    return rows


def test_the_docs_table_names_every_function_once() -> None:
    assert sorted(_docs_rows()) == sorted(function_costs.FUNCTIONS)


def test_a_comparison_costs_what_the_docs_say() -> None:
    """One row measured again (the whole table: the slow test below)."""
    measured = function_costs.table(["x < y"]).splitlines()[-1]
    assert measured == _docs_rows()["x < y"]
    assert measured == "| x < y | 2 | 16 | 1,720 | 1 | 8 | 3,048 |"


@pytest.mark.slow
def test_the_docs_table_is_what_the_functions_cost() -> None:
    measured = function_costs.table().splitlines()[2:]
    docs = _docs_rows()
    assert [docs[line.split("|")[1].strip()] for line in measured] == measured, (
        "docs/secret-sharing.md is out of date: run `python -m benchmarks.function_costs`"
    )
