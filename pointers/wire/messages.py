"""The message set every worker speaks, whatever the transport.

Each message is a frozen dataclass; on the wire it is ``[kind, field, ...]`` encoded by
:mod:`pointers.wire.serde`. :func:`decode_message` accepts only the kinds below with the right
number of fields, so a worker never runs anything it does not know.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

import torch

from pointers.errors import DecodeError
from pointers.wire import serde


@dataclass(slots=True)
class Message:
    KIND: ClassVar[str] = ""


@dataclass(slots=True)
class Store(Message):
    """Store ``value`` under ``obj_id`` with optional search tags and description.

    ``sealed``: the value is protocol material, and this its label (a list; see
    :mod:`pointers.worker.sealing`); only a peer delivering a sealed object may set it, a
    client's store with it set is refused."""

    KIND: ClassVar[str] = "store"
    obj_id: int
    value: torch.Tensor
    tags: list[str]
    description: str
    sealed: bool | list[Any] = False


@dataclass(slots=True)
class Fetch(Message):
    """Return the object (and remove it when ``delete``)."""

    KIND: ClassVar[str] = "fetch"
    obj_id: int
    delete: bool


@dataclass(slots=True)
class Delete(Message):
    KIND: ClassVar[str] = "delete"
    obj_ids: list[int]


@dataclass(slots=True)
class ExecuteOp(Message):
    """Run an allow-listed aten op; store tensor outputs under ``out_ids`` (None: skip)."""

    KIND: ClassVar[str] = "op"
    op: str
    args: list[Any]
    kwargs: dict[str, Any]
    out_ids: list[int | None]
    want_meta: bool


@dataclass(slots=True)
class CallFunction(Message):
    """Run a registered function; store its tensor outputs under ``out_ids``."""

    KIND: ClassVar[str] = "call"
    name: str
    args: list[Any]
    kwargs: dict[str, Any]
    out_ids: list[int | None]
    want_meta: bool


@dataclass(slots=True)
class Search(Message):
    KIND: ClassVar[str] = "search"
    query: list[str]


@dataclass(slots=True)
class Tag(Message):
    KIND: ClassVar[str] = "tag"
    obj_id: int
    tags: list[str]
    description: str


@dataclass(slots=True)
class Describe(Message):
    """Return shape, stride and dtype of stored objects."""

    KIND: ClassVar[str] = "describe"
    obj_ids: list[int]


@dataclass(slots=True)
class SendToPeer(Message):
    """Deliver a stored object to a peer worker under ``new_id`` (peer delivery).

    ``lend``: the object will only be read, at both ends (an opening of shares): an
    in-process peer may keep the sender's tensor itself rather than a copy."""

    KIND: ClassVar[str] = "send_peer"
    obj_id: int
    peer: str
    new_id: int
    delete: bool
    lend: bool = False


@dataclass(slots=True)
class StorePlan(Message):
    """Store a plan (its wire form, see :mod:`pointers.plans.wire`) under ``obj_id``."""

    KIND: ClassVar[str] = "store_plan"
    obj_id: int
    plan: list[Any]


@dataclass(slots=True)
class RunPlan(Message):
    """Run a stored plan on ``args``; store its outputs under ``out_ids`` (as ExecuteOp)."""

    KIND: ClassVar[str] = "run_plan"
    plan_id: int
    args: list[Any]
    out_ids: list[int | None]
    want_meta: bool


@dataclass(slots=True)
class StoreRunPlan(Message):
    """Store a variant of plan ``plan_id`` under ``obj_id``, then run it as RunPlan runs a
    plan: ``plan`` is the plan traced again for another input signature, without the
    state tensors, which it shares with plan ``plan_id`` (see
    :func:`pointers.plans.wire.variant_from_wire`). A call with a new signature is thus
    one message too."""

    KIND: ClassVar[str] = "store_run_plan"
    plan_id: int
    obj_id: int
    plan: list[Any]
    args: list[Any]
    out_ids: list[int | None]
    want_meta: bool


@dataclass(slots=True)
class ConnectPeer(Message):
    """Network workers: deliver to peer worker ``peer`` at ``address`` (host:port)."""

    KIND: ClassVar[str] = "connect_peer"
    peer: str
    address: str


@dataclass(slots=True)
class AcceptPeer(Message):
    """Network workers: accept deliveries from peer worker ``peer`` into this client's
    namespace (a peer may only deliver where a client asked for it)."""

    KIND: ClassVar[str] = "accept_peer"
    peer: str


@dataclass(slots=True)
class StoreProgram(Message):
    """Store a recorded program (see :mod:`pointers.worker.program`) under ``obj_id``."""

    KIND: ClassVar[str] = "store_program"
    obj_id: int
    messages: list[Any]


@dataclass(slots=True)
class RunProgram(Message):
    """Start a stored program with its slots bound to ``bindings``; ``promised`` are the
    ids it will create here (lookups of them wait for it)."""

    KIND: ClassVar[str] = "run_program"
    program_id: int
    bindings: list[int]
    promised: list[int]
    # an approved run of an owner's held parameters (pointers.worker.holding): [slot,
    # parameter name] per parameter slot, and the slots whose objects the run releases
    held: list[Any] = field(default_factory=list)
    outputs: list[int] = field(default_factory=list)


@dataclass(slots=True)
class Reply(Message):
    KIND: ClassVar[str] = "reply"
    value: Any


@dataclass(slots=True)
class ErrorReply(Message):
    KIND: ClassVar[str] = "error"
    kind: str
    message: str


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        Store,
        Fetch,
        Delete,
        ExecuteOp,
        CallFunction,
        Search,
        Tag,
        Describe,
        SendToPeer,
        StorePlan,
        RunPlan,
        StoreRunPlan,
        StoreProgram,
        RunProgram,
        ConnectPeer,
        AcceptPeer,
        Reply,
        ErrorReply,
    )
}
_FIELD_NAMES = {k: tuple(f.name for f in fields(c)) for k, c in MESSAGE_TYPES.items()}
_FIELD_COUNTS = {k: len(v) for k, v in _FIELD_NAMES.items()}


def encode_message(msg: Message) -> tuple[bytes, list[torch.Tensor]]:
    return serde.encode([msg.KIND, *[getattr(msg, n) for n in _FIELD_NAMES[msg.KIND]]])


def decode_message(header: bytes, buffers: list[Any], copy: bool = True) -> Message:
    """Decode a message; ``copy=False`` takes in-process tensor buffers over as they are."""
    return message_from_list(serde.decode(header, buffers, copy=copy))


def message_to_list(msg: Message) -> list[Any]:
    return [msg.KIND, *[getattr(msg, n) for n in _FIELD_NAMES[msg.KIND]]]


def message_from_list(raw: Any) -> Message:
    """A message from its decoded list form ``[kind, field, ...]``, type-checked."""
    if not isinstance(raw, list) or not raw or not isinstance(raw[0], str):
        raise DecodeError("a message must be a list starting with its kind")
    kind = raw[0]
    cls = MESSAGE_TYPES.get(kind)
    if cls is None:
        raise DecodeError(f"unknown message kind {kind!r}")
    if len(raw) - 1 != _FIELD_COUNTS[kind]:
        raise DecodeError(f"message {kind!r} expects {_FIELD_COUNTS[kind]} fields")
    msg = cls(*raw[1:])
    if type(msg) is ExecuteOp:  # the hot path: check its fields inline
        if not (
            type(msg.op) is str
            and type(msg.args) is list
            and type(msg.kwargs) is dict
            and type(msg.out_ids) is list
            and type(msg.want_meta) is bool
        ):
            raise DecodeError("malformed op message")
        for i in msg.out_ids:
            if type(i) is not int and i is not None:
                raise DecodeError("malformed op message: output ids must be ints")
        if msg.kwargs:
            for k in msg.kwargs:
                if type(k) is not str:
                    raise DecodeError("malformed op message: keyword names must be strings")
        return msg
    _check_types(msg)
    return msg


_SIMPLE_CHECKS: dict[str, type | tuple[type, ...]] = {
    "obj_id": int,
    "new_id": int,
    "delete": bool,
    "lend": bool,
    "sealed": (bool, list),
    "want_meta": bool,
    "op": str,
    "name": str,
    "peer": str,
    "description": str,
    "kind": str,
    "message": str,
    "args": list,
    "kwargs": dict,
    "value": object,
    "plan": list,
    "plan_id": int,
    "program_id": int,
    "address": str,
}


_LIST_CHECKS: dict[str, tuple[type, ...]] = {
    "obj_ids": (int,),
    "bindings": (int,),
    "promised": (int,),
    "messages": (list,),
    "out_ids": (int, type(None)),
    "tags": (str,),
    "query": (str,),
}


def _check_types(msg: Message) -> None:
    for name in _FIELD_NAMES[msg.KIND]:
        v = getattr(msg, name)
        want = _LIST_CHECKS.get(name)
        if want is not None:
            if not isinstance(v, list):
                raise DecodeError(f"{msg.KIND}.{name} must be a list")
            for x in v:
                if not isinstance(x, want):
                    raise DecodeError(f"{msg.KIND}.{name} holds values of the wrong type")
        elif name == "value" and isinstance(msg, Store):
            if not isinstance(v, torch.Tensor):
                raise DecodeError("store.value must be a tensor")
        elif name in _SIMPLE_CHECKS and not isinstance(v, _SIMPLE_CHECKS[name]):
            raise DecodeError(f"{msg.KIND}.{name} has type {type(v).__name__}")
    if isinstance(msg, ExecuteOp | CallFunction) and not all(
        isinstance(k, str) for k in msg.kwargs
    ):
        raise DecodeError("keyword argument names must be strings")


__all__ = [
    "Message",
    "Store",
    "Fetch",
    "Delete",
    "ExecuteOp",
    "CallFunction",
    "Search",
    "Tag",
    "Describe",
    "SendToPeer",
    "StorePlan",
    "RunPlan",
    "StoreRunPlan",
    "StoreProgram",
    "RunProgram",
    "ConnectPeer",
    "AcceptPeer",
    "Reply",
    "ErrorReply",
    "encode_message",
    "decode_message",
]
