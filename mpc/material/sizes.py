"""The sizes of the two steps declared by hand in modules of their own (an owner's
release of an aggregate, :mod:`mpc.material.owned`; the secure aggregation's sharing,
:mod:`mpc.secure_aggregation`): :func:`declare` attaches them. Every other step declares
its size where it is defined (:func:`mpc.protocols.step.step`; the helpers:
:mod:`mpc.protocols.sizes`)."""

from __future__ import annotations

from typing import Any

from mpc.protocols.sizes import (
    SLACK,
    WORD,
    elems,
    int_param,
    nbytes,
    tensors,
)
from pointers.worker.functions import SizeFunction, sized


def release_sum(p: dict[str, Any]) -> int:
    ts = tensors(p.get("parts"))
    return 2 * (nbytes(ts[0]) if ts else WORD) + SLACK


def share_update(p: dict[str, Any]) -> int:
    n = int_param(p.get("n_shares"), "n_shares", 2, 5)
    update = p.get("update")
    return (n + 5) * WORD * elems(update) + 2 * nbytes(update) + SLACK


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
