"""The sizes of the two steps declared by hand in modules of their own (an owner's
release of an aggregate, :mod:`mpc.material.owned`; the secure aggregation's sharing,
:mod:`mpc.secure_aggregation`): :func:`declare` attaches them. Every other step declares
its size where it is defined (:func:`mpc.protocols.step.step`; the helpers:
:mod:`mpc.protocols.sizes`)."""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.sizes import (
    WORD,
    declared,
    elems,
    int_param,
    nbytes,
    tensors,
)
from pointers.worker.functions import SizeFunction, sized


def release_sum(p: dict[str, Any]) -> int:
    """The sum, in one new tensor of a part's size."""
    ts = tensors(p.get("parts"))
    return declared(nbytes(ts[0]) if ts else WORD)


def share_update(p: dict[str, Any]) -> int:
    """The shares (one word an element each) and, for an update narrower than float64,
    half its size again (measured at 2^20 elements)."""
    n = int_param(p.get("n_shares"), "n_shares", 2, 5)
    update = p.get("update")
    narrow = isinstance(update, torch.Tensor) and update.element_size() < 8
    return declared(n * WORD * elems(update) + (nbytes(update) // 2 if narrow else 0))


# the steps declared in modules of others' (registered name -> (peak, keeps))
DECLARED: dict[str, tuple[SizeFunction, SizeFunction | int]] = {
    "mpc.release_sum": (release_sum, 0),
    "mpc.secagg.share_update": (share_update, 0),
}


def declare(functions: dict[str, Any]) -> None:
    """Attach the declaration of :data:`DECLARED` to each function of ``functions`` named
    there (:func:`pointers.worker.functions.sized`)."""
    for name, fn in functions.items():
        spec = DECLARED.get(name)
        if spec is not None:
            sized(*spec)(fn)
