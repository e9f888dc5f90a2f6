"""Peak resident memory of this process (the W14-W16 rows record it)."""

from __future__ import annotations

from pointers.worker.memory import trim_heap


def reset_peak_rss() -> bool:
    """Start counting this process's peak resident memory afresh (Linux:
    ``/proc/self/clear_refs``), after :func:`~pointers.worker.memory.trim_heap`, so that
    the count starts from what is in use (the parties of an earlier case must be dropped
    and their lane threads ended first: ``pointers.worker.lanes.release_idle_lanes``);
    False where that is not possible (the peak is then the process's peak since it
    started)."""
    trim_heap()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def peak_rss() -> int | None:
    """Peak resident memory of this process in bytes, since :func:`reset_peak_rss`
    (``VmHWM``; elsewhere ``ru_maxrss``, since the process started)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024
    except (ImportError, OSError):
        return None
