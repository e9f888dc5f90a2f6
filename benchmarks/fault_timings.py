"""How long a client waits to learn that a served worker is gone: ``python -m
benchmarks.fault_timings``.

Starts 3 served workers (``alice``, ``bob`` and the crypto provider ``carol``: ``python -m
pointers serve`` processes on 127.0.0.1 with mutual TLS and their default options) for
each trial, then either kills ``bob`` (SIGKILL: a dead worker) or stops it (SIGSTOP: a
hung one, which keeps its sockets open but answers nothing, as a partitioned machine
does), and times, from that moment, the client's next call until it raises:

* ``direct``: a call to ``bob`` itself (``(y + 1).get()`` on a pointer to ``bob``);
* ``shared``: a product of values shared between ``alice`` and ``bob``, revealed
  (``(a * b).get()``): ``alice`` needs ``bob``'s opening.

Then, for a stopped worker, SIGCONT and the time until the same connection works again.
Prints one line per trial and the median of each; ``--repeat`` trials each (default 3).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

import mpc
import pointers as pt
from pointers.network.cluster import LocalCluster


def _time_failure(call: Callable[[], Any], limit: float = 300.0) -> tuple[float, str]:
    """Seconds until ``call`` raises, and the error's type and first words."""
    start = time.monotonic()
    try:
        call()
    except Exception as e:  # the failure is what is measured
        took = time.monotonic() - start
        return took, f"{type(e).__name__}: {str(e)[:120]}"
    took = time.monotonic() - start
    return took, f"no error after {took:.1f} s (limit {limit:g} s)"


def _wait_state(proc: Any, how: str) -> None:
    """Until the process is dead (``kill``) or stopped (``stop``: state T in /proc)."""
    if how == "kill":
        proc.wait(timeout=30)
        return
    for _ in range(3000):
        with open(f"/proc/{proc.pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "T":
                return
        time.sleep(0.01)
    raise RuntimeError(f"process {proc.pid} did not stop")


def trial(how: str, what: str) -> dict[str, Any]:
    """One fresh cluster; ``how`` is "kill" or "stop", ``what`` "direct" or "shared"."""
    with LocalCluster(["alice", "bob", "carol"]) as cluster:
        alice, bob, carol = (cluster.connect(n) for n in ("alice", "bob", "carol"))
        x, y = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 4.0])
        a = mpc.share(x, alice, bob, crypto_provider=carol)
        b = mpc.share(y, alice, bob, crypto_provider=carol)
        assert torch.allclose((a * b).get(), x * y, atol=1e-3)  # everything warm
        p = pt.send(torch.ones(2), bob)
        for w in (alice, bob, carol):
            w.sync()
        proc = cluster.servers["bob"].proc
        assert proc is not None
        os.kill(proc.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        _wait_state(proc, how)  # (kill() returns before the signal has taken effect)
        if what == "direct":
            took, error = _time_failure(lambda: (p + 1).get())
        else:
            took, error = _time_failure(lambda: (a * b).get())
        out: dict[str, Any] = {"how": how, "what": what, "seconds": took, "error": error}
        if how == "stop":
            os.kill(proc.pid, signal.SIGCONT)
            start = time.monotonic()
            while time.monotonic() - start < 60:
                try:
                    pt.send(torch.ones(2), bob).get()
                    break
                except Exception:
                    time.sleep(0.1)
            out["back_after_sigcont_s"] = time.monotonic() - start
        return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fault_timings", description=__doc__)
    ap.add_argument("--repeat", type=int, default=3, help="trials of each case (default 3)")
    args = ap.parse_args(argv)
    print(f"load average before: {os.getloadavg()}", flush=True)
    results: dict[tuple[str, str], list[float]] = {}
    for how in ("kill", "stop"):
        for what in ("direct", "shared"):
            for _ in range(args.repeat):
                r = trial(how, what)
                results.setdefault((how, what), []).append(r["seconds"])
                back = r.get("back_after_sigcont_s")
                more = f", works again {back:.2f} s after SIGCONT" if back is not None else ""
                print(f"{how:>4} {what:<6} {r['seconds']:6.2f} s  {r['error']}{more}", flush=True)
    print(f"load average after: {os.getloadavg()}")
    for (how, what), secs in results.items():
        print(
            f"{'dead (SIGKILL)' if how == 'kill' else 'stopped (SIGSTOP)'}, {what}: median "
            f"{statistics.median(secs):.2f} s (min {min(secs):.2f}, max {max(secs):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
