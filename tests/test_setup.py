"""The two set-up commands (`make demo`, `make test`) on a fresh clone, as `make -n` plans
them: the demo installs only what it runs on, each step says what it installs, and the
package index for torch's CPU build is the caller's to name."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def _plan(tmp_path: Path, target: str, *extra: str) -> list[str]:
    venv = tmp_path / "venv"  # (a fresh one: nothing installed, so every step is planned)
    out = subprocess.run(
        ["make", "-n", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}", target, *extra],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return out.splitlines()


def _installs(lines: list[str]) -> list[str]:
    return [line for line in lines if " -m pip install " in line]


def test_make_demo_installs_the_demo_extra_not_the_dev_tools(tmp_path: Path) -> None:
    lines = _plan(tmp_path, "demo")
    installs = _installs(lines)
    assert len(installs) == 2
    assert "torch==2.13.0" in installs[0] and "--index-url" not in installs[0]
    assert "-e '.[demo]'" in installs[1]
    assert not any("[dev]" in line for line in lines)
    says = [line for line in lines if line.startswith("echo") and "installing" in line]
    assert len(says) == 2 and "scikit-learn" in says[1]  # said before pip runs
    assert lines[-1].endswith("-m mpc.examples.demo")


def test_make_test_installs_the_dev_tools(tmp_path: Path) -> None:
    installs = _installs(_plan(tmp_path, "test"))
    assert "-e '.[dev]'" in installs[-1]


def test_torch_index_is_passed_to_the_torch_install_only(tmp_path: Path) -> None:
    url = "https://download.pytorch.org/whl/cpu"
    installs = _installs(_plan(tmp_path, "demo", f"TORCH_INDEX={url}"))
    assert f"--index-url {url}" in installs[0] and "torch==2.13.0" in installs[0]
    assert "--index-url" not in installs[1]  # (the project's own dependencies: pip's index)
