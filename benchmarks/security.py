"""The benchmark's modes: which comparison protocol and which security mode each case runs
in (``python -m benchmarks --comparison ... --security ...``), and the side-by-side table
of the malicious mode against the semi-honest one."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from mpc.config import MPCConfig

#: the workloads the malicious mode (security="malicious") runs
MALICIOUS_WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
#: its goals against the semi-honest mode: time and bytes per party, at most these ratios
TIME_GOAL, BYTES_GOAL = 3.0, 2.5


class Mode(NamedTuple):
    comparison: str  # "default" or "fss"
    security: str  # "semi-honest" or "malicious"

    def config(self) -> MPCConfig | None:
        """The sessions' config (None: the default one)."""
        if self == Mode("default", "semi-honest"):
            return None
        return MPCConfig(comparison=self.comparison, security=self.security)

    def suffix(self) -> str:
        """What the table's op column adds: " (fss)", " (malicious)" or nothing."""
        words = [w for w in (self.comparison, self.security) if w not in DEFAULTS]
        return f" ({', '.join(words)})" if words else ""


DEFAULTS = ("default", "semi-honest")


def modes(comparison: str, security: str) -> list[Mode]:
    """Each case runs once per mode: ``both`` of either option doubles the runs."""
    comparisons = ["default", "fss"] if comparison == "both" else [comparison]
    securities = ["semi-honest", "malicious"] if security == "both" else [security]
    return [Mode(c, s) for c in comparisons for s in securities]


def check_options(comparison: str, security: str, workloads: list[str], plan: bool) -> str | None:
    """Why these options cannot run together (None: they can)."""
    if security == "semi-honest":
        return None
    if comparison != "default":
        return "--security malicious runs the default comparison (the FSS mode is semi-honest)"
    if plan:
        return "--security malicious runs op by op (no --plan)"
    other = [w for w in workloads if w not in MALICIOUS_WORKLOADS]
    if other:
        return f"--security malicious runs {', '.join(MALICIOUS_WORKLOADS)}, not {', '.join(other)}"
    return None


def _ratio(a: float, b: float) -> str:
    return f"{b / a:.1f}x" if a and math.isfinite(a) and math.isfinite(b) else "-"


def security_table(rows: list[dict[str, Any]], markdown: bool = False) -> str:
    """Per case measured in both security modes (one run): time, bytes per party and
    rounds of each, their ratios, and whether the ratios meet the goals."""
    by: dict[str, dict[tuple[str, str], dict[str, Any]]] = {"semi-honest": {}, "malicious": {}}
    for r in rows:
        mode = r.get("security", "semi-honest")
        key = (r["workload"], str(r["size"]))
        by.setdefault(mode, {})[key] = r
    head = [
        "workload",
        "size",
        "time semi/mal",
        "time x",
        "KB/party semi/mal",
        "bytes x",
        "rounds semi/mal",
        f"goals ({TIME_GOAL:g}x, {BYTES_GOAL:g}x)",
    ]
    lines: list[list[str]] = []
    for key, s in by["semi-honest"].items():
        m = by["malicious"].get(key)
        if m is None:
            continue
        t = m["median_s"] / s["median_s"] if s["median_s"] else math.inf
        b = m["max_bytes_per_party"] / s["max_bytes_per_party"] if s["max_bytes_per_party"] else 0
        met = ("time met" if t <= TIME_GOAL else "time not met") + (
            ", bytes met" if b <= BYTES_GOAL else ", bytes not met"
        )
        lines.append(
            [
                key[0],
                key[1],
                f"{s['median_s']:.3f}/{m['median_s']:.3f} s",
                _ratio(s["median_s"], m["median_s"]),
                f"{s['max_bytes_per_party'] / 1e3:.0f}/{m['max_bytes_per_party'] / 1e3:.0f}",
                _ratio(s["max_bytes_per_party"], m["max_bytes_per_party"]),
                f"{s.get('rounds')}/{m.get('rounds')}",
                met,
            ]
        )
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        return "\n".join(out + ["| " + " | ".join(line) + " |" for line in lines])
    widths = [max(len(x) for x in col) for col in zip(head, *lines)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    title = "malicious against semi-honest (one run; ratios: malicious / semi-honest)"
    return "\n".join([title, fmt.format(*head)] + [fmt.format(*line) for line in lines])
