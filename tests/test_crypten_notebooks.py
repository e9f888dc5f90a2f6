"""CrypTen's tutorials 1-4 and 7 (the training tutorial), their real code cells, run with only
the import lines changed (``import crypten`` -> ``import mpc.crypten as crypten``), as
Jupyter runs them (notebook_runner.py). The cells, their source and licence, and the cells
replaced because they download MNIST or load a file from CrypTen's repository, are in
crypten_notebook_cells.py. What each tutorial prints is checked against plaintext torch.

Tutorial 2's three cells on binary (XOR) sharing raise :class:`mpc.crypten.NotAvailableError`,
which names what to use instead: XOR sharing is internal to the comparison protocol here.
The rest of tutorial 2 runs, showing each rank's share and each source's value.

Tutorials 3 and 7 run as written under ``-m slow`` (20-45 s each here), and with 15 epochs
and 20 images in the default run (a line run after the cell that sets them). Tutorials 2 and
4 run on served worker processes too (``crypten.init(served=True)`` after cell 1)."""

from __future__ import annotations

import copy
import fcntl
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from crypten_notebook_cells import NOTEBOOKS, mnist_utils
from notebook_runner import run_notebook

import mpc.crypten as crypten
from mpc.crypten import _world

pytest.importorskip("sklearn")

RING = 1 << 64
PRINTED = 5e-5  # the tutorials print 4 decimals


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """Runs a tutorial. The tutorials write fixed files in /tmp: one run at a time on this
    machine (a lock file). Tutorial 4's relative models/ path lands in ``tmp_path``. The
    notebook's globals are a module's, as Jupyter's ``__main__`` is (tutorial 4 pickles its
    AliceNet)."""
    monkeypatch.chdir(tmp_path)
    module = types.ModuleType("crypten_tutorial")
    sys.modules[module.__name__] = module
    with open("/tmp/tessera-crypten-tutorials.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)

        def run(name: str, **kwargs: Any) -> dict[str, Any]:
            return run_notebook(NOTEBOOKS[name][1], name, namespace=module.__dict__, **kwargs)

        try:
            yield run
        finally:
            crypten.uninit()
            torch.set_printoptions(profile="default")
            sys.modules.pop(module.__name__, None)


def printed(out: str, label: str, nth: int = 0) -> torch.Tensor:
    """The numbers of the ``tensor(...)`` printed after the ``nth`` occurrence of ``label``."""
    at = -1
    for _ in range(nth + 1):
        at = out.index(label, at + 1)
    start = out.index("tensor(", at) + len("tensor(")
    depth, end = 1, start
    while depth:
        depth += {"(": 1, ")": -1}.get(out[end], 0)
        end += 1
    body = out[start : end - 1].split("dtype=")[0]
    return torch.tensor([float(v) for v in re.findall(r"-?\d+\.?\d*(?:e[-+]?\d+)?", body)])


def printed_ints(out: str, label: str, nth: int = 0) -> list[int]:
    at = -1
    for _ in range(nth + 1):
        at = out.index(label, at + 1)
    start = out.index("tensor([", at) + len("tensor([")
    return [int(v) for v in re.findall(r"-?\d+", out[start : out.index("])", start)])]


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 0.0, atol: float = 0.0) -> bool:
    return torch.allclose(got, want.reshape(-1).float(), rtol=rtol, atol=atol + PRINTED)


# -- tutorial 1: basics --------------------------------------------------------------------


def test_tutorial_1_basics(notebook: Any, capsys: pytest.CaptureFixture[str]) -> None:
    ns = notebook("tutorial1")
    out = capsys.readouterr().out
    assert torch.equal(ns["x_dec"], torch.tensor([1.0, 2.0, 3.0]))  # cell 3
    assert torch.equal(ns["y_dec"], torch.tensor([4.0, 5.0, 6.0]))
    x, y = torch.tensor([1.0, 2.0, 3.0]), 2.0  # cell 5
    exact = 2.0**-16
    for what, want in [
        ("addition", x + y),
        ("subtraction", x - y),
        ("multiplication", x * y),
        ("division", x / y),
    ]:
        assert close(printed(out, f"Public  {what}:"), want, atol=exact), what
        assert close(printed(out, f"Private {what}:"), want, rtol=5.2e-5, atol=exact), what
    x, y = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0]), torch.tensor([5.0, 4.0, 3.0, 2.0, 1.0])
    for op, want in [  # cell 7: encrypted 0./1.
        ("(x < y) ", x < y),
        ("(x <= y)", x <= y),
        ("(x > y) ", x > y),
        ("(x >= y)", x >= y),
        ("(x == y)", x == y),
        ("(x != y)", x != y),
    ]:
        for kind in ("Public ", "Private"):
            assert torch.equal(printed(out, f"{kind} {op}:"), want.float()), (kind, op)
    x = torch.tensor([0.1, 0.3, 0.5, 1.0, 1.5, 2.0, 2.5], dtype=torch.float64)  # cell 9
    # the engine's measured errors (docs/secret-sharing.md), with the inputs' encoding error
    for what, want, rtol, atol in [
        ("reciprocal", x.reciprocal(), 3e-4, 0.0),
        ("logarithm", x.log(), 0.0, 3e-4),
        ("exponential", x.exp(), 3e-4, 0.0),
        ("square root", x.sqrt(), 3e-4, 0.0),
        ("tanh", x.tanh(), 0.0, 3e-4),
    ]:
        assert close(printed(out, f"Public  {what}:"), want)
        assert close(printed(out, f"Private {what}:"), want, rtol, atol), what
    assert 'RuntimeError caught: "an encrypted tensor has no truth value' in out  # cell 11
    assert "crypten.where" in out.split("RuntimeError caught")[1].split("\n")[0]
    assert torch.equal(printed(out, "z:"), torch.tensor([2.0]))
    assert torch.equal(printed(out, "z:", 1), torch.tensor([2.0]))
    assert torch.equal(printed(out, "Indexing:"), torch.tensor([1.0, 2.0]))  # cell 13
    assert torch.equal(printed(out, "Concatenation:"), torch.arange(1.0, 7.0))
    assert torch.equal(printed(out, "Stacking:"), torch.arange(1.0, 7.0))
    assert "Stacking:\n tensor([[1., 2., 3.],\n        [4., 5., 6.]])" in out
    assert "Reshaping:\n tensor([[1., 2., 3., 4., 5., 6.]])" in out


# -- tutorial 2: inside CrypTensors -----------------------------------------------------------


BINARY = (crypten.NotAvailableError, r"binary \(XOR\) sharing exists only inside the comparison")


def _tutorial_2(run: Any, capsys: pytest.CaptureFixture[str]) -> None:
    run("tutorial2", raises={3: BINARY, 7: BINARY, 9: BINARY})
    out = capsys.readouterr().out
    assert "x_enc internal type: ptype.arithmetic" in out  # cell 3, before its binary line
    # cell 5: each rank prints its own share; the two add up to the encoding of [1, 2, 3]
    assert out.index("Rank 0:\n MPCTensor(") < out.index("Rank 1:\n MPCTensor(")
    shares = [printed_ints(out, f"Rank {r}:\n MPCTensor(\n\t_tensor=") for r in (0, 1)]
    encoded = [(a + b) % RING for a, b in zip(*shares)]
    assert encoded == [1 << 16, 2 << 16, 3 << 16]
    assert all(s % RING not in encoded for share in shares for s in share)
    # cell 11: each rank's tensor, then each source's value decrypted (3 ranks)
    assert "Rank 0: 0\nRank 1: 1\nRank 2: 2\n" in out
    assert "Source 0: 0.0\nSource 1: 1.0\nSource 2: 2.0\n" in out


def test_tutorial_2_inside_cryptensors(notebook: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _tutorial_2(notebook, capsys)


# -- tutorial 3: access control (linear SVMs on shared data) -----------------------------------


def _tutorial_3(run: Any, capsys: pytest.CaptureFixture[str], epochs: int, floor: float) -> None:
    run("tutorial3", after={3: f"epochs = {epochs}"} if epochs != 40 else None)
    out = capsys.readouterr().out
    tests = [float(v) for v in re.findall(r"Test accuracy (\d+\.\d+)%", out)]
    assert len(tests) == 4
    # scenarios 1-3 train from random weights: the same training in plaintext reaches 90-98%
    # in 40 epochs, 83-96% in 15, over 20 initialisations (test_crypten.py compares it step
    # by step from the same start)
    assert all(t >= floor for t in tests[:3]), tests
    assert tests[3] == 100.0  # scenario 4: the true weights, as the tutorial says
    found = re.findall(r"Epoch (\d+) --- Training Accuracy (\d+\.\d+)%", out)
    assert [int(e) for e, _ in found] == list(range(epochs)) * 3
    for k in range(3):  # each scenario learns
        accuracy = [float(a) for _, a in found[epochs * k : epochs * (k + 1)]]
        assert max(accuracy[-3:]) >= floor and accuracy[-1] > accuracy[0], accuracy


@pytest.mark.slow
def test_tutorial_3_access_control_as_written(
    notebook: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _tutorial_3(notebook, capsys, 40, 85.0)  # 40 epochs: 20-45 s here


def test_tutorial_3_access_control_fifteen_epochs(
    notebook: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _tutorial_3(notebook, capsys, 15, 75.0)


# -- tutorial 4: classification with an encrypted network ------------------------------------------


def _tutorial_4(run: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    ns = run("tutorial4")
    out = capsys.readouterr().out
    assert "Model successfully encrypted: True" in out
    assert "Output tensor encrypted: True" in out
    # the same 100 images (the stand-in writes them again, elsewhere), in plaintext
    mnist_utils(f"--option train_v_test --dest {tmp_path}")
    images = torch.load(tmp_path / "bob_test.pth")[:100].flatten(start_dim=1)
    labels = ns["labels"][:100]
    with torch.no_grad():
        logits = ns["plaintext_model"](images)
    clear = logits.argmax(1)
    decrypted = printed(out, "Decrypted labels:").long()
    top2 = logits.topk(2, dim=1).values
    differ = decrypted != clear
    assert int(differ.sum()) <= 1 and bool((top2[differ, 0] - top2[differ, 1] < 1e-2).all())
    accuracy = float(out.split("\tAccuracy: ")[1].split("\n")[0])
    assert accuracy == pytest.approx(100.0 * float((decrypted == labels).float().mean()))
    assert abs(accuracy - 100.0 * float((clear == labels).float().mean())) <= 1.0
    assert accuracy > 85.0  # of 100 held-out digits


def test_tutorial_4_encrypted_classification(
    notebook: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _tutorial_4(notebook, capsys, tmp_path)


# -- tutorial 7: training an encrypted network ------------------------------------------------


def _tutorial_7(run: Any, capsys: pytest.CaptureFixture[str], **kwargs: Any) -> None:
    ns = run("tutorial7", **kwargs)
    out = capsys.readouterr().out
    losses = [float(v) for v in re.findall(r"Epoch: \d Loss: (\d+\.\d+)", out)]
    # cell 9's training, in plaintext, from the same weights and data
    model = copy.deepcopy(ns["model_plaintext"]).train()
    x, y = ns["x_small"], ns["y_one_hot"]
    clear = []
    for _ in range(ns["num_epochs"]):
        loss = F.mse_loss(model(x), y)
        model.zero_grad()
        loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= ns["learning_rate"] * p.grad
        clear.append(loss.item())
    assert losses == pytest.approx(clear, abs=1e-3)
    decrypted = dict(ns["model"].decrypt().module.named_parameters())
    for name, p in model.named_parameters():
        assert torch.allclose(decrypted[name], p, atol=2e-3), name
    # cell 11: both feature sets, 28 x 20 and 28 x 8, concatenated into the network's shape
    assert "torch.Size([100, 28, 20])\ntorch.Size([100, 28, 8])" in out


@pytest.mark.slow
def test_tutorial_7_encrypted_training_as_written(
    notebook: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _tutorial_7(notebook, capsys)  # 100 images: 8-30 s here


# the default run trains on 20 of cell 8's 100 random images
TWENTY = "x_small, y_one_hot = x_small[:20], y_one_hot[:20]; x_train, y_train = x_train[:20], y_train[:20]"


def test_tutorial_7_encrypted_training_twenty_images(
    notebook: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _tutorial_7(notebook, capsys, after={8: TWENTY})


# -- the same notebooks on served worker processes ---------------------------------------------------


SERVED = {1: "crypten.init(served=True)  # (the test's: served workers)"}


@pytest.mark.slow
@pytest.mark.network
def test_tutorial_2_on_served_workers(notebook: Any, capsys: pytest.CaptureFixture[str]) -> None:
    _tutorial_2(lambda name, **kw: notebook(name, after=SERVED, **kw), capsys)
    parties = _world.setup().session(3).parties
    assert [type(p).__name__ for p in parties] == ["NetworkWorker"] * 3
    assert [p.id for p in parties] == ["party0", "party1", "party2"]


@pytest.mark.slow
@pytest.mark.network
def test_tutorial_4_on_served_workers(
    notebook: Any, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    _tutorial_4(lambda name, **kw: notebook(name, after=SERVED, **kw), capsys, tmp_path)


# -- every module path the tutorials import ----------------------------------------------------


def test_every_crypten_path_the_tutorials_import() -> None:
    import ast
    import importlib

    paths = set()
    for _title, cells in NOTEBOOKS.values():
        for _number, source in cells:
            for node in ast.walk(ast.parse(source)):
                if isinstance(node, ast.Import):
                    paths.update(a.name for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module:
                    paths.add(node.module)
    ours = {p for p in paths if p.startswith("mpc.crypten")}
    assert ours == {"mpc.crypten", "mpc.crypten.mpc", "mpc.crypten.communicator"}
    for path in sorted(paths):
        importlib.import_module(path)
