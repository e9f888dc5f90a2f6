"""Operands too big for one step, in pieces: a run whose largest step would declare more
than :data:`mpc.config.STEP_BYTES` (the most a served worker would hold for one call of
one client by default is 4 GiB, all it stores included) runs on pieces of its operands,
one after the other, the workers done with each piece before the next is sent (so what
a piece's steps hold is freed first), and the results are joined: each piece costs the
run's rounds, and no step is refused for its size (:func:`count`, :func:`split`,
:func:`each`, :func:`join`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, cast

import torch

from mpc import config
from mpc.protocols.parties import Shares
from mpc.session import Session, recording
from pointers.worker.functions import function_size

T = TypeVar("T")
R = TypeVar("R")


def count(step: Callable[..., Any], params: dict[str, Any], elements: int) -> int:
    """The pieces an operand of ``elements`` elements takes so that ``step``, called with
    ``params`` for the whole of it, declares at most :data:`mpc.config.STEP_BYTES` a piece
    (its declaration grows with the elements): 1 where it fits."""
    spec = function_size(step)
    if spec is None or elements <= 1:
        return 1
    peak = spec.peak(params)
    return max(1, min(elements, math.ceil(peak / config.STEP_BYTES)))


def split(shares: Shares, k: int, rows: bool = False) -> list[Shares]:
    """``shares`` in ``k`` pieces of about equal size, each party's the same: of the
    flattened elements, or (``rows``) of the first dimension."""
    length = shares[0].shape[0] if rows else shares[0].numel()
    step = -(-length // k)
    flat = shares if rows else [s.reshape(-1) for s in shares]
    return [[s[k0 : k0 + step] for s in flat] for k0 in range(0, length, step)]


def each(session: Session, parts: Iterable[T], run: Callable[[T], R]) -> list[R]:
    """``run`` of each piece, the session's workers done with one (:meth:`Session.sync`)
    before the next is sent (but while a plan is recorded: its commands are not sent)."""
    out = []
    for k, part in enumerate(parts):
        if k and not recording():
            session.sync()
        out.append(run(part))
    return out


def join(pieces: list[Shares], shape: Any = None) -> Shares:
    """The pieces' results joined at each party (the first dimension), in ``shape`` if
    given (the flattened operand's)."""
    out = [torch.cat(list(col)) for col in zip(*pieces)]
    if shape is not None:
        out = [s.reshape(list(shape)) for s in out]
    return cast(Shares, out)  # (ops on pointers give pointers; torch's stubs say Tensor)


__all__ = ["count", "each", "join", "split"]
