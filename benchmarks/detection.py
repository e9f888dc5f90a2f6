"""``python -m benchmarks.detection``: how often the malicious mode catches a cheating
party, over randomized trials.

Each trial runs one of a few programs (products and truncations; comparisons, ReLU and
max; a small CNN with max-pooling; a shared model queried twice, its weights masked once;
the last three also with ``comparison="fss"``) on 2 or 3
in-process parties with ``security="malicious"``, with one party deviating once: at a protocol step it ran in an
honest run of the same program (chosen at random, and which of its calls), it adds an
error (1, 2^16, 2^63 or a random word) to a random word of one of its outputs (for a
share, a piece or a residual: in the low 64 bits, the value's; the high 64 bits are
checked only as far as they can matter). Outcomes: **caught** (``get()`` raised
:class:`mpc.MACCheckError`, no value reached the client), **aborted** (another error,
no value), **harmless** (the value was right: the error never reached an opened or
output value) and **undetected** (a wrong value reached the client). The goal: 0
undetected.

Fault injection is for tests: this tool sets ``POINTERS_ALLOW_FAULTS=1`` for its own
process (:mod:`pointers.worker.faults`)."""

from __future__ import annotations

import argparse
import collections
import os
import random
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import mpc
import pointers as pt
from pointers.worker.faults import ALLOW_ENV, Fault, inject

ERRORS = (1, 1 << 16, 1 << 63, None)  # None: a random word
# (step, output) of the kept outputs that stack several shares, then their limbs: the
# truncation's U and H
STACKED = {("mpc.auth_trunc_mask", 2)}
X = torch.tensor([1.5, 2.0, -0.5, 3.0])
Y = torch.tensor([2.0, 3.0, 1.0, -1.0])
PUB = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
IMG = torch.linspace(-1, 1, 2 * 6 * 6).reshape(2, 1, 6, 6)
KERNEL = torch.tensor([[[[0.5, -0.25], [0.75, 0.1]]]])


def products(x: Any, y: Any) -> Any:
    return (((x * y + 1.0) * y).reshape(2, 2) @ PUB).sum(0) * 3


def comparisons(x: Any, y: Any) -> Any:
    return torch.maximum(torch.relu(x), y) + (x < y)


def cnn(img: Any, kernel: Any) -> Any:
    return F.max_pool2d(torch.relu(F.conv2d(img, kernel)), 2).sum((1, 2, 3))


def model(img: Any, _: Any) -> Any:
    """A shared model queried twice: the first query makes its weights' instances (F
    opened), the second uses them (mpc.protocols.auth_weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(32, 2))
    shared = mpc.share(net.eval(), session=img.session)
    return shared(img) + shared(img)


#: name -> (function, its two inputs, the comparison protocol: "fss" runs on 2 parties)
PROGRAMS: dict[str, tuple[Callable[[Any, Any], Any], torch.Tensor, torch.Tensor, str]] = {
    "products": (products, X, Y, "default"),
    "comparisons": (comparisons, X, Y, "default"),
    "comparisons (fss)": (comparisons, X, Y, "fss"),
    "cnn": (cnn, IMG, KERNEL, "default"),
    "cnn (fss)": (cnn, IMG, KERNEL, "fss"),
    "model": (model, IMG, KERNEL, "default"),
    "model (fss)": (model, IMG, KERNEL, "fss"),
}


def _run(name: str, n: int, fault: tuple[int, Fault] | None = None) -> torch.Tensor:
    fn, a, b, comparison = PROGRAMS[name]
    workers = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    s = mpc.Session(
        workers, pt.VirtualWorker("dealer"), security="malicious", comparison=comparison
    )
    if fault is not None:
        inject(workers[fault[0]].functions, fault[1])
    x, y = mpc.share(a, session=s), mpc.share(b, session=s)
    return fn(x, y).get()


# per (party, step), per call, per output: its shape and whether it holds bytes
Calls = dict[tuple[int, str], list[list[tuple[tuple[int, ...], bool]]]]


def _spec(t: Any) -> tuple[tuple[int, ...], bool]:
    if not isinstance(t, torch.Tensor):
        return (), False
    return tuple(t.shape), t.dtype == torch.uint8


def honest_calls(name: str, n: int) -> tuple[Calls, torch.Tensor]:
    """What each party's protocol steps return in an honest run: per (party, step), per
    call, the shapes of its tensor outputs; and the honest output."""
    calls: Calls = collections.defaultdict(list)
    fn, a, b, comparison = PROGRAMS[name]
    workers = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    s = mpc.Session(
        workers, pt.VirtualWorker("dealer"), security="malicious", comparison=comparison
    )
    for i, w in enumerate(workers):
        for step in w.functions.names():
            if step.startswith("mpc.auth") or step.startswith("mpc.mac_check"):
                w.functions.replace(step, _recording(w.functions.get(step), calls, (i, step)))
    out = fn(mpc.share(a, session=s), mpc.share(b, session=s)).get()
    return dict(calls), out


def _recording(fn: Callable[..., Any], calls: Calls, key: tuple[int, str]) -> Callable[..., Any]:
    def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        out = fn(ctx, *args, **kwargs)
        outs = out if isinstance(out, list | tuple) else [out]
        calls[key].append([_spec(t) for t in outs])
        return out

    for attr in ("__sealing__", "__size__", "__step__"):
        if hasattr(fn, attr):
            setattr(run, attr, getattr(fn, attr))
    import inspect

    run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    return run


def draw_fault(rng: random.Random, calls: Calls) -> tuple[int, Fault]:
    """A random deviation among the steps the parties ran: (party, fault)."""
    (party, step), per_call = rng.choice(sorted(calls.items()))
    k = rng.randrange(len(per_call))
    outputs = [(j, sh, b) for j, (sh, b) in enumerate(per_call[k]) if sh and 0 not in sh]
    output, shape, nbytes = rng.choice(outputs)
    index = [rng.randrange(d) for d in shape]
    if not nbytes:
        # the low 64 bits: shares, pieces and residuals are laid out limbs first; a step
        # that keeps several shares stacks them first, then their limbs (an FSS
        # selection's u, r u and r)
        stacked = (step, output) in STACKED or (
            step == "mpc.auth_fss_mask" and output == 2 and shape[0] == 3
        )
        index[1 if stacked else 0] = 0
    e = rng.choice(ERRORS)
    error = rng.getrandbits(64) | 1 if e is None else e
    if nbytes:
        error = error % 255 + 1  # (an error of a byte: never 0 mod 2^8)
    return party, Fault(step, output, error, tuple(index), call=k + 1)


def trial(rng: random.Random, cache: dict[tuple[str, int], Any]) -> tuple[str, str, Fault]:
    name = rng.choice(sorted(PROGRAMS))
    n = 2 if PROGRAMS[name][3] == "fss" else rng.choice([2, 3])
    if (name, n) not in cache:
        cache[(name, n)] = honest_calls(name, n)
    calls, want = cache[(name, n)]
    party, fault = draw_fault(rng, calls)
    try:
        got = _run(name, n, (party, fault))
    except mpc.MACCheckError:
        return "caught", name, fault
    except Exception:  # noqa: BLE001 - any other abort: no value reached the client
        return "aborted", name, fault
    if torch.allclose(got.double(), want.double(), atol=1e-3, rtol=1e-4):
        return "harmless", name, fault
    return "undetected", name, fault


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.detection", description=__doc__)
    ap.add_argument("--trials", type=int, default=1000, help="randomized trials (default 1000)")
    ap.add_argument("--seed", type=int, default=None, help="the trials' seed (default: random)")
    ap.add_argument("--verbose", action="store_true", help="list the harmless deviations")
    args = ap.parse_args(argv)
    if args.trials < 1:
        ap.error("--trials must be at least 1")
    os.environ[ALLOW_ENV] = "1"  # (this process only: the tool injects the faults)
    seed = args.seed if args.seed is not None else random.SystemRandom().getrandbits(32)
    rng = random.Random(seed)
    torch.set_num_threads(1)
    counts: collections.Counter[str] = collections.Counter()
    by_step: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    undetected: list[str] = []
    cache: dict[tuple[str, int], Any] = {}
    start = time.perf_counter()
    for t in range(args.trials):
        outcome, name, fault = trial(rng, cache)
        counts[outcome] += 1
        by_step[fault.function.removeprefix("mpc.")][outcome] += 1
        if outcome == "undetected":
            undetected.append(f"{name}: {fault}")
        if outcome == "harmless" and args.verbose:
            print(f"  harmless: {name}: {fault}", file=sys.stderr)
        if (t + 1) % 100 == 0:
            print(f"  {t + 1} trials, {dict(counts)}", file=sys.stderr)
    took = time.perf_counter() - start
    print(f"{args.trials} trials (seed {seed}), {took:.0f} s: " + ", ".join(
        f"{k} {counts[k]}" for k in ("caught", "aborted", "harmless", "undetected")
    ))  # fmt: skip
    changed = args.trials - counts["harmless"]
    caught = counts["caught"] + counts["aborted"]
    print(
        f"deviations that changed a value: {changed}, caught {caught} ({caught / max(changed, 1):.1%})"
    )
    print("by step (caught/aborted/harmless/undetected):")
    for step, c in sorted(by_step.items()):
        print(f"  {step:28s} {c['caught']}/{c['aborted']}/{c['harmless']}/{c['undetected']}")
    for line in undetected:
        print(f"UNDETECTED: {line}", file=sys.stderr)
    return 1 if undetected else 0


if __name__ == "__main__":
    sys.exit(main())
