"""Fuzzing the frame (envelope) decoder, the message decoder and a served worker's handlers.

Random bytes and mutated valid envelopes and messages must end in a clean error reply:
never an exception out of a handler, never a hang, and the worker stays usable. 200 cases
per property in the default suite, 10,000 in the slow one (``-m slow``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pointers as pt
from pointers.errors import DecodeError
from pointers.messages import (
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
from pointers.network.framing import FrameError, decode_envelope, encode_envelope
from pointers.network.server import ServerConfig, WorkerServer
from pointers.network.transport import EXEC, SYNC, open_channel
from pointers.serde import Ref

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


payloads = st.one_of(
    st.binary(max_size=300), mutated_envelopes(), envelopes_with_mutated_messages()
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
