"""The lock of a client namespace at a served worker: :class:`NamespaceLock`, a reentrant
lock that its owner can set aside while it waits (used by
:mod:`pointers.network.served` and :mod:`pointers.network.waiting`). Standard library
only."""

from __future__ import annotations

import threading
import time
from typing import Any


class NamespaceLock:
    """A reentrant lock that its owner can set aside while it waits.

    :meth:`suspend` releases it entirely (however deep the owner holds it) and returns
    what :meth:`resume` needs to take it back as it was. ``threading.RLock`` does this
    only through private methods, hence this small class.
    """

    __slots__ = ("_lock", "_owner", "_depth", "active_at")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._depth = 0
        # when the namespace last did something (a command or program took or let go of
        # the lock, a wait for a delivery began): see WaitingStore.stalled
        self.active_at = time.monotonic()

    @property
    def held(self) -> bool:
        """Whether a thread holds the lock now (a wait that set it aside does not)."""
        return self._owner is not None

    def acquire(self) -> bool:
        me = threading.get_ident()
        if self._owner == me:
            self._depth += 1
            return True
        self._lock.acquire()
        self._owner = me
        self._depth = 1
        self.active_at = time.monotonic()
        return True

    def release(self) -> None:
        if self._owner != threading.get_ident():
            raise RuntimeError("cannot release a namespace lock this thread does not hold")
        self._depth -= 1
        if not self._depth:
            self._owner = None
            self.active_at = time.monotonic()
            self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def suspend(self) -> int:
        """Release the lock if this thread holds it; the depth to resume (0: not held)."""
        if self._owner != threading.get_ident():
            return 0
        depth, self._depth, self._owner = self._depth, 0, None
        self._lock.release()
        return depth

    def resume(self, depth: int) -> None:
        """Take the lock back after :meth:`suspend` returned ``depth``."""
        if depth:
            self._lock.acquire()
            self._owner = threading.get_ident()
            self._depth = depth
