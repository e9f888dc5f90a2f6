"""A party that deviates from the protocol, for the attack tests of the malicious mode:
one in-process worker runs a protocol step that changes one of its outputs (an error added
to a share, a piece of an opening, a triple share, an output share...) or hands on a stale
one (the same output of the step's previous call: another instance's material)."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

import torch

from mpc.protocols.step import name_of
from pointers.worker.faults import add_error


@contextlib.contextmanager
def deviating(
    worker: Any,
    step: Any,
    output: int = 0,
    error: int = 1,
    part: tuple[int, ...] = (0, 0),
    stale: bool = False,
    flip: bool = False,
    every: bool = False,
) -> Iterator[list[int]]:
    """Inside: ``worker`` runs ``step`` with output ``output`` changed: ``error`` added to
    ``t[part]``'s first element (``every``: to each of its elements), or (``stale``) the
    output of the previous call of the same shape, or (``flip``) the first element XOR 1.
    Yields a list holding how often it deviated."""
    name = name_of(step)
    functions = worker.functions
    original = functions.get(name)
    previous: dict[tuple[int, ...], torch.Tensor] = {}  # by shape
    count = [0]

    def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(ctx, *args, **kwargs)
        many = isinstance(out, list | tuple)
        outs = list(out) if many else [out]
        t = outs[output]
        if stale:
            old = previous.get(tuple(t.shape))
            previous[tuple(t.shape)] = t.clone()
            if old is not None:
                outs[output] = old
                count[0] += 1
        elif every:
            changed = t.clone()
            e = error % (1 << 64)
            changed[part] += e - (1 << 64) if e >> 63 else e  # (int64: wraps)
            outs[output] = changed
            count[0] += 1
        elif flip:
            changed = t.clone()
            changed.view(-1)[0] ^= 1
            outs[output] = changed
            count[0] += 1
        else:
            outs[output] = add_error(t, part, error)
            count[0] += 1
        return outs if many else outs[0]

    for attr in ("__sealing__", "__size__", "__step__"):
        if hasattr(original, attr):
            setattr(run, attr, getattr(original, attr))
    run.__signature__ = inspect.signature(original)  # type: ignore[attr-defined]
    functions._functions[name] = run
    functions._parameters.pop(name, None)
    try:
        yield count
    finally:
        functions._functions[name] = original
        functions._parameters.pop(name, None)
