"""Every ```python block of README.md and docs/*.md runs, in order, one namespace per page."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks(page: Path) -> list[str]:
    return BLOCK.findall(page.read_text())


# (transformers.md builds and generates with models for 20 s: in the slow suite)
SLOW_PAGES = {"transformers.md"}


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, marks=pytest.mark.slow) if p.name in SLOW_PAGES else p
        for p in PAGES
        if _blocks(p)
    ],
    ids=lambda p: p.name,
)
def test_page_code_runs(page: Path) -> None:
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    blocks = _blocks(page)
    assert blocks, f"{page.name} has no python blocks"
    for i, block in enumerate(blocks):
        code = compile(block, f"{page.name}[block {i}]", "exec")
        exec(code, namespace)  # noqa: S102 - running our own documentation
