"""What a benchmark run records besides its rows: the machine and its load, and the
throughput plot (``python -m benchmarks --plot out.png``)."""

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
