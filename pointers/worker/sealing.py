"""Sealed objects: protocol material that no client may read, and the protocol instances
that alone may use it.

A higher layer (``mpc``) creates objects at the workers that must never reach the client
that orchestrates it: seeds, masks, opened values, dealer corrections, triples, and values
shared by an owner other than the client. They are *sealed* where they are created, and
the worker enforces the rules, whatever the client sends:

* a client cannot fetch, describe, tag or find (search) a sealed object, nor run a plan or
  any aten op on one; stores from a client are never sealed;
* every sealed object carries a :class:`Label` that says what made it and for which
  protocol instance (its nonce): the registered function that made it, not the client,
  writes it. A peer delivery (``copy_to``, ``move``) keeps the label and records the
  sender as its origin; an object whose label allows no more deliveries (a seed, once it
  left the dealer) cannot be sent again, and one whose label names the workers it may go
  to (``to``: a protocol session's computing parties) goes to no other;
* a registered function that takes or makes sealed objects is a *protocol step*: it
  declares a rule (:func:`protocol_function`) that the worker runs with the labels of the
  arguments before the step runs. The rule checks that each sealed input is the output of
  the previous step of the same instance, of the right kind, made here or delivered by a
  peer as the protocol says; it marks what the step consumes (used once: a consumed
  object no longer matches any rule) and it names the label of each output (None: an
  ordinary object, the step's final result). An undeclared function takes no sealed
  object and makes none, and so does a plan's ``fn::`` node: protocol steps run only as
  commands, where these checks run.

The values a protocol means to reveal (the shares of its outputs, which the caller
reconstructs with ``get()``) are ordinary objects.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch

from pointers.errors import NotAllowedError

F = TypeVar("F", bound=Callable[..., Any])

RULE = "protocol material is sealed at the workers (docs/security.md)"

# The wire and store form of a sealed object's label: a list
#   [kind, nonce, index, origin, deliveries, extra] or, bound to a group of parties,
#   [kind, nonce, index, origin, deliveries, extra, to]
# kind: what made it (a protocol step's output name); nonce and index: the protocol instance
# and its sub-step; origin: "" where it was made, else the worker that delivered it;
# deliveries: how many more times it may be sent to a peer (-1: any); extra: the step's
# own data (a list); to: the only workers it may be delivered to (a list of ids; absent:
# any), written by the step that made it and checked by its worker at every delivery (a
# delivered copy of it is never sent on, and travels without it). A sealed entry of a
# store holds its label (a non-empty list).
UNLIMITED = -1
SPENT = "spent"
# an owner's data at its own worker (pointers.worker.owners): extra (owner, the value's
# digest, the owner's count); found by a search and described, never read
OWNERS_DATA = "owners_data"
OWNERS_RULE = "a data owner's data is used only as its owner allows (docs/security.md)"


@dataclass(frozen=True, slots=True)
class Label:
    """A sealed object's label (see the module comment above)."""

    kind: str
    nonce: int = 0
    index: int = 0
    origin: str = ""
    deliveries: int = UNLIMITED
    extra: tuple[Any, ...] = ()
    to: tuple[str, ...] = ()

    def wire(self) -> list[Any]:
        out = [self.kind, self.nonce, self.index, self.origin, self.deliveries, list(self.extra)]
        return [*out, list(self.to)] if self.to else out

    @staticmethod
    def of(sealed: Any) -> Label | None:
        """The label a store entry's ``sealed`` field holds (None: not sealed; an
        unlabelled or malformed seal reads as a label that matches no rule)."""
        if not sealed:
            return None
        if (
            isinstance(sealed, list)
            and len(sealed) in (6, 7)
            and type(sealed[0]) is str
            and type(sealed[1]) is int
            and type(sealed[2]) is int
            and type(sealed[3]) is str
            and type(sealed[4]) is int
            and isinstance(sealed[5], list)
        ):
            to: tuple[str, ...] = ()
            if len(sealed) == 7:
                group = sealed[6]
                if not (
                    isinstance(group, list)
                    and group
                    and all(type(w) is str for w in group)
                    and len(set(group)) == len(group)
                ):
                    return Label("unlabelled")
                to = tuple(group)
            return Label(
                sealed[0], sealed[1], sealed[2], sealed[3], sealed[4], tuple(sealed[5]), to
            )
        return Label("unlabelled")

    @property
    def local(self) -> bool:
        return self.origin == ""


def seal(kind: str, nonce: int = 0, index: int = 0, *, deliveries: int = UNLIMITED,
         extra: tuple[Any, ...] = (), to: tuple[str, ...] = ()) -> list[Any]:  # fmt: skip
    """The ``sealed`` value of an object made here (a label's wire form)."""
    return Label(kind, nonce, index, "", deliveries, extra, to).wire()


def delivered_seal(sealed: Any, sender: str, peer: str) -> list[Any]:
    """The seal a delivered copy of a sealed object carries (origin: the sender), or a
    refusal if the label allows no more deliveries, or names the workers it may go to
    (``to``) and ``peer`` is not one of them. A copy of a bound object is never sent on
    (the worker that made it delivers it where it goes), so it travels unbound and with
    no delivery left. The sender's entry is updated by the caller with
    :func:`after_delivery`."""
    label = Label.of(sealed)
    assert label is not None
    if label.kind == OWNERS_DATA:
        raise NotAllowedError(f"sending an owner's data to a peer is refused; {OWNERS_RULE}")
    if label.deliveries == 0:  # (delivered as often as it may be, or kept where it is)
        raise refused(f"sending a {label.kind} to a peer (again)")
    if label.to and (peer not in label.to or peer == sender):
        raise NotAllowedError(
            f"worker {sender!r}: sending a {label.kind} to {peer!r} is refused: it goes only "
            f"to {_names(label.to, sender)}, the computing parties it was made for (never "
            f"the crypto provider, nor a worker outside them); {RULE}"
        )
    left = 0 if label.deliveries != UNLIMITED or label.to else UNLIMITED
    return replace(label, origin=sender, deliveries=left, to=()).wire()


def _names(to: tuple[str, ...], but: str) -> str:
    others = [repr(w) for w in to if w != but]
    return ", ".join(others) if others else "no other worker"


def after_delivery(sealed: Any) -> Any:
    """The sender's seal once a copy left (one delivery fewer)."""
    label = Label.of(sealed)
    if label is None or label.deliveries == UNLIMITED:
        return sealed
    return replace(label, deliveries=label.deliveries - 1).wire()


@dataclass
class Arg:
    """One argument of a protocol step as its rule sees it: the resolved value, and for
    a reference the store entry (or entries, for a list of references)."""

    value: Any
    entry: Any = None  # the store entry of a single reference
    entries: list[Any] | None = None  # the entries of a list of references

    @property
    def label(self) -> Label | None:
        return None if self.entry is None else Label.of(self.entry.sealed)


@dataclass
class ProtocolCall:
    """What a protocol step's rule sees: the step, the worker, the arguments by name."""

    name: str
    worker_id: str
    state: dict[str, Any]  # the worker's function state (per client namespace)
    args: dict[str, Arg]
    spend: list[Any] = field(default_factory=list)  # entries consumed if the step runs
    # the worker owner's approvals for the values it shares (pointers.worker.policy.Policy)
    policy: Any = None
    # what the worker knows of data owners (pointers.worker.owners.DataPolicy)
    data_policy: Any = None

    def refuse(self, why: str) -> NotAllowedError:
        return NotAllowedError(f"worker {self.worker_id!r}: {self.name}: {why}; {RULE}")

    def value(self, name: str) -> Any:
        a = self.args.get(name)
        return None if a is None else a.value

    def material(
        self,
        name: str,
        kinds: str | tuple[str, ...],
        nonce: int | None = None,
        *,
        local: bool | None = None,
        optional: bool = False,
        consume: bool = False,
    ) -> Label | None:
        """The label of sealed parameter ``name``, which must be of one of ``kinds``, for
        instance ``nonce`` (None: any), made here (``local``) or delivered by a peer (not
        ``local``; None: either); ``optional``: None is accepted (then None is
        returned); ``consume``: used up if the step runs."""
        a = self.args.get(name)
        if a is None or (a.entry is None and a.value is None):
            if optional:
                return None
            raise self.refuse(f"parameter {name!r} takes protocol material, got nothing")
        label = a.label
        if label is None or not a.entry.sealed:
            raise self.refuse(f"parameter {name!r} takes protocol material only")
        self._check(name, label, kinds, nonce, local)
        if consume:
            self.spend.append(a.entry)
        return label

    def materials(
        self,
        name: str,
        kinds: str | tuple[str, ...],
        what: str,
        *,
        local: bool | None = None,
        consume: bool = False,
    ) -> list[Label]:
        """The labels of list parameter ``name``, each checked as :meth:`material` checks
        one (``what``: how the refusal of an empty or missing list names the parameter)."""
        a = self.args.get(name)
        if a is None or not a.entries:
            raise self.refuse(f"parameter {name!r} takes {what}")
        labels = []
        for e in a.entries:
            label = Label.of(e.sealed) if e is not None else None
            if label is None:
                raise self.refuse(f"parameter {name!r} takes protocol material only")
            self._check(name, label, kinds, None, local)
            if consume:
                self.spend.append(e)
            labels.append(label)
        return labels

    def pieces(self, name: str) -> list[Label]:
        """Labels of a list parameter of sealed objects (each consumed if the step runs):
        the first made here, the others delivered by distinct peers (an opening). If this
        worker's own piece is bound to a group of workers (``to``), this worker is one of
        them and the others come from every other worker of the group, once each."""
        a = self.args.get(name)
        if a is None or a.entries is None or len(a.entries) < 2:
            raise self.refuse(f"parameter {name!r} takes this party's piece and its peers'")
        labels = []
        for e in a.entries:
            label = Label.of(e.sealed) if e is not None else None
            if label is None:
                raise self.refuse(f"parameter {name!r} takes protocol material only")
            labels.append(label)
        first = labels[0]
        if not first.local:
            raise self.refuse(f"the first piece of {name!r} must be this party's own")
        origins = [lb.origin for lb in labels[1:]]
        if any(o == "" for o in origins) or len(set(origins)) != len(origins):
            raise self.refuse(f"the other pieces of {name!r} must come from distinct peers")
        for lb in labels:
            if (lb.kind, lb.nonce, lb.index, lb.extra) != (
                first.kind,
                first.nonce,
                first.index,
                first.extra,
            ):
                raise self.refuse(f"the pieces of {name!r} are not pieces of one value")
        if first.to and (
            self.worker_id not in first.to or {self.worker_id, *origins} != set(first.to)
        ):
            raise self.refuse(
                f"the pieces of {name!r} are this party's and one from each other party of "
                f"{list(first.to)}, got pieces from {origins}"
            )
        self.spend.extend(a.entries)
        return labels

    def share(self, name: str, optional: bool = False) -> Any:
        """The value of parameter ``name``, which must be an ordinary object (a share),
        never protocol material."""
        a = self.args.get(name)
        if a is None or (a.entry is None and a.value is None and optional):
            return None
        if a.entry is None or a.entry.sealed:
            raise self.refuse(f"parameter {name!r} takes a share (an ordinary stored object)")
        return a.value

    def _check(
        self,
        name: str,
        label: Label,
        kinds: str | tuple[str, ...],
        nonce: int | None,
        local: bool | None,
    ) -> None:
        wanted = (kinds,) if isinstance(kinds, str) else kinds
        if label.kind not in wanted:
            raise self.refuse(
                f"parameter {name!r} takes a {' or '.join(wanted)}, not a {label.kind}"
            )
        if nonce is not None and label.nonce != nonce:
            raise self.refuse(
                f"parameter {name!r} belongs to protocol instance {label.nonce}, not {nonce}"
            )
        if local is True and not label.local:
            raise self.refuse(f"parameter {name!r} must be this worker's own, not delivered")
        if local is False and label.local:
            raise self.refuse(f"parameter {name!r} must be delivered by a peer")


# A rule: checks a call (raising NotAllowedError) and returns the seals of the outputs in
# order (None: an ordinary object), or one seal for every output.
Rule = Callable[[ProtocolCall], Any]


@dataclass(frozen=True)
class Sealing:
    """How a registered function treats sealed objects (see the module docstring)."""

    rule: Rule | None = None


NO_SEALING = Sealing()


def protocol_function(rule: Rule) -> Callable[[F], F]:
    """Declare a registered function a protocol step, with the ``rule`` its worker checks
    before it runs (see :class:`ProtocolCall`)."""

    def mark(fn: F) -> F:
        fn.__sealing__ = Sealing(rule)  # type: ignore[attr-defined]
        return fn

    return mark


def sealing_of(fn: Callable[..., Any]) -> Sealing:
    spec = getattr(fn, "__sealing__", None)
    return spec if isinstance(spec, Sealing) else NO_SEALING


def spend(entries: list[Any]) -> None:
    """Mark the entries a step consumed: their labels match no rule any more, so nothing
    can read their values again (no step, no client), and the store lets go of them at
    once: a spent tensor stays as a one-element stand-in of its shape and dtype until
    the client deletes its id. (The client deletes them when its pointers die, which in a
    long protocol may be much later: a network party of BERT-base at 128 tokens held
    5 GB of spent material 80 s into the first query.) The tensor itself is not touched:
    in process it may be another worker's object too."""
    for e in entries:
        label = Label.of(e.sealed)
        if label is not None:
            e.sealed = Label(SPENT, label.nonce, label.index, label.origin, 0).wire()
            e.value = _husk(e.value)


_HUSKS: dict[tuple[Any, ...], torch.Tensor] = {}  # by shape, dtype and device
_MAX_HUSKS = 4096  # (a program's steps spend a few hundred shapes: forgotten past this)


def _husk(value: Any) -> Any:
    """What a spent entry keeps of its value: a tensor's shape and dtype (stride 0 over
    one element); anything else as it is. One husk serves every spent tensor of a shape,
    dtype and device (made once: a decoding step spends thousands; nothing writes to a
    husk, and torch refuses a write to a tensor whose elements share memory)."""
    if type(value) is torch.Tensor and value.numel() > 1:
        key = (value.shape, value.dtype, value.device)
        husk = _HUSKS.get(key)
        if husk is None:
            if len(_HUSKS) >= _MAX_HUSKS:
                _HUSKS.clear()
            husk = torch.zeros((), dtype=value.dtype, device=value.device).expand(value.shape)
            _HUSKS[key] = husk
        return husk
    return value


def is_owners_data(sealed: Any) -> bool:
    """Whether a store entry's seal is an owner's data (found by a search, described)."""
    return bool(sealed) and sealed[0] == OWNERS_DATA and Label.of(sealed) is not None


def refused_entry(what: str, obj_id: int, sealed: Any) -> NotAllowedError:
    """The refusal of ``what`` on the sealed entry ``obj_id``, naming its rule."""
    label = Label.of(sealed)
    if label is not None and label.kind == OWNERS_DATA and label.extra:
        return NotAllowedError(
            f"object {obj_id} is the owner's data at worker {label.extra[0]!r}: {what} is "
            f"refused; {OWNERS_RULE}"
        )
    return refused(what, obj_id)


def refused(what: str, obj_id: int | None = None) -> NotAllowedError:
    obj = f"object {obj_id} is sealed" if obj_id is not None else "sealed objects"
    return NotAllowedError(f"{obj}: {what} is refused; {RULE}")
