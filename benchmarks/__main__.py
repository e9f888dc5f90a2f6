"""``python -m benchmarks``: measure the protocol workloads (WORKLOADS.md W1-W6, max-pool W7,
secure aggregation W8) and the pointer overhead (P1, P2) without pytest, and print the
results table.

Examples::

    python -m benchmarks                          # every workload at its WORKLOADS.md sizes
    python -m benchmarks --quick                  # without the 1e6-element and batch-64 cases
    python -m benchmarks --workloads W3,W4 --sizes 1e4,1e5,1e6 --parties 3
    python -m benchmarks --sizes 1e3,1e4 --sizes W2=32,64 --sizes W5=1 --repeat 3 \\
        --json out.json --plot out.png

``--sizes`` takes a comma-separated list (``1e4,1e5``): the sizes of every workload whose
size counts elements (W1, W3, W4, W6, W7, W8); ``W2=64,128`` (matrix side) or ``W5=1,8``
(batch) sets one workload's sizes, and may be repeated. Exit status: 0, 1 if a result was
incorrect, 2 on a usage error (including ``--network``/``--latency-ms`` for now).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Any

import pointers
from benchmarks import report
from benchmarks.workloads import (
    MPC_CASES,
    NOT_ELEMENTS,
    OPS,
    POINTER_CASES,
    SIZE_UNIT,
    Case,
    failures,
    format_markdown,
    format_table,
    measure,
)

NETWORK_UNAVAILABLE = (
    "python -m benchmarks: network workers are not available yet (--network and "
    "--latency-ms need pointers.connect, issue 5); run without them to use in-process "
    "workers"
)
NETWORK_NOT_WIRED = (
    "python -m benchmarks: pointers.connect exists, but this tool does not start network "
    "workers yet (issue 6: --network, --latency-ms); run without them to use in-process "
    "workers"
)


def parse_size(text: str) -> int:
    """``1e5`` -> 100000, ``256`` -> 256; a positive whole number."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r}") from None
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"a size must be a positive whole number: {text!r}")
    return int(value)


def parse_sizes(specs: list[str]) -> tuple[list[int] | None, dict[str, list[int]]]:
    """``["1e4,1e5", "W2=64"]`` -> ([10000, 100000], {"W2": [64]})."""
    common: list[int] | None = None
    per: dict[str, list[int]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if sep:
            key = key.strip().upper()
            if key not in OPS:
                raise argparse.ArgumentTypeError(
                    f"unknown workload {key!r} in --sizes (known: {', '.join(_ids())})"
                )
            per[key] = [parse_size(v) for v in values.split(",") if v.strip()]
        else:
            common = [parse_size(v) for v in spec.split(",") if v.strip()]
    return common, per


def select_cases(
    quick: bool,
    k: str,
    parties: int,
    common: list[int] | None,
    per: dict[str, list[int]],
    workloads: list[str] | None = None,
) -> list[Case]:
    """The cases to run: the default sizes, with ``--sizes`` overrides, filtered by
    ``--workloads`` and ``-k``."""
    defaults: dict[str, list[Case]] = {}
    for case in MPC_CASES + POINTER_CASES:
        defaults.setdefault(case.workload, []).append(case)
    cases: list[Case] = []
    for wid, default in defaults.items():
        if workloads and wid not in workloads:
            continue
        if wid in per:
            chosen = [Case(wid, n) for n in per[wid]]
        elif common is not None and wid.startswith("W") and wid not in NOT_ELEMENTS:
            chosen = [Case(wid, n) for n in common]
        else:
            chosen = [c for c in default if not (quick and c.big)]
        cases += [Case(c.workload, c.size, c.big, c.rounds, parties) for c in chosen]
    return [c for c in cases if k in c.id]


def _ids() -> list[str]:
    """The workload ids, protocol workloads first: W1..W8, P1, P2."""
    return sorted(OPS, key=lambda w: (not w.startswith("W"), w))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        epilog="Sizes: "
        + "; ".join(f"{w}: {SIZE_UNIT[w]}" for w in _ids())
        + ". See benchmarks/README.md.",
    )
    ap.add_argument("--quick", action="store_true", help="skip the big (1e6, batch 64) cases")
    ap.add_argument("-k", default="", help="only the cases whose id contains this text")
    ap.add_argument(
        "--workloads",
        default="",
        metavar="IDS",
        help=f"only these workloads, comma-separated ({','.join(_ids())})",
    )
    ap.add_argument(
        "--parties", type=int, default=2, help="computing parties, 2..5 (default 2; + dealer)"
    )
    ap.add_argument(
        "--sizes",
        action="append",
        default=[],
        metavar="LIST",
        help="sizes, e.g. 1e4,1e5 (element-count workloads) or W2=64,128 (one workload); "
        "repeatable",
    )
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per case (default 5)")
    ap.add_argument("--json", metavar="FILE", help="also write machine info and rows as JSON")
    ap.add_argument("--plot", metavar="PNG", help="also plot throughput against size")
    ap.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument(
        "--network",
        action="store_true",
        help="run the parties as network workers (not available yet)",
    )
    ap.add_argument(
        "--latency-ms",
        type=float,
        default=None,
        help="added one-way latency between network workers (not available yet)",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 2 <= args.parties <= 5:
        ap.error(f"--parties must be 2..5, got {args.parties}")
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    if args.network or args.latency_ms is not None:
        # TODO(issue 6): start `python -m pointers serve` processes and connect to them
        print(
            NETWORK_NOT_WIRED if hasattr(pointers, "connect") else NETWORK_UNAVAILABLE,
            file=sys.stderr,
        )
        return 2
    try:
        common, per = parse_sizes(args.sizes)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in OPS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)} (known: {', '.join(_ids())})")
    cases = select_cases(args.quick, args.k, args.parties, common, per, workloads)
    if not cases:
        ap.error("no case matches --workloads/-k")
    if args.list:
        for c in cases:
            print(c.id)
        return 0

    meta: dict[str, Any] = report.machine_info()
    meta.update(
        parties=args.parties,
        repeat=args.repeat,
        workers="in-process (VirtualWorker)",
        frac_bits=16,
        torch_threads=1,
        load_before=meta.pop("load"),
    )
    rows, bad = [], []
    progress = _progress(len(cases) * (args.repeat + 2), disable=args.no_progress)
    try:
        for case in cases:
            progress.set_description(case.id)
            row = measure(case.build(), repeat=args.repeat, progress=lambda: progress.update())
            rows.append(row)
            bad += failures(row)
    finally:
        progress.close()
    meta["load_after"] = report.load_average()

    print(report.describe(meta))
    print(format_table(rows))
    if args.markdown:
        print()
        print(format_markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_finite({"meta": meta, "rows": rows}), f, indent=1, default=str)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.plot:
        report.plot_throughput(rows, args.plot, title=report.describe(meta))
        print(f"wrote {args.plot}", file=sys.stderr)
    for line in bad:
        print(f"INCORRECT: {line}", file=sys.stderr)
    return 1 if bad else 0


def _finite(obj: Any) -> Any:
    """NaN and infinity (no dealer, a zero plaintext time) as null: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_finite(v) for v in obj]
    return obj


def _progress(total: int, disable: bool) -> Any:
    from tqdm import tqdm

    return tqdm(total=total, file=sys.stderr, unit="run", disable=disable, leave=False)


if __name__ == "__main__":
    sys.exit(main())
