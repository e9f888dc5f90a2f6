"""The model owner's step (:mod:`mpc.held`): its worker splits a parameter it holds into
one additive share per party with its own CSPRNG, sealed as the owner's held shares
(:mod:`pointers.worker.holding`), which only the runs the owner approved may use."""

from __future__ import annotations

from typing import Any

import torch

from mpc.material.sizes import SLACK, WORD, elems, nbytes
from mpc.math.encoding import encode
from mpc.math.prg import split_additive
from pointers.worker import holding
from pointers.worker.functions import sized
from pointers.worker.sealing import ProtocolCall, protocol_function

MAX_NAME = 512  # characters of a parameter's name


def held_share_rule(call: ProtocolCall) -> Any:
    """The owner's worker splits one of its own (ordinary) tensors; every share is sealed
    with the owner, the parameter's name and the owner's approvals (its policy, set at
    the worker), and may leave the worker once, to its party."""
    value = call.share("value")
    name = call.value("name")
    if not isinstance(value, torch.Tensor) or not value.is_floating_point():
        raise call.refuse("parameter 'value' takes a floating tensor")
    if type(name) is not str or not 0 < len(name) <= MAX_NAME:
        raise call.refuse(f"a parameter's name is a str of 1 to {MAX_NAME} characters")
    return holding.share_seal(call.worker_id, name, call.policy)


def _peak(p: dict[str, Any]) -> int:
    n = p.get("n_shares")
    n = n if type(n) is int and 2 <= n <= 5 else 5
    return (n + 3) * WORD * elems(p.get("value")) + nbytes(p.get("value")) + SLACK


@sized(_peak)
@protocol_function(held_share_rule)
def held_share(
    ctx: Any, value: torch.Tensor, name: str, frac_bits: int, n_shares: int
) -> list[torch.Tensor]:
    """Run at the owner's worker: ``value`` in fixed point, split into ``n_shares``
    additive shares (uniform but for the last)."""
    if isinstance(n_shares, bool) or not isinstance(n_shares, int) or not 2 <= n_shares <= 5:
        raise ValueError(f"n_shares must be an int in [2, 5], got {n_shares!r}")
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int) or not 0 <= frac_bits <= 32:
        raise ValueError(f"frac_bits must be an int in [0, 32], got {frac_bits!r}")
    return split_additive(encode(value.detach(), frac_bits), n_shares)


FUNCTIONS = {"mpc.held_share": held_share}
