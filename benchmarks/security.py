"""The benchmark's modes: which comparison protocol and which security mode each case runs
in (``python -m benchmarks --comparison ... --security ...``), and the side-by-side table
of the malicious mode against the semi-honest one."""

from __future__ import annotations

import argparse
import math
from typing import Any, NamedTuple

from mpc.config import MPCConfig

#: the workloads the malicious mode (security="malicious") runs
MALICIOUS_WORKLOADS = ("W1", "W2", "W3", "W4", "W5")
#: its goals against the semi-honest mode: time and bytes per party, at most these ratios
TIME_GOAL, BYTES_GOAL = 3.0, 2.5


#: the default-mode comparison's size thresholds a run may set (``--two-round-up-to``,
#: ``--three-round-up-to``), as MPCConfig fields, and their short names in the op column
THRESHOLDS = {"two_round_up_to": "2r", "three_round_up_to": "3r"}


class Mode(NamedTuple):
    comparison: str  # "default" or "fss"
    security: str  # "semi-honest" or "malicious"
    #: MPCConfig's comparison thresholds other than their defaults: (field, value) pairs
    thresholds: tuple[tuple[str, int | None], ...] = ()

    def config(self) -> MPCConfig | None:
        """The sessions' config (None: the default one)."""
        if self == Mode("default", "semi-honest"):
            return None
        fields: dict[str, Any] = dict(self.thresholds)
        return MPCConfig(comparison=self.comparison, security=self.security, **fields)

    def suffix(self) -> str:
        """What the table's op column adds: " (fss)", " (malicious)", the thresholds set
        (" (2r<=2^22)") or nothing."""
        words = [w for w in (self.comparison, self.security) if w not in DEFAULTS]
        words += [f"{THRESHOLDS[k]}<={shown(v)}" for k, v in self.thresholds]
        return f" ({', '.join(words)})" if words else ""


DEFAULTS = ("default", "semi-honest")


def modes(
    comparison: str, security: str, thresholds: dict[str, int | None] | None = None
) -> list[Mode]:
    """Each case runs once per mode: ``both`` of either option doubles the runs.
    ``thresholds``: MPCConfig's comparison thresholds to set (:data:`THRESHOLDS`' fields;
    a value equal to the default is left out)."""
    comparisons = ["default", "fss"] if comparison == "both" else [comparison]
    securities = ["semi-honest", "malicious"] if security == "both" else [security]
    defaults = MPCConfig()
    given = thresholds or {}
    changed = tuple(
        (k, given[k]) for k in THRESHOLDS if k in given and getattr(defaults, k) != given[k]
    )
    return [Mode(c, s, changed) for c in comparisons for s in securities]


def add_threshold_options(ap: argparse.ArgumentParser) -> None:
    """``--two-round-up-to N`` and ``--three-round-up-to N``: MPCConfig's thresholds."""
    defaults = MPCConfig()
    for field in THRESHOLDS:
        value = getattr(defaults, field)
        ap.add_argument(
            "--" + field.replace("_", "-"),
            type=_threshold_arg,
            default=value,
            metavar="N",
            help=f"MPCConfig({field}=N) for every session: a count, 2^k or none (default "
            f"{shown(value)}): a default-mode comparison's rounds against the dealer's bytes "
            "and local work (docs/secret-sharing.md)",
        )


def run_modes(args: argparse.Namespace) -> list[Mode]:
    """The modes of a run's options (--comparison, --security, the thresholds)."""
    thresholds = {field: getattr(args, field) for field in THRESHOLDS}
    return modes(args.comparison, args.security, thresholds)


def shown(value: int | None) -> str:
    """A threshold as the options write it: ``none``, ``2^k`` or the count."""
    if value is None:
        return "none"
    return f"2^{value.bit_length() - 1}" if value > 0 and not value & (value - 1) else str(value)


def _threshold_arg(text: str) -> int | None:
    try:
        return parse_threshold(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def parse_threshold(text: str) -> int | None:
    """A comparison threshold's value on the command line: a count (an int, or a power
    of two written 2^k, k at most 62), or ``none``."""
    t = text.strip().lower()
    if t == "none":
        return None
    power = t.startswith("2^")
    try:
        n = int(t[2:] if power else t)
    except ValueError:
        raise ValueError(f"not a count, 2^k or none: {text!r}") from None
    if power:
        if not 0 <= n <= 62:
            raise ValueError(f"2^k takes k from 0 to 62, got {text!r}")
        return 2**n
    if n < 0:
        raise ValueError(f"a count is not negative, got {text!r}")
    return n


def check_options(comparison: str, security: str, workloads: list[str], plan: bool) -> str | None:
    """Why these options cannot run together (None: they can)."""
    if security == "semi-honest":
        return None
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
