"""Handing freed memory back to the system (a served worker after a session's requests,
the benchmark between cases)."""

from __future__ import annotations

import ctypes
import gc
import sys


def trim_heap() -> None:
    """A collection (objects caught in reference cycles: request buffers held by
    tracebacks, workers, sessions and pointers that refer to each other), then glibc's
    ``malloc_trim``: its arenas keep freed blocks for reuse, and it returns them to the
    system. Elsewhere the collection only."""
    gc.collect()
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
