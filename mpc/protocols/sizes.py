"""What every step's size declaration is made of (:func:`mpc.protocols.step.step`'s
``size`` and ``keeps``): a step's peak function takes the call's arguments by parameter
name and bounds the bytes one call allocates at its peak, its outputs included (from the
shapes of its tensor arguments and its shape parameters; int64 words of 8 bytes); its
keeps function gives what the step keeps at the worker after it returned: the
``(seed, nonce, stream)`` records of :func:`mpc.protocols.streams.consume`
(:data:`RECORD_BYTES` each, never freed while the session lives).

A worker with a storage limit checks both against the client's limit before the step runs
(``serve --max-stored-mb``), so that no call, however small its message, allocates past
the limit; ``tests/test_limits_memory.py`` measures every step's peak against its
declaration.

A declaration models what a step holds at its peak (its outputs, its temporaries: the
live tensors, in words of its arguments' sizes, as measured) and adds a margin to it
(:func:`declared`: :data:`MARGIN` times the model, plus :data:`SLACK`), so that it is at
least the step's peak on every machine and at most 1.5 times it on this one
(``tests/test_limits_memory.py`` checks both).

A malformed shape parameter raises ``ValueError`` naming the parameter (the step itself
would refuse it too); a missing or non-tensor argument counts as one element (the step
refuses it).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.ring import (
    limbs_pay,
    relayout_pays,
    ring_conv2d,
    ring_matmul,
    speeds_measured,
)
from pointers.worker.functions import SizeFunction

WORD = 8  # bytes of an int64 ring element
RECORD_BYTES = 192  # one (seed, nonce, stream) record (measured: about 170 bytes)
INPUT_SEED_BYTES = 128  # one input seed remembered by share_from_seed
# per call: small tensors, Python objects, the allocator's rounding (a CI machine measured
# 108 KiB for a 1,024-element mpc.trunc_mask, whose tensors are 24 KiB: 64 KiB was too little)
SLACK = 128 << 10
MAX_DIMS = 64
# what a declaration adds to the bytes a step was measured to hold at its peak: another
# machine's allocator and libraries, and the step's shapes that were not measured
MARGIN = 1.25


def declared(nbytes: float) -> int:
    """The declaration of a step that holds ``nbytes`` at its peak: :data:`MARGIN` times
    it, plus :data:`SLACK` (small tensors, Python objects, the allocator's rounding)."""
    return int(MARGIN * nbytes) + SLACK


def numel(shape: Any, name: str = "shape") -> int:
    """The element count of a shape parameter (a list of non-negative ints)."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise ValueError(f"parameter {name!r} is a list of at most {MAX_DIMS} sizes, got {shape!r}")
    n = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise ValueError(f"parameter {name!r} is a list of non-negative sizes, got {shape!r}")
        n *= d
    return n


def elems(t: Any) -> int:
    """Elements of a tensor argument (1 for anything else: the step refuses it)."""
    return t.numel() if isinstance(t, torch.Tensor) else 1


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else WORD


def tensors(ts: Any) -> list[torch.Tensor]:
    return [t for t in ts if isinstance(t, torch.Tensor)] if isinstance(ts, list | tuple) else []


def count(seeds: Any) -> int:
    return len(seeds) if isinstance(seeds, list | tuple) else 1


def shape_of(t: Any) -> list[int]:
    return list(t.shape) if isinstance(t, torch.Tensor) else [1]


def int_param(v: Any, name: str, lo: int, hi: int) -> int:
    """An int parameter clamped to the range the step accepts (it refuses the others)."""
    if type(v) is not int:
        raise ValueError(f"parameter {name!r} is an int, got {type(v).__name__}")
    return min(max(v, lo), hi)


def records(seeds: Any, tags: int) -> int:
    return count(seeds) * tags * RECORD_BYTES


def meta(shape: list[int]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.int64, device="meta")


def bilinear(
    op: Any, params: Any, a_shape: Any, b_shape: Any, b_row_major: bool = True
) -> tuple[int, int]:
    """(output bytes, temporary bytes) of ``ring_bilinear(op, params, a, b)`` on int64
    operands of these shapes (the output's shape found on the ``meta`` device), in the way
    this process computes it (:func:`mpc.math.ring.ring_matmul` on CPU: the float64 limbs
    or torch's int64 kernel, with ``b`` laid out anew first or not, as measured here;
    before this process measured its speeds, the larger of those ways)."""
    numel(a_shape, "a_shape")
    numel(b_shape, "b_shape")
    a, b = meta(list(a_shape)), meta(list(b_shape))
    try:
        if op == "mul":
            return torch.mul(a, b).numel() * WORD, 0
        if op == "matmul":
            out = ring_matmul(a, b, method="int64")
            a2 = list(a_shape) if len(a_shape) > 1 else [1, *a_shape]
            b2 = list(b_shape) if len(b_shape) > 1 else [*b_shape, 1]
            rows = numel(a2) // max(a2[-1], 1)
            # three limbs of each operand, the products in float64 and in int64, the sum
            # (and a chunked one's output)
            limbs = 3 * numel(a2) + 3 * numel(b2) + 8 * out.numel()
            if not speeds_measured():  # (the speeds are measured by a product, not here)
                return out.numel() * WORD, max(limbs, numel(b_shape)) * WORD
            if limbs_pay(rows, tuple(b2), b_row_major):
                return out.numel() * WORD, limbs * WORD
            if relayout_pays(tuple(a_shape), tuple(b_shape), b_row_major):
                return out.numel() * WORD, numel(b_shape) * WORD  # b's copy
            return out.numel() * WORD, 0
        if op == "conv2d" and isinstance(params, dict):
            out = ring_conv2d(
                a,
                b,
                stride=tuple(params["stride"]),
                padding=tuple(params["padding"]),
                dilation=tuple(params["dilation"]),
                groups=int(params["groups"]),
                method="int64",
            )
            n = a_shape[0] if len(a_shape) == 4 else 1
            taps = numel(list(b_shape)[1:]) * (int(params["groups"]) or 1)
            cols = n * taps * numel(list(out.shape)[-2:])  # im2col's unfolded input
            return out.numel() * WORD, cols * WORD
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ValueError(f"malformed operands of a {op!r} product: {e}") from None
    raise ValueError(f"unknown bilinear op {op!r}")


def row_major(t: Any) -> bool:
    """Whether tensor argument ``t`` is laid out row by row (its last stride is 1)."""
    return not isinstance(t, torch.Tensor) or t.dim() < 2 or t.stride(-1) == 1


def tensor_elems(p: dict[str, Any], name: str) -> int:
    """Elements of tensor argument ``name`` (1 if it is missing or not a tensor)."""
    return elems(p.get(name))


def all_bytes(p: dict[str, Any]) -> int:
    """Bytes of every tensor argument, lists of tensors included."""
    total = 0
    for v in p.values():
        if isinstance(v, torch.Tensor):
            total += nbytes(v)
        elif isinstance(v, list | tuple):
            total += sum(nbytes(t) for t in tensors(v))
    return total


def largest(p: dict[str, Any]) -> int:
    """Elements of the largest tensor argument, lists of tensors included."""
    n = 1
    for v in p.values():
        for t in [v] if isinstance(v, torch.Tensor) else tensors(v):
            n = max(n, t.numel())
    return n


def stream_records(tags: int) -> SizeFunction:
    """The records of ``tags`` streams of each seed the step consumes."""

    def keeps(p: dict[str, Any]) -> int:
        return records(p.get("seeds", p.get("seed")), tags)

    return keeps


def elementwise(k: float, name: str) -> SizeFunction:
    """A step that holds ``k`` int64 tensors of the size of argument ``name`` at its peak
    (:func:`declared`)."""

    def peak(p: dict[str, Any]) -> int:
        return declared(k * WORD * tensor_elems(p, name))

    return peak


def derived(p: dict[str, Any]) -> int:
    """One int64 tensor of the shape parameter ``shape`` (a stream derived from a seed)."""
    return declared(WORD * numel(p.get("shape")))


def fixed(p: dict[str, Any]) -> int:
    """A step that allocates nothing of its inputs' size (views, small records)."""
    return SLACK
