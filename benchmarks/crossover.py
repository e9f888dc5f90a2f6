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

T is the in-process median less the dealer's time (the dealer's work is what
``mpc.preprocess`` moves offline), so "keys ahead" is the online phase of a preprocessed
plan. "keys inline" adds the dealer's time and its bytes to each party (as an op-by-op
run pays them; the dealer's delivery overlaps the first round on a network, so this is a
pessimistic bound). Every party's work runs in one process in these measurements, so T
is the sum over the parties: an upper bound for parties on separate machines.
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
    td = default["median_s"] - (0.0 if inline else _dealer(default))
    tf = fss["median_s"] - (0.0 if inline else _dealer(fss))
    bytes_d = default["max_bytes_per_party"] + (default["dealer_bytes"] if inline else 0)
    bytes_f = fss["max_bytes_per_party"] + (fss["dealer_bytes"] if inline else 0)
    per_byte = 0.0 if mbit is None else 8.0 / (mbit * 1e6)
    extra = (tf - td) + (bytes_f - bytes_d) * per_byte
    return max(0.0, extra / (rd - rf))


def _dealer(row: dict[str, Any]) -> float:
    d = row.get("dealer_s")
    return 0.0 if d is None or (isinstance(d, float) and math.isnan(d)) else float(d)


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
        "online s def/fss",
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
                f"{d['median_s'] - _dealer(d):.3f}/{f['median_s'] - _dealer(f):.3f}",
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
