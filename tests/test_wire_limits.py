"""The limits of the wire format: no header, however nested or however large its declared
sizes, crashes a worker or a client, or makes either allocate more than a small multiple
of what it received (issue 12: "Crashes", "Limits that do not limit", "Faults").

The hostile headers are raw msgpack bytes (the encoder refuses to produce them). They go
to the decoder in this process, to real ``python -m pointers serve`` processes through
Exec (as a client) and Deliver (as a peer), and come back to a client from a fake
malicious worker. The cases that used to end in SIGSEGV run in a subprocess, so a
regression shows as a failed test, not a dead test run.
"""

from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import tracemalloc
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import msgpack
import pytest
import torch

import pointers as pt
from pointers.errors import DecodeError
from pointers.network import ClientContext
from pointers.network.context import DEFAULT_CONTEXT
from pointers.network.framing import FrameError, decode_envelope, encode_envelope
from pointers.network.lease import session_of
from pointers.network.transport import DELIVER, EXEC, SERVICE, SYNC, open_channel
from pointers.wire import serde
from pointers.wire.messages import (
    AcceptPeer,
    ErrorReply,
    Fetch,
    Reply,
    decode_message,
    encode_message,
)
from pointers.wire.serde import Ref

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


# ---------------------------------------------------------------- hostile msgpack bytes


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def array(*items: bytes) -> bytes:
    """A msgpack array of already-packed items."""
    n = len(items)
    head = bytes([0x90 | n]) if n < 16 else b"\xdd" + n.to_bytes(4, "big")
    return head + b"".join(items)


def ext(code: int, data: bytes) -> bytes:
    return b"\xc9" + len(data).to_bytes(4, "big") + bytes([code & 0xFF]) + data


def nested_tuples(depth: int, leaf: bytes = b"\x90") -> bytes:
    """``((...(leaf,)...),)``: each level an extension (decoded by a nested unpackb) around
    an array of one (built outside in: ext(7, [inner]) takes 7 bytes more than inner)."""
    return (
        b"".join(
            b"\xc9" + (1 + len(leaf) + 7 * i).to_bytes(4, "big") + b"\x07\x91"
            for i in reversed(range(depth))
        )
        + leaf
    )


def nested_exts(depth: int) -> bytes:
    """A tuple extension directly inside a tuple extension, ``depth`` times."""
    return (
        b"".join(b"\xc9" + (1 + 6 * i).to_bytes(4, "big") + b"\x07" for i in reversed(range(depth)))
        + b"\x90"
    )


def nested_arrays(depth: int) -> bytes:
    return b"\x91" * depth + b"\xc0"


def nested_maps(depth: int) -> bytes:
    return b"\x81\xa1k" * depth + b"\xc0"


def nested_mixed(depth: int) -> bytes:
    """Lists, maps, tuples and a reference, in turn, ``depth`` levels."""
    data = ext(4, struct.pack("<q", 1))
    for i in range(depth):
        kind = i % 3
        if kind == 0:
            data = b"\x92\x01" + data
        elif kind == 1:
            data = b"\x81\xa1k" + data
        else:
            data = ext(7, b"\x91" + data)
    return data


def huge_array() -> bytes:
    return b"\xdd\xff\xff\xff\xff\xc0"  # declares 2^32-1 values, holds one


def nested_huge_arrays(levels: int) -> bytes:
    """The issue's memory bomb, scaled down: arrays that each declare far more values
    than the message holds (msgpack allocated each one's slots up front)."""
    return b"\xdd\x00\xff\xff\xff" * levels + b"\x90"


def many_empty_arrays(n: int) -> bytes:
    """One empty list per byte: about 80 bytes of Python objects per byte received."""
    return b"\xdd" + n.to_bytes(4, "big") + b"\x90" * n


HUGE_SCALARS = {
    "str32": b"\xdb\xff\xff\xff\xff" + b"a" * 8,
    "bin32": b"\xc6\xff\xff\xff\xff" + b"a" * 8,
    "ext32": b"\xc9\xff\xff\xff\xff\x07" + b"a" * 8,
    "map32": b"\xdf\xff\xff\xff\xff\xa1k\xc0",
    "array32": huge_array(),
}


def tensor_ext(index: int, dtype: str, shape: list[int]) -> bytes:
    return ext(1, pack([index, dtype, shape]))


def op_message(arg: bytes) -> bytes:
    """``["op", "aten::abs.default", [arg], {}, [1], False]`` around a raw argument."""
    return array(pack("op"), pack("aten::abs.default"), array(arg), b"\x80", pack([1]), b"\xc2")


def store_message(value: bytes, obj_id: int = 5) -> bytes:
    return array(pack("store"), pack(obj_id), value, pack([]), pack(""))


def reply_message(value: bytes) -> bytes:
    return array(pack("reply"), value)


@functools.cache
def hostile_headers() -> dict[str, tuple[bytes, list[bytes]]]:
    """Name -> (header, buffers): each must end in a clean DecodeError."""
    cases: dict[str, tuple[bytes, list[bytes]]] = {
        "tuples-200": (op_message(nested_tuples(200)), []),
        "tuples-100000": (op_message(nested_tuples(100_000)), []),
        "exts-1000": (op_message(nested_exts(1000)), []),
        "arrays-100000": (op_message(nested_arrays(100_000)), []),
        "maps-1000": (op_message(nested_maps(1000)), []),
        "mixed-1000": (op_message(nested_mixed(1000)), []),
        "nested-huge-arrays": (op_message(nested_huge_arrays(20_000)), []),
        "empty-arrays-bomb": (op_message(many_empty_arrays(400_000)), []),
        "tensor-2^40-elements": (store_message(tensor_ext(0, "float32", [1 << 40])), [b"\0" * 8]),
        "tensor-overflowing-shape": (
            store_message(tensor_ext(0, "float32", [1 << 62, 1 << 62, 0])),
            [b""],
        ),
        "tensor-100-dims": (store_message(tensor_ext(0, "float32", [1] * 100)), [b"\0" * 4]),
        "tensor-buffer-twice": (
            array(pack("reply"), array(tensor_ext(0, "int64", [1]), tensor_ext(0, "int64", [1]))),
            [b"\0" * 8],
        ),
        "tensor-no-buffer": (store_message(tensor_ext(3, "float32", [1])), []),
    }
    for name, raw in HUGE_SCALARS.items():
        cases[f"huge-{name}"] = (op_message(raw), [])
    return cases


# ------------------------------------------------------------------ the decoder itself


@pytest.mark.parametrize("depth", [17, 50, 200, 1000, 100_000])
def test_deep_tuples_are_a_decode_error(depth):
    with pytest.raises(DecodeError, match="deeper than"):
        decode_message(op_message(nested_tuples(depth)), [])


@pytest.mark.parametrize(
    "build", [nested_exts, nested_arrays, nested_maps, nested_mixed], ids=lambda f: f.__name__
)
@pytest.mark.parametrize("depth", [65, 200, 1000])
def test_deep_values_of_every_kind_are_a_decode_error(build, depth):
    with pytest.raises(DecodeError, match="deeper than"):
        serde.decode(build(depth), [])


def test_nesting_within_the_limits_decodes():
    value = serde.decode(nested_tuples(serde.MAX_EXT_DEPTH), [])
    for _ in range(serde.MAX_EXT_DEPTH):
        assert isinstance(value, tuple) and len(value) == 1
        value = value[0]
    assert value == []
    assert serde.decode(nested_arrays(serde.MAX_DEPTH - 1), []) is not None
    assert serde.decode(nested_maps(serde.MAX_DEPTH - 1), []) is not None
    with pytest.raises(DecodeError, match=f"nests deeper than {serde.MAX_DEPTH}"):
        serde.decode(nested_arrays(serde.MAX_DEPTH + 1), [])
    # a long header (the exact scan) draws the same line as a short one
    padding = pack("x" * 4000)
    assert serde.decode(array(padding, nested_arrays(serde.MAX_DEPTH - 2)), [])
    with pytest.raises(DecodeError, match="nests deeper"):
        serde.decode(array(padding, nested_arrays(serde.MAX_DEPTH)), [])


@pytest.mark.parametrize("name", sorted(hostile_headers()))
def test_hostile_headers_are_decode_errors_within_bounded_memory(name):
    header, buffers = hostile_headers()[name]
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError):
            decode_message(header, buffers)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * len(header) + (4 << 20), f"{name}: {peak} bytes for {len(header)}"


def test_memory_stays_a_small_multiple_of_the_header():
    """The densest header the limits accept: one empty list per two bytes."""
    n = 1 << 18
    header = b"\xdd" + n.to_bytes(4, "big") + b"\x90\x00" * (n // 2)
    tracemalloc.start()
    try:
        value = serde.decode(header, [])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(value) == n
    assert peak < 48 * len(header), peak / len(header)
    del value
    with pytest.raises(DecodeError, match="too many objects"):  # one list per byte
        serde.decode(many_empty_arrays(n), [])


def test_header_size_limit():
    big = pack(["reply", "x" * serde.MAX_HEADER_BYTES])
    with pytest.raises(DecodeError, match="exceeds the limit"):
        serde.decode(big, [])
    with pytest.raises(TypeError, match="exceeds the limit"):
        serde.encode(["reply", "x" * serde.MAX_HEADER_BYTES])


def test_msgpack_bounds_declared_lengths_by_the_input_by_itself():
    """serde.decode relies on unpackb's own max_*_len (from len(packed)): a declared
    length past the bytes present fails before anything is allocated for it."""
    for raw in (b"\xdd\x00\x01\x00\x00" + b"\xc0" * 10, b"\xdf\x00\x00\x00\x08" + b"\xc0" * 10):
        with pytest.raises(ValueError, match="exceeds max_"):
            msgpack.unpackb(raw)
    tracemalloc.start()
    try:
        for raw in HUGE_SCALARS.values():
            with pytest.raises(ValueError):
                msgpack.unpackb(raw)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20


def test_tensor_sizes_are_checked_before_allocation():
    header, buffers = hostile_headers()["tensor-2^40-elements"]
    with pytest.raises(DecodeError, match="holds 8 bytes, header says 4398046511104"):
        decode_message(header, buffers)
    with pytest.raises(DecodeError, match="too large"):
        decode_message(*hostile_headers()["tensor-overflowing-shape"])
    with pytest.raises(DecodeError, match="malformed tensor shape"):
        decode_message(*hostile_headers()["tensor-100-dims"])
    with pytest.raises(DecodeError, match="used twice"):
        decode_message(*hostile_headers()["tensor-buffer-twice"])
    with pytest.raises(DecodeError, match="out of range"):
        decode_message(*hostile_headers()["tensor-no-buffer"])
    # in process the buffer is a tensor: its size must match too
    h = store_message(tensor_ext(0, "float32", [1 << 40]))
    with pytest.raises(DecodeError, match="does not match"):
        decode_message(h, [torch.zeros(2)])
    # an empty tensor of any (sane) shape needs no bytes
    msg = decode_message(reply_message(tensor_ext(0, "float32", [0, 1 << 30])), [b""])
    assert isinstance(msg, Reply) and msg.value.shape == (0, 1 << 30)


def test_booleans_from_the_wire_are_booleans():
    msg = decode_message(reply_message(tensor_ext(0, "bool", [3])), [b"\x00\x02\xff"])
    assert isinstance(msg, Reply)
    assert msg.value.view(torch.uint8).tolist() == [0, 1, 1]


def test_buffer_count_limit():
    too_many = [torch.zeros(1) for _ in range(serde.MAX_BUFFERS + 1)]
    with pytest.raises(TypeError, match="more than the 4096 allowed"):
        serde.encode(["reply", too_many])
    with pytest.raises(DecodeError, match="buffers, at most"):
        serde.decode(pack(["reply", None]), [b""] * (serde.MAX_BUFFERS + 1))
    h, b = serde.encode(["reply", too_many[: serde.MAX_BUFFERS]])
    assert len(serde.decode(h, b)[1]) == serde.MAX_BUFFERS


def test_encoder_refuses_what_the_decoder_refuses():
    deep: Any = None
    for _ in range(serde.MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(TypeError, match="nests deeper"):
        encode_message(Reply(deep))
    tup: Any = torch.zeros(1)
    for _ in range(serde.MAX_EXT_DEPTH * 4):
        tup = (tup, 1)
    with pytest.raises(TypeError, match="cannot be encoded"):
        serde.encode(["reply", tup])
    # right at the limits both sides agree
    ok: Any = None
    for _ in range(serde.MAX_DEPTH - 1):
        ok = [ok]
    h, b = serde.encode(ok)
    assert serde.decode(h, b) == ok
    ids = list(range(1 << 40, (1 << 40) + 50_000))
    h, b = encode_message(Reply(ids))
    assert decode_message(h, b).value == ids  # type: ignore[attr-defined]


def test_legitimate_messages_keep_within_the_limits():
    """What plans, programs and protocols send: far inside the limits."""
    metas = [[[3, 4], [4, 1], "float32"] for _ in range(20_000)]  # a large Describe reply
    h, b = encode_message(Reply(metas))
    assert decode_message(h, b).value == metas  # type: ignore[attr-defined]
    nodes = [["aten::add.Tensor", [Ref(i), Ref(i + 1)], {}] for i in range(5000)]
    h, b = serde.encode(["store_plan", 1, ["pointers.plans.plan", nodes]])
    assert serde.decode(h, b)[2][1] == nodes
    arg: Any = 1
    for _ in range(16):  # the deepest argument a plan accepts
        arg = [arg, (Ref(1), torch.ones(1))]
    h, b = serde.encode(["store_program", 1, [["op", "aten::add.Tensor", [arg], {}, [1], False]]])
    serde.decode(h, b)


def test_envelope_metadata_is_held_to_the_same_limits():
    for raw in (nested_arrays(1000), nested_huge_arrays(2000), many_empty_arrays(1 << 16)):
        meta = array(b"\x81\xa1k" + raw, b"\x90")
        data = b"PTW1" + len(meta).to_bytes(4, "big") + meta
        with pytest.raises(FrameError):
            decode_envelope(data)


_SUBPROCESS_DECODE = """
import sys, threading
sys.path.insert(0, {tests!r})
import test_wire_limits as t
from pointers.errors import DecodeError
from pointers.wire.messages import decode_message

def run_all(where):
    for name, (header, buffers) in t.hostile_headers().items():
        try:
            decode_message(header, buffers)
        except DecodeError:
            continue
        raise SystemExit(f"{{where}}: {{name}} decoded")

run_all("main thread")
for size in (0, 1 << 20):  # the default thread stack, and a small one
    threading.stack_size(size)
    th = threading.Thread(target=run_all, args=(f"thread with stack {{size}}",))
    th.start()
    th.join()
print("all refused")
"""


def test_no_header_crashes_the_decoder_in_a_fresh_process():
    """The cases that used to kill the process with SIGSEGV (a C stack overflow)."""
    r = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_DECODE.format(tests=str(TESTS))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "all refused" in r.stdout


# ------------------------------------------------- real worker processes (Exec, Deliver)


def _raw_call(cluster: Any, worker: str, identity: str, method: str) -> Any:
    channel = open_channel(
        cluster.address(worker),
        worker_id=worker,
        credentials=pt.network.load_credentials(cluster.certs, identity),
        max_message_bytes=64 << 20,
    )
    return channel, channel.unary_unary(method)


def _peak_rss(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _error_replies(resp: bytes) -> list[ErrorReply]:
    info, frames = decode_envelope(resp)
    assert "error" not in info, info
    out = [decode_message(h, b) for _, h, b in frames]
    assert all(isinstance(m, ErrorReply) for m in out), out
    return out  # type: ignore[return-value]


def _still_serves(cluster: Any, worker: str) -> None:
    assert cluster.servers[worker].alive(), cluster.servers[worker].output()[-2000:]
    w = cluster.fresh(worker)
    assert torch.equal((pt.send(torch.ones(3), w) * 2).get(), torch.full((3,), 2.0))


@pytest.mark.network
def test_a_client_cannot_crash_or_exhaust_a_worker_through_exec(network_cluster):
    cluster = network_cluster
    pid = cluster.servers["carol"].proc.pid
    before = _peak_rss(pid)
    channel, call = _raw_call(cluster, "carol", "client", EXEC)
    try:
        for name, (header, buffers) in hostile_headers().items():
            resp = call(encode_envelope({}, [(SYNC, header, buffers)]), timeout=60)
            (err,) = _error_replies(resp)
            assert err.kind == "DecodeError", (name, err)
        # all of them in one envelope: each answered, in order
        frames = [(SYNC, h, b) for h, b in hostile_headers().values()]
        resp = call(encode_envelope({}, frames), timeout=120)
        assert len(_error_replies(resp)) == len(frames)
        # a hostile envelope (its metadata) is refused as a whole
        for raw in (nested_arrays(100_000), nested_huge_arrays(20_000)):
            meta = array(array(b"\x81\xa1k" + raw), b"\x90")
            resp = call(b"PTW1" + len(meta).to_bytes(4, "big") + meta, timeout=60)
            info, _ = decode_envelope(resp)
            assert info["error"][0] == "FrameError"
    finally:
        channel.close()
    after = _peak_rss(pid)
    if before is not None and after is not None:  # the old decoder: gigabytes
        assert after - before < 256 << 20, (before, after)
    _still_serves(cluster, "carol")
    cluster.close_connections()


@pytest.mark.network
def test_a_peer_cannot_crash_a_worker_through_deliver(network_cluster):
    cluster = network_cluster
    bob = cluster.fresh("bob")
    bob.request(AcceptPeer("alice"))  # deliveries from alice may land in client's namespace
    channel, call = _raw_call(cluster, "bob", "alice", DELIVER)
    # (the client's namespace at bob is its session's: pointers.network.lease)
    info = {"client": "client", "from": "alice", "session": session_of(DEFAULT_CONTEXT)}
    try:
        for name, (header, buffers) in hostile_headers().items():
            resp = call(encode_envelope(info, [(0, header, buffers)]), timeout=60)
            (err,) = _error_replies(resp)
            assert err.kind == "DecodeError", (name, err)
    finally:
        channel.close()
    _still_serves(cluster, "bob")
    alice, bob = cluster.fresh("alice"), cluster.fresh("bob")  # and peers still deliver
    assert torch.equal(pt.send(torch.arange(3), alice).move(bob).get(), torch.arange(3))
    cluster.close_connections()


# ------------------------------------------------ a malicious worker's replies to a client


Answer = Callable[[list[Any]], bytes]  # the request's frames -> the reply envelope


class FakeWorker:
    """A gRPC server on loopback (insecure) that says hello as worker ``alice`` and
    answers each Exec with ``answer(frames)``."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handlers = {
            "Exec": grpc.unary_unary_rpc_method_handler(self._exec),
            "Inspect": grpc.unary_unary_rpc_method_handler(self._inspect),
        }
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, handlers),)
        )
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.server.start()

    def _inspect(self, request: bytes, context: Any) -> bytes:
        return encode_envelope({"worker": "alice", "epoch": "e"}, [])

    def _exec(self, request: bytes, context: Any) -> bytes:
        _, frames = decode_envelope(request)
        return self.answer(frames)

    def connect(self) -> pt.NetworkWorker:
        return pt.connect(
            "alice", f"127.0.0.1:{self.port}", insecure=True, timeout=20, context=ClientContext()
        )

    def stop(self) -> None:
        self.server.stop(None)


def _answer_sync_frames(header: bytes, buffers: list[bytes] = ()) -> Answer:  # type: ignore[assignment]
    def answer(frames: list[Any]) -> bytes:
        replies = [(k, header, list(buffers)) for k, (tag, _, _) in enumerate(frames) if tag & SYNC]
        return encode_envelope({}, replies)

    return answer


def _deep_error_header() -> bytes:
    return array(pack("error"), pack("RuntimeError"), nested_tuples(100_000))


MALICIOUS_ANSWERS: dict[str, tuple[Answer, str]] = {
    "deep-reply": (
        _answer_sync_frames(array(pack("reply"), nested_tuples(100_000))),
        "deeper than",
    ),
    "deep-arrays": (_answer_sync_frames(array(pack("reply"), nested_arrays(100_000))), "deeper"),
    "deep-error": (_answer_sync_frames(_deep_error_header()), "deeper than"),
    "bomb": (
        _answer_sync_frames(array(pack("reply"), many_empty_arrays(1 << 20))),
        "objects|reply header of",  # (refused by its size before decoding, since issue 28)
    ),
    "huge-tensor": (
        _answer_sync_frames(array(pack("reply"), tensor_ext(0, "int64", [1 << 40])), [b"\0" * 8]),
        "header says",
    ),
    "left-out": (lambda frames: encode_envelope({}, []), "left out the answer"),
    "out-of-range": (
        lambda frames: encode_envelope({}, [(len(frames) + 5, encode_message(Reply(1))[0], [])]),
        "out of range",
    ),
    "twice": (
        lambda frames: encode_envelope({}, [(0, encode_message(Reply(1))[0], [])] * 2),
        "out of range or twice",
    ),
    "not-a-reply": (
        _answer_sync_frames(encode_message(Fetch(1, True))[0]),
        "'fetch' message answers a request",
    ),
    "error-not-an-error": (
        _answer_sync_frames(array(pack("error"), pack("x"), pack("y"), pack("z"))),
        "malformed reply",
    ),
    "bad-error-field": (lambda frames: encode_envelope({"error": [1]}, []), "error field"),
    "deep-envelope": (
        lambda frames: (
            b"PTW1"
            + len(m := array(b"\x81\xa1k" + nested_arrays(100_000), b"\x90")).to_bytes(4, "big")
            + m
        ),
        "malformed reply",
    ),
}


@pytest.mark.network
@pytest.mark.parametrize("case", sorted(MALICIOUS_ANSWERS))
def test_a_malicious_workers_reply_raises_at_the_client(case):
    answer, match = MALICIOUS_ANSWERS[case]
    fake = FakeWorker(answer)
    try:
        w = fake.connect()
        p = pt.send(torch.ones(2), w)
        with pytest.raises(DecodeError, match=match) as raised:
            p.get()
        assert "worker 'alice'" in str(raised.value) and "malformed reply" in str(raised.value)
        with pytest.raises(DecodeError):  # and again: the client goes on
            w.request(Fetch(p.id_at_location, False))
        w.close()
    finally:
        fake.stop()


@pytest.mark.network
def test_a_real_worker_answers_every_request(network_cluster):
    """The other side of the rule above: a request that returns nothing is answered."""
    cluster = network_cluster
    channel, call = _raw_call(cluster, "dave", "client", EXEC)
    try:
        accept = encode_message(AcceptPeer("erin"))
        resp = call(encode_envelope({}, [(0, *accept), (SYNC, *accept)]), timeout=30)
        _, frames = decode_envelope(resp)
        assert [k for k, _, _ in frames] == [1]  # the request, not the post
        assert decode_message(frames[0][1], frames[0][2]) == Reply(None)
    finally:
        channel.close()


_SUBPROCESS_CLIENT = """
import sys
sys.path.insert(0, {tests!r})
import torch
import test_wire_limits as t
import pointers as pt
from pointers.errors import DecodeError

for case in ("deep-reply", "deep-error", "deep-arrays"):
    fake = t.FakeWorker(t.MALICIOUS_ANSWERS[case][0])
    w = fake.connect()
    try:
        pt.send(torch.ones(2), w).get()
    except DecodeError as e:
        print(case, "raised", str(e)[:80])
    else:
        raise SystemExit(f"{{case}}: no error")
    w.close()
    fake.stop()
print("client alive")
"""


@pytest.mark.network
def test_a_deeply_nested_reply_cannot_crash_the_client():
    r = subprocess.run(
        [sys.executable, "-c", _SUBPROCESS_CLIENT.format(tests=str(TESTS))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"},
    )
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    assert "client alive" in r.stdout
