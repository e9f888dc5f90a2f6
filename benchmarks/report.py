"""What a benchmark run records besides its rows (the machine and its load), the
throughput plot of one run (``python -m benchmarks --plot out.png``), and
``python -m benchmarks.report``: the docs' results table and plot regenerated from the
committed results file (:mod:`benchmarks.results`)."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import subprocess
import textwrap
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (as ``uptime`` prints them), if known."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def commit() -> str | None:
    """The checked-out commit (short), or None outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def machine_info() -> dict[str, Any]:
    """Date, machine, load and software versions, for the JSON file and the table header."""
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "load": load_average(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "platform": platform.platform(),
        "commit": commit(),
    }


NETWORK_WORKERS = (
    "network: one `python -m pointers serve` process per worker on 127.0.0.1, gRPC with mutual TLS"
)


def describe(meta: dict[str, Any]) -> str:
    """One line: ``2 parties + crypto provider, in-process; 2 x CPU, load ...; date``
    (with ``--network``: the worker processes and the added latency instead)."""
    load = meta.get("load_before") or meta.get("load")
    load_s = " ".join(f"{x:.2f}" for x in load) if load else "unknown"
    if meta.get("network"):
        where = (
            f"NETWORK workers (one `python -m pointers serve` process each on 127.0.0.1, "
            f"mutual TLS), added latency {meta.get('latency_ms') or 0:g} ms per call received"
        )
        if meta.get("bandwidth_mbit"):
            where += f", simulated bandwidth {meta['bandwidth_mbit']:g} Mbit/s"
    elif "serial" in str(meta.get("workers", "")):
        where = "in-process VirtualWorkers one after the other (--serial)"
    else:
        where = "in-process VirtualWorkers (side by side for operands of 2^15+ elements)"
    if meta.get("plan"):
        where += f"; {' and '.join(meta['plan'])} as mpc.plan calls"
    return (
        f"{meta.get('parties', 2)} parties + crypto provider, {where}, "
        f"{meta.get('torch_threads', 1)} torch thread(s), {meta.get('repeat', '?')} timed runs; "
        f"{meta['nproc']} x {meta['cpu']}, load {load_s}; {meta['date']}"
        + (f"; commit {meta['commit']}" if meta.get("commit") else "")
    )


def plot_throughput(rows: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """Throughput (elements per second) against size, one line per MPC workload, log axes.

    Pointer rows (P1, P2) are left out: they measure per-op overhead, not throughput.
    Uses matplotlib's Agg backend through a bare ``Figure`` (no pyplot, no display).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    lines: dict[str, list[tuple[int, float]]] = defaultdict(list)
    for r in rows:
        if "messages_per_op" in r or not r.get("elements_per_s"):
            continue
        lines[f"{r['workload']} {r['op']}"].append((r["elements"], r["elements_per_s"]))
    fig = Figure(figsize=(7.5, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for label in sorted(lines):
        pts = sorted(lines[label])
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("size (elements; W2: output entries, W5: images, W8: all updates)")
    ax.set_ylabel("throughput (elements / s)")
    ax.grid(True, which="both", alpha=0.3)
    if lines:
        ax.legend(fontsize="small")
    if title:
        ax.set_title(textwrap.fill(title, 110), fontsize="x-small")
    path = Path(path)
    fig.savefig(path, dpi=120)
    return path


def floor_table(rows: list[dict[str, Any]], latency_ms: float, markdown: bool = False) -> str:
    """With an added latency L: per protocol row, its rounds R, the latency floor R x L
    (the least any protocol of R rounds could take), the median, what lies above the
    floor, the row's own time at L = 0 (``loopback_s``: the same case on served workers
    without the added latency, measured by the same command) and the goal an op-by-op
    run aims at, (R + 2) x L plus that time (``--plan``: (R + 1) x L plus it), with
    whether the median is within it. (R + 2) x L alone leaves out the protocol's own
    time, so it lies below every median; without ``loopback_s`` the goal is not shown."""
    from benchmarks.workloads import _fmt_time

    head = [
        "workload",
        "size",
        "rounds",
        "floor R x L",
        "median",
        "above floor",
        "L = 0",
        "goal",
        "within",
        "L",
    ]
    lines: list[list[str]] = []
    for r in rows:
        if "messages_per_op" in r or "rounds" not in r:
            continue
        rounds = int(r["rounds"])
        floor = rounds * latency_ms / 1e3
        extra = 1 if r.get("plan") else 2
        median = r.get("median_s")
        above = None if median is None else median - floor
        t0 = r.get("loopback_s")
        goal = None if t0 is None else (rounds + extra) * latency_ms / 1e3 + t0
        if goal is None or median is None:
            within = "-"
        else:
            within = "yes" if median <= goal else f"no (+{(median / goal - 1) * 100:.0f}%)"
        lines.append(
            [
                f"{r['workload']} {r['op']}",
                str(r["size"]),
                str(rounds),
                _fmt_time(floor),
                _fmt_time(median),
                _fmt_time(above),
                _fmt_time(t0),
                "-" if goal is None else f"(R+{extra})L + t0 = {_fmt_time(goal)}",
                within,
                f"{(median or 0) * 1e3 / latency_ms:.1f} L",
            ]
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(cells) + " |" for cells in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" if i < 2 else f"{{:>{w}}}" for i, w in enumerate(widths))
    out = [
        f"latency floor at {latency_ms:g} ms per call received (median in units of L; "
        "L = 0: the same case without the added latency, t0):",
        fmt.format(*head),
    ]
    out += [fmt.format(*cells) for cells in lines]
    return "\n".join(out)


def plot_results(data: dict[str, Any], path: str | Path) -> Path:
    """The docs' plot from a results file: on the left, time against size of each workload
    measured at several sizes (ours in process, lines; CrypTen where measured, hollow
    markers); on the right, each case CrypTen was measured on, ours beside it.

    Uses matplotlib's Agg backend through a bare ``Figure`` (no pyplot, no display).
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from benchmarks.results import other_rows, ours_rows

    ours = [r for r in ours_rows(data) if "messages_per_op" not in r and r.get("median_s")]
    theirs = [(m, r) for m, r in other_rows(data) if r.get("median_s")]
    by_workload: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in ours:
        by_workload[r["workload"]].append(r)
    several = sorted((w for w, rs in by_workload.items() if len(rs) > 1), key=lambda w: int(w[1:]))
    fig = Figure(figsize=(11, 4.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2, width_ratios=[1.1, 1])
    colors = {w: f"C{i % 10}" for i, w in enumerate(several)}
    for w in several:
        pts = sorted((r["elements"], r["median_s"]) for r in by_workload[w])
        op = by_workload[w][0]["op"]
        left.plot(*zip(*pts, strict=True), marker="o", color=colors[w], label=f"{w} {op}")
        cpts = sorted((r["elements"], r["median_s"]) for _, r in theirs if r["workload"] == w)
        if cpts:
            left.plot(
                *zip(*cpts, strict=True),
                marker="o",
                markerfacecolor="none",
                linestyle="--",
                color=colors[w],
                label=f"{w} CrypTen",
            )
    left.set_xscale("log")
    left.set_yscale("log")
    left.set_xlabel("size (elements; W5: images in the batch; W8: elements of all updates)")
    left.set_ylabel("median time per run (s)")
    left.set_title("Time against size, 2 parties + crypto provider, in process", fontsize="small")
    left.grid(True, which="both", alpha=0.3)
    if several:
        left.legend(fontsize="x-small", ncol=2)

    ours_by_name = {r["name"]: r for r in ours}
    pairs = [
        (r["name"], ours_by_name[r["name"]], r, m) for m, r in theirs if r["name"] in ours_by_name
    ]
    if pairs:
        labels = [p[0] for p in pairs]
        ys = range(len(pairs))
        right.barh([y + 0.2 for y in ys], [p[1]["median_s"] for p in pairs], 0.4, label="ours")
        engine = pairs[0][3].get("engine", "CrypTen")
        right.barh([y - 0.2 for y in ys], [p[2]["median_s"] for p in pairs], 0.4, label=engine)
        right.set_yticks(list(ys), labels, fontsize="x-small")
        right.set_title(f"Ours (in process) beside {engine}", fontsize="small")
    else:
        single = [r for r in ours if r["workload"] not in several]
        right.barh(range(len(single)), [r["median_s"] for r in single])
        right.set_yticks(range(len(single)), [r["name"] for r in single], fontsize="x-small")
        right.set_title("Workloads measured at one size", fontsize="small")
    right.invert_yaxis()
    right.set_xscale("log")
    right.set_xlabel("median time per run (s)")
    right.grid(True, axis="x", which="both", alpha=0.3)
    if pairs:
        right.legend(fontsize="x-small")
    fig.suptitle(_runs_line(data), fontsize="x-small")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    return path


def _runs_line(data: dict[str, Any]) -> str:
    """Which runs the plot shows: engine, date, commit and load average before each."""
    from benchmarks.results import OURS, setting

    shown = setting({"parties": 2})
    parts = []
    for run in data["runs"]:
        m = run["meta"]
        if m.get("engine", OURS) == OURS and setting(m) != shown:
            continue  # (not in the plot)
        load = m.get("load_before") or []
        parts.append(
            f"{m.get('engine', 'tessera-mpc')} {str(m.get('date', '?'))[:16].replace('T', ' ')}"
            f" UTC, commit {m.get('commit', '?')}, load {load[0] if load else '?'}"
        )
    return (
        "; ".join(parts) + f"; {data['runs'][0]['meta'].get('nproc', '?')} cores" if parts else ""
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.report``: regenerate the docs' results table (and plot) from
    the committed results file; ``--check`` only says whether the page is up to date."""
    import argparse
    import sys

    from benchmarks import results

    ap = argparse.ArgumentParser(prog="python -m benchmarks.report", description=main.__doc__)
    ap.add_argument("file", nargs="?", default=str(results.RESULTS), help="the results file")
    ap.add_argument("--docs", default=str(results.DOCS), help="the page to rewrite")
    ap.add_argument("--plot", default=str(results.PLOT), help="the PNG to draw")
    ap.add_argument("--no-plot", action="store_true", help="leave the plot alone")
    ap.add_argument("--markdown", action="store_true", help="print the tables, change nothing")
    ap.add_argument("--check", action="store_true", help="exit 1 if the page is out of date")
    args = ap.parse_args(argv)
    data = results.load(args.file)
    if args.markdown:
        print(results.render(data))
        return 0
    if args.check:
        if results.docs_table(args.docs) != results.render(data).strip():
            print(f"{args.docs} is out of date: run python -m benchmarks.report", file=sys.stderr)
            return 1
        return 0
    changed = results.rewrite_docs(data, args.docs)
    print(f"{args.docs}: {'rewritten' if changed else 'already up to date'}", file=sys.stderr)
    if not args.no_plot:
        try:
            print(f"wrote {plot_results(data, args.plot)}", file=sys.stderr)
        except ImportError as e:  # matplotlib is an extra (dev)
            print(f"plot not drawn: {e} (pip install matplotlib)", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
