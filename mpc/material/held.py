"""The model owner's step (:mod:`mpc.held`): its worker splits a value its owner
registered for a parameter name (``mpc.offer`` in process, ``serve --offer`` on a served
worker) into one additive share per party with its own CSPRNG, at the scale the owner
chose, sealed as the owner's held shares (:mod:`pointers.worker.holding`), which only the
runs the owner approved may use. No tensor of a client's, and no scale of its choosing,
ever becomes a held share."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from mpc.math.encoding import encode
from mpc.math.prg import split_additive
from mpc.protocols.sizes import SLACK, WORD
from pointers.worker import holding
from pointers.worker import policy as owner_policy
from pointers.worker.functions import sized
from pointers.worker.sealing import Label, ProtocolCall, protocol_function

MAX_DIMS = 8  # dimensions of a parameter's shape


def _shape(shape: Any) -> list[int] | None:
    if type(shape) is not list or len(shape) > MAX_DIMS:
        return None
    if not all(type(s) is int and 0 <= s < 1 << 40 for s in shape):
        return None
    return list(shape)


def held_share_rule(call: ProtocolCall) -> Any:
    """The owner's worker splits the value its owner registered under ``name`` (of the
    shape the client expects); every share is sealed with the owner, the parameter's
    name, the digest of its value and scale, and the owner's approvals (its policy, set
    at the worker), and may leave the worker once, to its party: share k to
    ``parties[k]``, distinct parties the owner approved runs for (never two shares of one
    split to one worker, which would hold the value, nor one to the dealer)."""
    name, shape = call.value("name"), _shape(call.value("shape"))
    if shape is None:
        raise call.refuse("a parameter's shape is a list of at most 8 sizes")
    param = owner_policy.held_param(call.policy, call.worker_id, name, shape)  # (refuses others)
    if call.value("frac_bits") != param.frac_bits:
        raise call.refuse(
            f"parameter {name!r} is registered at frac_bits={param.frac_bits}, not "
            f"{call.value('frac_bits')!r}: its owner fixed the scale (share with that "
            "frac_bits)"
        )
    parties, n = call.value("parties"), call.value("n_shares")
    if not (
        type(parties) is list
        and type(n) is int
        and len(parties) == n
        and all(type(p) is str for p in parties)
        and len(set(parties)) == len(parties)
    ):
        raise call.refuse("the shares go to n_shares distinct parties, named by worker id")
    approved = set(call.policy.approvals)
    if not set(parties) <= approved:
        raise call.refuse(
            f"the owner approved runs for {sorted(approved)} only, not for "
            f"{sorted(set(parties) - approved)}: its shares go to those parties"
        )
    label = Label.of(holding.share_seal(call.worker_id, name, call.policy))
    assert label is not None
    return [replace(label, to=(p,)).wire() for p in parties]


def _peak(p: dict[str, Any]) -> int:
    n = p.get("n_shares")
    n = n if type(n) is int and 2 <= n <= 5 else 5
    numel = 1
    for s in _shape(p.get("shape")) or [0]:
        numel *= s
    return (n + 3) * WORD * numel + SLACK


@sized(_peak)
@protocol_function(held_share_rule)
def held_share(
    ctx: Any,
    name: str,
    shape: list[int],
    frac_bits: int,
    n_shares: int,
    parties: list[str] | None = None,
) -> list[torch.Tensor]:
    """Run at the owner's worker: the registered value of ``name`` in fixed point at its
    registered scale (``frac_bits``: the client's expectation, checked by the rule),
    split into ``n_shares`` additive shares (uniform but for the last), share k for
    ``parties[k]`` (the rule binds it there)."""
    if isinstance(n_shares, bool) or not isinstance(n_shares, int) or not 2 <= n_shares <= 5:
        raise ValueError(f"n_shares must be an int in [2, 5], got {n_shares!r}")
    param = owner_policy.held_param(getattr(ctx, "holding_policy", None), ctx.id, name, shape)
    return split_additive(encode(param.value, param.frac_bits), n_shares)


FUNCTIONS = {"mpc.held_share": held_share}
