"""The results as text: the MPC table (with its notes), the pointer table and the MPC rows
as Markdown."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from benchmarks.workloads.by_module import Pass, describe


def _fmt_time(s: float | None) -> str:
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    return f"{s * 1e6:.1f} us"


def _fmt_bytes(n: float | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def _fmt_err(row: dict[str, Any]) -> str:
    parts = []
    if "max_abs_err" in row:
        parts.append(f"err {row['max_abs_err']:.1e}")
    if "mean_abs_err" in row:
        parts.append(f"mean err {row['mean_abs_err']:.1e}")
    for key, short in (
        ("mismatches", "mism"),
        ("sign_mismatches", "sign-mism"),
        ("argmax_mismatches", "argmax-mism"),
        ("goals_missed", "goals-missed"),
        ("token_mismatches", "token-mism"),
    ):
        if key in row:
            parts.append(f"{short} {row[key]}")
    if "upload_bytes_per_client" in row:
        parts.append(f"upload/client {_fmt_bytes(row['upload_bytes_per_client'])}")
    if "tokens_checked" in row:  # (W16, W17: every token against plaintext greedy decoding)
        parts.append(f"of {row['tokens_checked']} tokens")
    if row.get("workload") in ("W16", "W17") and row.get("client_messages") is not None:
        parts.append(f"{row['client_messages']} client msgs")
    if row.get("first_run_max_bytes_per_party") is not None:  # (W14-W16: masks opened)
        parts.append(f"first run {_fmt_bytes(row['first_run_max_bytes_per_party'])}/party")
    if row.get("peak_rss_bytes") is not None:
        parts.append(f"peak RSS {_fmt_bytes(row['peak_rss_bytes'])}")
    return ", ".join(parts)


def _fmt_dealt(r: dict[str, Any]) -> str:
    """The dealer's bytes in one run, or "ahead" where its material was dealt before the
    timer (--preprocess: none in the run)."""
    if r.get("preprocess_s") is not None and not r.get("dealer_bytes"):
        return "ahead"
    return _fmt_bytes(r.get("dealer_bytes"))


def _fmt_rate(r: float | None) -> str:
    if r is None or not math.isfinite(r):
        return "-"
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if r >= scale:
            return f"{r / scale:.2f} {unit}"
    return f"{r:.1f}"


def _fmt_ratio(r: float | None) -> str:
    return "-" if r is None or not math.isfinite(r) else f"{r:.0f}x"


# (header, width, cell) of the MPC table; "wide" columns only with wide=True.
_MPC_COLUMNS: list[tuple[str, int, Callable[[dict[str, Any]], str], bool]] = [
    ("workload", 12, lambda r: f"{r['workload']} {r['op']}", False),
    ("size", 8, lambda r: str(r["size"]), False),
    ("median", 10, lambda r: _fmt_time(r.get("median_s")), False),
    ("cpu", 10, lambda r: _fmt_time(r.get("cpu_median_s")), False),
    ("min", 10, lambda r: _fmt_time(r.get("min_s")), True),
    ("max", 10, lambda r: _fmt_time(r.get("max_s")), True),
    ("elem/s", 9, lambda r: _fmt_rate(r.get("elements_per_s")), False),
    ("plaintext", 10, lambda r: _fmt_time(r["plain_s"]), False),
    ("ratio", 8, lambda r: _fmt_ratio(r.get("ratio")), False),
    ("rounds", 6, lambda r: str(r["rounds"]), False),
    ("bytes/party", 11, lambda r: _fmt_bytes(r["max_bytes_per_party"]), False),
    ("dealer B", 10, _fmt_dealt, False),
    ("msgs", 6, lambda r: str(r["client_messages"]), True),
    ("dealer t*", 10, lambda r: _fmt_time(r["dealer_s"]), False),
    ("client B", 10, lambda r: _fmt_bytes(r["client_bytes_sent"]), True),
]
CPU_NOTE = (
    "cpu: median process CPU time per run (every party runs in this process, one torch "
    "thread): the protocol's work, much less sensitive than wall time to other load."
)
DEALER_NOTE = (
    "* dealer t: time inside the crypto provider's message handler during one extra run "
    "(the one that counts rounds and bytes). By default the dealer works inline, so this "
    "is part of the online time, not in addition to it; with --preprocess (plans, W16, "
    "W17) its material is dealt before the timer and its offline time is printed below."
)
NETWORK_NOTE = (
    "network: every worker is its own process; each timed run ends with a sync of every "
    "worker (commands are pipelined), inside the timer, except a run that reveals its "
    "result to the client (W3, W6, W8): its timer stops when the value is in hand, and the "
    "sync follows outside it. dealer t: not measured."
)
NETWORK_CPU_NOTE = (
    "cpu: CPU time per run of all the processes together (this client and every worker "
    "process, all threads; the mean of the timed runs; on C cores a run takes at least "
    "cpu / C)."
)
ELEMENTS_NOTE = (
    "elem/s: elements per second of the median (W2: output entries, W5: images, W8: the "
    "elements of all updates)."
)
POINTER_HEADER = (
    f"{'workload':<20} {'pointer op':>10} {'local op':>10} {'overhead':>10} "
    f"{'msgs/op':>8} {'B/msg':>7} {'reply B/msg':>11}  correctness"
)


def _mpc_columns(wide: bool) -> list[tuple[str, int, Callable[[dict[str, Any]], str], bool]]:
    return [c for c in _MPC_COLUMNS if wide or not c[3]]


def mpc_header(wide: bool = False) -> str:
    cols = _mpc_columns(wide)
    first, *rest = cols
    return " ".join(
        [f"{first[0]:<{first[1]}}"] + [f"{h:>{w}}" for h, w, _, _ in rest] + [" correctness"]
    )


def format_row(row: dict[str, Any], wide: bool = False) -> str:
    """One line of the results table (MPC or pointer layout, chosen by the row's keys);
    ``wide`` adds min, max, dealer bytes, client messages and client bytes."""
    if "messages_per_op" in row:
        return (
            f"{row['name']:<20} {_fmt_time(row.get('median_s')):>10} "
            f"{_fmt_time(row['plain_s']):>10} {row.get('overhead_us', math.nan):>8.1f}us "
            f"{row['messages_per_op']:>8.3f} {row['bytes_per_message']:>7.0f} "
            f"{row['reply_bytes_per_message']:>11.0f}  {_fmt_err(row)}"
        )
    first, *rest = _mpc_columns(wide)
    cells = [f"{first[2](row):<{first[1]}}"] + [f"{cell(row):>{w}}" for _, w, cell, _ in rest]
    return " ".join(cells + [" " + _fmt_err(row)])


def format_table(rows: list[dict[str, Any]], wide: bool = False) -> str:
    """The results table: MPC rows (with the notes on elem/s and the dealer time), then
    the pointer rows in their own layout."""
    mpc_rows = [r for r in rows if "messages_per_op" not in r]
    ptr_rows = [r for r in rows if "messages_per_op" in r]
    out = []
    if mpc_rows:
        header = mpc_header(wide)
        out += [header, "-" * len(header)] + [format_row(r, wide) for r in mpc_rows]
        if any("cpu_median_s" in r for r in mpc_rows):
            network = [r.get("workers") == "network" for r in mpc_rows if "cpu_median_s" in r]
            if all(network):
                out.append(NETWORK_CPU_NOTE)
            elif not any(network):
                out.append(CPU_NOTE)
            else:  # (one table of both kinds: each note says which rows it covers)
                out += [f"in-process rows: {CPU_NOTE}", f"network rows: {NETWORK_CPU_NOTE}"]
        out += [ELEMENTS_NOTE, DEALER_NOTE]
        out += [line for r in mpc_rows if (line := rounds_by_module(r))]
        out += [line for r in mpc_rows if (line := dealt_by_module(r))]
    if ptr_rows:
        if out:
            out.append("")
        out += [POINTER_HEADER, "-" * len(POINTER_HEADER)] + [format_row(r) for r in ptr_rows]
    if any(r.get("workers") == "network" for r in rows):
        out.append(NETWORK_NOTE)
    return "\n".join(out)


def rounds_by_module(row: dict[str, Any]) -> str:
    """``W16 decode p32: rounds by module: attention 408, ...`` for a row that counted its
    rounds by module (W16, W17: one token), else ``""``."""
    kinds = row.get("rounds_by_module")
    if not kinds or row.get("rounds") is None:
        return ""
    table = Pass(dict(kinds)).table(int(row["rounds"]))
    return f"{row['workload']} {row['op']} {row['size']}: rounds by module: {describe(table)}"


def dealt_by_module(row: dict[str, Any]) -> str:
    """``W16 decode p32: dealt by module: attention 199.48 MB, ...`` for a row that
    counted the dealer's material by module (as its program was recorded), else ``""``."""
    table = row.get("dealt_by_module")
    if not table:
        return ""
    text = describe({k: int(v) for k, v in table.items()}, _fmt_bytes)
    return f"{row['workload']} {row['op']} {row['size']}: dealt by module: {text}"


def format_markdown(rows: list[dict[str, Any]]) -> str:
    """The MPC rows as a Markdown table (the columns of :func:`format_table`)."""
    cols = _mpc_columns(False)
    lines = [
        "| " + " | ".join([h for h, _, _, _ in cols] + ["correctness"]) + " |",
        "|" + "---|" * (len(cols) + 1),
    ]
    for r in rows:
        if "messages_per_op" not in r:
            lines.append("| " + " | ".join([c(r) for _, _, c, _ in cols] + [_fmt_err(r)]) + " |")
    return "\n".join(lines)
