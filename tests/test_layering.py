"""The layers import only downwards (docs/index.md has the map):

- ``pointers`` never imports ``mpc``;
- ``mpc.math`` (ring, prg, encoding, bits) imports neither ``pointers`` nor the rest of ``mpc``;
- importing ``pointers`` loads neither ``mpc`` nor the federated application layer, nor
  gRPC (network workers load on first use).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    package = parts[:-1] if parts[-1] != "__init__" else parts[:-1]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            out.add(mod)
            out.update(f"{mod}.{a.name}" for a in node.names)
    return out


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("path", _modules("pointers"), ids=lambda p: str(p.relative_to(ROOT)))
def test_pointers_never_imports_mpc(path: Path) -> None:
    bad = sorted(m for m in _imports(path) if m == "mpc" or m.startswith("mpc."))
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


@pytest.mark.parametrize("path", _modules("mpc/math"), ids=lambda p: str(p.relative_to(ROOT)))
def test_mpc_math_imports_no_pointers_and_no_protocols(path: Path) -> None:
    bad = sorted(
        m
        for m in _imports(path)
        if m == "pointers"
        or m.startswith("pointers.")
        or (m.startswith("mpc") and not m.startswith("mpc.math") and m != "mpc")
    )
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_importing_pointers_loads_only_its_core() -> None:
    code = (
        "import sys, pointers\n"
        "loaded = [m for m in sys.modules if m == 'mpc' or m.startswith('mpc.')"
        " or m.startswith('pointers.federated') or m.startswith('grpc')]\n"
        "print(loaded)\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
