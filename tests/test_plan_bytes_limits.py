"""Serialised plans and protocols from untrusted bytes: ``Plan.from_bytes`` and
``Protocol.from_bytes`` unpack within the wire's structural limits
(:func:`pointers.wire.serde.unpack_document`: nesting, declared lengths, objects), not
with a plain ``msgpack.unpackb``, yet without a message header's 8 MiB cap (a plan
carries its tensors). Hostile inputs end in the modules' own errors, fast and without
allocating on a declared size's account; never in a RecursionError, MemoryError or a raw
msgpack error.
"""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import msgpack
import pytest
import torch
from byte_mutation import mutated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pointers as pt
from pointers.errors import DecodeError
from pointers.plans.wire import BYTES_MAGIC, plan_from_bytes
from pointers.wire import serde

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# the errors each decoder may raise (a protocol decodes its plans with Plan.from_bytes and
# reports a bad one as its own ProtocolError, naming the role)
PLAN_ERRORS = (pt.PlanDecodeError,)
PROTOCOL_ERRORS = (pt.ProtocolError,)


def _plan() -> pt.Plan:
    return pt.func2plan(args_shape=[(4,)], state=(torch.tensor([1.0, 2.0, 3.0, 4.0]),))(
        lambda x, state: x * 2 + state.read()[0]
    )


def _protocol() -> pt.Protocol:
    inc = pt.func2plan(args_shape=[(1,)])(lambda x: x + 1)
    dbl = pt.func2plan(args_shape=[(1,)])(lambda x: x * 2)
    return pt.Protocol([("first", inc), ("second", dbl)]).tag("t1", "t2").describe("inc, dbl")


PLAN_BYTES = _plan().to_bytes()
PROTOCOL_BYTES = _protocol().to_bytes()
DECODERS: list[tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]] = [
    (pt.Plan.from_bytes, PLAN_ERRORS),
    (pt.Protocol.from_bytes, PROTOCOL_ERRORS),
]
IDS = ["plan", "protocol"]


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


@contextmanager
def cheap(seconds: float = 2.0, peak_bytes: int = 16 << 20) -> Iterator[None]:
    """The block takes at most ``seconds`` and allocates at most ``peak_bytes``."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert elapsed < seconds, f"took {elapsed:.2f} s"
    assert peak < peak_bytes, f"allocated {peak} bytes at the peak"


# ------------------------------------------------------------------------- round trips


def test_plan_bytes_round_trip():
    plan = _plan()
    loaded = pt.Plan.from_bytes(plan.to_bytes())
    x = torch.arange(4.0)
    assert torch.equal(loaded(x), plan(x))
    graph = plan_from_bytes(bytearray(PLAN_BYTES))  # any bytes-like object
    assert graph.name == plan.graph.name and graph.n_state == 1
    assert pt.Plan.from_bytes(memoryview(PLAN_BYTES)).name == plan.name


def test_a_plan_larger_than_a_message_header_round_trips():
    big = torch.arange(3 << 20, dtype=torch.float32)  # 12 MiB of state > MAX_HEADER_BYTES
    plan = pt.func2plan(args_shape=[(3 << 20,)], state=(big,))(lambda x, state: x + state.read()[0])
    data = plan.to_bytes()
    assert len(data) > serde.MAX_HEADER_BYTES
    loaded = pt.Plan.from_bytes(data)
    assert torch.equal(loaded(torch.ones(3 << 20)), big + 1)


def test_protocol_bytes_round_trip():
    protocol = _protocol()
    loaded = pt.Protocol.from_bytes(protocol.to_bytes())
    assert loaded.roles == ["first", "second"]
    assert loaded.tags == {"t1", "t2"} and loaded.description == "inc, dbl"
    x = torch.tensor([3.0])
    assert torch.equal(loaded.plans["second"](loaded.plans["first"](x)), torch.tensor([8.0]))


def test_unpack_document_keeps_structure_without_the_header_cap():
    doc = ["magic", {"k": [1, 2.5, None, True]}, [b"x" * (serde.MAX_HEADER_BYTES + 1)]]
    data = pack(doc)
    assert serde.unpack_document(data) == doc
    assert serde.unpack_document(bytearray(data)) == doc
    with pytest.raises(DecodeError, match="exceeds the limit"):
        serde.unpack_limited(data)  # a message header keeps its cap
    with pytest.raises(DecodeError, match="exceeds the limit of 100 bytes"):
        serde.unpack_document(data, max_bytes=100)
    with pytest.raises(DecodeError, match="must be bytes, not str"):
        serde.unpack_document("a string")
    with pytest.raises(DecodeError, match="unexpected bytes after"):
        serde.unpack_document(pack(list(range(3000))) + b"\xc0")
    with pytest.raises(DecodeError, match="1 unexpected bytes after"):
        serde.unpack_document(b"\x01\x02")
    with pytest.raises(DecodeError, match="invalid byte 0xc1"):
        serde.unpack_document(b"\x91\xc1")
    with pytest.raises(DecodeError, match="malformed msgpack: UnicodeDecodeError"):
        serde.unpack_document(b"\xa1\xff")  # not UTF-8
    with pytest.raises(DecodeError, match="malformed msgpack: ValueError"):
        serde.unpack_document(pack({1: 2}))  # map keys are strings (or bytes)


# ------------------------------------------------------------------------ deep nesting


def _nested_ext(levels: int) -> bytes:
    """``levels`` tuple extension values, each holding a one-item array of the next."""
    inner = b"\xc0"
    for _ in range(levels):
        body = b"\x91" + inner
        inner = b"\xc9" + len(body).to_bytes(4, "big") + bytes([7]) + body
    return inner


DEEP = {
    "arrays": b"\x91" * 10_000 + b"\xc0",
    "maps": b"\x81\xa1k" * 10_000 + b"\xc0",
    "array32s": b"\xdd\x00\x00\x00\x01" * 10_000 + b"\xc0",
    "just past the limit": b"\x91" * (serde.MAX_DEPTH + 1) + b"\xc0",
    "tuple extensions": _nested_ext(10_000),
    "inside a plan's outer list": b"\x93" + pack(BYTES_MAGIC) + b"\x91" * 10_000 + b"\xc0\x90",
}


@pytest.mark.parametrize("decode,errors", DECODERS, ids=IDS)
@pytest.mark.parametrize("data", DEEP.values(), ids=DEEP.keys())
def test_deep_nesting_is_refused_clearly(decode, errors, data):
    with cheap(), pytest.raises(errors, match="nests (tuples )?deeper than"):
        decode(data)


def test_nesting_within_the_limit_is_decoded():
    data = b"\x91" * (serde.MAX_DEPTH - 1) + b"\xc0"
    value = serde.unpack_document(data)
    for _ in range(serde.MAX_DEPTH - 1):
        (value,) = value
    assert value is None


# ------------------------------------------------------ declared lengths past the input

HUGE = b"\xff\xff\xff\xff"
LIARS = {
    "array32": b"\xdd" + HUGE,
    "map32": b"\xdf" + HUGE,
    "str32": b"\xdb" + HUGE + b"abc",
    "bin32": b"\xc6" + HUGE + b"abc",
    "ext32": b"\xc9" + HUGE + b"\x01abc",
    "array16": b"\xdc\xff\xff\xc0",
}


def _padded(liar: bytes) -> bytes:
    """``liar`` as the last item of a plan's outer list, after enough bytes that the
    decoder scans the document instead of leaving the lengths to msgpack."""
    return b"\x93" + pack(BYTES_MAGIC) + pack(b"\x00" * 4096) + liar


@pytest.mark.parametrize("decode,errors", DECODERS, ids=IDS)
@pytest.mark.parametrize("liar", LIARS.values(), ids=LIARS.keys())
@pytest.mark.parametrize("pad", [False, True], ids=["short", "long"])
def test_declared_lengths_past_the_input_are_refused_without_allocating(decode, errors, liar, pad):
    data = _padded(liar) if pad else liar
    with cheap(seconds=0.5, peak_bytes=1 << 20), pytest.raises(errors) as raised:
        decode(data)
    message = str(raised.value)
    assert "not a serialised" in message
    assert "declares" in message or "ends in the middle" in message, message


@pytest.mark.parametrize("decode,errors", DECODERS, ids=IDS)
def test_many_small_containers_are_refused_before_they_are_built(decode, errors):
    # one empty list per byte: ~56 bytes of Python objects per byte of input
    n = 100_000
    data = b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n
    with cheap(seconds=5.0, peak_bytes=4 << 20), pytest.raises(errors, match="too many objects"):
        decode(data)


# ----------------------------------------------------- truncated, random, mutated bytes


@pytest.mark.parametrize("decode,errors", DECODERS, ids=IDS)
def test_every_truncation_is_refused(decode, errors):
    data = PLAN_BYTES if decode is pt.Plan.from_bytes else PROTOCOL_BYTES
    step = max(1, len(data) // 400)
    for end in [*range(0, len(data), step), len(data) - 1]:
        with pytest.raises(errors):
            decode(data[:end])


@FAST
@given(st.binary(max_size=400))
def test_random_bytes_raise_only_the_modules_errors(data):
    for decode, errors in DECODERS:
        try:
            decode(data)
        except errors:
            pass


_MSGPACK_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | st.sampled_from([BYTES_MAGIC, "pointers.protocol/1", "pointers.plans.plan"]),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=30,
)


@FAST
@given(_MSGPACK_VALUES)
def test_random_msgpack_documents_raise_only_the_modules_errors(value):
    data = pack(value)
    for decode, errors in DECODERS:
        try:
            decode(data)
        except errors:
            pass


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_mutated_protocols_raise_only_the_modules_errors(data):
    raw = mutated(data, PROTOCOL_BYTES)
    try:
        pt.Protocol.from_bytes(raw)
    except PROTOCOL_ERRORS:
        pass


def test_a_protocol_with_a_bad_plan_names_the_role() -> None:
    good = _protocol()
    bad = msgpack.unpackb(PROTOCOL_BYTES, raw=False)
    bad[1][1][1] = bad[1][1][1][:-3]  # the second role's plan, truncated
    with pytest.raises(pt.ProtocolError, match="role 'second'") as caught:
        pt.Protocol.from_bytes(pack(bad))
    assert isinstance(caught.value.__cause__, pt.PlanDecodeError)
    assert pt.Protocol.from_bytes(good.to_bytes()).roles == good.roles
