"""The rounds and bytes of every non-linear function on shares, in both comparison modes:
``python -m benchmarks.function_costs`` prints the table of docs/secret-sharing.md
("Rounds and bytes of the non-linear functions").

Each function runs once on about 4,096 elements (2 parties and a crypto provider, in
process, ``mpc.stats()``), on inputs inside its documented domain; bytes are per element
of the input (the row-wise functions' per-row costs spread over their rows' elements).
Rounds and bytes are exact and machine-independent.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

import mpc
import pointers as pt
from mpc.config import MPCConfig

N = 4096


def _gelu_tanh(x: Any) -> Any:
    return F.gelu(x, approximate="tanh")


# name: (function of the shared inputs, a function of a generator giving the plain inputs)
FUNCTIONS: dict[str, tuple[Callable[..., Any], Callable[[torch.Generator], list[torch.Tensor]]]] = {
    "x < y": (lambda a, b: a < b, lambda g: [torch.randn(N, generator=g)] * 2),
    "x == y": (lambda a, b: a == b, lambda g: [torch.randn(N, generator=g)] * 2),
    "relu": (F.relu, lambda g: [torch.randn(N, generator=g)]),
    "abs": (torch.abs, lambda g: [torch.randn(N, generator=g)]),
    "clamp(x, -1, 1)": (lambda a: a.clamp(-1, 1), lambda g: [torch.randn(N, generator=g)]),
    "max over 8": (
        lambda a: a.max(dim=1).values,
        lambda g: [torch.randn(N // 8, 8, generator=g)],
    ),
    "argmax over 8": (
        lambda a: a.argmax(dim=1),
        lambda g: [torch.randn(N // 8, 8, generator=g)],
    ),
    "max_pool2d 2x2": (
        lambda a: F.max_pool2d(a, 2),
        lambda g: [torch.randn(1, 1, 64, 64, generator=g)],
    ),
    "exp": (torch.exp, lambda g: [torch.rand(N, generator=g) * 12 - 8]),
    "log": (torch.log, lambda g: [torch.rand(N, generator=g) * 100 + 0.01]),
    "reciprocal": (torch.reciprocal, lambda g: [torch.rand(N, generator=g) * 100 + 0.01]),
    "a / b": (
        lambda a, b: a / b,
        lambda g: [torch.randn(N, generator=g), torch.rand(N, generator=g) * 9.5 + 0.5],
    ),
    "sqrt": (torch.sqrt, lambda g: [torch.rand(N, generator=g) * 100 + 0.01]),
    "rsqrt": (torch.rsqrt, lambda g: [torch.rand(N, generator=g) * 100 + 0.01]),
    "sigmoid": (torch.sigmoid, lambda g: [4 * torch.randn(N, generator=g)]),
    "tanh": (torch.tanh, lambda g: [2 * torch.randn(N, generator=g)]),
    "gelu": (F.gelu, lambda g: [2 * torch.randn(N, generator=g)]),
    "gelu (tanh)": (_gelu_tanh, lambda g: [2 * torch.randn(N, generator=g)]),
    "silu": (F.silu, lambda g: [2 * torch.randn(N, generator=g)]),
    "softmax over 32": (
        lambda a: torch.softmax(a, -1),
        lambda g: [2 * torch.randn(N // 32, 32, generator=g)],
    ),
    "log_softmax over 32": (
        lambda a: torch.log_softmax(a, -1),
        lambda g: [2 * torch.randn(N // 32, 32, generator=g)],
    ),
    "layer_norm over 64": (
        lambda a: F.layer_norm(a, (64,)),
        lambda g: [torch.randn(N // 64, 64, generator=g)],
    ),
    "layer_norm over 768": (
        lambda a: F.layer_norm(a, (768,)),
        lambda g: [torch.randn(N // 768 + 1, 768, generator=g)],
    ),
}


def measure(name: str, mode: str) -> dict[str, Any]:
    """One function's rounds, bytes per party per input element and dealer bytes per
    input element, in ``mode`` (``"default"`` or ``"fss"``)."""
    fn, make = FUNCTIONS[name]
    plain = make(torch.Generator().manual_seed(0))
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    config = MPCConfig(comparison=mode)
    shared = [mpc.share(x, alice, bob, crypto_provider=carol, config=config) for x in plain]
    with torch.no_grad(), mpc.stats() as s:
        out = fn(*shared)
        if hasattr(out, "materialize"):
            out.materialize()
    elements = plain[0].numel()
    return {
        "rounds": s.rounds,
        "bytes": s.max_bytes_per_party / elements,
        "dealer": s.dealer_bytes / elements,
    }


def table(names: list[str] | None = None) -> str:
    """The Markdown table of docs/secret-sharing.md."""
    lines = [
        "| function | default rounds | default B/elem/party | default dealer B/elem "
        "| FSS rounds | FSS B/elem/party | FSS dealer B/elem |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names or list(FUNCTIONS):
        d, f = measure(name, "default"), measure(name, "fss")
        lines.append(
            f"| {name} | {d['rounds']} | {d['bytes']:,.0f} | {d['dealer']:,.0f} "
            f"| {f['rounds']} | {f['bytes']:,.0f} | {f['dealer']:,.0f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", help=f"functions (default: all): {', '.join(FUNCTIONS)}")
    args = ap.parse_args(argv)
    unknown = [n for n in args.names if n not in FUNCTIONS]
    if unknown:
        ap.error(f"no function {unknown[0]!r}: one of {', '.join(FUNCTIONS)}")
    torch.set_num_threads(1)
    print(table(args.names or None))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
