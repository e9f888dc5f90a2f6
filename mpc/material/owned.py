"""The workers' side of the release rules (see :mod:`mpc.release`): shares of a value an
owner's worker split are sealed with the owner and its rule, and open only as an
aggregate (``mpc.release_sum``, at every party).

A share's label (:func:`owned_seal`) says where the value came from:

* ``owner``: a data owner's own data at its worker (:mod:`pointers.worker.owners`). The
  owner's worker shares it only into an aggregation the owner joined (its count > 0), at
  the owner's count as its weight, once (by the value's digest, whatever the round or the
  session); the label carries the owner, the weight, the scale, the round and the digest.
  A party adds such shares only for owners its deployment lists (never itself), with
  weights within the deployment's bound, of one round and one scale, spanning at least
  the deployment's least number of distinct owners (``pointers.worker.owners.DataPolicy``).
* ``client``: a value the client sent to that worker itself, which is the client's: the
  parties add such shares only among themselves (never with an owner's), as the client
  API presents them (a sum of at least two workers' values, one scale).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from mpc.errors import MPCError
from pointers.worker.sealing import OWNERS_DATA, Label, ProtocolCall, protocol_function


class ReleaseRuleError(MPCError):
    """Opening more of an owner's value than its release rule allows."""


OWNED = "owned"
MIN_OWNERS = 2  # an aggregate of at least this many owners' values (and never fewer)
OWNER, CLIENT = "owner", "client"  # where a shared value came from (a label's source)
MAX_ROUND = 64  # characters of a round id


@dataclass(frozen=True)
class Term:
    """What a party reads from the label of one share in a sum."""

    owner: str
    min_owners: int
    source: str
    weight: int
    frac_bits: int
    round: str
    digest: str


def owned_seal(term: Term) -> list[Any]:
    """The label of a share an owner's worker made: delivered once, to its party."""
    extra = (term.owner, term.min_owners, term.source, term.weight, term.frac_bits)
    return Label(OWNED, 0, 0, "", 1, (*extra, term.round, term.digest)).wire()


def _term(call: ProtocolCall, label: Label) -> Term:
    x = label.extra
    if (
        len(x) != 7
        or type(x[0]) is not str
        or type(x[1]) is not int
        or x[2] not in (OWNER, CLIENT)
        or not all(type(v) is int for v in x[3:5])
        or not all(type(v) is str for v in x[5:7])
    ):
        raise call.refuse("a malformed owner label")
    return Term(*x)


def _release_rule(call: ProtocolCall) -> Any:
    labels = call.materials("parts", OWNED, "shares of owned values", consume=True)
    terms = [_term(call, label) for label in labels]
    for label, t in zip(labels, terms):
        if label.origin not in (t.owner, "") or (label.local and t.owner != call.worker_id):
            raise call.refuse(f"a share of {t.owner!r}'s value must be delivered by {t.owner!r}")
    if len({t.source for t in terms}) > 1:
        raise call.refuse(
            "an owner's value adds only to other owners' values, never to a value the client "
            "sent (which the client knows, and could subtract)"
        )
    if len({t.frac_bits for t in terms}) > 1:
        raise call.refuse(
            "the values to add must have one fixed-point scale (two scales weight one value "
            f"against the others), got frac_bits {sorted({t.frac_bits for t in terms})}"
        )
    need = max([MIN_OWNERS, *(t.min_owners for t in terms)])
    if terms[0].source == OWNER:
        need = max(need, _check_owner_terms(call, labels, terms))
    owners = {t.owner for t in terms}
    if len(owners) < need:
        raise call.refuse(
            f"the release rule of these values opens only an aggregate of at least {need} "
            f"owners' values, got {len(owners)} owner(s) ({sorted(owners)})"
        )
    parts = call.value("parts")
    if any(v.shape != parts[0].shape or v.dtype != torch.int64 for v in parts):
        raise call.refuse("the shares to add must have one shape")
    return None


def _check_owner_terms(call: ProtocolCall, labels: list[Label], terms: list[Term]) -> int:
    """Owners' values: listed owners (never this party), delivered by them, weights within
    the deployment's bound, one round. The least number of distinct owners to span."""
    policy = call.data_policy
    listed: frozenset[str] = getattr(policy, "owners", frozenset())
    if not listed:
        raise call.refuse(
            "this party's deployment lists no data owners (serve --owner NAME, or "
            "VirtualWorker(id, owners=...)): it adds no owner's value"
        )
    for label, t in zip(labels, terms):
        if t.owner not in listed:
            raise call.refuse(
                f"{t.owner!r} is not one of this deployment's data owners ({sorted(listed)})"
            )
        if label.local:
            raise call.refuse("a computing party is never a data owner")
        if not 1 <= t.weight <= policy.max_weight:
            raise call.refuse(
                f"{t.owner!r}'s value has weight {t.weight}, over this deployment's bound of "
                f"{policy.max_weight} (serve --max-weight): no weight may single out one "
                "owner's value"
            )
    if len({t.round for t in terms}) > 1:
        raise call.refuse("the owners' values to add must be of one round")
    return int(policy.min_owners)


@protocol_function(_release_rule)
def release_sum(ctx: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """A party's share of the sum of at least k owners' values (an ordinary share)."""
    out = parts[0].clone()
    for p in parts[1:]:
        out += p
    return out


def share_rule(call: ProtocolCall) -> Any:
    """The owner's worker splits a value it holds, once: the shares are sealed with the
    owner, the rule (at least ``min_owners``, never under 2), the value's source, weight,
    scale and round (module docstring)."""
    min_owners = check_min_owners(call.value("min_owners"))
    weight, frac_bits, round_id = call.value("weight"), call.value("frac_bits"), call.value("round")
    if type(frac_bits) is not int or type(weight) is not int:
        raise call.refuse("frac_bits and weight take ints")
    if type(round_id) is not str or len(round_id) > MAX_ROUND:
        raise call.refuse(f"round takes a str of at most {MAX_ROUND} characters")
    a = call.args.get("update")
    label = a.label if a is not None else None
    if label is not None and label.kind == OWNERS_DATA:
        return owned_seal(_owners_value(call, label, min_owners, weight, frac_bits, round_id))
    update = call.share("update")  # an ordinary object: a value the client sent
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
    term = Term(call.worker_id, min_owners, CLIENT, weight, frac_bits, round_id, "")
    return owned_seal(term)


def _owners_value(
    call: ProtocolCall, label: Label, min_owners: int, weight: int, frac_bits: int, round_id: str
) -> Term:
    """An owner's own data: shared at the owner's count, once (recorded before the step
    runs, so a refused value, e.g. over the client's bound, is not offered again)."""
    if len(label.extra) != 3 or not label.local:
        raise call.refuse("a malformed owner's data label")
    owner, digest, count = label.extra
    if owner != call.worker_id or type(count) is not int or type(digest) is not str:
        raise call.refuse("a malformed owner's data label")
    if count < 1:
        raise call.refuse(
            "its owner joins no aggregation with this value (it gave it no count, "
            "pointers.own(..., count=N) or OwnedData(count=N))"
        )
    if weight != count:
        raise call.refuse(
            f"the weight of an owner's value is its owner's count, {count}; got {weight}"
        )
    if not round_id:
        raise call.refuse("an owner's value is shared into a named round")
    policy = call.data_policy
    if policy is None:
        raise call.refuse("this worker holds no owner's data")
    policy.record(call.worker_id, round_id, digest)  # (refused: shared before)
    return Term(owner, min_owners, OWNER, weight, frac_bits, round_id, digest)


def check_min_owners(min_owners: Any) -> int:
    if type(min_owners) is not int or min_owners < MIN_OWNERS:
        raise MPCError(
            f"a release rule opens an aggregate of at least {MIN_OWNERS} owners, got {min_owners!r}"
        )
    return min_owners
