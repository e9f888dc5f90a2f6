"""What a network client accepts in a worker's replies, and the errors it makes of them.

A reply's value is checked against what its request asks for before the client uses it
(:func:`reply_check`: a search's matches, the descriptions of an op's outputs), so a
malformed or hostile reply fails its call with a clear error instead of a crash later;
:class:`WorkerRestartedError` is the error for an object that died with an earlier process
of its worker.

Imports :mod:`pointers.errors` and the wire formats only.
"""

from __future__ import annotations

from typing import Any

from pointers.errors import DecodeError, PointerError, RemoteError
from pointers.wire.messages import (
    CallFunction,
    Describe,
    ExecuteOp,
    Message,
    RunPlan,
    Search,
    StoreRunPlan,
)
from pointers.wire.serde import MAX_TENSOR_DIMS, dtype_from_name


class WorkerRestartedError(RemoteError):
    """A command named an object that died with an earlier run of the worker's process:
    the worker restarted (same address, empty store) after the object was made."""

    def __init__(self, worker: str, obj_id: int, message: str) -> None:
        PointerError.__init__(
            self,
            f"worker {worker!r} restarted after object {obj_id} was made there: the objects "
            "of its earlier process are gone (send or share them again; new work goes to "
            f"the new process). The worker said: {message}",
        )
        self.worker = worker
        self.kind = "UnknownObjectError"
        self.remote_message = message
        self.obj_id = obj_id


# the largest reply header a client decodes (decoding takes up to ~40x a header's size in
# memory): a reply holds a value's description or a fetched value's metadata; a search's
# reply, which lists every match, may take the worker's own limit (serde.MAX_HEADER_BYTES)
MAX_REPLY_HEADER = 1 << 20


def _is_count(v: Any) -> bool:
    return type(v) is int and 0 <= v < 1 << 62


def _tensor_meta_error(m: Any) -> str | None:
    """What is wrong with a tensor's description ``[shape, stride, dtype name]``."""
    if not (isinstance(m, list) and len(m) == 3):
        return "a tensor description is not [shape, stride, dtype]"
    shape, stride, dtype = m
    if not (
        isinstance(shape, list) and len(shape) <= MAX_TENSOR_DIMS and all(map(_is_count, shape))
    ):
        return f"a tensor shape is not a list of sizes: {str(shape)[:80]}"
    if not (
        isinstance(stride, list)
        and len(stride) == len(shape)
        and all(type(k) is int and abs(k) < 1 << 62 for k in stride)
    ):
        return f"a tensor stride does not match its shape: {str(stride)[:80]}"
    try:
        itemsize = (
            dtype_from_name(dtype) if isinstance(dtype, str) else dtype_from_name("")
        ).itemsize
    except DecodeError as e:
        return str(e)
    # no tensor (nor a pointer's wrapper of one) can have more elements, or reach further
    # into its storage, than 2^62 bytes: torch's own size arithmetic overflows first
    numel, extent = 1, 1
    for size, step in zip(shape, stride):
        numel *= size
        extent += (size - 1) * abs(step) if size else 0
    if numel and (numel * itemsize > _MAX_BYTES or extent * itemsize > _MAX_BYTES):
        return f"a tensor of {numel} elements (shape {str(shape)[:80]}) cannot exist"
    return None


_MAX_BYTES = 1 << 62


def search_reply(value: Any) -> str | None:
    if not isinstance(value, list):
        return "a search's answer is not a list"
    for entry in value:
        if not (isinstance(entry, list) and len(entry) == 6 and _is_count(entry[0])):
            return "a search's match is not [id, shape, stride, dtype, tags, description]"
        why = _tensor_meta_error(entry[1:4])
        if why is not None:
            return why
        if not (isinstance(entry[4], list) and all(isinstance(t, str) for t in entry[4])):
            return "a search's match has tags that are not strings"
        if not isinstance(entry[5], str):
            return "a search's match has a description that is not a string"
    return None


def _described_reply(value: Any) -> str | None:
    """An op's, function's or plan's outputs described: ``[is_sequence, metas]``."""
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[1], list)):
        return "an output description is not [sequence, [descriptions]]"
    for m in value[1]:
        why = None if m is None else _tensor_meta_error(m)
        if why is not None:
            return why
    return None


def reply_check(msg: Message) -> Any:
    """The check of the reply value ``msg`` expects (None: any value)."""
    if type(msg) is Search:
        return search_reply
    if type(msg) in (ExecuteOp, CallFunction, RunPlan, StoreRunPlan) and getattr(
        msg, "want_meta", False
    ):
        return _described_reply
    if type(msg) is Describe:
        return _described_list
    return None


def _described_list(value: Any) -> str | None:
    if not isinstance(value, list):
        return "a description of objects is not a list"
    for m in value:
        why = _tensor_meta_error(m)
        if why is not None:
            return why
    return None
