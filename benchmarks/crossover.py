"""The latency from which the FSS comparison beats the default one, per workload size
(``python -m benchmarks --comparison both``), computed from the measured rounds, bytes
and time of both modes.

A run of R rounds that sends B bytes per party and computes for T seconds takes about
T + R L + B / W on a link of latency L (one way: a round is one message from each party to
its peer) and bandwidth W. FSS takes fewer rounds and sends fewer bytes online, but its
parties compute more (the DCF evaluation) and its dealer much more (key generation, 3 KB
of keys per comparison). The crossover is the L where both take the same time:

    L* = ((T_fss - T_def) + (B_fss - B_def) / W) / (R_def - R_fss),

0 where FSS is faster at any latency, "never" where it takes as many rounds or more.

T is the parties' CPU time per party: the process CPU time of one in-process run (every
party, the dealer and the client run in this process; the run in which the dealer's CPU
time is measured, so that both come from one run) less the dealer's CPU time, divided
by the number of parties, which work side by side on separate machines. CPU time rather
than wall time: on a loaded machine it moves much less. That is the online phase of a
preprocessed plan, the dealer's work being what ``mpc.preprocess`` moves offline ("keys
ahead"). "keys inline" adds the dealer's CPU time and its bytes to the run (as an
op-by-op run pays them before the parties can evaluate; the client's own CPU, in T, is
small). Rows without CPU times (network workers) fall back to the wall-clock median less
the dealer's wall time.
"""

from __future__ import annotations

import math
from typing import Any

BANDWIDTHS_MBIT = (None, 1000.0, 100.0)  # None: unlimited


def _key(row: dict[str, Any]) -> tuple[str, str]:
    return (row["workload"], str(row["size"]))


def crossover_latency(
    default: dict[str, Any], fss: dict[str, Any], mbit: float | None, inline: bool
) -> float | None:
    """Seconds of one-way latency from which ``fss`` is faster (0.0: at any latency;
    None: never), from two measured rows of the same workload and size."""
    rd, rf = int(default["rounds"]), int(fss["rounds"])
    if rf >= rd:
        return None
    td, tf = _online(default), _online(fss)
    if inline:
        td, tf = td + _dealer(default), tf + _dealer(fss)
    bytes_d = default["max_bytes_per_party"] + (default["dealer_bytes"] if inline else 0)
    bytes_f = fss["max_bytes_per_party"] + (fss["dealer_bytes"] if inline else 0)
    per_byte = 0.0 if mbit is None else 8.0 / (mbit * 1e6)
    extra = (tf - td) + (bytes_f - bytes_d) * per_byte
    return max(0.0, extra / (rd - rf))


def _number(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def _cpu(row: dict[str, Any]) -> float | None:
    """The process CPU time of the run whose dealer time was measured (else the timed
    runs' median): both from one run, so the difference is not the runs' noise."""
    run = _number(row.get("run_cpu_s"))
    return run if run is not None else _number(row.get("cpu_median_s"))


def _dealer(row: dict[str, Any]) -> float:
    """The dealer's time in one run (CPU where measured)."""
    cpu = _number(row.get("dealer_cpu_s"))
    if cpu is not None and _cpu(row) is not None:
        return cpu
    return _number(row.get("dealer_s")) or 0.0


def _online(row: dict[str, Any]) -> float:
    """One party's time in one run, the dealer's work left out (see the module docstring)."""
    cpu = _cpu(row)
    if cpu is not None:
        return max(cpu - _dealer(row), 0.0) / max(int(row.get("parties", 2)), 1)
    return max(float(row["median_s"]) - _dealer(row), 0.0)


def _ms(v: float | None) -> str:
    if v is None:
        return "never"
    return "any" if v == 0.0 else f"{v * 1e3:.2f} ms"


def crossover_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """Per workload size measured in both modes: rounds, bytes per party and time of each,
    and the crossover latency at unlimited, 1 Gbit/s and 100 Mbit/s, keys dealt ahead,
    and at 100 Mbit/s with the keys dealt inline."""
    by_mode: dict[str, dict[tuple[str, str], dict[str, Any]]] = {"default": {}, "fss": {}}
    for r in rows:
        mode = r.get("comparison")
        if mode in by_mode and "rounds" in r:
            by_mode[mode][_key(r)] = r
    head = [
        "workload",
        "size",
        "rounds def/fss",
        "KB/party def/fss",
        "dealer KB def/fss",
        "dealer s def/fss",
        "party s def/fss",
        "L* (keys ahead)",
        "L* 1 Gbit/s",
        "L* 100 Mbit/s",
        "L* 100 Mbit/s, keys inline",
    ]
    lines: list[list[str]] = []
    for key, d in by_mode["default"].items():
        f = by_mode["fss"].get(key)
        if f is None:
            continue
        lines.append(
            [
                d["workload"],
                str(d["size"]),
                f"{d['rounds']}/{f['rounds']}",
                f"{d['max_bytes_per_party'] / 1e3:.1f}/{f['max_bytes_per_party'] / 1e3:.1f}",
                f"{d['dealer_bytes'] / 1e3:.0f}/{f['dealer_bytes'] / 1e3:.0f}",
                f"{_dealer(d):.3f}/{_dealer(f):.3f}",
                f"{_online(d):.3f}/{_online(f):.3f}",
            ]
            + [_ms(crossover_latency(d, f, mbit, inline=False)) for mbit in BANDWIDTHS_MBIT]
            + [_ms(crossover_latency(d, f, 100.0, inline=True))]
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(cells) + " |" for cells in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    title = "crossover: one-way latency from which comparison='fss' is faster"
    return "\n".join([title, fmt.format(*head)] + [fmt.format(*c) for c in lines])
