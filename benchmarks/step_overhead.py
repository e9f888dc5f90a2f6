"""``python -m benchmarks.step_overhead``: what one step of a stored program costs a party,
against the same command sent op by op.

A chain of N additions of two shared values (one local step at each party: no material,
no round) is recorded once with :func:`mpc.plan`, then called; the same chain also runs op
by op. In-process workers (every party runs in this process, one torch thread): the CPU
time of a call over the 2 N steps it runs is what a step costs a party (the work of
looking up its bindings, running the op on the party's share and storing the result),
and op by op the same figure is the client's and the party's work for one command.
Best of ``--repeat`` calls.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import mpc
import pointers as pt


def chain(n: int) -> Callable[[Any, Any], Any]:
    def run(x: Any, y: Any) -> Any:
        for _ in range(n):
            x = x + y
        return x

    return run


def best_cpu(fn: Callable[[], Any], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        start = time.process_time()
        fn()
        best = min(best, time.process_time() - start)
    return best


def measure(n: int = 300, repeat: int = 7, elements: int = 4) -> tuple[float, float]:
    """(a program step's CPU at a party, an op-by-op command's CPU), in seconds."""
    torch.set_num_threads(1)
    alice, bob, carol = (pt.VirtualWorker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.zeros(elements), alice, bob, crypto_provider=carol)
    y = mpc.share(torch.ones(elements), alice, bob, crypto_provider=carol)
    fn = chain(n)
    program = mpc.plan(fn, x, y)
    expected = torch.full((elements,), float(n))
    for _ in range(2):  # (warm-up; and the program gives the chain's result)
        assert torch.allclose(program(x, y).clone().get(), expected)
    steps = 2 * n  # (two parties run n steps each)
    in_program = best_cpu(lambda: program(x, y).clone().get(), repeat) / steps
    op_by_op = best_cpu(lambda: fn(x, y).clone().get(), repeat) / steps
    return in_program, op_by_op


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=300, help="additions in the chain (300)")
    ap.add_argument("--repeat", type=int, default=7, help="calls timed, the best kept (7)")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.repeat < 1:
        ap.error("--steps and --repeat must be at least 1")
    in_program, op_by_op = measure(args.steps, args.repeat)
    print(
        f"a program step: {in_program * 1e6:.1f} us of CPU at a party; the same op by op: "
        f"{op_by_op * 1e6:.1f} us a command (client and party)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
