"""A plan's wire form: a msgpack list, validated field by field; and its byte form.

The wire form (what :class:`~pointers.wire.messages.StorePlan` carries) is::

    ["pointers.plans.plan", version, name, input_specs, n_state, tensors, nodes, outputs,
     tuple_output]

with ``input_specs`` a list of ``[shape (-1: any size), dtype name]``, ``tensors`` the
state then the constants (they travel as message buffers), ``nodes`` a list of
``[target, args, kwargs]`` whose :class:`~pointers.wire.serde.Ref` values name earlier slots
(see :mod:`pointers.plans.graph`), and ``outputs`` a list of Refs.

:func:`plan_from_wire` checks every field before a :class:`PlanGraph` exists: the version,
each op against the worker's allow-list, every reference (only to values computed
earlier), every argument's type and nesting. :func:`plan_to_bytes` packs the wire form
and its tensor buffers into one msgpack byte string; nothing here uses pickle.
:func:`plan_from_bytes` unpacks it within the wire's structural limits
(:func:`pointers.wire.serde.unpack_document`: nesting, declared lengths, objects) and
decodes the plan's header as a worker decodes a message's, after
:func:`check_plan_bytes` has checked the outer layout without decoding anything
(:class:`OuterReader` reads that of a serialised protocol too).

A *variant* is a stored plan traced again for another input signature (what
:class:`~pointers.wire.messages.StoreRunPlan` carries): the same wire form under the magic
``"pointers.plans.plan.variant"``, with the state left out of its tensor table (only the
constants travel): :func:`variant_from_wire` takes the state from the stored plan it is
a variant of, so a model's weights never travel again for a new batch size.
"""

from __future__ import annotations

from typing import Any

import msgpack
import torch

from pointers.errors import DecodeError, NotAllowedError
from pointers.plans.graph import (
    SYM_OPS,
    InputSpec,
    Node,
    PlanDecodeError,
    PlanGraph,
    is_protocol_step,
)
from pointers.wire import serde
from pointers.wire.ops import resolve_op
from pointers.wire.serde import Ref

MAGIC = "pointers.plans.plan"
VARIANT_MAGIC = "pointers.plans.plan.variant"
BYTES_MAGIC = "pointers.plans.plan.bytes"
VERSION = 1
MAX_NODES = 1_000_000
MAX_DEPTH = 16  # nesting of lists/tuples inside one argument
MAX_NAME = 200


def plan_to_wire(graph: PlanGraph) -> list[Any]:
    """The plan as a msgpack-able list (tensors stay tensors: they travel as buffers)."""
    return [
        MAGIC,
        VERSION,
        graph.name,
        [
            [[-1 if s is None else s for s in i.shape], serde.dtype_name(i.dtype)]
            for i in graph.inputs
        ],
        graph.n_state,
        [t.detach() for t in graph.tensors],
        [[n.target, list(n.args), dict(n.kwargs)] for n in graph.nodes],
        [Ref(s) for s in graph.outputs],
        graph.tuple_output,
    ]


def variant_to_wire(graph: PlanGraph) -> list[Any]:
    """A graph's wire form as a variant of a stored plan: without its state tensors."""
    wire = plan_to_wire(graph)
    wire[0] = VARIANT_MAGIC
    wire[5] = wire[5][graph.n_state :]
    return wire


def variant_from_wire(base: PlanGraph, wire: Any, functions: Any = None) -> PlanGraph:
    """Validate a variant of the stored plan ``base`` (see :func:`variant_to_wire`) and
    build it with ``base``'s state tensors; raises :class:`PlanDecodeError`."""
    if not isinstance(wire, list) or len(wire) != 9 or wire[0] != VARIANT_MAGIC:
        raise PlanDecodeError(
            "not a plan variant: expected a 9-field list starting with 'pointers.plans.plan.variant'"
        )
    if type(wire[4]) is not int or wire[4] != base.n_state:
        raise PlanDecodeError(
            f"a variant of plan {base.name!r} must use its {base.n_state} state tensors"
        )
    if not isinstance(wire[5], list):
        raise PlanDecodeError("the plan's tensor table must be a list of tensors")
    return plan_from_wire([MAGIC, *wire[1:5], [*base.state, *wire[5]], *wire[6:]], functions)


def plan_to_bytes(graph: PlanGraph) -> bytes:
    """One byte string holding the plan and its tensors (msgpack; no pickle)."""
    header, buffers = serde.encode(plan_to_wire(graph))
    raw = [b.reshape(-1).view(torch.uint8).numpy().tobytes() for b in buffers]
    return msgpack.packb([BYTES_MAGIC, header, raw], use_bin_type=True)


def plan_from_bytes(data: bytes) -> PlanGraph:
    """Decode :func:`plan_to_bytes` output; raises :class:`PlanDecodeError` on anything else."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise PlanDecodeError(f"a plan decodes from bytes, not {type(data).__name__}")
    try:  # within the wire's structural limits (nesting, declared lengths, objects)
        outer = serde.unpack_document(data)
    except DecodeError as e:
        raise PlanDecodeError(f"not a serialised plan: {e}") from None
    if not (
        isinstance(outer, list)
        and len(outer) == 3
        and outer[0] == BYTES_MAGIC
        and isinstance(outer[1], bytes)
        and isinstance(outer[2], list)
        and all(isinstance(b, bytes) for b in outer[2])
    ):
        raise PlanDecodeError("not a serialised plan (bad outer structure)")
    try:
        wire = serde.decode(outer[1], outer[2])
    except DecodeError as e:
        raise PlanDecodeError(f"malformed plan: {e}") from None
    return plan_from_wire(wire)


_LEAF_TYPES = (
    type(None),
    bool,
    int,
    float,
    str,
    torch.dtype,
    torch.device,
    torch.layout,
    torch.memory_format,
)


def _check_value(v: Any, limit: int, where: str, depth: int = 0) -> None:
    t = type(v)
    if t is Ref:
        if not 0 <= v.obj_id < limit:
            raise PlanDecodeError(
                f"{where} refers to value {v.obj_id}, which does not exist yet (only values "
                f"0..{limit - 1} come before it)"
            )
        return
    if t in (list, tuple):
        if depth >= MAX_DEPTH:
            raise PlanDecodeError(f"{where} nests lists too deeply")
        for x in v:
            _check_value(x, limit, where, depth + 1)
        return
    if t is str and len(v) > 10_000:
        raise PlanDecodeError(f"{where} holds an overlong string")
    if t in _LEAF_TYPES:
        return
    if isinstance(v, torch.Tensor):
        raise PlanDecodeError(f"{where} holds a tensor; tensors belong in the plan's tensor table")
    raise PlanDecodeError(f"{where} holds a value of type {t.__name__}")


def check_target(target: Any, where: str, functions: Any = None) -> None:
    """Check one node target against the plan vocabulary (aten allow-list, sym ops, fn)."""
    if type(target) is not str:
        raise PlanDecodeError(f"{where}: the op name must be a string")
    ns, sep, rest = target.partition("::")
    if ns == "aten" and sep:
        try:
            resolve_op(target)
        except NotAllowedError as e:
            raise PlanDecodeError(f"{where}: {e}") from None
    elif ns == "fn" and sep:
        if not rest or len(rest) > MAX_NAME:
            raise PlanDecodeError(f"{where}: malformed function name {target!r}")
        if functions is not None and rest not in functions:
            raise PlanDecodeError(f"{where}: no function {rest!r} is registered at this worker")
        if functions is not None and is_protocol_step(functions.get(rest)):
            raise PlanDecodeError(
                f"{where}: {rest!r} is a protocol step, which runs only as a command (its "
                "worker checks its material); a plan may not call it"
            )
    elif target not in SYM_OPS:
        raise PlanDecodeError(
            f"{where}: unknown op {target[:MAX_NAME]!r}; a plan may use allow-listed aten ops "
            "('aten::name.overload'), size arithmetic ('sym::...') and registered functions "
            "('fn::name')"
        )


def plan_from_wire(wire: Any, functions: Any = None) -> PlanGraph:
    """Validate a plan's wire form and build it; raises :class:`PlanDecodeError`.

    ``functions`` (a worker's registry) makes ``fn::`` nodes naming unregistered
    functions fail here, at store time, rather than when the plan runs.
    """
    if not isinstance(wire, list) or len(wire) != 9 or wire[0] != MAGIC:
        raise PlanDecodeError(
            "not a plan: expected a 9-field list starting with 'pointers.plans.plan'"
        )
    _, version, name, specs, n_state, tensors, nodes, outputs, tuple_output = wire
    if version != VERSION:
        raise PlanDecodeError(f"unsupported plan format version {version!r} (expected {VERSION})")
    if type(name) is not str or len(name) > MAX_NAME:
        raise PlanDecodeError("the plan's name must be a short string")
    if not isinstance(specs, list):
        raise PlanDecodeError("the plan's input specs must be a list")
    inputs = []
    for k, spec in enumerate(specs):
        if not (
            isinstance(spec, list)
            and len(spec) == 2
            and isinstance(spec[0], list)
            and all(type(s) is int and s >= -1 for s in spec[0])
            and type(spec[1]) is str
        ):
            raise PlanDecodeError(f"input spec {k} is malformed")
        try:
            dtype = serde.dtype_from_name(spec[1])
        except DecodeError as e:
            raise PlanDecodeError(f"input spec {k}: {e}") from None
        inputs.append(InputSpec(tuple(None if s == -1 else s for s in spec[0]), dtype))
    if not isinstance(tensors, list) or not all(type(t) is torch.Tensor for t in tensors):
        raise PlanDecodeError("the plan's tensor table must be a list of tensors")
    if type(n_state) is not int or not 0 <= n_state <= len(tensors):
        raise PlanDecodeError("the plan's state count does not fit its tensor table")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise PlanDecodeError(f"the plan's nodes must be a list of at most {MAX_NODES}")
    parsed = []
    limit = len(inputs) + len(tensors)
    for i, raw in enumerate(nodes):
        where = f"node {i}"
        if not (isinstance(raw, list) and len(raw) == 3):
            raise PlanDecodeError(f"{where} must be [op, args, kwargs]")
        target, args, kwargs = raw
        check_target(target, where, functions)
        if not isinstance(args, list) or not isinstance(kwargs, dict):
            raise PlanDecodeError(f"{where}: args must be a list and kwargs a map")
        _check_value(args, limit, where)
        for key, v in kwargs.items():
            if type(key) is not str:
                raise PlanDecodeError(f"{where}: keyword names must be strings")
            _check_value(v, limit, where)
        parsed.append(Node(target, tuple(args), dict(kwargs)))
        limit += 1
    if not isinstance(outputs, list) or not outputs:
        raise PlanDecodeError("a plan must have at least one output")
    for o in outputs:
        if type(o) is not Ref:
            raise PlanDecodeError("the plan's outputs must be value references")
        _check_value(o, limit, "the plan's outputs")
    if type(tuple_output) is not bool or (not tuple_output and len(outputs) != 1):
        raise PlanDecodeError("the plan's output form is malformed")
    try:
        return PlanGraph(
            name, inputs, n_state, tensors, parsed, [o.obj_id for o in outputs], tuple_output
        )
    except (NotAllowedError, KeyError) as e:  # already checked above; kept for safety
        raise PlanDecodeError(f"invalid plan: {e}") from None


# -- the outer layout of a serialised plan or protocol, checked before it is decoded


class OuterReader:
    """Reads the few msgpack values of a serialised plan's or protocol's outer layout
    (arrays, strings, binaries) one at a time, checking each declared length against a
    bound and the bytes present, before anything is decoded: a hostile document that
    holds anything else fails in microseconds, instead of decoding into millions of
    objects (a 64 MiB document could take 2.5 GiB and 20 s)."""

    def __init__(self, data: Any, what: str) -> None:
        if not isinstance(data, bytes | bytearray | memoryview):
            raise PlanDecodeError(f"{what} decodes from bytes, not {type(data).__name__}")
        self.data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self.pos = 0
        self.what = what

    def _fail(self, why: str) -> PlanDecodeError:
        return PlanDecodeError(f"not {self.what}: {why} (at byte {self.pos})")

    def _length(self, size: int) -> int:
        end = self.pos + size
        if end > len(self.data):
            raise self._fail("it ends in the middle of a value")
        n = int.from_bytes(self.data[self.pos : end], "big")
        self.pos = end
        return n

    def _first(self) -> int:
        if self.pos >= len(self.data):
            raise self._fail("it ends in the middle of a value")
        b = self.data[self.pos]
        self.pos += 1
        return int(b)

    def array(self, most: int, what: str) -> int:
        b = self._first()
        if 0x90 <= b <= 0x9F:
            n = b & 0x0F
        elif b in (0xDC, 0xDD):
            n = self._length(2 if b == 0xDC else 4)
        else:
            raise self._fail(f"{what} is not a list")
        if n > most:
            raise self._fail(f"{what} holds {n} values, more than {most}")
        return n

    def string(self, most: int, what: str) -> str:
        b = self._first()
        if 0xA0 <= b <= 0xBF:
            n = b & 0x1F
        elif b in (0xD9, 0xDA, 0xDB):
            n = self._length({0xD9: 1, 0xDA: 2, 0xDB: 4}[b])
        else:
            raise self._fail(f"{what} is not a string")
        if n > most:
            raise self._fail(f"{what} of {n} bytes is longer than {most} bytes")
        end = self.pos + n
        if end > len(self.data):
            raise self._fail(f"{what} runs past the end")
        raw = bytes(self.data[self.pos : end])
        self.pos = end
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self._fail(f"{what} is not UTF-8") from None

    def binary(self, most: int, what: str) -> int:
        """Skip a byte string; returns its length."""
        b = self._first()
        if b not in (0xC4, 0xC5, 0xC6):
            raise self._fail(f"{what} is not a byte string")
        n = self._length({0xC4: 1, 0xC5: 2, 0xC6: 4}[b])
        if n > most or self.pos + n > len(self.data):
            raise self._fail(f"{what} of {n} bytes is longer than {most} bytes or the document")
        self.pos += n
        return n

    def end(self) -> None:
        if self.pos != len(self.data):
            raise self._fail(f"{len(self.data) - self.pos} unexpected bytes after its value")


PLAN_BUFFERS = serde.MAX_BUFFERS  # tensor buffers of a serialised plan, at most
# a document this small that the outer check refuses is decoded anyway (at most ~40 MiB),
# so that the wire's structural scan names what is wrong (nesting, lengths, objects)
PRECISE_BELOW = 1 << 20


def check_plan_bytes(data: Any, what: str = "a serialised plan") -> int:
    """Check the outer layout of :meth:`~pointers.plans.plan.Plan.to_bytes` output, ``[magic, header,
    [buffers]]``, without decoding it: the header at most ``serde.MAX_HEADER_BYTES`` (a
    worker's limit for a message header, which :meth:`~pointers.plans.plan.Plan.from_bytes` then decodes
    within the same limits as a worker does), at most :data:`PLAN_BUFFERS` buffers.
    Returns the header's length; raises :class:`PlanDecodeError`."""
    r = OuterReader(data, what)
    if r.array(3, "its outer value") != 3:
        raise r._fail("its outer value is not [magic, header, buffers]")
    r.string(64, "its magic")
    n = r.binary(serde.MAX_HEADER_BYTES, "its header")
    for _ in range(r.array(PLAN_BUFFERS, "its buffers")):
        r.binary(len(r.data), "a buffer")
    r.end()
    return n


__all__ = [
    "BYTES_MAGIC",
    "MAGIC",
    "PLAN_BUFFERS",
    "PRECISE_BELOW",
    "VARIANT_MAGIC",
    "VERSION",
    "OuterReader",
    "check_plan_bytes",
    "check_target",
    "plan_from_bytes",
    "plan_from_wire",
    "plan_to_bytes",
    "plan_to_wire",
    "variant_from_wire",
    "variant_to_wire",
]
