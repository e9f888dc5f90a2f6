"""Held values: an owner's shares that only the computations it approved may use, and that
open only as those computations' outputs.

A model owner shares its weights from its own worker (``mpc.share(model_ptr, ...)``). Its
shares reach the parties *sealed* (:mod:`pointers.worker.sealing`) with a
:data:`HELD_SHARE` label: the owner, the parameter's name, the digest of the value it is a
share of (:func:`param_digest`: the value and scale the owner registered under that name,
:class:`Policy`; the owner's worker shares no other) and the owner's approvals, a list of
``[party, digest]``. Sealed, no client can fetch one, run an op on one or send it on
(a share leaves its owner once, to its party). The one way to use them is an **approved
run**: a stored program (:mod:`pointers.worker.program`) started with ``held`` (which input
slots take which of the owner's parameters, by name) and ``outputs`` (the slots whose
objects the run releases), whose :func:`program_digest` at this party is one the owner
approved for this party. During such a run, at this party:

* the owner's shares bound to the declared slots, and the objects this run made, read as
  ordinary objects to the run's own commands (and only to them: the client's commands see
  them sealed);
* every object the run makes is sealed :data:`HELD` for the owner and this run (protocol
  material keeps its own label), so no client reads an intermediate, during the run or
  after it; only the run's own peer deliveries may send one, to the peers its approved
  program names;
* when the run ends without error, the objects in its output slots become ordinary
  objects, which the client reconstructs.

The digest covers the program's commands (ops, functions, constants, peers), the
declared parameter names by slot with the digests of their values, the output slots and
the party: a client that records
another computation, binds another parameter to a slot or asks for another output gets
no approval. What the digest does not fix is what the client binds to the other input
slots (its own query) and the public values it sends with them. A worker's approvals are
its owner's policy (:func:`set_policy`), set at the worker, never by a client's message.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from pointers.errors import NotAllowedError
from pointers.wire.messages import Delete
from pointers.wire.serde import Slot, SlotRef, ref_id
from pointers.worker.policy import (
    HeldParam,
    Policy,
    held_param,
    load_offer,
    make_policy,
    param_digest,
    save_offer,
    set_policy,
)
from pointers.worker.sealing import RULE, SPENT, Label, seal, spend

# an owner's share: extra (owner, parameter name, the value's digest, approvals)
HELD_SHARE = "held_share"
HELD = "held"  # made by an approved run: extra (owner, run token)
# kept by an approved run for the owner's later runs: extra (owner, role, maker run token)
HELD_INSTANCE = "held_instance"
KEEP = "keep"  # [KEEP, role]: a declared slot whose object the run keeps for later runs
CARRIED = ["carried"]  # a declared slot bound to what an earlier approved run kept
MAX_ROLE = 64  # characters of a kept object's role


def keep(role: str) -> list[str]:
    """The declaration of a kept slot: the run keeps its object for the owner's later
    approved runs under ``role`` (a later run's digest names the role each of its carried
    slots takes)."""
    return [KEEP, role]


def _kept_role(name: Any) -> str | None:
    """The role of a kept-slot declaration (None: not one)."""
    if type(name) is list and len(name) == 2 and name[0] == KEEP and type(name[1]) is str:
        if 0 < len(name[1]) <= MAX_ROLE:
            return name[1]
    return None


_TOKENS = "pointers.holding.tokens"  # function-state key: the run tokens a namespace used
_BOUND = "pointers.holding.bound"  # function-state key: value bound in a run -> its token


def share_seal(owner: str, name: str, policy: Policy) -> list[Any]:
    """The label of a share the owner's worker made of its registered parameter ``name``:
    delivered once, to its party, carrying the parameter's digest and the owner's
    approvals."""
    param = policy.params[name]
    return seal(HELD_SHARE, deliveries=1, extra=(owner, name, param.digest, policy.wire()))


def program_digest(
    raw: list[Any],
    held: list[list[Any]],
    outputs: list[int],
    party: str,
    store: Any,
    uses: dict[int, str] | None = None,
    params: dict[str, str] | None = None,
    cache: dict[Any, Any] | None = None,
) -> str:
    """The digest an owner approves: a program's commands as this party stores them, with
    each reference to an object that exists before the run replaced by its kind (its
    sealed label's kind in ``store``, or "ordinary"), the declared parameter, input, kept
    and carried slots, the output slots and the party. ``uses``: per carried slot bound to
    an object an earlier run kept, that object's key (the kept slot of the approved
    program that made it: the digest fixes which kept object each carried slot takes).
    ``params``: per parameter name, the digest of the registered value and scale its slot
    takes (:func:`param_digest`): the owner approves a computation on those values.
    ``cache``: the stored program's own record (its constants, and the digest of its
    commands for the kinds those constants have): a program's structure is walked once,
    and each run checks only the kinds of its constants and its declared slots."""
    slots = sorted([int(s), _slot_name(s, n, uses or {}, params or {})] for s, n in held)
    doc = [party, commands_digest(raw, store, cache), slots, sorted(outputs)]
    return hashlib.sha256(msgpack.packb(doc, use_bin_type=True)).hexdigest()


def program_constants(raw: list[Any], cache: dict[Any, Any] | None = None) -> list[int]:
    """The ids a program refers to directly (objects that exist before its runs), once
    per stored program (``cache``)."""
    if cache is not None and "constants" in cache:
        return cache["constants"]  # type: ignore[no-any-return]
    out = sorted(_constants(raw))
    if cache is not None:
        cache["constants"] = out
    return out


def commands_digest(raw: list[Any], store: Any, cache: dict[Any, Any] | None = None) -> str:
    """The digest of a program's commands, each reference to an object that exists
    before the run replaced by its kind (its sealed label's kind in ``store``, or
    "ordinary"); with ``cache``, computed once per kinds of the constants."""

    def kind_of(obj_id: int) -> str:
        label = Label.of(store.entry(obj_id).sealed)
        return "ordinary" if label is None else label.kind

    key = ("commands", tuple(kind_of(c) for c in program_constants(raw, cache)))
    if cache is not None and key in cache:
        return cache[key]  # type: ignore[no-any-return]

    def canon(o: Any) -> Any:
        if isinstance(o, Slot):
            return ["slot", o.index]
        if isinstance(o, SlotRef):
            return ["slotref", o.index]
        rid = ref_id(o)
        if rid is not None:
            return ["const", kind_of(rid)]
        if isinstance(o, torch.Tensor):
            t = o.detach().contiguous().reshape(-1)
            data = t.view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return ["tensor", str(o.dtype), list(o.shape), hashlib.sha256(data).hexdigest()]
        if isinstance(o, list | tuple):
            return [canon(x) for x in o]
        if isinstance(o, dict):
            return [["dict"], sorted([str(k), canon(v)] for k, v in o.items())]
        if o is None or isinstance(o, bool | int | float | str | bytes):
            return o
        return ["other", type(o).__name__, repr(o)]

    # the deletes of a run's temporaries are not part of what is approved: where they
    # fall depends on when the client's pointers died and on its kind of connection (an
    # in-process client deletes as it goes, a network one in batches), and a delete
    # reveals nothing (it can only make the run, or a later one, fail)
    commands = [c for c in raw if not (isinstance(c, list) and c and c[0] == Delete.KIND)]
    digest = hashlib.sha256(msgpack.packb(canon(commands), use_bin_type=True)).hexdigest()
    if cache is not None:
        if len(cache) > 16:  # (kinds do not change from run to run: a bound, not a store)
            cache.clear()
        cache[key] = digest
    return digest


def _slot_name(slot: int, name: Any, uses: dict[int, str], params: dict[str, str]) -> str:
    """A declared slot in the digest: "" an input, a parameter's name and its value's
    digest, or (NUL-prefixed: no parameter's name) kept under a role, carried, or carried
    and bound to the object kept under the role ``uses[slot]``."""
    if name is None:
        return ""
    role = _kept_role(name)
    if role is not None:
        return "\x00keep:" + role
    if name == CARRIED:
        return "\x00use:" + uses[slot] if slot in uses else "\x00carried"
    return f"{name}\x00{params.get(str(name), '')}"


@dataclass
class HeldRun:
    """An approved run at one party: its owner, its token, the ids it admits."""

    owner: str
    token: str
    admitted: set[int]
    outputs: list[int]
    # the ordinary objects the run may read: its declared input slots' and the program's
    # constants (everything else it reads it made itself, sealed held, or is material)
    readable: set[int] = field(default_factory=set)
    digest: str = ""
    # (role, id) of the objects the run keeps for the owner's later runs (kept slots);
    # at release, the protocol material among them is kept too (not spent at the end)
    keep: list[tuple[str, int]] = field(default_factory=list)
    kept: set[int] = field(default_factory=set)

    def check_read(self, obj_id: int) -> None:
        """An ordinary object read by the run must be one of its inputs or constants."""
        if obj_id not in self.readable:
            raise NotAllowedError(
                f"an approved run reads object {obj_id}, an ordinary object that is neither "
                f"one of its declared inputs nor made by the run; {RULE}"
            )

    def admits(self, sealed: Any, obj_id: int | None = None) -> bool:
        """Whether a sealed object reads as ordinary to this run's commands."""
        label = Label.of(sealed)
        if label is None:
            return False
        if label.kind == HELD:
            return label.extra == (self.owner, self.token)
        return label.kind in (HELD_SHARE, HELD_INSTANCE) and obj_id in self.admitted

    def seal(self) -> list[Any]:
        """The label of an ordinary object this run makes."""
        return seal(HELD, extra=(self.owner, self.token))


_current = threading.local()


def current() -> HeldRun | None:
    """The approved run this thread executes (None: none)."""
    return getattr(_current, "run", None)


class running:
    """``with running(run):`` this thread executes ``run``'s commands."""

    def __init__(self, run: HeldRun | None) -> None:
        self.run = run

    def __enter__(self) -> None:
        self.prior = current()
        _current.run = self.run

    def __exit__(self, *exc: Any) -> None:
        _current.run = self.prior


def begin(
    worker_id: str,
    store: Any,
    state: dict[str, Any],
    program_raw: list[Any],
    bindings: list[int],
    held: list[list[Any]],
    outputs: list[int],
    cache: dict[Any, Any] | None = None,
) -> HeldRun | None:
    """Check a run that declares ``held`` parameter slots (None: an ordinary run): each
    slot bound to a share of the named parameter delivered by one owner, and the program's
    digest approved by that owner for this party."""
    if not held:
        if outputs:
            raise NotAllowedError("a run declares output slots only with held parameters")
        return None
    if type(outputs) is not list or not all(type(s) is int for s in outputs):
        raise NotAllowedError("output slots are ints")
    if not all(0 <= s < len(bindings) for s in outputs):
        raise NotAllowedError("an output slot is out of range")
    owner = None
    approvals: Any = None
    admitted: set[int] = set()
    readable: set[int] = set()
    keeps: list[tuple[int, str]] = []
    carried: list[int] = []
    declared: set[int] = set()
    values: dict[str, str] = {}  # parameter name -> the digest of the value its shares are of
    for item in held:
        if not (isinstance(item, list) and len(item) == 2 and type(item[0]) is int):
            raise NotAllowedError("held parameter slots are [slot, name] pairs")
        slot, name = item
        role = _kept_role(name)
        ok_name = name is None or type(name) is str or name == CARRIED or role is not None
        if not 0 <= slot < len(bindings) or not ok_name:
            raise NotAllowedError(f"held parameter slot {slot} is out of range")
        if slot in declared:
            raise NotAllowedError(f"slot {slot} is declared twice")
        declared.add(slot)
        obj_id = bindings[slot]
        if name is None:  # one of the client's inputs (an ordinary object)
            readable.add(obj_id)
            continue
        if role is not None:
            keeps.append((slot, role))
            continue
        if name == CARRIED:
            carried.append(slot)
            continue
        label = Label.of(store.entry(obj_id).sealed)
        if label is None or label.kind != HELD_SHARE or len(label.extra) != 4:
            raise NotAllowedError(
                f"worker {worker_id!r}: slot {slot} ({name!r}) is bound to object {obj_id}, "
                f"which is not an owner's held share; {RULE}"
            )
        o, n, value_digest, a = label.extra
        if label.origin != o:
            raise NotAllowedError(f"a held share of {o!r} must be delivered by {o!r}; {RULE}")
        if n != name:
            raise NotAllowedError(
                f"worker {worker_id!r}: slot {slot} is declared {name!r} but bound to "
                f"{o!r}'s parameter {n!r}; {RULE}"
            )
        if owner is None:
            owner, approvals = o, a
        elif o != owner:
            raise NotAllowedError("one run uses the held parameters of one owner")
        if values.setdefault(n, value_digest) != value_digest:
            raise NotAllowedError(f"parameter {n!r} is bound to shares of two values; {RULE}")
        admitted.add(obj_id)
    if owner is None:
        raise NotAllowedError("a held run declares at least one held parameter slot")
    # a carried slot bound to an object an earlier approved run kept: the owner's only
    # (admitted to this run), and its key (which kept slot of which approved program made
    # it) enters the digest: the owner approved which kept object each carried slot takes
    uses: dict[int, str] = {}
    makers: set[str] = set()  # the runs that kept the carried objects: one
    for slot in carried:
        obj_id = bindings[slot]
        if obj_id not in store:
            continue
        label = Label.of(store.entry(obj_id).sealed)
        if label is None or label.kind != HELD_INSTANCE:
            continue  # (protocol material, or nothing the run can read: its steps' rules)
        if len(label.extra) != 3 or label.extra[0] != owner:
            raise NotAllowedError(
                f"worker {worker_id!r}: slot {slot} is bound to an object kept for another "
                f"owner; {RULE}"
            )
        uses[slot] = str(label.extra[1])
        makers.add(str(label.extra[2]))
        admitted.add(obj_id)
    if len(makers) > 1:  # (a generation's caches and position are one run's, together)
        raise NotAllowedError(
            f"worker {worker_id!r}: the carried slots are bound to objects kept by "
            f"{len(makers)} different runs; one run takes what one earlier run kept; {RULE}"
        )
    param_slots = {item[0] for item in held if type(item[1]) is str} | set(uses)
    for k, b in enumerate(bindings):  # a parameter is bound to its own slots only
        if b in admitted and k not in param_slots:
            raise NotAllowedError(
                f"worker {worker_id!r}: slot {k} is bound to a held parameter, but only the "
                f"declared parameter slots take one; {RULE}"
            )
    for s in outputs:  # an output's id is bound to no other slot (it would hold that too)
        if bindings.count(bindings[s]) != 1:
            raise NotAllowedError(f"output slot {s} must be bound to an id of its own; {RULE}")
    for s, _ in keeps:  # (a kept object is made by the run: an id of its own, as an output)
        if bindings.count(bindings[s]) != 1 or bindings[s] in store:
            raise NotAllowedError(f"kept slot {s} must be bound to a new id of its own; {RULE}")
    readable |= set(program_constants(program_raw, cache))

    digest = program_digest(program_raw, held, outputs, worker_id, store, uses, values, cache)
    if [worker_id, digest] not in (approvals or []):
        raise NotAllowedError(
            f"worker {worker_id!r}: this program (digest {digest[:16]}...) is not a "
            f"computation {owner!r} approved for this party: record the plan the owner "
            f"approved (mpc.approve); {RULE}"
        )
    token = hashlib.sha256(msgpack.packb([int(b) for b in bindings])).hexdigest()[:32]
    used: set[str] = state.setdefault(_TOKENS, set())
    if token in used:
        raise NotAllowedError("a run's bindings are used once")
    used.add(token)
    bound: dict[int, str] = state.setdefault(_BOUND, {})
    skip = set(carried)  # (what an earlier run kept is not this run's to spend)
    for k, b in enumerate(bindings):  # (its nonces among them: see check_instances)
        if k not in skip:
            bound.setdefault(int(b), token)
    run = HeldRun(owner, token, admitted, [bindings[s] for s in outputs], readable)
    run.digest, run.keep = digest, [(role, bindings[s]) for s, role in keeps]
    return run


def _constants(raw: Any) -> set[int]:
    """The ids a program refers to directly (objects that exist before its runs)."""
    rid = ref_id(raw)
    if rid is not None:
        return {rid}
    if isinstance(raw, list | tuple):
        return set().union(*(_constants(x) for x in raw)) if raw else set()
    if isinstance(raw, dict):
        return set().union(*(_constants(x) for x in raw.values())) if raw else set()
    return set()


def release(store: Any, run: HeldRun) -> None:
    """After a run without error: its output objects become ordinary objects, and the
    objects in its kept slots are kept for the owner's later approved runs: one the run
    made (held) becomes :data:`HELD_INSTANCE` with its role and this run's token (the
    maker), which only a later approved run of the same owner reads, one whose digest
    names that role for the slot it binds it to and whose carried objects one run kept;
    protocol material among them stays as it is (not spent at the run's end)."""
    for obj_id in run.outputs:
        if obj_id in store:
            entry = store.entry(obj_id)
            if run.admits(entry.sealed):
                entry.sealed = False
    for role, obj_id in run.keep:
        if obj_id not in store:
            continue
        entry = store.entry(obj_id)
        label = Label.of(entry.sealed)
        if label is None or label.kind in (HELD_SHARE, HELD_INSTANCE, SPENT):
            continue
        if label.kind == HELD:
            if run.admits(entry.sealed):
                extra = (run.owner, role, run.token)
                entry.sealed = seal(HELD_INSTANCE, deliveries=0, extra=extra)
        else:
            run.kept.add(obj_id)


def end(store: Any, state: dict[str, Any], run: HeldRun) -> None:
    """After a run, with or without error: the protocol material of its instances that
    is still unconsumed here is spent (no step outside the run may finish one), and the
    record of its bindings is dropped (the namespace keeps only the run's token)."""
    bound: dict[int, str] = state.get(_BOUND, {})
    mine = {v for v, t in bound.items() if t == run.token}
    for obj_id in list(store.view()):
        if obj_id not in store:
            continue
        if obj_id in run.kept:
            continue
        label = Label.of(store.entry(obj_id).sealed)
        if label is not None and label.nonce in mine and label.kind not in _NOT_MATERIAL:
            spend([store.entry(obj_id)])
    for v in mine:
        del bound[v]


_NOT_MATERIAL = frozenset({HELD, HELD_SHARE, HELD_INSTANCE, SPENT})


def any_bound(state: dict[str, Any]) -> bool:
    """Whether a namespace holds the bindings of an approved run (see check_instances)."""
    return bool(state.get(_BOUND))


def check_instances(state: dict[str, Any], labels: list[Label]) -> None:
    """A protocol step outside an approved run may not take material of an instance that
    an approved run started (its nonce was bound in that run): such a step could finish
    the run's computation on an intermediate and hand the client an ordinary share."""
    bound: dict[int, str] = state.get(_BOUND, {})
    if not bound:
        return
    run = current()
    for label in labels:
        token = bound.get(label.nonce) if label.nonce else None
        if token is not None and (run is None or run.token != token):
            raise NotAllowedError(
                f"protocol material of instance {label.nonce} belongs to an approved run of "
                "a held computation: only that run's own steps take it; " + RULE
            )


def check_send(sealed: Any) -> None:
    """A held object leaves its worker only as its approved run's own delivery."""
    label = Label.of(sealed)
    if label is not None and label.kind in (HELD, HELD_INSTANCE):
        run = current()
        if run is None or not run.admits(sealed):
            raise NotAllowedError(
                "sending an object held for its owner is refused: only its approved run "
                "sends it, to the peers that run names; " + RULE
            )


__all__ = [
    "HELD",
    "HELD_INSTANCE",
    "HELD_SHARE",
    "CARRIED",
    "KEEP",
    "HeldParam",
    "HeldRun",
    "any_bound",
    "Policy",
    "begin",
    "check_instances",
    "check_send",
    "current",
    "end",
    "held_param",
    "keep",
    "load_offer",
    "save_offer",
    "make_policy",
    "commands_digest",
    "param_digest",
    "program_constants",
    "program_digest",
    "release",
    "running",
    "set_policy",
    "share_seal",
]
