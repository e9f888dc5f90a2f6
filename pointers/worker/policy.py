"""A model owner's policy at its worker: the values it registered, by parameter name and
with the fixed-point scale it chose (:class:`HeldParam`, digested by :func:`param_digest`),
and the program digests it approves per party (:class:`Policy`). Set at the worker's side
(:func:`set_policy`, or ``python -m pointers serve --offer FILE`` from :func:`save_offer`),
never by a client's message; :mod:`pointers.worker.holding` enforces it."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from pointers.errors import NotAllowedError
from pointers.wire import files
from pointers.worker.sealing import RULE


@dataclass(frozen=True)
class HeldParam:
    """A value the owner registered for one parameter name: the tensor, the fixed-point
    scale the owner chose for it, and their digest (:func:`param_digest`)."""

    value: torch.Tensor
    frac_bits: int
    digest: str


def param_digest(value: torch.Tensor, frac_bits: int) -> str:
    """The digest of a parameter's value and scale: its dtype, shape, bytes and
    ``frac_bits``. An approval names the parameters by these (see :func:`program_digest`)."""
    t = value.detach().contiguous().reshape(-1)
    h = hashlib.sha256()
    h.update(msgpack.packb(["held-param", str(value.dtype), list(value.shape), int(frac_bits)]))
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Policy:
    """A worker owner's approvals: per party id, the program digests it approves; and the
    values it registered, by parameter name (the only values its shares are made of)."""

    approvals: dict[str, set[str]] = field(default_factory=dict)
    params: dict[str, HeldParam] = field(default_factory=dict)

    def wire(self) -> list[list[str]]:
        return sorted([party, d] for party, ds in self.approvals.items() for d in ds)


MAX_FRAC_BITS = 32  # the largest fixed-point scale an owner may register


def make_policy(
    approvals: dict[str, Any], params: dict[str, tuple[torch.Tensor, int]] | None = None
) -> Policy:
    """A :class:`Policy` from ``approvals`` (per party id, an iterable of hex digests) and
    ``params`` (per parameter name, its value and fixed-point scale), both checked."""
    policy = Policy()
    for party, digests in approvals.items():
        if type(party) is not str:
            raise TypeError("approvals are keyed by party id (a str)")
        ds = {digests} if isinstance(digests, str) else set(digests)
        if not all(type(d) is str and len(d) == 64 for d in ds):
            raise ValueError("an approval is a program digest: 64 hex digits")
        policy.approvals.setdefault(party, set()).update(ds)
    for name, (value, frac_bits) in (params or {}).items():
        if type(name) is not str or not 0 < len(name) <= MAX_NAME:
            raise ValueError(f"a parameter's name is a str of 1 to {MAX_NAME} characters")
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            raise TypeError(f"parameter {name!r}: the owner registers a floating tensor")
        if type(frac_bits) is not int or not 0 <= frac_bits <= MAX_FRAC_BITS:
            raise ValueError(f"parameter {name!r}: frac_bits is an int in [0, {MAX_FRAC_BITS}]")
        v = value.detach().clone()
        policy.params[name] = HeldParam(v, frac_bits, param_digest(v, frac_bits))
    return policy


MAX_NAME = 512  # characters of a parameter's name


def set_policy(
    worker: Any,
    approvals: dict[str, Any] | Policy,
    params: dict[str, tuple[torch.Tensor, int]] | None = None,
) -> None:
    """The owner of ``worker`` approves, per party id, the program digests in
    ``approvals`` (an iterable of hex digests each) for the values it shares from there,
    and registers ``params`` (per parameter name, its value and fixed-point scale): the
    worker makes held shares of these values only. A local call at the worker's side,
    never a message."""
    worker.holding_policy = (
        approvals if isinstance(approvals, Policy) else make_policy(approvals, params)
    )


OFFER_MAGIC = b"pointers-offer-1\n"


def save_offer(path: Any, policy: Policy) -> None:
    """Write an owner's policy (its approvals and its registered values with their
    scales) to ``path``, for ``python -m pointers serve --offer PATH``: a document in the
    wire's encoding (:mod:`pointers.wire.files`, never pickle)."""
    doc = {
        "approvals": {party: sorted(ds) for party, ds in policy.approvals.items()},
        "params": {n: [p.value, p.frac_bits] for n, p in policy.params.items()},
    }
    files.write_document(path, OFFER_MAGIC, doc)


def load_offer(path: Any) -> Policy:
    """The policy :func:`save_offer` wrote (checked as :func:`make_policy` checks it)."""
    doc = files.read_document(path, OFFER_MAGIC, "an offer file")
    try:
        approvals, params = doc["approvals"], doc["params"]
        pairs = {n: (v[0], v[1]) for n, v in params.items()}
    except Exception as e:
        raise ValueError(
            f"offer file {str(path)!r} is malformed: {type(e).__name__}: {e}"
        ) from None
    return make_policy(approvals, pairs)


def held_param(policy: Policy | None, owner: str, name: Any, shape: Any) -> HeldParam:
    """The value the owner registered as ``name``, of ``shape``; refused otherwise."""
    if policy is None or not policy.approvals:
        raise NotAllowedError(
            f"worker {owner!r} approves no computation on its values: its owner approves "
            "a plan first (mpc.approve, then mpc.offer at the owner's side); " + RULE
        )
    param = policy.params.get(name) if type(name) is str else None
    if param is None:
        raise NotAllowedError(
            f"worker {owner!r}: {name!r} is no parameter its owner registered (mpc.offer, or "
            "serve --offer): a held share is made only of the owner's own values; " + RULE
        )
    if list(param.value.shape) != shape:
        raise NotAllowedError(
            f"worker {owner!r}: parameter {name!r} has shape {list(param.value.shape)}, "
            f"not {shape!r}"
        )
    return param


__all__ = [
    "MAX_FRAC_BITS",
    "MAX_NAME",
    "HeldParam",
    "Policy",
    "held_param",
    "load_offer",
    "make_policy",
    "param_digest",
    "save_offer",
    "set_policy",
]
