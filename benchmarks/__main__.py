"""``python -m benchmarks``: measure the workloads of docs/workloads.md (W1-W16) and the
pointer overhead (P1, P2) without pytest, and print the results table.

Examples::

    python -m benchmarks                          # every default case
    python -m benchmarks --quick                  # without the 1e6-element and batch-64 cases
    python -m benchmarks --workloads W3,W4 --sizes 1e4,1e5,1e6 --parties 3
    python -m benchmarks --sizes 1e3,1e4 --sizes W2=32,64 --sizes W5=1 --repeat 3 \\
        --json out.json --plot out.png

``--sizes`` takes a comma-separated list (``1e4,1e5``): the sizes of every workload whose
size counts elements (W1, W3, W4, W6, W7, W8); ``W2=64,128`` (matrix side) or ``W5=1,8``
(batch) sets one workload's sizes, and may be repeated.

``--network`` runs the same workloads on served workers: the tool writes a development CA
into a temporary directory, starts one ``python -m pointers serve`` process per worker the
selected cases use (the parties, the crypto provider ``carol``, and W8's five data workers
``client0``..``client4``) on 127.0.0.1 with free ports and mutual TLS, connects to them as
``client`` and stops them all at the end, also after an error or Ctrl-C.
``--latency-ms X`` (with ``--network`` only) is every server's ``--latency-ms X``: each
worker sleeps X ms before it handles each gRPC call it receives (a batch of pipelined
commands from the client, or one object a peer delivers).

``--bandwidth MBIT`` (with ``--network`` only) simulates a link of that speed: every call
a process sends (a client's batch of commands, a delivery between workers) waits
size / bandwidth before it leaves; calls sent side by side do not share the bandwidth, and
replies (a fetched value) are not delayed. With a latency set, every case runs first on
served workers without it (its time t0 at L = 0, the protocol's own time), then with it,
and a second table gives each row its ``floor`` = rounds x latency, the least any protocol
of that many rounds could take, and its goal (R + 2) x L + t0 ((R + 1) x L + t0 for a plan)
with whether the median is within it.

``--comparison fss`` runs every comparison (lt, ReLU, max, max-pool, the non-linear
functions' comparisons) by function secret sharing (``MPCConfig(comparison="fss")``, 2
parties); ``--comparison both`` runs each case in both modes and prints the crossover table
(the latency from which FSS is faster; :mod:`benchmarks.crossover`).

``--plan`` runs W5 and W13 as ``mpc.plan`` calls (recorded once, before the timer; each
timed run is one plan call: one message per worker); other workloads run op by op.

Exit status: 0, 1 if a result was incorrect, 2 on a usage error, 130 on Ctrl-C (and, with
``--network``, on SIGTERM: both stop the worker processes first).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import json
import math
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pointers as pt
from benchmarks import report, results, security, workloads
from benchmarks.crossover import crossover_table
from benchmarks.planned import PLAN_WORKLOADS, as_plan, preprocess_plan
from benchmarks.workloads import (
    MPC_CASES,
    NOT_ELEMENTS,
    OPS,
    POINTER_CASES,
    SIZE_UNIT,
    Case,
    _fmt_time,
    failures,
    format_markdown,
    format_table,
    measure,
    processes_cpu,
    worker_names,
)
from benchmarks.workloads.generation import write_offer
from benchmarks.workloads.workers import OWNERS
from pointers.worker.lanes import release_idle_lanes

LATENCY_NEEDS_NETWORK = (
    "--latency-ms needs --network: the latency is added by the served worker processes "
    "(python -m pointers serve --latency-ms); in-process workers have no network to delay"
)
LATENCY_HELP = (
    "with --network only: each worker process sleeps MS milliseconds before it handles "
    "every gRPC call it receives (a batch of pipelined commands from the client, or one "
    "object a peer delivers: a share opened to it, dealer material); replies are not "
    "delayed. 0 to 10000; default 0"
)
BANDWIDTH_NEEDS_NETWORK = (
    "--bandwidth needs --network: the worker processes and the client delay what they send"
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
    tiny: bool = False,
) -> list[Case]:
    """The cases to run: the default sizes, with ``--sizes`` overrides, filtered by
    ``--workloads`` and ``-k``. The ``explicit`` cases (W14-W16, minutes each) only when
    their workload is named in ``workloads`` or ``per``; ``tiny`` builds them with the
    tiny model configs."""
    defaults: dict[str, list[Case]] = {}
    for case in MPC_CASES + POINTER_CASES:
        defaults.setdefault(case.workload, []).append(case)
    cases: list[Case] = []
    for wid, default in defaults.items():
        if workloads and wid not in workloads:
            continue
        explicit = any(c.explicit for c in default)
        if explicit and not (workloads and wid in workloads) and wid not in per:
            continue  # minutes per case (W14-W16): only when named
        if wid in per:
            chosen = [Case(wid, n, explicit=explicit) for n in per[wid]]
        elif common is not None and wid.startswith("W") and wid not in NOT_ELEMENTS:
            chosen = [Case(wid, n) for n in common]
        else:
            chosen = [c for c in default if not (quick and c.big)]
        cases += [replace(c, parties=parties, tiny=tiny and c.explicit) for c in chosen]
    return [c for c in cases if k in c.id]


def _ids() -> list[str]:
    """The workload ids, protocol workloads first: W1..W8, P1, P2."""
    return sorted(OPS, key=lambda w: (not w.startswith("W"), int(w[1:])))


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=__doc__.split("\n\n")[0],
        epilog="Sizes: "
        + "; ".join(f"{w}: {SIZE_UNIT[w]}" for w in _ids())
        + ". See docs/benchmarks.md and docs/workloads.md.",
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
    ap.add_argument(
        "--record",
        metavar="FILE",
        help="also add this run to a results file (benchmarks/results/latest.json): its rows "
        "replace earlier rows of the same cases in the same setting; then `python -m "
        "benchmarks.report` regenerates the docs table and plot from it",
    )
    ap.add_argument("--plot", metavar="PNG", help="also plot throughput against size")
    ap.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    ap.add_argument("--list", action="store_true", help="list the selected cases and exit")
    ap.add_argument("--no-progress", action="store_true", help="no progress bar")
    ap.add_argument(
        "--network",
        action="store_true",
        help="run the workers as `python -m pointers serve` processes on 127.0.0.1 (mutual "
        "TLS, temporary certificates), started and stopped by this tool",
    )
    ap.add_argument("--latency-ms", type=float, default=None, metavar="MS", help=LATENCY_HELP)
    ap.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="MBIT",
        help="with --network only: simulate a link of MBIT Mbit/s (each call sent waits "
        "size/bandwidth before it leaves; replies are not delayed)",
    )
    ap.add_argument(
        "--plan",
        action="store_true",
        help=f"run {' and '.join(PLAN_WORKLOADS)} as mpc.plan calls (recorded once before "
        "the timer)",
    )
    ap.add_argument(
        "--preprocess",
        action="store_true",
        help="with --plan, and for W16 and W17: deal each plan call's (decoding step's) "
        "crypto-provider material ahead (mpc.preprocess), outside the timer; the median is "
        "then the online time, and the offline time per call is printed after the table",
    )
    ap.add_argument(
        "--hf-tiny",
        action="store_true",
        help="W14-W16 with tiny model configs (2 layers, width 64, vocabulary 99): seconds "
        "instead of minutes. W14-W16 run only when named in --workloads",
    )
    ap.add_argument(
        "--comparison",
        choices=("default", "fss", "both"),
        default="default",
        help="the comparison protocol: default (4 rounds), fss (function secret sharing, 1 "
        "round; 2 parties), or both (each case twice, then the crossover table)",
    )
    ap.add_argument(
        "--security",
        choices=("semi-honest", "malicious", "both"),
        default="semi-honest",
        help="the security mode: semi-honest (the default), malicious (authenticated "
        f"shares, SPDZ2k-style: {', '.join(security.MALICIOUS_WORKLOADS)}), or both (each "
        "case twice, then the side-by-side table)",
    )
    security.add_threshold_options(ap)
    ap.add_argument(
        "--serial",
        action="store_true",
        help="in-process workers run one after the other in one thread, even for large "
        "operands (VirtualWorker(concurrent=False)): the protocol's work on one core",
    )
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    if not 2 <= args.parties <= 5:
        ap.error(f"--parties must be 2..5, got {args.parties}")
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    named = {w.strip().upper() for w in args.workloads.split(",")}
    if args.preprocess and not args.plan and not named & {"W16", "W17"}:
        ap.error(
            "--preprocess needs --plan or W16/W17 (material is dealt ahead for plan calls "
            "and decoding steps)"
        )
    if args.serial and args.network:
        ap.error("--serial is for in-process workers; network workers run in their own processes")
    if args.latency_ms is not None:
        if not args.network:
            ap.error(LATENCY_NEEDS_NETWORK)
        if not 0 <= args.latency_ms <= 10_000:
            ap.error(f"--latency-ms must lie in [0, 10000], got {args.latency_ms:g}")
    if args.bandwidth is not None:
        if not args.network:
            ap.error(BANDWIDTH_NEEDS_NETWORK)
        if not 0 < args.bandwidth <= 1_000_000:
            ap.error(f"--bandwidth must lie in (0, 1000000] Mbit/s, got {args.bandwidth:g}")
    if args.comparison != "default" and args.parties != 2:
        ap.error("--comparison fss is for 2 parties (the DCF keys are dealt to two)")
    latency = args.latency_ms or 0.0
    try:
        common, per = parse_sizes(args.sizes)
    except argparse.ArgumentTypeError as e:
        ap.error(str(e))
    workloads = [w.strip().upper() for w in args.workloads.split(",") if w.strip()]
    unknown = [w for w in workloads if w not in OPS]
    if unknown:
        ap.error(f"unknown workload(s) {', '.join(unknown)} (known: {', '.join(_ids())})")
    if args.security != "semi-honest" and not workloads:
        workloads = list(security.MALICIOUS_WORKLOADS)
    why = security.check_options(args.comparison, args.security, workloads, args.plan)
    if why:
        ap.error(why)
    cases = select_cases(args.quick, args.k, args.parties, common, per, workloads, args.hf_tiny)
    if not cases:
        ap.error("no case matches --workloads/-k")
    if args.list:
        for c in cases:
            print(c.id)
        return 0

    meta: dict[str, Any] = report.machine_info()
    words = sys.argv[1:] if argv is None else argv
    meta.update(
        command=" ".join(["python -m benchmarks", *words]),
        parties=args.parties,
        repeat=args.repeat,
        workers="in-process (VirtualWorker), serial"
        if args.serial
        else "in-process (VirtualWorker)",
        frac_bits=16,
        torch_threads=1,
        load_before=meta.pop("load"),
    )
    if args.network:
        meta.update(workers=report.NETWORK_WORKERS, network=True, latency_ms=latency)
        if args.bandwidth is not None:
            meta.update(bandwidth_mbit=args.bandwidth)
    if args.plan:
        meta.update(plan=list(PLAN_WORKLOADS))
    if args.preprocess:
        meta.update(preprocess=True)
    meta.update(comparison=args.comparison, security=args.security)
    try:
        with _sigterm_as_interrupt() if args.network else contextlib.nullcontext():
            loopback = _run(cases, args, 0.0)[0] if latency else []
            rows, bad = _run(cases, args, latency)
            with_loopback(rows, loopback)
    except KeyboardInterrupt:
        stopped = " (worker processes stopped)" if args.network else ""
        print(f"python -m benchmarks: interrupted{stopped}", file=sys.stderr)
        return 130
    meta["load_after"] = report.load_average()

    print(report.describe(meta))
    print(format_table(rows))
    if latency:
        print()
        print(report.floor_table(rows, latency))
    if args.comparison == "both":
        print()
        print(crossover_table(rows))
    if args.security == "both":
        print()
        print(security.security_table(rows))
    for row in rows:
        if row.get("preprocess_s") is not None:
            print(
                f"{row['workload']} {row['op']} {row['size']}: offline (mpc.preprocess, outside "
                f"the timer) {_fmt_time(row['preprocess_s'])} per call; online: the median above"
            )
    if args.markdown:
        print()
        print(format_markdown(rows))
        if latency:
            print()
            print(report.floor_table(rows, latency, markdown=True))
        if args.comparison == "both":
            print()
            print(crossover_table(rows, markdown=True))
        if args.security == "both":
            print()
            print(security.security_table(rows, markdown=True))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(_finite({"meta": meta, "rows": rows}), f, indent=1, default=str)
        print(f"wrote {args.json}", file=sys.stderr)
    if args.record:
        results.record(args.record, _finite(meta), _finite(rows))
        print(f"added this run to {args.record}", file=sys.stderr)
    if args.plot:
        report.plot_throughput(rows, args.plot, title=report.describe(meta))
        print(f"wrote {args.plot}", file=sys.stderr)
    for line in bad:
        print(f"INCORRECT: {line}", file=sys.stderr)
    return 1 if bad else 0


def with_loopback(rows: list[dict[str, Any]], loopback: list[dict[str, Any]]) -> None:
    """Each row gets ``loopback_s``: the median of the same case (workload, op, size) in
    ``loopback``, the run without the added latency."""
    t0 = {(r["workload"], r["op"], str(r["size"])): r.get("median_s") for r in loopback}
    for r in rows:
        key = (r["workload"], r["op"], str(r["size"]))
        if t0.get(key) is not None:
            r["loopback_s"] = t0[key]


def _run(
    cases: list[Case], args: argparse.Namespace, latency: float
) -> tuple[list[dict[str, Any]], list[str]]:
    """Measure every case (on served workers with ``--network``); the rows and failures."""
    rows: list[dict[str, Any]] = []
    bad: list[str] = []
    cluster = None
    progress = None
    try:
        factory = None
        if args.serial:
            factory = functools.partial(pt.VirtualWorker, concurrent=False)
        if args.network:
            configs = [m.config() for m in security.run_modes(args)]
            cluster = _start_cluster(cases, latency, args.bandwidth, configs)
            factory = cluster.connect
            if any(c.workload in HF_WORKLOADS for c in cases):  # (see _start_cluster)
                factory = functools.partial(cluster.connect, timeout=HF_TIMEOUT)
        modes = security.run_modes(args)
        progress = _progress(len(cases) * len(modes) * (args.repeat + 2), args.no_progress)
        for case, mode in ((c, m) for c in cases for m in modes):
            progress.set_description(case.id + mode.suffix())
            # the sessions' config (None: the default one, as without the options)
            workloads.workers.CONFIG = mode.config()
            w = case.build(factory)
            planned = args.plan and case.workload in PLAN_WORKLOADS
            offline = as_plan(w) if planned else None
            dealt = None
            if args.preprocess and (planned or w.preprocess is not None):
                # warm-up, the timed runs, profile and check
                dealt = preprocess_plan(w, args.repeat + 3)
            clock = processes_cpu(cluster.pids()) if cluster is not None else None
            row = measure(
                w, repeat=args.repeat, progress=lambda: progress.update(), cpu_clock=clock
            )
            if offline is not None:
                row.update(plan=True, plan_record_s=offline)
            if dealt is not None:
                row.update(preprocess_s=dealt)
            row.update(comparison=mode.comparison, security=mode.security)
            row.update(dict(mode.thresholds))  # (only those other than the defaults)
            row["op"] += mode.suffix()
            if cluster is not None:
                cluster.close_connections()  # the next case connects afresh
                row.update(workers="network", latency_ms=latency)
                if args.bandwidth is not None:
                    row.update(bandwidth_mbit=args.bandwidth)
            rows.append(row)
            bad += failures(row)
            # the case's workers, shared model and stores go before the next case builds:
            # W16 after W14 in one run peaked at 17.5 GB (8.97 GB alone) while W14's
            # workload stayed bound here and its in-process workers were held by their
            # lane threads (for 2 s idle); parties, sessions and pointers refer to each
            # other, so only a collection frees them
            del w
            release_idle_lanes()
            gc.collect()
    finally:
        workloads.workers.CONFIG = None  # (back to the default config for whatever runs next)
        if progress is not None:
            progress.close()
        if cluster is not None:
            cluster.stop()
    return rows, bad


@contextlib.contextmanager
def _sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so ``finally`` stops the worker
    processes; the previous handler comes back afterwards. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _start_cluster(
    cases: list[Case],
    latency: float,
    bandwidth: float | None = None,
    configs: list[Any] | None = None,
) -> Any:
    """Serve every worker the cases use, each in its own process on 127.0.0.1 (with a
    simulated ``bandwidth`` in Mbit/s: set in the environment the processes inherit); a
    generation's owner approves its programs for each of ``configs`` (the run's modes)."""
    import os

    from pointers.network.cluster import LocalCluster
    from pointers.network.transport import BANDWIDTH_ENV

    names = list(dict.fromkeys(n for c in cases for n in worker_names(c.workload, c.parties)))
    link = f", simulated bandwidth {bandwidth:g} Mbit/s" if bandwidth else ""
    print(
        f"python -m benchmarks: starting {len(names)} worker processes "
        f"({', '.join(names)}) on 127.0.0.1, mutual TLS, added latency {latency:g} ms"
        f"{link} ...",
        file=sys.stderr,
    )
    if bandwidth:  # the client's own connections read it when they are made
        os.environ[BANDWIDTH_ENV] = f"{bandwidth:g}"
    else:
        os.environ.pop(BANDWIDTH_ENV, None)
    server_args: list[str] = []
    if any(c.workload in HF_WORKLOADS for c in cases):
        # a full-size model's shares, its weights' instances and a prefill's comparisons
        # take a client past the default 4 GiB per worker (GPT-2 small: about 6 GB)
        server_args = ["--max-stored-mb", str(HF_STORED_MB)]
        # a party waits for the crypto provider's share of each product while the provider
        # computes it; at BERT-base's size one such product (the one-hot rows times a
        # 10922-row piece of the embedding table) takes 3 to 40 s, so a provider that lags
        # on a loaded machine passed the default 10 s (PartyUnavailable "waited 10 s")
        # (and the client's calls, in which a command may wait that long, a longer
        # timeout still: HF_TIMEOUT)
        server_args += ["--deadline", str(HF_DEADLINE)]
        # a held model's shares go from its owner's worker to each party whole: GPT-2's
        # token embedding is 309 MB, over the default 256 MiB a message
        server_args += ["--max-message-mb", str(HF_MESSAGE_MB)]
        # glibc keeps freed large tensors in its heap once its dynamic mmap threshold has
        # grown: a BERT-base party process reached 13 GB (2 layers: 3.5 GB, 1.2 GB with this)
        os.environ.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
        print(
            f"  (W14-W17: each worker serves --max-stored-mb {HF_STORED_MB} --deadline "
            f"{HF_DEADLINE} --max-message-mb {HF_MESSAGE_MB}, with "
            f"MALLOC_MMAP_THRESHOLD_={os.environ['MALLOC_MMAP_THRESHOLD_']})",
            file=sys.stderr,
        )
    with tempfile.TemporaryDirectory(prefix="benchmarks-offers-") as offers:
        worker_args = {}
        for c in cases:  # generation: the owner's worker serves the owner's offer file
            if c.workload in OWNERS:
                print(f"  ({c.workload}: the owner approves its model ...)", file=sys.stderr)
                path = write_offer(Path(offers), c.workload, c.size, c.parties, c.tiny, configs)
                worker_args[OWNERS[c.workload]] = ["--offer", str(path)]
        cluster = LocalCluster(
            names, latency_ms=latency, server_args=server_args, worker_args=worker_args
        )
        return cluster.start()  # (the servers read their offer files as they start)


HF_WORKLOADS = ("W14", "W15", "W16", "W17")
HF_STORED_MB = 16384
HF_MESSAGE_MB = 512
HF_DEADLINE = 600  # seconds (serve --deadline)
HF_TIMEOUT = 900.0  # seconds per call of the client (connect(timeout=...); default 120)


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
    try:
        from tqdm import tqdm
    except ImportError:  # an optional extra: pip install 'tessera-mpc[bench]'
        if not disable:
            print("(no progress bar: tqdm is not installed)", file=sys.stderr)
        disable = True
        return _NoProgress()
    return tqdm(total=total, file=sys.stderr, unit="run", disable=disable, leave=False)


class _NoProgress:
    def update(self, n: int = 1) -> None:
        pass

    def set_postfix_str(self, s: str) -> None:
        pass

    def close(self) -> None:
        pass


if __name__ == "__main__":
    sys.exit(main())
