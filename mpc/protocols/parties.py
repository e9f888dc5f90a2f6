"""How a protocol's client-side run calls its steps: at every party, at the dealer, or at
one worker, by the step's function (:func:`mpc.protocols.step.step`); the wire carries
its name.

Notation: [x] is an additive sharing, x = sum_i x_i mod 2^64, party i holding x_i;
:data:`Shares` holds one pointer per party.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

import pointers as pt
from mpc import accounting
from mpc.protocols.step import name_of
from mpc.session import Session

Shares = list[pt.PointerTensor]
I64 = torch.int64

#: a step's outputs: (shape, dtype) of each
Out = list[tuple[Any, torch.dtype]]


def call(worker: Any, name: str, args: list[Any], out: Out) -> Shares:
    """Run the step of wire name ``name`` at ``worker`` (what every call below sends)."""
    return pt.call_function(worker, name, args, out=out)  # type: ignore[return-value]


def run_step(worker: Any, step: Callable[..., Any], args: list[Any], out: Out) -> Shares:
    """Run ``step`` at one worker; per output, a pointer to it there."""
    return call(worker, name_of(step), args, out)


def at_parties(
    session: Session, step: Callable[..., Any], args: Callable[[int], list[Any]], out: Out
) -> list[Shares]:
    """Run ``step`` at every party, party i with ``args(i)``; per output of the step, its
    shares (one pointer per party): ``e, f, a = at_parties(...)``."""
    name = name_of(step)
    per_party = [call(p, name, args(i), out) for i, p in enumerate(session.parties)]
    return [list(col) for col in zip(*per_party)]


def last_only(session: Session, value: Any) -> Callable[[int], Any]:
    """``value`` at the last party (the dealer's corrections go there), None elsewhere."""
    last = session.n - 1
    return lambda i: value if i == last else None


def deal(
    session: Session, what: str, step: Callable[..., Any], args: list[Any], out: Out
) -> Shares:
    """Run the dealer's ``step`` (its first argument: the dealer's copies of the party
    seeds) and deliver its outputs, the last party's corrections, dealer -> last party.
    The other parties derive their material from their seeds. ``what``: the operation,
    for the error where the session has no dealer."""
    dealer = session.require_dealer(what)
    corr = call(dealer, name_of(step), [session.dealer_seeds, *args], out=out)
    count_dealt(out)
    last_party = session.parties[-1]
    return [c.move(last_party) for c in corr]


def count_dealt(out: Out) -> None:
    """Count the dealer's outputs ``out`` as material it delivers
    (:attr:`mpc.accounting.Recorder.dealt`)."""
    accounting.count_dealt(sum(math.prod(shape) * dtype.itemsize for shape, dtype in out))


__all__ = [
    "I64",
    "Out",
    "Shares",
    "at_parties",
    "call",
    "count_dealt",
    "deal",
    "last_only",
    "run_step",
]
