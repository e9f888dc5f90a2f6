"""Runs a notebook's code cells as Jupyter would: in order, in one namespace, the value of a
cell's last expression displayed (``repr``) and kept in the output history (``Out``: a
displayed pointer keeps its object alive, as in Jupyter), ``%%time`` as a cell magic. Used by
tests/test_pysyft_notebooks.py on the PySyft tutorials' cells (pysyft_notebook_cells.py)."""

from __future__ import annotations

import ast
import re
import time
from typing import Any


class CellError(AssertionError):
    """A cell raised: names the notebook and the cell, and chains the error."""


def run_cell(source: str, namespace: dict[str, Any], where: str = "<cell>") -> Any:
    """Run one cell; returns the displayed value (the last expression's), or None."""
    lines = source.split("\n")
    magic = lines[0].strip() if lines else ""
    if magic.startswith("%%"):
        if magic != "%%time":
            raise ValueError(f"{where}: cell magic {magic!r} is not supported")
        start = time.perf_counter()
        out = run_cell("\n".join(lines[1:]), namespace, where)
        print(f"Wall time: {time.perf_counter() - start:.2f} s")
        return out
    tree = ast.parse(source, filename=where)
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, where, "exec"), namespace)
    if last is None:
        return None
    value = eval(compile(last, where, "eval"), namespace)
    if value is not None:  # Jupyter displays it and keeps it in its output history
        namespace["_"] = value
        namespace.setdefault("Out", []).append(value)
        print(repr(value))
    return value


def run_notebook(
    cells: list[tuple[int, str]],
    name: str,
    after: dict[int, str] | None = None,
    raises: dict[int, tuple[type[BaseException], str]] | None = None,
    namespace: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Run every cell; a failing cell raises :class:`CellError` naming it. ``after``: code
    run after a cell (a test's shorter setting, e.g. fewer epochs), by cell number.
    ``raises``: cells expected to fail, by number, with the error's type and a regular
    expression its message matches (the notebook goes on after them, as Jupyter does); a
    listed cell that runs, or fails otherwise, raises :class:`CellError`. ``namespace``: the
    globals to run in (default: a fresh ``__main__``-named one; a notebook that pickles its
    own classes needs a module's, as Jupyter's ``__main__`` is)."""
    if namespace is None:
        namespace = {"__name__": "__main__"}
    after = dict(after or {})
    raises = dict(raises or {})
    for number, source in cells:
        where = f"{name}, cell {number}"
        expected = raises.pop(number, None)
        try:
            run_cell(source, namespace, where)
            if number in after:
                exec(after.pop(number), namespace)
        except Exception as e:
            if expected is not None and isinstance(e, expected[0]):
                if re.search(expected[1], str(e)):
                    continue
            raise CellError(f"{where} failed: {type(e).__name__}: {e}\n---\n{source}") from e
        if expected is not None:
            raise CellError(f"{where} ran, but should raise {expected[0].__name__}")
    if after or raises:
        raise ValueError(f"{name}: no cells {sorted([*after, *raises])}")
    return namespace
