"""``python -m benchmarks [--quick] [-k TEXT] [--repeat N]``: measure the workloads of
WORKLOADS.md without pytest and print the results table."""

from __future__ import annotations

import argparse
import json
import sys

from benchmarks.workloads import MPC_CASES, POINTER_CASES, failures, format_table, measure


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="skip the big (1e6, batch 64) cases")
    ap.add_argument("-k", default="", help="only the cases whose id contains this text")
    ap.add_argument("--repeat", type=int, default=5, help="timed runs per case (default 5)")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args(argv)
    rows, bad = [], []
    for case in MPC_CASES + POINTER_CASES:
        if (args.quick and case.big) or args.k not in case.id:
            continue
        row = measure(case.build(), repeat=args.repeat)
        rows.append(row)
        bad += failures(row)
        print(f"done {case.id}", file=sys.stderr, flush=True)
    print(format_table(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    for line in bad:
        print(f"INCORRECT: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
