"""Accuracy and rounds of the non-linear functions (issue 13, docs/workloads.md W11 inputs).

``python -m benchmarks.function_accuracy [--n 10000]`` prints a markdown table: for 2 and 3
parties, the max error against float64 torch on the issue's inputs, and the rounds of one
call (the table in docs/secret-sharing.md comes from this script).

``python -m benchmarks.function_accuracy --time [--n 100000] [--repeat 5]`` times each
function instead (2 parties + crypto provider in process, one torch thread): median and
process CPU time of one call, rounds and bytes per party, and the reference figures of
CrypTen 0.4.1 quoted in issue 13 where there is one.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import mpc
import pointers as pt

Case = tuple[str, str, Callable[[int, torch.Generator], Any], Callable[..., Any], str, float]


def _u(lo: float, hi: float) -> Callable[[int, torch.Generator], torch.Tensor]:
    return lambda n, g: torch.rand(n, generator=g, dtype=torch.float64) * (hi - lo) + lo


def _pm(lo: float, hi: float) -> Callable[[int, torch.Generator], torch.Tensor]:
    def draw(n: int, g: torch.Generator) -> torch.Tensor:
        sign = torch.randint(0, 2, (n,), generator=g, dtype=torch.float64) * 2 - 1
        return sign * _u(lo, hi)(n, g)

    return draw


def _randn(scale: float, shape: Callable[[int], tuple[int, ...]] = lambda n: (n,)) -> Any:
    return lambda n, g: torch.randn(shape(n), generator=g, dtype=torch.float64) * scale


def _division(n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(n, generator=g, dtype=torch.float64), _u(0.5, 10.0)(n, g)


CASES: list[Case] = [
    ("exp", "U(-8, 4)", _u(-8, 4), torch.exp, "rel", 1e-3),
    ("log", "U(0.01, 100)", _u(0.01, 100), torch.log, "abs", 1e-3),
    ("reciprocal", "±U(0.01, 100)", _pm(0.01, 100), torch.reciprocal, "rel", 1e-3),
    ("sqrt", "U(0.01, 100)", _u(0.01, 100), torch.sqrt, "rel", 1e-3),
    ("rsqrt", "U(0.01, 100)", _u(0.01, 100), torch.rsqrt, "rel", 1e-3),
    ("sigmoid", "4·randn", _randn(4), torch.sigmoid, "abs", 5e-4),
    ("tanh", "2·randn", _randn(2), torch.tanh, "abs", 1e-3),
    ("gelu", "2·randn", _randn(2), F.gelu, "abs", 1e-3),
    ("gelu (tanh)", "2·randn", _randn(2), lambda t: F.gelu(t, approximate="tanh"), "abs", 1e-3),
    ("silu", "2·randn", _randn(2), F.silu, "abs", 1e-3),
    (
        "softmax over 100",
        "2·randn",
        _randn(2, lambda n: (max(n // 100, 1), 100)),
        lambda t: torch.softmax(t, -1),
        "abs",
        5e-4,
    ),
    ("a / b", "a randn, b U(0.5, 10)", _division, lambda a, b: a / b, "abs", 1e-3),
]


def measure(n: int, parties: int, seed: int = 0) -> list[tuple[str, str, str, float, int, float]]:
    workers = [pt.VirtualWorker(f"p{i}") for i in range(parties)]
    dealer = pt.VirtualWorker("dealer")
    rows = []
    for name, inputs, draw, fn, kind, goal in CASES:
        g = torch.Generator().manual_seed(seed)
        xs = draw(n, g)
        xs = xs if isinstance(xs, tuple) else (xs,)
        shared = [mpc.share(x.float(), *workers, crypto_provider=dealer) for x in xs]
        with mpc.stats() as s:
            out = fn(*shared)
        got = out.get().double()
        ref = fn(*xs)
        err = (got - ref).abs()
        if kind == "rel":
            err = err / ref.abs()
        rows.append((name, inputs, kind, err.max().item(), s.rounds, goal))
    return rows


# CrypTen 0.4.1 on the same inputs, as quoted in issue 13 (2 processes, 1 thread each)
CRYPTEN = {
    "exp": (66e-3, 8),
    "reciprocal": (491e-3, 38),
    "sigmoid": (311e-3, 23),
}


def timing(n: int, repeat: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """Per function of :data:`CASES` at n elements: median wall and CPU seconds of one
    call (after a warm-up), rounds and max bytes sent per party."""
    torch.set_num_threads(1)
    workers = [pt.VirtualWorker(name) for name in ("alice", "bob")]
    dealer = pt.VirtualWorker("carol")
    rows = []
    for name, _, draw, fn, _, _ in CASES:
        xs = draw(n, torch.Generator().manual_seed(seed))
        xs = xs if isinstance(xs, tuple) else (xs,)
        shared = [mpc.share(x.float(), *workers, crypto_provider=dealer) for x in xs]
        fn(*shared)
        walls, cpus = [], []
        for _ in range(repeat):
            t0, c0 = time.perf_counter(), time.process_time()
            fn(*shared)
            walls.append(time.perf_counter() - t0)
            cpus.append(time.process_time() - c0)
        with mpc.stats() as s:
            fn(*shared)
        ref = CRYPTEN.get(name)
        rows.append(
            {
                "function": name,
                "median_s": statistics.median(walls),
                "cpu_s": statistics.median(cpus),
                "rounds": s.rounds,
                "bytes_per_party": s.max_bytes_per_party,
                "crypten_s": ref[0] if ref else None,
                "crypten_rounds": ref[1] if ref else None,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=None, help="elements per function")
    ap.add_argument("--time", action="store_true", help="time each function instead")
    ap.add_argument("--repeat", type=int, default=5, help="timed calls (--time)")
    args = ap.parse_args()
    if args.time:
        print("| function | median | cpu | rounds | bytes/party | CrypTen 0.4.1 | ratio |")
        print("|---|---|---|---|---|---|---|")
        for r in timing(args.n or 100_000, args.repeat):
            ct = r["crypten_s"]
            ref = f"{ct * 1e3:.0f} ms, {r['crypten_rounds']} rounds" if ct else "-"
            ratio = f"{r['median_s'] / ct:.2f}x" if ct else "-"
            print(
                f"| {r['function']} | {r['median_s'] * 1e3:.0f} ms | {r['cpu_s'] * 1e3:.0f} ms "
                f"| {r['rounds']} | {r['bytes_per_party'] / 1e6:.1f} MB | {ref} | {ratio} |"
            )
        return
    args.n = args.n or 10_000
    two, three = measure(args.n, 2), measure(args.n, 3)
    print("| function | inputs | error | 2 parties | 3 parties | goal | rounds |")
    print("|---|---|---|---|---|---|---|")
    for a, b in zip(two, three):
        print(f"| {a[0]} | {a[1]} | max {a[2]} | {a[3]:.1e} | {b[3]:.1e} | {a[5]:.0e} | {a[4]} |")


if __name__ == "__main__":
    main()
