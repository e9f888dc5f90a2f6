"""Accuracy and rounds of the non-linear functions (issue 13, WORKLOADS.md W11 inputs).

``python -m benchmarks.function_accuracy [--n 10000]`` prints a markdown table: for 2 and 3
parties, the max error against float64 torch on the issue's inputs, and the rounds of one
call (the table in docs/secret-sharing.md comes from this script).
"""

from __future__ import annotations

import argparse
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=10_000, help="elements per function")
    args = ap.parse_args()
    two, three = measure(args.n, 2), measure(args.n, 3)
    print("| function | inputs | error | 2 parties | 3 parties | goal | rounds |")
    print("|---|---|---|---|---|---|---|")
    for a, b in zip(two, three):
        print(f"| {a[0]} | {a[1]} | max {a[2]} | {a[3]:.1e} | {b[3]:.1e} | {a[5]:.0e} | {a[4]} |")


if __name__ == "__main__":
    main()
