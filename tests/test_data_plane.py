"""The data plane (issue 24): bulk peer deliveries over persistent mutual-TLS sockets, on
by default (``serve --no-data-plane`` / ``POINTERS_DATA_PLANE=0`` turn it off).

Results equal the gRPC path's; a client certificate, or a party posing as another, gets
no frame stored; a malformed or oversized header is refused before anything is allocated;
a frame cut off is never stored and its sender hears of it within the fault bound.
"""

from __future__ import annotations

import random
import socket
import ssl
import threading
import time

import msgpack
import pytest
import torch

import mpc
import pointers as pt
from pointers.errors import DecodeError, LimitExceeded, PartyUnavailable
from pointers.network import ServerConfig, WorkerServer, create_certs
from pointers.network.certs import load_credentials, party_name
from pointers.network.config import plugin_functions
from pointers.network.dataplane import (
    ACK,
    ANSWER_TIMEOUT,
    MAGIC,
    PREFIX,
    THRESHOLD,
    DataLink,
    decode_frame_header,
    encode_frame_header,
)
from pointers.network.framing import FrameError, encode_envelope
from pointers.wire.messages import Store, encode_message

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice", "bob", "carol"], clients=["client"])
    return d


@pytest.fixture
def served(certs):
    started: list[WorkerServer] = []
    conns: list[pt.NetworkWorker] = []

    def start(worker_id: str, functions=None, **config):
        config.setdefault("data_plane", True)
        s = WorkerServer(
            ServerConfig(worker_id, certs=str(certs), threads=16, **config),
            {} if functions is None else functions,
        )
        s.start()
        started.append(s)
        w = pt.connect(s.id, s.address, certs=certs, identity="client")
        conns.append(w)
        return s, w

    yield start
    for w in conns:
        w.close()
    for s in started:
        s.stop(grace=None)


def _mpc_results(served, data_plane: bool):
    fns = plugin_functions()
    servers, workers = zip(
        *(served(w, fns, data_plane=data_plane) for w in ("alice", "bob", "carol")),
        strict=True,
    )
    alice, bob, carol = workers
    g = torch.Generator().manual_seed(5)
    x = torch.randn(20_000, generator=g)
    y = torch.randn(20_000, generator=g)
    a = mpc.share(x, alice, bob, crypto_provider=carol)
    b = mpc.share(y, alice, bob, crypto_provider=carol)
    out = [(a * b).get(), (a + b).get(), (a > b).get()]
    frames = sum(s.data_plane.frames for s in servers if s.data_plane is not None)
    for w in workers:
        w.close()
    for s in servers:
        s.stop(grace=None)
    return out, frames, x, y


def test_protocol_results_equal_the_grpc_paths(served):
    on, frames, x, y = _mpc_results(served, True)
    off, none, _, _ = _mpc_results(served, False)
    assert frames > 0 and none == 0  # the shares and the openings took the data plane
    for got, want in zip(on, off, strict=True):
        assert torch.equal(got, want)
    assert torch.allclose(on[0], x * y, atol=1e-3)


def test_a_copy_over_the_data_plane_is_the_value_when_posted(served):
    sa, alice = served("alice")
    sb, bob = served("bob")
    t = torch.arange(100_000, dtype=torch.int64)
    x = pt.send(t, alice)
    c = x.copy_to(bob)
    x.add_(1)  # a later write does not travel
    assert torch.equal(c.get(), t)
    flags = pt.send(torch.rand(THRESHOLD * 2) > 0.5, alice)
    assert torch.equal(flags.copy_to(bob).get(), flags.get())
    assert sb.data_plane.frames == 2
    small = pt.send(torch.ones(4), alice)  # under the threshold: gRPC
    assert torch.equal(small.copy_to(bob).get(), torch.ones(4))
    assert sb.data_plane.frames == 2


def test_a_refused_delivery_is_reported_to_both_sides(served):
    _, alice = served("alice")
    sb, bob = served("bob", max_stored_bytes=256 * 1024, deadline=30.0)
    big = pt.send(torch.ones(100_000), alice)  # 800 kB: over bob's limit (refused unread)
    start = time.monotonic()
    with pytest.raises(pt.PointerError, match="limit"):
        big.move(bob).get()
    assert time.monotonic() - start < 10
    with pytest.raises(pt.RemoteError, match="could not deliver object .* to its peer 'bob'"):
        alice.sync()
    ok = pt.send(torch.ones(20_000), alice)  # the connection is still good
    assert torch.equal(ok.copy_to(bob).get(), torch.ones(20_000))
    assert sb.data_plane.frames == 1


# -- raw connections to a data port -----------------------------------------------------


def _dial(certs, server: WorkerServer, identity: str):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.load_verify_locations(str(certs / "ca.pem"))
    ctx.load_cert_chain(str(certs / f"{identity}.pem"), str(certs / f"{identity}.key"))
    raw = socket.create_connection(("127.0.0.1", server.data_plane.port), timeout=10)
    return ctx.wrap_socket(raw, server_hostname=party_name(server.id))


def _frame(client, source, session, obj_id, t, sealed=False):
    header, _ = encode_message(Store(obj_id, t, [], "", sealed))
    info = {"client": client, "from": source, "session": session}
    return encode_frame_header(info, obj_id, header, t), memoryview(t.numpy()).cast("B")


def _read_ack(sock):
    data = b""
    while len(data) < ACK.size:
        k = sock.recv(ACK.size - len(data))
        if not k:
            return "closed"
        data += k
    (n,) = ACK.unpack(data)
    body = b""
    while len(body) < n:
        body += sock.recv(n - len(body))
    return msgpack.unpackb(body)


def _closed(sock) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionError, ssl.SSLError):
        return True


@pytest.fixture
def pair(served):
    """alice and bob with data planes; bob's session accepts alice (one delivery made)."""
    sa, alice = served("alice")
    sb, bob = served("bob")
    x = pt.send(torch.ones(THRESHOLD), alice)
    assert torch.equal(x.copy_to(bob).get(), torch.ones(THRESHOLD))
    ((client, session),) = sb.sessions()
    return sb, bob, client, session


def test_a_client_certificate_cannot_open_a_data_connection(pair, certs):
    sb, bob, client, session = pair
    before = sb.data_plane.frames
    sock = _dial(certs, sb, "client")  # CA-signed: TLS completes, then the worker closes
    head, body = _frame(client, "client", session, 10**6, torch.ones(THRESHOLD))
    try:
        sock.sendall(head)
        sock.sendall(body)
    except OSError:
        pass
    assert _read_ack(sock) == "closed"
    assert sb.data_plane.frames == before


def test_a_party_cannot_deliver_as_another(pair, certs):
    sb, bob, client, session = pair
    sock = _dial(certs, sb, "carol")
    head, body = _frame(client, "alice", session, 10**6, torch.ones(THRESHOLD))
    sock.sendall(head)
    sock.sendall(body)
    kind, message = _read_ack(sock)
    assert kind == "NotAllowedError" and "cannot deliver as 'alice'" in message
    head, body = _frame(client, "carol", session, 10**6, torch.ones(THRESHOLD))
    sock.sendall(head)
    sock.sendall(body)
    kind, message = _read_ack(sock)  # carol was never accepted by this session
    assert kind == "NotAllowedError" and "accept" in message
    sock.close()


def test_the_dialing_side_requires_the_named_peers_certificate(pair, certs):
    sb, *_ = pair
    address = f"127.0.0.1:{sb.data_plane.port}"  # bob's data port
    kw = dict(credentials=load_credentials(certs, "alice"), cert_dir=str(certs), owner="alice")
    with pytest.raises(PartyUnavailable, match="will not deliver to 'carol'"):
        DataLink.connect(address, "carol", timeout=5, **kw)
    DataLink.connect(address, "bob", timeout=5, **kw).close()


def test_an_undeclared_id_is_held_not_stored_and_counts(pair, certs):
    sb, bob, client, session = pair
    ns = sb._namespaces[(client, session)]
    used = ns.store.used()
    sock = _dial(certs, sb, "alice")
    head, body = _frame(client, "alice", session, 10**6, torch.ones(THRESHOLD))
    sock.sendall(head)
    sock.sendall(body)
    assert _read_ack(sock) is None  # held until the client announces it: no error yet
    assert 10**6 not in ns.store._entries
    assert ns.store.used() - used >= 4 * THRESHOLD  # (held, and counted)
    sock.close()


@pytest.mark.parametrize(
    "what",
    ["oversized body", "huge header", "bad magic", "shape mismatch", "garbage header"],
)
def test_a_bad_header_is_refused_before_allocation(pair, certs, monkeypatch, what):
    sb, bob, client, session = pair
    allocated: list[int] = []
    real_empty = torch.empty

    def spy(*a, **k):
        allocated.append(1)
        return real_empty(*a, **k)

    sock = _dial(certs, sb, "alice")
    t = torch.ones(THRESHOLD)
    head, _ = _frame(client, "alice", session, 10**6, t)
    hdr = msgpack.unpackb(head[PREFIX.size :])
    if what == "oversized body":
        hdr["shape"], hdr["nbytes"] = [1 << 37], 4 << 37  # 512 GiB
        data = msgpack.packb(hdr, use_bin_type=True)
        data = PREFIX.pack(MAGIC, len(data)) + data
    elif what == "huge header":
        data = PREFIX.pack(MAGIC, 1 << 30)
    elif what == "bad magic":
        data = PREFIX.pack(b"XXXX", 10) + b"0" * 10
    elif what == "shape mismatch":
        hdr["nbytes"] += 8
        data = msgpack.packb(hdr, use_bin_type=True)
        data = PREFIX.pack(MAGIC, len(data)) + data
    else:
        data = PREFIX.pack(MAGIC, 64) + bytes(range(64))
    monkeypatch.setattr(torch, "empty", spy)
    sock.sendall(data)
    assert _closed(sock)
    assert not allocated
    assert sb.data_plane.frames == 1


def test_a_frame_cut_mid_way_is_never_stored(pair, certs):
    sb, bob, client, session = pair
    ns = sb._namespaces[(client, session)]
    used = ns.store.used()
    sock = _dial(certs, sb, "alice")
    head, body = _frame(client, "alice", session, 10**6, torch.ones(1 << 20))
    sock.sendall(head)
    sock.sendall(body[: len(body) // 2])
    sock.close()
    time.sleep(0.5)
    assert 10**6 not in ns.store._entries
    assert sb.data_plane.frames == 1
    assert ns.store.used() - used < 4096  # (a failure notice at most, no tensor)


# -- the sending side's failures, within the fault bound --------------------------------


def _fake_peer(certs, behaviour):
    """A TLS server with bob's party certificate that reads frames and ``behaviour``s."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(str(certs / "ca.pem"))
    ctx.load_cert_chain(str(certs / "bob.pem"), str(certs / "bob.key"))
    ls = socket.create_server(("127.0.0.1", 0))

    def run():
        raw, _ = ls.accept()
        with ctx.wrap_socket(raw, server_side=True) as s:
            behaviour(s)

    threading.Thread(target=run, daemon=True).start()
    return ls, f"127.0.0.1:{ls.getsockname()[1]}"


def _send_one(certs, address):
    link = DataLink.connect(
        address,
        "bob",
        credentials=load_credentials(certs, "alice"),
        cert_dir=str(certs),
        owner="alice",
        timeout=5,
    )
    answers: list[str | None] = []
    got = threading.Event()

    def done(why):
        answers.append(why)
        got.set()

    head, body = _frame("client", "alice", "", 7, torch.ones(1 << 20))
    start = time.monotonic()
    link.send(head, body, done)
    assert got.wait(ANSWER_TIMEOUT + 5)
    return answers[0], time.monotonic() - start, link


def test_a_connection_cut_mid_frame_fails_the_delivery_at_once(certs):
    ls, address = _fake_peer(certs, lambda s: s.recv(1000))  # reads a little, closes
    why, took, link = _send_one(certs, address)
    assert why.startswith("PartyUnavailable") and "bob" in why
    assert took < 3 and link.broken is not None
    ls.close()


def test_a_peer_that_never_answers_fails_the_delivery_within_the_bound(certs):
    stop = threading.Event()

    def swallow(s):
        while not stop.is_set():
            try:
                if not s.recv(1 << 20):
                    return
            except OSError:
                return

    ls, address = _fake_peer(certs, swallow)
    why, took, link = _send_one(certs, address)
    assert why.startswith("PartyUnavailable") and "no answer" in why
    assert ANSWER_TIMEOUT <= took < 10
    stop.set()
    ls.close()


def test_a_data_port_that_hangs_holds_up_no_other_delivery_and_is_tried_less_often(
    served, monkeypatch
):
    """Opening a data link runs without the server's lock: while one to bob hangs (a port a
    firewall drops), bob's other deliveries go over gRPC and carol's link is opened at
    once. Failures in a row wait 5, 10, 20 s ... (over gRPC) before the next try."""
    from pointers.network import peers

    s, _ = served("alice")
    clock = [1000.0]

    class Clock:  # peers' own clock only: the server's other threads keep the real one
        monotonic = staticmethod(lambda: clock[0])

        def __getattr__(self, name):
            return getattr(time, name)

    monkeypatch.setattr(peers, "time", Clock())

    class Ask:
        def blocking(self, data, timeout, metadata=None):
            return encode_envelope({"data_port": 9}, [])

    monkeypatch.setattr(s, "peer_call", lambda peer, address: Ask())
    hang, tries = threading.Event(), []

    def connect(cls, address, peer, **kw):
        tries.append(peer)
        if peer == "bob" and len(tries) == 1:
            assert hang.wait(10)
        raise OSError("no answer")

    monkeypatch.setattr(DataLink, "connect", classmethod(connect))
    first = threading.Thread(target=lambda: s.data_link("bob", "127.0.0.1:1"))
    first.start()
    while not tries:
        time.sleep(0.01)
    assert s.data_link("bob", "127.0.0.1:1") is None  # meanwhile: over gRPC, no second try
    assert s.data_link("carol", "127.0.0.1:2") is None and tries == ["bob", "carol"]
    hang.set()
    first.join(5)
    assert not first.is_alive()
    for wait in (5, 10, 20, 40):
        n = len(tries)
        clock[0] += wait - 0.5
        assert s.data_link("bob", "127.0.0.1:1") is None and len(tries) == n
        clock[0] += 1
        assert s.data_link("bob", "127.0.0.1:1") is None and len(tries) == n + 1


# -- the header decoder -------------------------------------------------------------------


def test_the_header_decoder_takes_only_what_it_checked():
    t = torch.ones(THRESHOLD)
    head, _ = _frame("client", "alice", "", 3, t, sealed=["mask", 1])
    frame = decode_frame_header(head[PREFIX.size :], 1 << 30)
    assert (frame.obj_id, frame.shape, frame.nbytes) == (3, [THRESHOLD], 4 * THRESHOLD)
    with pytest.raises(LimitExceeded):
        decode_frame_header(head[PREFIX.size :], 1024)
    rng = random.Random(24)
    base = bytearray(head[PREFIX.size :])
    for i in range(3000):
        data = bytearray(base)
        if i % 3 == 0:
            data = bytearray(rng.randbytes(rng.randrange(0, 200)))
        else:
            for _ in range(rng.randrange(1, 6)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            if i % 3 == 2:
                data = data[: rng.randrange(len(data) + 1)]
        try:
            f = decode_frame_header(bytes(data), 1 << 24)
        except (FrameError, DecodeError, LimitExceeded):
            continue
        numel = 1
        for s in f.shape:
            numel *= s
        assert numel * f.dtype.itemsize == f.nbytes <= 1 << 24


# -- on by default, with an opt-out ---------------------------------------------------------


def test_the_data_plane_is_on_by_default_and_can_be_turned_off(monkeypatch):
    from pointers.__main__ import _parser
    from pointers.network.config import DATA_PLANE_ENV

    monkeypatch.delenv(DATA_PLANE_ENV, raising=False)
    assert ServerConfig("alice", insecure=True).data_plane
    monkeypatch.setenv(DATA_PLANE_ENV, "0")
    assert not ServerConfig("alice", insecure=True).data_plane
    assert ServerConfig("alice", insecure=True, data_plane=True).data_plane
    monkeypatch.setenv(DATA_PLANE_ENV, "1")
    assert ServerConfig("alice", insecure=True).data_plane
    serve = ["serve", "--id", "alice", "--insecure"]
    assert _parser().parse_args(serve).data_plane is None  # ServerConfig's default decides
    assert _parser().parse_args([*serve, "--data-plane"]).data_plane is True
    assert _parser().parse_args([*serve, "--no-data-plane"]).data_plane is False
