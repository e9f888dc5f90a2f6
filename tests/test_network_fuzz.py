"""Fuzzing the frame (envelope) decoder, the message decoder and a served worker's handlers.

Random bytes, mutated valid envelopes and messages, values nested 1..1000 deep (lists,
maps, tuples, extensions inside extensions), values and tensors that declare far more
than they hold, and ops of the sparse, quantized and empty families must end in a clean
error reply: never an exception out of a handler, never a crash or a hang, and the worker
stays usable. 200 cases per property in the default suite, 10,000 in the slow one
(``-m slow``). The op families run against a worker process of their own (a regression
there kills that process, not the test run).
"""

from __future__ import annotations

import struct
import time
from typing import Any

import msgpack
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from network_fixtures import Cluster
from test_wire_limits import array, ext, op_message, pack, tensor_ext

import pointers as pt
from pointers.errors import DecodeError
from pointers.network import ServerConfig, WorkerServer
from pointers.network.framing import FrameError, decode_envelope, encode_envelope
from pointers.network.transport import EXEC, SYNC, open_channel
from pointers.wire import serde
from pointers.wire.messages import (
    CallFunction,
    Delete,
    Describe,
    ErrorReply,
    ExecuteOp,
    Fetch,
    Message,
    Reply,
    Search,
    SendToPeer,
    Store,
    Tag,
    decode_message,
    encode_message,
)
from pointers.wire.ops import ZERO_FILLED
from pointers.wire.serde import Ref

pytestmark = pytest.mark.network

SEED_MESSAGES: list[Message] = [
    Store(1, torch.arange(6.0).reshape(2, 3), ["t"], "d"),
    Store(2, torch.tensor([1, 2, 3]), [], ""),
    ExecuteOp("aten::add.Tensor", [Ref(1), Ref(1)], {}, [3], False),
    ExecuteOp("aten::mul.Tensor", [Ref(1), 2.5], {}, [4], False),
    ExecuteOp("aten::sum.dim_IntList", [Ref(1), [0]], {"keepdim": True}, [5], False),
    ExecuteOp("aten::max.dim", [Ref(1), 1], {}, [None, None], True),
    CallFunction("no.such.function", [Ref(1)], {}, [6], False),
    Fetch(1, False),
    Search(["t"]),
    Tag(1, ["u"], "x"),
    Describe([1, 2]),
    Delete([4]),
    SendToPeer(1, "bob", 9, False),
]
SEED_FRAMES = [encode_message(m) for m in SEED_MESSAGES]


def _envelope(frames: list[tuple[bytes, list[Any]]], info: dict[str, Any] | None = None) -> bytes:
    return encode_envelope(
        info or {}, [(SYNC if i % 3 == 0 else 0, h, b) for i, (h, b) in enumerate(frames)]
    )


SEED_ENVELOPES = [
    _envelope(SEED_FRAMES[:3]),
    _envelope(SEED_FRAMES[2:8], {"expect": [["bob", [77]]], "deadline": 0.2}),
    _envelope(SEED_FRAMES[8:]),
    _envelope(
        [SEED_FRAMES[0], encode_message(ExecuteOp("aten::abs.default", [Ref(77)], {}, [8], False))]
    ),
    encode_envelope({"what": "stats"}, []),
    encode_envelope({"client": "client", "from": "bob"}, [(0, *SEED_FRAMES[0])]),
]


def _mutate(draw: Any, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not out:
            break
        i = draw(st.integers(0, len(out) - 1))
        kind = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]))
        if kind == "flip":
            out[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set":
            out[i] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0xC1, 0xCF, 0xD3, 0xDD, 0xFF]))
        elif kind == "insert":
            out[i:i] = draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete":
            del out[i : i + draw(st.integers(1, 9))]
        else:
            del out[i:]
    return bytes(out)


@st.composite
def mutated_envelopes(draw: Any) -> bytes:
    return _mutate(draw, draw(st.sampled_from(SEED_ENVELOPES)))


@st.composite
def mutated_headers(draw: Any) -> tuple[bytes, list[Any]]:
    header, buffers = draw(st.sampled_from(SEED_FRAMES))
    return _mutate(draw, header), buffers


@st.composite
def envelopes_with_mutated_messages(draw: Any) -> bytes:
    frames = draw(st.lists(mutated_headers(), min_size=1, max_size=4))
    return _envelope(frames)


# -- deep nesting -------------------------------------------------------------------------
_TENSOR_LEAF = tensor_ext(0, "float32", [1])  # buffer 0 (4 bytes) travels with it
_LEAVES = [b"\xc0", b"\x90", pack("x"), ext(4, struct.pack("<q", 1)), _TENSOR_LEAF]


@st.composite
def deep_values(draw: Any) -> tuple[bytes, bool, int]:
    """A value nested 1..1000 levels deep, its levels lists, maps, tuples and extensions
    directly inside extensions in a drawn repeating pattern; whether it holds a tensor;
    its depth. Built inside out without copying (an extension's length is its inner
    value's)."""
    depth = draw(st.integers(1, 1000) | st.sampled_from([15, 16, 17, 31, 32, 33, 63, 64, 65]))
    pattern = draw(
        st.lists(st.sampled_from(["list", "map", "tuple", "ext"]), min_size=1, max_size=4)
    )
    leaf = draw(st.sampled_from(_LEAVES))
    size = len(leaf)
    prefixes: list[bytes] = []  # innermost first
    for i in range(depth):
        kind = pattern[i % len(pattern)]
        if kind == "list":
            prefix = b"\x91"
        elif kind == "map":
            prefix = b"\x81\xa1k"
        elif kind == "tuple":
            prefix = b"\xc9" + (size + 1).to_bytes(4, "big") + b"\x07\x91"
        else:
            prefix = b"\xc9" + size.to_bytes(4, "big") + b"\x07"
        prefixes.append(prefix)
        size += len(prefix)
    prefixes.reverse()
    return b"".join(prefixes) + leaf, leaf is _TENSOR_LEAF, depth


@st.composite
def in_a_message(draw: Any, value: bytes) -> bytes:
    """``value`` where a message holds arguments, tensors, tags, plans or programs."""
    where = draw(st.sampled_from(["arg", "kwarg", "store", "call", "reply", "program", "plan"]))
    if where == "arg":
        return op_message(value)
    if where == "kwarg":
        return array(
            pack("op"),
            pack("aten::add.Tensor"),
            pack([]),
            b"\x81\xa5alpha" + value,
            pack([3]),
            b"\xc2",
        )
    if where == "store":
        return array(pack("store"), pack(5), value, pack([]), pack(""), b"\xc2")
    if where == "call":
        return array(
            pack("call"), pack("no.such.function"), array(value), b"\x80", pack([6]), b"\xc2"
        )
    if where == "reply":
        return array(pack("reply"), value)
    if where == "program":
        return array(pack("store_program"), pack(9), array(value))
    return array(pack("store_plan"), pack(9), value)


@st.composite
def deep_cases(draw: Any) -> tuple[bytes, list[Any], int]:
    value, has_tensor, depth = draw(deep_values())
    return draw(in_a_message(value)), [b"\0" * 4] if has_tensor else [], depth


deep_frames = deep_cases().map(lambda c: (c[0], c[1]))


# -- declared sizes far past what is there ---------------------------------------------------
_LENGTH_FIELDS = {  # first byte -> bytes of its length field
    "array16": (0xDC, 2),
    "array32": (0xDD, 4),
    "map16": (0xDE, 2),
    "map32": (0xDF, 4),
    "str8": (0xD9, 1),
    "str16": (0xDA, 2),
    "str32": (0xDB, 4),
    "bin8": (0xC4, 1),
    "bin16": (0xC5, 2),
    "bin32": (0xC6, 4),
    "ext8": (0xC7, 1),
    "ext16": (0xC8, 2),
    "ext32": (0xC9, 4),
}
_DIMS = [0, 1, 3, 1 << 31, 1 << 40, 1 << 62, (1 << 63) - 1, (1 << 64) - 1]


@st.composite
def huge_values(draw: Any) -> tuple[bytes, list[bytes], int]:
    """A value declaring a length, shape or byte count beyond the bytes present (a tensor
    of at least 2^31 elements with at most 64 bytes); the declaring values may nest inside
    one another (the issue's memory bomb). Also what its first value declares (-1 for a
    tensor): more than the message's bytes makes it malformed for sure."""
    if draw(st.booleans()):  # a tensor whose header and buffer disagree
        shape = draw(st.lists(st.sampled_from(_DIMS[1:]), max_size=70))
        shape.insert(draw(st.integers(0, len(shape))), draw(st.sampled_from(_DIMS[3:])))
        index = draw(st.sampled_from([0, 0, 0, 1, -1, 1 << 32]))
        dtype = draw(st.sampled_from(["float32", "int64", "bool", "complex128", "float128"]))
        buffers = draw(st.lists(st.binary(max_size=64), min_size=0, max_size=2))
        return tensor_ext(index, dtype, shape), buffers, -1
    parts = []
    declared = []
    for _ in range(draw(st.integers(1, 4))):  # a pattern, repeated below
        first, width = _LENGTH_FIELDS[draw(st.sampled_from(sorted(_LENGTH_FIELDS)))]
        top = (1 << (8 * width)) - 1
        n = draw(st.sampled_from([top, top // 2 + 1, 1 << 20, 255]) | st.integers(1, top))
        code = b"\x07" if first in (0xC7, 0xC8, 0xC9) else b""
        parts.append(bytes([first]) + min(n, top).to_bytes(width, "big") + code)
        declared.append(n)
    parts *= draw(st.integers(1, 500) | st.integers(1, 3))
    return b"".join(parts) + draw(st.binary(max_size=16)), [], declared[0]


@st.composite
def huge_cases(draw: Any) -> tuple[bytes, list[Any], bool]:
    """A message holding a huge value; and whether it cannot possibly be well-formed."""
    value, buffers, declared = draw(huge_values())
    header = draw(in_a_message(value))
    return header, buffers, declared < 0 or declared > len(header)


huge_frames = huge_cases().map(lambda c: (c[0], c[1]))


@st.composite
def envelopes_declaring_too_much(draw: Any) -> bytes:
    """An envelope whose index declares headers and buffers larger than what follows."""
    frames = [
        [draw(st.integers(0, 3)), draw(st.sampled_from([0, 5, 1 << 20, 1 << 31, (1 << 64) - 1])),
         draw(st.lists(st.sampled_from([0, 1, 1 << 30, 1 << 40, (1 << 64) - 1]), max_size=5))]
        for _ in range(draw(st.integers(1, 3)))
    ]  # fmt: skip
    meta = msgpack.packb([{}, frames])
    return b"PTW1" + len(meta).to_bytes(4, "big") + meta + draw(st.binary(max_size=64))


@st.composite
def hostile_envelopes(draw: Any) -> bytes:
    frames = draw(st.lists(deep_frames | huge_frames, min_size=1, max_size=3))
    return _envelope(frames)


payloads = st.one_of(
    st.binary(max_size=300),
    mutated_envelopes(),
    envelopes_with_mutated_messages(),
    hostile_envelopes(),
    envelopes_declaring_too_much(),
)


class _Context:
    """The parts of a gRPC servicer context the handlers use (insecure mode)."""

    def __init__(self, identity: str) -> None:
        self._md = (("pointers-identity", identity),)

    def invocation_metadata(self) -> Any:
        return self._md

    def abort(self, code: Any, details: str) -> None:
        raise RuntimeError(details)


@pytest.fixture(scope="module")
def server() -> WorkerServer:
    # not started: the handlers are called directly; a short deadline bounds any wait
    return WorkerServer(ServerConfig("alice", insecure=True, deadline=0.2), {})


def _check_reply(reply: Any) -> None:
    assert isinstance(reply, bytes)
    info, frames = decode_envelope(reply)
    for _, header, buffers in frames:
        assert isinstance(decode_message(header, buffers), Reply | ErrorReply)
    if "error" in info:
        kind, message = info["error"]
        assert isinstance(kind, str) and isinstance(message, str)


def _handlers_survive(server: WorkerServer, data: bytes) -> None:
    ctx = _Context("client")
    for handler in (server._exec, server._deliver, server._inspect):
        start = time.monotonic()
        _check_reply(handler(data, ctx))
        assert time.monotonic() - start < 5.0


def _still_usable(server: WorkerServer) -> None:
    store = encode_message(Store(424242, torch.tensor([3.0]), [], ""))
    fetch = encode_message(Fetch(424242, True))
    reply = server._exec(encode_envelope({}, [(0, *store), (SYNC, *fetch)]), _Context("client"))
    _, frames = decode_envelope(reply)
    value = decode_message(frames[-1][1], frames[-1][2])
    assert isinstance(value, Reply) and torch.equal(value.value, torch.tensor([3.0]))


FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
FUZZ_SLOW = settings(FUZZ, max_examples=10_000)


@FUZZ
@given(data=st.binary(max_size=300) | mutated_envelopes())
def test_frame_decoder_raises_only_frame_errors(data):
    try:
        info, frames = decode_envelope(data)
    except FrameError:
        return
    assert isinstance(info, dict) and all(len(f) == 3 for f in frames)


@FUZZ
@given(frame=mutated_headers())
def test_message_decoder_raises_only_decode_errors(frame):
    try:
        msg = decode_message(*frame)
    except DecodeError:
        return
    assert isinstance(msg, Message)


@FUZZ
@given(data=payloads)
def test_served_worker_answers_every_input_cleanly(server, data):
    _handlers_survive(server, data)


@pytest.mark.slow
@FUZZ_SLOW
@given(data=payloads)
def test_served_worker_answers_every_input_cleanly_10k(server, data):
    _handlers_survive(server, data)


@pytest.mark.slow
@FUZZ_SLOW
@given(frame=mutated_headers())
def test_message_decoder_10k(frame):
    try:
        decode_message(*frame)
    except DecodeError:
        pass


def _decodes_cleanly(frame: tuple[bytes, list[Any]]) -> None:
    try:
        msg = decode_message(*frame)
    except DecodeError:
        return
    assert isinstance(msg, Message)


@FUZZ
@given(case=deep_cases())
def test_deep_nesting_is_decoded_or_refused_cleanly(case):
    header, buffers, depth = case
    _decodes_cleanly((header, buffers))
    if depth >= serde.MAX_DEPTH:  # with the message around it: past the limit
        with pytest.raises(DecodeError, match="deeper than"):
            decode_message(header, buffers)


@FUZZ
@given(case=huge_cases())
def test_huge_declared_sizes_are_refused_cleanly(case):
    header, buffers, malformed = case
    _decodes_cleanly((header, buffers))
    if malformed:
        with pytest.raises(DecodeError):
            decode_message(header, buffers)


@pytest.mark.slow
@FUZZ_SLOW
@given(frame=deep_frames | huge_frames)
def test_deep_and_huge_10k(frame):
    _decodes_cleanly(frame)


def test_worker_usable_after_fuzzing(server):
    _still_usable(server)


def test_real_worker_process_survives_garbage(network_cluster):
    """Garbage over a real mutual-TLS connection: clean replies, the process lives on."""
    cluster = network_cluster
    channel = open_channel(
        cluster.address("carol"),
        worker_id="carol",
        credentials=pt.network.load_credentials(cluster.certs, "client"),
        max_message_bytes=1 << 20,
    )
    call = channel.unary_unary(EXEC)
    try:
        quick = [e for e in SEED_ENVELOPES if b"expect" not in e]  # no waits for peers
        for data in [b"", b"\x00" * 7, b"PTW1\xff\xff\xff\xff", *quick]:
            _check_reply(call(_mutate_fixed(data), timeout=20))
    finally:
        channel.close()
    assert cluster.servers["carol"].alive()
    carol = cluster.fresh("carol")
    assert torch.equal(pt.send(torch.ones(2), carol).get(), torch.ones(2))
    cluster.close_connections()


def _mutate_fixed(data: bytes) -> bytes:
    """A deterministic corruption: flip the middle byte."""
    if len(data) < 2:
        return data
    out = bytearray(data)
    out[len(out) // 2] ^= 0x5A
    return bytes(out)


@pytest.mark.parametrize(
    "t",
    [
        torch.arange(4)[1::2][:1],  # one element, stride 2 ("contiguous" to torch)
        torch.arange(4.0)[1::2][:1].reshape(()),
        torch.arange(12, dtype=torch.int32).reshape(3, 4).t(),
        torch.zeros(0, 3),
        torch.tensor([True, False]),
        torch.randn(2, 2, dtype=torch.complex64),
    ],
    ids=["stride2", "scalar", "transposed", "empty", "bool", "complex"],
)
def test_envelope_round_trip_of_any_tensor(t):
    header, buffers = encode_message(Store(5, t, ["a"], ""))
    info, frames = decode_envelope(encode_envelope({"k": 1}, [(3, header, buffers)]))
    assert info == {"k": 1} and frames[0][0] == 3
    msg = decode_message(frames[0][1], frames[0][2])
    assert isinstance(msg, Store) and torch.equal(msg.value, t) and msg.value.dtype == t.dtype


# -- ops of the sparse, quantized and empty families, at a worker process of their own ----
_DENSE, _INDICES, _VALUES = 1, 2, 3  # stored at the worker before fuzzing
_D, _I, _V = Ref(_DENSE), Ref(_INDICES), Ref(_VALUES)
FAMILY_OPS: dict[str, list[Any]] = {  # op -> arguments it would accept (the fuzzer varies them)
    "aten::_sparse_coo_tensor_unsafe.default": [_I, _V, [3, 3]],
    "aten::_sparse_coo_tensor_with_dims_and_tensors.default": [2, 0, [3, 3], _I, _V],
    "aten::sparse_coo_tensor.indices": [_I, _V],
    "aten::sparse_coo_tensor.indices_size": [_I, _V, [3, 3]],
    "aten::sparse_coo_tensor.size": [[3, 3]],
    "aten::_sparse_csr_tensor_unsafe.default": [_I, _I, _V, [3, 3]],
    "aten::sparse_csr_tensor.crow_col_value_size": [_I, _I, _V, [3, 3]],
    "aten::to_sparse.default": [_D],
    "aten::to_sparse.sparse_dim": [_D, 1],
    "aten::_to_sparse.default": [_D],
    "aten::to_sparse_csr.default": [_D],
    "aten::sparse_resize_.default": [_D, [3, 3], 2, 0],
    "aten::sparse_resize_and_clear_.default": [_D, [3, 3], 2, 0],
    "aten::_indices.default": [_D],
    "aten::_values.default": [_D],
    "aten::_coalesced_.default": [_D, True],
    "aten::quantize_per_tensor.default": [_D, 0.1, 0, torch.int8],
    "aten::quantize_per_channel.default": [_D, _V, _V, 0, torch.uint8],
    "aten::_empty_affine_quantized.default": [[2, 3]],
    "aten::_empty_per_channel_affine_quantized.default": [[2, 3], _V, _V, 0],
    "aten::_make_per_tensor_quantized_tensor.default": [_D, 0.1, 0],
    "aten::int_repr.default": [_D],
    "aten::q_scale.default": [_D],
    "aten::empty.memory_format": [[2, 3]],
    "aten::empty_strided.default": [[2, 3], [3, 1]],
    "aten::empty_like.default": [_D],
    "aten::empty_permuted.default": [[2, 3], [1, 0]],
    "aten::new_empty.default": [_D, [4]],
    "aten::new_empty_strided.default": [_D, [2, 3], [3, 1]],
    "aten::resize_.default": [_D, [4, 4]],
    "aten::resize_as_.default": [_D, _V],
}


@st.composite
def _family_calls(draw: Any) -> tuple[str, list[Any], dict[str, Any]]:
    """A family op with its plausible arguments, some of them replaced by sizes (huge
    ones too), scalars, other tensors or dtypes."""
    op = draw(st.sampled_from(sorted(FAMILY_OPS)))
    args = list(FAMILY_OPS[op])
    sizes = st.lists(
        st.sampled_from([0, 1, 2, 3, 1 << 20, 1 << 40, (1 << 62) - 1]) | st.integers(-2, 8),
        max_size=4,
    )
    value = st.one_of(
        st.sampled_from([_D, _I, _V, Ref(404)]),
        sizes,
        st.sampled_from([0, 1, -1, 2, 10**6, 1 << 40, 0.5, True, None]),
        st.sampled_from([torch.float32, torch.int8, torch.uint8, torch.int64]),
    )
    for _ in range(draw(st.integers(0, 2))):
        if args:
            args[draw(st.integers(0, len(args) - 1))] = draw(value)
    kwargs = draw(
        st.dictionaries(st.sampled_from(["dtype", "scale", "zero_point"]), value, max_size=1)
        | st.just({})
    )
    return op, args, kwargs


@pytest.fixture(scope="module")
def fuzzee(tmp_path_factory):
    """One worker process for the op families: if one of them crashes it, it takes only
    this module's tests with it."""
    cluster = Cluster(tmp_path_factory.mktemp("fuzzee"), ["fuzzee"]).start()
    channel = open_channel(
        cluster.address("fuzzee"),
        worker_id="fuzzee",
        credentials=pt.network.load_credentials(cluster.certs, "client"),
        max_message_bytes=1 << 24,
    )
    call = channel.unary_unary(EXEC)
    operands = {
        _DENSE: torch.arange(6.0).reshape(2, 3),
        _INDICES: torch.tensor([[0, 10**6, 1 << 40], [0, 1, 2]]),  # out of range
        _VALUES: torch.ones(3),
    }
    frames = [(0, *encode_message(Store(i, t, [], ""))) for i, t in operands.items()]
    _, replies = decode_envelope(call(encode_envelope({}, frames), timeout=30))
    assert not replies, [decode_message(h, b) for _, h, b in replies]
    yield cluster, call
    channel.close()
    cluster.stop()


def _family_op_is_refused(cluster: Any, call: Any, op: str, args: list, kwargs: dict) -> None:
    out = 100
    frames = [
        (0, *encode_message(ExecuteOp(op, args, kwargs, [out], False))),
        # then use what it made (a dense + sparse add wrote out of bounds)
        (SYNC, *encode_message(ExecuteOp("aten::add.Tensor", [Ref(_DENSE), Ref(out)], {}, [101], False))),
        (SYNC, *encode_message(Fetch(out, True))),
    ]  # fmt: skip
    resp = call(encode_envelope({}, frames), timeout=60)
    info, replies = decode_envelope(resp)
    assert "error" not in info, info
    answers = {k: decode_message(h, b) for k, h, b in replies}
    if op in ZERO_FILLED and not isinstance(answers.get(0), ErrorReply):
        # allowed in a zero-filling form (dropout and plans need them): what it made must
        # hold zeros, never memory another client freed
        resp = call(encode_envelope({}, [(SYNC, *encode_message(Fetch(out, True)))]), timeout=60)
        _, replies = decode_envelope(resp)
        (fetched,) = [decode_message(h, b) for _, h, b in replies]
        if isinstance(fetched, Reply):
            assert not fetched.value.any(), (op, args, kwargs)
    else:
        assert isinstance(answers.get(0), ErrorReply), (op, args, kwargs, answers)
        assert all(isinstance(a, ErrorReply) for a in answers.values()), answers
    assert cluster.servers["fuzzee"].alive(), cluster.servers["fuzzee"].output()[-3000:]


@FUZZ
@given(case=_family_calls())
def test_sparse_quantized_and_empty_ops_are_refused(fuzzee, case):
    cluster, call = fuzzee
    _family_op_is_refused(cluster, call, *case)


@pytest.mark.parametrize("op", sorted(FAMILY_OPS))
def test_every_family_op_is_refused(fuzzee, op):
    cluster, call = fuzzee
    _family_op_is_refused(cluster, call, op, list(FAMILY_OPS[op]), {})


def test_the_family_worker_still_serves(fuzzee):
    cluster, _ = fuzzee
    w = cluster.fresh("fuzzee")
    assert torch.equal((pt.send(torch.ones(2), w) + 1).get(), torch.full((2,), 2.0))
    cluster.close_connections()
