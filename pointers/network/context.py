"""What the connections of one client share: :class:`ClientContext`.

Messages to network workers are pipelined, so a failed command is reported by a later
call that waits for an answer, possibly on another connection. A :class:`ClientContext`
numbers every message its connections send (one clock for all of them) and uses those
numbers to report errors in the order their causes happened:

* when a call fails, the context raises the *root cause*: the earliest error any of its
  connections holds for a message posted before the failed one. It waits briefly
  (:attr:`ClientContext.root_cause_wait`) for connections still running such earlier
  messages, since their failure may be what made this call fail (a data worker's command
  fails, so its delivery to a party fails, so the party's command fails);
* an error raised to the caller consumes the pending errors of every message posted before
  it, to any worker of the context: they belong to the computation that just failed (as
  in process, where the first failing op raises and the later ones never run).

:func:`pointers.connect` puts every connection in :data:`DEFAULT_CONTEXT` unless given
``context=``; give independent computations (e.g. one per thread) a context each so that
one's errors are never reported, nor consumed, by the other.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from typing import Protocol


class Connection(Protocol):
    """What a context asks of its connections (the real class, in
    :mod:`pointers.network.connection`, imports this module): the first error of a
    posted message it holds, and whether a message numbered below ``seq`` is still
    queued or in flight."""

    deferred: tuple[BaseException, int] | None

    def busy_before(self, seq: int) -> bool: ...


class ClientContext:
    """The message clock and the error order shared by a client's connections."""

    def __init__(self, root_cause_wait: float = 2.0) -> None:
        if not 0 <= root_cause_wait <= 60:
            raise ValueError(f"root_cause_wait must lie in [0, 60] seconds, got {root_cause_wait}")
        self.root_cause_wait = root_cause_wait
        self.raised = 0  # the number of the latest message whose failure was raised
        self._count = itertools.count(1)
        self._connections: weakref.WeakSet[Connection] = weakref.WeakSet()
        self._cond = threading.Condition()
        # (pid, token) of this context's client session (see pointers.network.lease)
        self.session: tuple[int, str] | None = None

    @property
    def lock(self) -> threading.Condition:
        """The context's lock (a condition variable), for state kept on the context."""
        return self._cond

    def tick(self) -> int:
        """The next message number (thread-safe)."""
        return next(self._count)

    def consumed(self, seq: int) -> None:
        """An error was raised at message ``seq``: earlier pending errors are reported."""
        with self._cond:
            if seq > self.raised:
                self.raised = seq

    def register(self, conn: Connection) -> None:
        with self._cond:
            self._connections.add(conn)

    def settled(self) -> None:
        """A connection finished a call (wakes :meth:`root_cause`)."""
        with self._cond:
            self._cond.notify_all()

    def root_cause(self, error: BaseException, seq: int) -> BaseException:
        """The error to raise for a call whose ``error`` comes from message ``seq``.

        That is the earliest error a connection of this context holds for a message posted
        before ``seq`` and not yet reported, once every connection finished its messages
        posted before it (waiting at most :attr:`root_cause_wait` seconds); the error
        returned is taken from its connection. ``error`` itself when there is none."""
        end = time.monotonic() + self.root_cause_wait
        with self._cond:
            while True:
                best: tuple[Connection, tuple[BaseException, int]] | None = None
                for conn in list(self._connections):
                    held = conn.deferred
                    if held is not None and self.raised <= held[1] < seq:
                        if best is None or held[1] < best[1][1]:
                            best = (conn, held)
                limit = seq if best is None else best[1][1]
                busy = any(c.busy_before(limit) for c in list(self._connections))
                left = end - time.monotonic()
                if not busy or left <= 0:
                    break
                self._cond.wait(min(left, 0.05))
        if best is None:
            return error
        conn, held = best
        if conn.deferred is held:
            conn.deferred = None
        return held[0]


DEFAULT_CONTEXT = ClientContext()
"""The context of every connection made without ``context=``: created here, once, so that
the workers of a script share one error order without the script naming a context."""
