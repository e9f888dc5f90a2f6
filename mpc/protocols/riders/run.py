"""Truncations that ride in the first round of the next comparison run (MP-SPDZ merges
the openings of independent operations the same way): :func:`riding`.

A truncation is one opening (c = z + r, :class:`~mpc.protocols.truncation.run.TruncRun`)
and a local finish. When its result is needed only after a comparison that does not
depend on it, its opening can travel with the comparison's first opening (c = x + r of
the comparison), so it costs no round of its own. Layer norm compares the squares' sum S
at its full scale with its bins' thresholds while S's truncation, which the bins' slopes
multiply, rides along (:func:`mpc.ops.functions.layer_norm`).

Only the batching changes: each truncation keeps its own nonce, material, steps and
rules; an opening is an opening whatever else travels in its round. A rider left when
the block ends (no comparison ran) opens in a round of its own, so the result is always
there.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import Shares
from mpc.protocols.truncation.run import TruncRun

_RIDING: contextvars.ContextVar[Riders | None] = contextvars.ContextVar("mpc_riders", default=None)


class Riders:
    """Truncations waiting for a round; ``results`` once they rode (in their order)."""

    def __init__(self, runs: list[TruncRun]) -> None:
        self.runs = list(runs)
        self.results: list[Shares] = []
        self._opened: list[Opened] = []

    def open_in(self, round: Round) -> None:
        self._opened = [r.open_in(round) for r in self.runs]

    def finish(self) -> None:
        self.results = [r.finish(o.value) for r, o in zip(self.runs, self._opened)]
        self.runs, self._opened = [], []


def take() -> Riders | None:
    """The truncations waiting to ride (the next comparison's first round calls this,
    and then :meth:`Riders.open_in` and, once the round opened, :meth:`Riders.finish`),
    or None."""
    riders = _RIDING.get()
    if riders is None or not riders.runs:
        return None
    return riders


@contextmanager
def riding(runs: list[TruncRun]) -> Iterator[Riders]:
    """Inside the block, ``runs`` open in the first round of the first comparison run
    (:class:`~mpc.protocols.comparison.base.ComparisonRun`); their results are the
    yielded object's ``results`` after the block."""
    riders = Riders(runs)
    token = _RIDING.set(riders)
    try:
        yield riders
    finally:
        _RIDING.reset(token)
    if riders.runs:  # (no comparison ran: a round of their own)
        one = Round(runs[0].session)
        riders.open_in(one)
        one.open()
        riders.finish()
