"""Peak resident memory of this process (the W14-W16 rows record it)."""

from __future__ import annotations

import ctypes
import gc
import sys


def trim_heap() -> None:
    """Give the memory earlier cases freed back to the system, so that a peak counted
    from here starts from what is in use: a collection (workers, sessions and pointers
    refer to each other), then glibc's ``malloc_trim`` (its arenas keep freed blocks:
    after W14, 7.9 -> 6.4 GB resident while W14's parties were still alive). Elsewhere
    the collection only. (The parties' lane threads must have ended first:
    ``pointers.worker.lanes.release_idle_lanes``.)"""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass


def reset_peak_rss() -> bool:
    """Start counting this process's peak resident memory afresh (Linux:
    ``/proc/self/clear_refs``), after :func:`trim_heap`; False where that is not possible
    (the peak is then the process's peak since it started)."""
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
