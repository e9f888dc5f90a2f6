"""The workers' side of the release rules (see :mod:`mpc.release`): shares of an owner's
value are sealed with the owner and its rule, and open only as an aggregate of at least k
owners' values (``mpc.release_sum``, at every party)."""

from __future__ import annotations

import weakref
from typing import Any

import torch

from mpc.errors import MPCError
from pointers.worker.sealing import Label, ProtocolCall, protocol_function


class ReleaseRuleError(MPCError):
    """Opening more of an owner's value than its release rule allows."""


OWNED = "owned"
MIN_OWNERS = 2  # an aggregate of at least this many owners' values (and never fewer)


def owned_seal(owner: str, min_owners: int) -> list[Any]:
    """The label of a share an owner's worker made: delivered once, to its party."""
    return Label(OWNED, 0, 0, "", 1, (owner, min_owners)).wire()


def _release_rule(call: ProtocolCall) -> Any:
    labels = call.materials("parts", OWNED, "shares of owned values", consume=True)
    owners: set[str] = set()
    need = MIN_OWNERS
    for label in labels:
        if len(label.extra) != 2 or type(label.extra[0]) is not str:
            raise call.refuse("a malformed owner label")
        owner, k_min = label.extra
        if label.origin not in (owner, "") or (label.local and owner != call.worker_id):
            raise call.refuse(f"a share of {owner!r}'s value must be delivered by {owner!r}")
        owners.add(owner)
        need = max(need, int(k_min))
    if len(owners) < need:
        raise call.refuse(
            f"the release rule of these values opens only an aggregate of at least {need} "
            f"owners' values, got {len(owners)} owner(s) ({sorted(owners)})"
        )
    parts = call.value("parts")
    if any(v.shape != parts[0].shape or v.dtype != torch.int64 for v in parts):
        raise call.refuse("the shares to add must have one shape")
    return None


@protocol_function(_release_rule)
def release_sum(ctx: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """A party's share of the sum of at least k owners' values (an ordinary share)."""
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


def share_rule(call: ProtocolCall) -> Any:
    """The owner's worker splits a value it holds (an ordinary object), once: the shares
    are sealed with the owner and the rule (at least ``min_owners``, never under 2)."""
    update = call.share("update")
    min_owners = check_min_owners(call.value("min_owners"))
    if not isinstance(update, torch.Tensor):
        raise call.refuse("parameter 'update' takes a tensor")
    seen: dict[int, Any] = call.state.setdefault("mpc.owned_shared", {})
    for key in [k for k, (ref, _) in seen.items() if ref() is None]:
        del seen[key]  # (forget values that are gone)
    prior = seen.get(id(update))
    if prior is not None and prior[0]() is update and prior[1] == update._version:
        raise call.refuse(
            "this value was shared before: an owner's value is shared once (two sharings "
            "would let two aggregates be subtracted)"
        )
    seen[id(update)] = (weakref.ref(update), update._version)
    return owned_seal(call.worker_id, min_owners)


def check_min_owners(min_owners: Any) -> int:
    if type(min_owners) is not int or min_owners < MIN_OWNERS:
        raise MPCError(
            f"a release rule opens an aggregate of at least {MIN_OWNERS} owners, got {min_owners!r}"
        )
    return min_owners
