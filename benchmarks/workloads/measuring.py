""":func:`measure` times a workload (one warm-up, then ``repeat`` runs) and :func:`profile`
records the rest: plaintext time, rounds and bytes of one run under ``mpc.stats()``, the
time spent inside the crypto provider and the correctness check. :func:`processes_cpu`
clocks the CPU of served worker processes too."""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import mpc
import pointers as pt
from benchmarks.workloads.registry import WORKLOADS
from benchmarks.workloads.rss import peak_rss
from benchmarks.workloads.workers import WorkerFactory
from benchmarks.workloads.workload import Workload

# Rows measured in this process (the benchmark tests append here; conftest prints them).
RESULTS: list[dict[str, Any]] = []


def _time_calls(
    fn: Callable[[], Any],
    inner: int,
    sync: Callable[[], Any] | None = None,
    after: Callable[[], Any] | None = None,
) -> float:
    """Seconds per call of ``fn``, over ``inner`` back-to-back calls (then ``sync()``,
    inside the timer: waiting until network workers ran them; ``after()`` outside it)."""
    t0 = time.perf_counter()
    for _ in range(inner):
        fn()
    if sync is not None:
        sync()
    elapsed = time.perf_counter() - t0
    if after is not None:
        after()
    return elapsed / inner


def _calibrate(fn: Callable[[], Any], target: float, sync: Callable[[], Any] | None = None) -> int:
    """How many calls make one timing sample last about ``target`` seconds (at least 1)."""
    once = _time_calls(fn, 1, sync)
    if once >= target:
        return 1
    inner = max(1, int(target / max(once, 1e-7)))
    per = _time_calls(fn, inner, sync)  # refine: the first call is often slower
    return max(1, int(target / max(per, 1e-9)))


def time_plain(fn: Callable[[], Any], repeat: int = 5, target: float = 0.01) -> float:
    """Median seconds per call of a (usually fast) plaintext op, looped to ``target`` s."""
    fn()
    inner = _calibrate(fn, target)
    return statistics.median(_time_calls(fn, inner) for _ in range(max(repeat, 3)))


class _DealerTimer:
    """Adds up the time the crypto provider spends serving messages (its material work).

    Wraps the worker's ``handle_frames`` for the duration of a ``with`` block (an instance
    attribute, removed on exit). The dealer's work happens inline in this engine, not in a
    separate offline phase, so this is the dealer share of the online time.
    """

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.seconds = 0.0
        self.cpu_seconds = 0.0  # CPU time of the serving thread (less sensitive to load)

    def __enter__(self) -> _DealerTimer:
        if not isinstance(self.worker, pt.VirtualWorker):
            self.worker = None  # nothing to time here: no dealer, or a served one
            self.seconds = self.cpu_seconds = math.nan
            return self
        inner = self.worker.handle_frames

        def timed(header: bytes, buffers: list[Any], **kwargs: Any) -> Any:
            t0, c0 = time.perf_counter(), time.thread_time()
            try:
                return inner(header, buffers, **kwargs)
            finally:
                self.seconds += time.perf_counter() - t0
                self.cpu_seconds += time.thread_time() - c0

        setattr(self.worker, "handle_frames", timed)  # noqa: B010 - (a method, patched on purpose)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.worker is not None:
            del self.worker.handle_frames


def _worker_totals(workers: list[Any]) -> dict[str, int]:
    keys = ("messages_received", "bytes_received", "bytes_sent", "peer_bytes_sent")
    return {k: sum(getattr(w.stats, k) for w in workers) for k in keys}


def profile(w: Workload, repeat: int = 5) -> dict[str, Any]:
    """Everything but the secure timing: plaintext time, communication of one run, the
    crypto provider's time in that run, and correctness."""
    info: dict[str, Any] = {
        "workload": w.id,
        "op": w.op,
        "size": w.size,
        "name": w.name,
        "parties": len(w.workers) if w.kind == "mpc" else 1,
        "elements": w.elements,
        "shape": list(w.shape),
    }
    info["plain_s"] = time_plain(w.plain, repeat)
    if w.kind == "mpc":
        everyone = w.everyone
        before = _worker_totals(everyone)
        clients_before = [c.stats.snapshot() for c in w.clients]
        c0 = time.process_time()
        with _DealerTimer(w.dealer) as dt, mpc.stats() as s:
            w.run()
            w.sync()
        run_cpu = time.process_time() - c0
        after = _worker_totals(everyone)
        info.update(
            rounds=s.rounds,
            bytes_per_party=dict(s.bytes_per_party),
            max_bytes_per_party=s.max_bytes_per_party,
            dealer_bytes=s.dealer_bytes,
            client_messages=s.client_messages,
            # what the client sent to the workers (peer deliveries are counted by the peer
            # that sent them, so they are taken out)
            client_bytes_sent=(after["bytes_received"] - before["bytes_received"])
            - (after["peer_bytes_sent"] - before["peer_bytes_sent"]),
            dealer_s=dt.seconds,
            dealer_cpu_s=dt.cpu_seconds,
            # this process's CPU time in that run (in process: every party and the dealer)
            run_cpu_s=run_cpu if w.in_process else math.nan,
        )
        if w.clients:
            info["upload_bytes_per_client"] = max(
                after_c.peer_bytes_sent - before_c.peer_bytes_sent
                for before_c, after_c in zip(clients_before, (c.stats for c in w.clients))
            )
    else:
        (worker,) = w.workers
        calls = 200
        before = worker.stats.snapshot()
        for _ in range(calls):
            w.run()
        w.sync()
        after = worker.stats.snapshot()
        msgs = after.messages_received - before.messages_received
        info.update(
            messages_per_op=msgs / calls,
            bytes_per_message=(after.bytes_received - before.bytes_received) / max(msgs, 1),
            reply_bytes_per_message=(after.bytes_sent - before.bytes_sent) / max(msgs, 1),
        )
    info.update(w.check())
    if w.track_rss:
        info["peak_rss_bytes"] = peak_rss()
    return info


def finish(
    info: dict[str, Any], times: list[float], cpu_times: list[float] | None = None
) -> dict[str, Any]:
    """Add the secure timing (seconds per run) and the ratio to a :func:`profile` row;
    ``cpu_times`` (process CPU seconds per run) adds ``cpu_median_s``."""
    if cpu_times:
        # all parties run in this process on one torch thread, so this is the work of the
        # whole protocol; it grows much less than wall time when other processes load the CPU
        info["cpu_median_s"] = statistics.median(cpu_times)
    info["median_s"] = statistics.median(times)
    info["min_s"] = min(times)
    info["max_s"] = max(times)
    info["runs"] = len(times)
    info["ratio"] = info["median_s"] / info["plain_s"] if info["plain_s"] > 0 else math.inf
    if info.get("elements"):
        info["elements_per_s"] = info["elements"] / info["median_s"]
    if "messages_per_op" in info:
        info["overhead_us"] = (info["median_s"] - info["plain_s"]) * 1e6
    return info


def measure(
    workload: str | Workload,
    size: int | None = None,
    repeat: int = 5,
    parties: int = 2,
    progress: Callable[[], Any] | None = None,
    factory: WorkerFactory | None = None,
    cpu_clock: Callable[[], float] | None = None,
) -> dict[str, Any]:
    """Warm up once, time ``repeat`` runs (perf_counter; median/min/max), time the
    plaintext op, and record rounds, bytes, client messages and correctness of one run.

    ``workload`` is an id ("W1".."W8", "P1", "P2") with ``size`` (and ``parties``, 2 to 5
    computing parties; ``factory`` makes the workers, default ``pt.VirtualWorker``), or a
    built Workload. Sub-millisecond ops (the pointer cases) are looped so each sample lasts
    ~10 ms; times are per call. ``progress`` is called after the warm-up, after each timed
    run and after the profiling run (``repeat + 2`` calls).

    On network workers (any worker that is not a ``VirtualWorker``) each timed sample ends
    with :meth:`Workload.sync` inside the timer (commands are pipelined: without it the
    timer would stop before the workers did the work), or, for a run that reveals its
    result (``Workload.revealed``), right after the timer; their ``cpu`` column needs
    ``cpu_clock``, CPU seconds of every process involved (see :func:`processes_cpu`).
    """
    torch.set_num_threads(1)
    tick = progress or (lambda: None)
    if isinstance(workload, str):
        if size is None:
            raise TypeError("measure() needs a size with a workload id")
        w = WORKLOADS[workload](size, parties=parties, factory=factory)
    else:
        w = workload
    local = w.in_process
    sync = None if local else w.sync
    after = None
    if sync is not None and w.revealed:  # the result in hand ends the run (see Workload)
        sync, after = None, sync
    # W14-W16: the first query also opens each weight's F = W - B (a weight instance,
    # mpc.protocols.weights), what every query would send without the masks' reuse
    with mpc.stats() if w.kind == "mpc" and w.track_rss else contextlib.nullcontext() as first:
        w.run()  # warm-up
        w.sync()
    first_bytes = None if first is None else first.max_bytes_per_party
    tick()
    inner = _calibrate(w.run, 0.01, sync) if w.kind == "pointer" else 1
    times, cpu_times = [], []
    clock = cpu_clock or time.process_time
    start = clock()
    for _ in range(repeat):
        c0 = clock()
        times.append(_time_calls(w.run, inner, sync, after))
        cpu_times.append((clock() - c0) / inner)
        tick()
    if cpu_clock is not None:  # (other processes' CPU comes in ticks of 10 ms: the mean)
        cpu_times = [(clock() - start) / (repeat * inner)]
    row = finish(profile(w, repeat), times, cpu_times if local or cpu_clock else None)
    if first_bytes is not None:
        row["first_run_max_bytes_per_party"] = first_bytes
    tick()
    return row


def processes_cpu(pids: list[int]) -> Callable[[], float]:
    """A clock of CPU seconds (user + system, every thread) of this process and of the
    processes ``pids`` together (Linux: /proc/PID/stat; elsewhere this process only)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def other(pid: int) -> float:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / tick  # utime, stime

    def clock() -> float:  # (this process's own to the ns: the others' come in ticks)
        return time.process_time() + sum(other(p) for p in pids)

    return clock


def timings(benchmark: Any, fn: Callable[[], Any]) -> list[float]:
    """Per-call times pytest-benchmark recorded; with --benchmark-disable it records none,
    so time one call here."""
    data = getattr(getattr(getattr(benchmark, "stats", None), "stats", None), "data", None)
    if data:
        return list(data)
    return [_time_calls(fn, 1)]


# --------------------------------------------------------------------------- reporting
