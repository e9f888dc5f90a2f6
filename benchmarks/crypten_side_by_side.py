"""Ours (network workers) against CrypTen 0.4.1 (2 processes over gloo), in one run.

Run by hand only (the test suite never imports it). CrypTen lives in its own virtual
environment, since it pins old dependencies::

    python3 -m venv /tmp/cvenv
    SKLEARN_ALLOW_DEPRECATED_SKLEARN_PACKAGE_INSTALL=True \\
        /tmp/cvenv/bin/pip install -c constraints.txt torch==2.13.0 crypten==0.4.1
    .venv/bin/python benchmarks/crypten_side_by_side.py --crypten-python /tmp/cvenv/bin/python

CrypTen 0.4.1 needs the deprecated ``sklearn`` placeholder package (hence the variable
above), and its ONNX converter imports ``torch.onnx._internal.registration``, which torch
2.13 no longer has: this script puts an empty stand-in module there before importing
crypten (only ``crypten.nn.from_onnx``/``from_pytorch`` would need it; LeNet is built
from ``crypten.nn`` modules instead).

The script first times CrypTen's workloads (this file run by ``--crypten-python`` with
``--crypten-only``: 2 ranks, one torch thread each, gloo over loopback, CrypTen's default
trusted-first-party provider; each op timed at rank 0, median of ``--repeat`` runs after
one warm-up), then ours (``python -m benchmarks --network``: 3 worker processes, mutual
TLS), and prints both with the ratio ours / CrypTen. Same workloads as WORKLOADS.md: W1 mul
1e5 and 1e6 (with truncation), W2 matmul 256, W3 compare 1e4 and 1e6 (revealing the 0/1
result), W5 LeNet batch 1 (model and input private), W6 share + reconstruct 1e6.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = [("W1", 100_000), ("W1", 1_000_000), ("W2", 256), ("W3", 10_000), ("W3", 1_000_000)]
CASES += [("W5", 1), ("W6", 1_000_000)]
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------- CrypTen side


def _crypten_worker(cases: list[list[Any]], repeat: int) -> dict[str, float]:
    """Runs in each CrypTen rank; returns rank 0's medians by case id."""
    import crypten
    import crypten.communicator as comm
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out: dict[str, float] = {}
    for wid, n in cases:
        run = _crypten_case(crypten, torch, wid, n)
        run()
        times = []
        for _ in range(repeat):
            comm.get().barrier()
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
        out[f"{wid}-{n}"] = statistics.median(times)
    return out if comm.get().get_rank() == 0 else {}


def _crypten_case(crypten: Any, torch: Any, wid: str, n: int) -> Any:
    if wid in ("W1", "W3"):
        x = crypten.cryptensor(torch.randn(n), src=0)
        y = crypten.cryptensor(torch.randn(n), src=1)
        if wid == "W1":
            return lambda: x * y
        return lambda: (x < y).get_plain_text()
    if wid == "W2":
        a = crypten.cryptensor(torch.randn(n, n), src=0)
        b = crypten.cryptensor(torch.randn(n, n), src=1)
        return lambda: a.matmul(b)
    if wid == "W5":
        cnn = crypten.nn
        model = cnn.Sequential(
            cnn.Conv2d(1, 16, 5),
            cnn.ReLU(),
            cnn.MaxPool2d(2),
            cnn.Conv2d(16, 16, 5),
            cnn.ReLU(),
            cnn.MaxPool2d(2),
            cnn.Flatten(),
            cnn.Linear(256, 100),
            cnn.ReLU(),
            cnn.Linear(100, 10),
        )
        model.encrypt(src=0)
        model.eval()
        x = crypten.cryptensor(torch.rand(n, 1, 28, 28), src=1)
        return lambda: model(x)
    if wid == "W6":
        plain = torch.randn(n)
        return lambda: crypten.cryptensor(plain, src=0).get_plain_text()
    raise ValueError(f"unknown workload {wid}")


def crypten_only(cases: list[list[Any]], repeat: int, out: str) -> None:
    import types

    # crypten 0.4.1's ONNX converter imports a module torch 2.13 no longer has
    sys.modules.setdefault(
        "torch.onnx._internal.registration",
        types.ModuleType("torch.onnx._internal.registration"),
    )
    sys.modules["torch.onnx._internal.registration"].registry = None  # type: ignore[attr-defined]
    import crypten
    import crypten.mpc

    results: dict[str, float] = {}

    @crypten.mpc.run_multiprocess(world_size=2)
    def job() -> dict[str, float]:
        return _crypten_worker(cases, repeat)

    for r in job():
        if r:
            results.update(r)
    Path(out).write_text(json.dumps({"crypten": results}))


# ----------------------------------------------------------------------- both sides


def _ours(repeat: int, latency: float) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ours.json")
        cmd = [
            sys.executable, "-m", "benchmarks", "--network", "--no-progress",
            "--repeat", str(repeat), "--json", path,
            "--workloads", "W1,W2,W3,W5,W6", "--sizes", "1e5,1e6", "--sizes", "W2=256",
            "--sizes", "W3=1e4,1e6", "--sizes", "W5=1", "--sizes", "W6=1e6",
        ]  # fmt: skip
        if latency:
            cmd += ["--latency-ms", f"{latency:g}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows = json.loads(Path(path).read_text())["rows"]
    out = {}
    for r in rows:
        if r["workload"] == "W6" and r["elements"] != 1_000_000:
            continue
        if r["workload"] == "W1" and r["elements"] not in (100_000, 1_000_000):
            continue
        n = r["elements"] if r["workload"] != "W2" else 256
        n = 1 if r["workload"] == "W5" else n
        out[f"{r['workload']}-{n}"] = r["median_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crypten-python", default="/tmp/cvenv/bin/python")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--crypten-only", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cases = [[w, n] for w, n in CASES]
    if args.crypten_only:
        crypten_only(cases, args.repeat, args.crypten_only)
        return 0
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "crypten.json")
        subprocess.run(
            [args.crypten_python, __file__, "--crypten-only", path, "--repeat", str(args.repeat)],
            check=True,
        )
        theirs = json.loads(Path(path).read_text())["crypten"]
    ours = _ours(args.repeat, 0.0)
    load_after = os.getloadavg()
    print(f"load before {load_before}, after {load_after}; {time.strftime('%Y-%m-%d %H:%M')}")
    print("| workload | ours, network | CrypTen 0.4.1 | ratio |")
    print("|---|---|---|---|")
    for wid, n in CASES:
        key = f"{wid}-{n}"
        a, b = ours.get(key), theirs.get(key)
        ratio = f"{a / b:.2f}x" if a and b else "-"
        fa = f"{a * 1e3:.1f} ms" if a else "-"
        fb = f"{b * 1e3:.1f} ms" if b else "-"
        size = f"1e{len(str(n)) - 1}" if n >= 1000 and str(n).strip("0") == "1" else str(n)
        print(f"| {wid} {size} | {fa} | {fb} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
