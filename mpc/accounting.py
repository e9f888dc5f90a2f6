"""Communication accounting: rounds and bytes per party, read from the workers' counters.

``with mpc.stats() as s: ...`` records every protocol that runs inside the block:
``s.rounds`` (sequential openings among the parties), ``s.bytes_per_party`` (bytes each
party sent to its peers), ``s.dealer_bytes`` (what the crypto provider shipped),
``s.dealt`` (the bytes of the dealer's material the protocols asked for, counted by the
client as they run, or as a program is recorded) and ``s.client_messages`` (commands the
orchestrating client sent).

Work deferred inside the block (a ReLU computed at its first read,
:class:`mpc.shared.Deferred`) does not outlive it: what is still deferred when the block
ends runs then, inside the block, so the figures are those of the work the block caused
whether or not its results are read before it ends.
"""

from __future__ import annotations

import contextvars
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

_active: contextvars.ContextVar[tuple[Recorder, ...]] = contextvars.ContextVar(
    "mpc_recorders", default=()
)


@dataclass
class Recorder:
    rounds: int = 0
    #: bytes of the dealer's material the protocols asked for (its steps' out shapes)
    dealt: int = 0
    _start: dict[int, tuple[Any, Any]] = field(default_factory=dict)
    _roles: dict[int, str] = field(default_factory=dict)
    _end: dict[int, Any] = field(default_factory=dict)
    # work deferred while the block ran (weakly: a value dropped unread costs nothing)
    _deferred: list[weakref.ref[Any]] = field(default_factory=list)

    def watch(self, worker: Any, role: str) -> None:
        if id(worker) not in self._start:
            self._start[id(worker)] = (worker, worker.stats.snapshot())
            self._roles[id(worker)] = role

    def flush(self) -> None:
        """Run the work deferred inside the block that is still pending (see the module
        docstring); its rounds and bytes count here and in every enclosing block."""
        while self._deferred:
            d = self._deferred.pop()()
            if d is not None and not d.done:
                d.value()

    def close(self) -> None:
        for key, (worker, _) in self._start.items():
            self._end[key] = worker.stats.snapshot()

    def _delta(self, key: int, attr: str) -> int:
        worker, start = self._start[key]
        end = self._end.get(key) or worker.stats
        return getattr(end, attr) - getattr(start, attr)

    @property
    def bytes_per_party(self) -> dict[str, int]:
        """Bytes each computing party sent to its peers."""
        return {
            w.id: self._delta(k, "peer_bytes_sent")
            for k, (w, _) in self._start.items()
            if self._roles[k] == "party"
        }

    @property
    def max_bytes_per_party(self) -> int:
        return max(self.bytes_per_party.values(), default=0)

    @property
    def dealer_bytes(self) -> int:
        return sum(
            self._delta(k, "peer_bytes_sent") for k in self._start if self._roles[k] == "dealer"
        )

    @property
    def client_messages(self) -> int:
        """Messages the workers received from the client (their party-to-party
        deliveries among the watched workers subtracted)."""
        received = sum(self._delta(k, "messages_received") for k in self._start)
        return received - sum(self._delta(k, "peer_messages_sent") for k in self._start)

    def __repr__(self) -> str:
        return (
            f"Stats(rounds={self.rounds}, bytes_per_party={self.bytes_per_party}, "
            f"dealer_bytes={self.dealer_bytes}, client_messages={self.client_messages})"
        )


@contextmanager
def stats() -> Iterator[Recorder]:
    """Record rounds and bytes of every protocol run inside the ``with`` block."""
    rec = Recorder()
    token = _active.set(_active.get() + (rec,))
    try:
        yield rec
        rec.flush()  # (not after an error: the block's own error is the one to see)
    finally:
        _active.reset(token)
        rec.close()


def watch(parties: list[Any], dealer: Any | None) -> None:
    for rec in _active.get():
        for p in parties:
            rec.watch(p, "party")
        if dealer is not None:
            rec.watch(dealer, "dealer")


def note_deferred(work: Any) -> None:
    """``work`` (with a ``value()`` that runs it, once) was deferred: every active block
    runs it at its end if it is still pending then."""
    for rec in _active.get():
        if len(rec._deferred) >= 4096:  # (a long block: drop what was run or dropped)
            rec._deferred = [r for r in rec._deferred if _pending(r())]
        rec._deferred.append(weakref.ref(work))


def _pending(work: Any) -> bool:
    return work is not None and not work.done


def count_round(n: int = 1) -> None:
    for rec in _active.get():
        rec.rounds += n


def count_dealt(nbytes: int) -> None:
    """The dealer was asked for ``nbytes`` of material (what its step delivers)."""
    for rec in _active.get():
        rec.dealt += nbytes
