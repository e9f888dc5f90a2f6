"""Who a worker delivers to, and whose deliveries it takes (issue 27: the rogue peer,
and a party filling a slot promised for another party), on served workers on loopback,
attacked as a client that does not follow the protocol.

The peer rule: a worker delivers only to a server that presents the party certificate
(subjectAltName URI ``role:party``) of the peer the client named, checked after a TLS
handshake of its own before any channel is opened; no object and no session token reach
anything else. The delivery rule: an object the client announced from one peer is taken
from that peer only, held or not, and a delivery that is refused is reported to the
client at its next sync.
"""

from __future__ import annotations

import datetime
import socket
import ssl
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

import pointers as pt
from pointers.network import ServerConfig, WorkerServer
from pointers.network.certs import certificate_role, create_certs, load_credentials, party_name
from pointers.network.context import DEFAULT_CONTEXT
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.lease import session_of
from pointers.network.transport import DELIVER, open_channel
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ErrorReply,
    RunProgram,
    SendToPeer,
    Store,
    StoreProgram,
    decode_message,
    encode_message,
)

pytestmark = pytest.mark.network


def _legacy_cert(certs: Path, identity: str, role: str) -> None:
    """A certificate as `python -m pointers certs` issued them before issue 27: both
    extended key usages (serverAuth and clientAuth) whatever the role, no role-bound
    party name."""
    ca = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    san = [
        x509.DNSName(identity),
        x509.UniformResourceIdentifier(f"role:{role}"),
        x509.DNSName("localhost"),
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity)]))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    (certs / f"{identity}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (certs / f"{identity}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice", "bob", "eve"], clients=["client", "mallory"])
    _legacy_cert(d, "oldclient", "client")  # a client certificate that can still serve
    _legacy_cert(d, "oldparty", "party")
    return d


@pytest.fixture
def served(certs):
    started: list[WorkerServer] = []
    conns: list[pt.NetworkWorker] = []

    def start(worker_id: str, **config: Any) -> WorkerServer:
        s = WorkerServer(ServerConfig(worker_id, certs=str(certs), threads=8, **config), {})
        s.start()
        started.append(s)
        return s

    def connect(server: WorkerServer, identity: str = "client", **kw: Any) -> pt.NetworkWorker:
        w = pt.connect(server.id, server.address, certs=certs, identity=identity, **kw)
        conns.append(w)
        return w

    yield start, connect
    for w in conns:
        w.close()
    for s in started:
        s.stop(grace=None)


class FakeServer:
    """A TLS server on loopback that presents ``identity``'s certificate (whatever its
    role) and records every byte it receives after a handshake: what a client that
    holds a CA certificate can stand up at an address it controls."""

    def __init__(self, certs: Path, identity: str) -> None:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(str(certs / f"{identity}.pem"), str(certs / f"{identity}.key"))
        ctx.load_verify_locations(str(certs / "ca.pem"))
        ctx.verify_mode = ssl.CERT_OPTIONAL
        ctx.set_alpn_protocols(["h2"])
        self._ctx = ctx
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.address = f"127.0.0.1:{self._sock.getsockname()[1]}"
        self.connections = 0  # TCP connections accepted
        self.handshakes = 0  # TLS handshakes completed (on the server's side)
        self.received = b""  # application bytes after a handshake
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                continue
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(3.0)
        try:
            with self._ctx.wrap_socket(conn, server_side=True) as tls:
                self.handshakes += 1
                while True:
                    data = tls.recv(65536)
                    if not data:
                        return
                    self.received += data
        except (OSError, ssl.SSLError):
            return

    def close(self) -> None:
        self._stop.set()
        self._sock.close()
        self._thread.join(2)


@pytest.fixture
def fake(certs):
    made: list[FakeServer] = []

    def make(identity: str) -> FakeServer:
        f = FakeServer(certs, identity)
        made.append(f)
        return f

    yield make
    for f in made:
        f.close()


def test_certificates_carry_the_key_usages_of_their_role(certs):
    def usages(name: str) -> tuple[set[Any], list[str]]:
        cert = x509.load_pem_x509_certificate((certs / f"{name}.pem").read_bytes())
        eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return set(eku), san.get_values_for_type(x509.DNSName)

    eku, dns = usages("client")
    assert eku == {ExtendedKeyUsageOID.CLIENT_AUTH}  # a client certificate cannot serve
    assert not any(d.endswith(".invalid") for d in dns)
    eku, dns = usages("alice")
    assert eku == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert party_name("alice") in dns and party_name("bob") not in dns
    assert certificate_role((certs / "alice.pem").read_bytes()) == ("alice", "party")
    with pytest.raises(ValueError, match="may not end with"):
        create_certs(certs, ["zed"], hosts=["bob.party.pointers.invalid"])


def _attack(alice: pt.NetworkWorker, peer: str, address: str) -> None:
    """As the issue's attacker: name a peer at an address the client controls, and
    have the worker deliver an object there."""
    p = pt.send(torch.arange(4.0), alice)
    alice.post(ConnectPeer(peer, address))
    alice.post(SendToPeer(p.id_at_location, peer, 1_000_001, False))
    alice.sync()


@pytest.mark.parametrize(
    ("presents", "named"),
    [
        ("mallory", "mallory"),  # a client certificate (clientAuth only) as the server
        ("oldclient", "oldclient"),  # a client certificate issued before, serverAuth too
        ("eve", "bob"),  # another party's certificate
        ("eve", "localhost"),  # a name every certificate is valid for
    ],
)
def test_a_worker_delivers_nothing_to_a_rogue_peer(served, fake, presents, named):
    start, connect = served
    a_srv = start("alice")
    rogue = fake(presents)
    alice = connect(a_srv, identity="mallory")
    with pytest.raises(pt.PointerError) as refused:
        _attack(alice, named, rogue.address)
    # the worker made a TLS handshake of its own to read the certificate, and sent
    # nothing after it: no HTTP/2 preface, no session token, no object
    assert rogue.connections >= 1
    assert rogue.received == b""
    assert "party certificate" in str(refused.value)
    with pytest.raises(pt.PointerError, match="party certificate"):  # (and again)
        _attack(alice, named, rogue.address)
    assert rogue.received == b""


def test_a_configured_peer_is_checked_too(served, fake):
    start, connect = served
    rogue = fake("eve")
    b_srv = start("bob")
    a_srv = start("alice", peers=(("bob", rogue.address),))
    alice = connect(a_srv)
    with pytest.raises(pt.PointerError) as refused:
        _attack(alice, "bob", b_srv.address)  # (the configured address wins)
    assert rogue.received == b""
    assert "party certificate of 'eve', not of 'bob'" in str(refused.value)


def test_parties_still_deliver_with_and_without_peer_lists(served):
    start, connect = served
    b_srv = start("bob")
    for config in ({}, {"peers": (("bob", b_srv.address),)}):
        a_srv = start("alice", **config)
        alice, bob = connect(a_srv), connect(b_srv)
        assert torch.equal(pt.send(torch.ones(3), alice).move(bob).get(), torch.ones(3))


def test_a_legacy_party_certificate_is_refused_with_how_to_reissue(certs):
    with pytest.raises(ValueError, match="issue it again with `python -m pointers certs"):
        WorkerServer(ServerConfig("oldparty", certs=str(certs)), {})


def test_a_client_does_not_take_a_client_certificate_for_a_worker(certs, fake):
    rogue = fake("oldclient")  # (serverAuth, but no party certificate of 'alice')
    with pytest.raises(pt.PointerError):
        pt.connect("alice", rogue.address, certs=certs, identity="client", timeout=5)
    assert rogue.received == b""


def test_the_session_limit_does_not_tell_how_many_sessions_are_open(served):
    from pointers.network.context import ClientContext

    start, connect = served
    srv = start("alice", max_sessions=3)
    for _ in range(3):
        pt.send(torch.ones(1), connect(srv, context=ClientContext())).get()
    extra = connect(srv, context=ClientContext())
    with pytest.raises(pt.LimitExceeded) as limit:
        pt.send(torch.ones(1), extra).get()
    message = str(limit.value)
    assert "limit of open sessions" in message and "--max-sessions" in message
    assert "3" not in message.replace(srv.address, "")  # neither the count nor the limit


def test_a_party_certificate_connecting_as_a_client_is_told_how_to_make_one(served):
    start, connect = served
    srv = start("alice")
    as_bob = connect(srv, identity="bob")  # a party's certificate, used to run commands
    with pytest.raises(pt.RemoteError) as refused:
        pt.send(torch.ones(1), as_bob).get()
    assert "python -m pointers certs DIR --client NAME" in str(refused.value)


# -- a party fills a slot promised for another party (issue 27, finding 7) -------------


def _deliver_as(certs: Path, party: str, server: WorkerServer, obj_id: int, value: Any) -> Any:
    """``party`` delivers ``value`` into ``obj_id`` of the default client session at
    ``server``, with its own certificate and the session token it sees in every
    delivery: what a party that does not follow the protocol can send."""
    channel = open_channel(
        server.address,
        worker_id=server.id,
        credentials=load_credentials(certs, party),
        max_message_bytes=1 << 20,
    )
    to = {"client": "client", "from": party, "session": session_of(DEFAULT_CONTEXT)}
    try:
        store = encode_message(Store(obj_id, value, [], ""))
        resp = channel.unary_unary(DELIVER)(encode_envelope(to, [(0, *store)]), timeout=10)
    finally:
        channel.close()
    _, out = decode_envelope(resp)
    return decode_message(out[0][1], out[0][2])


@pytest.fixture
def victim(served):
    """bob, serving a client session that accepts deliveries from alice and eve."""
    start, connect = served
    b_srv = start("bob")
    bob = connect(b_srv)
    bob.request(AcceptPeer("alice"))
    bob.request(AcceptPeer("eve"))
    return b_srv, bob


def test_a_held_delivery_is_taken_only_from_the_announced_peer(victim, certs):
    b_srv, bob = victim
    slot = bob.new_id()
    forged = _deliver_as(certs, "eve", b_srv, slot, torch.zeros(3))  # before the client
    assert not isinstance(forged, ErrorReply)  # held: its announcement may still come
    bob.expect_delivery("alice", slot)  # the client names alice for it
    real = _deliver_as(certs, "alice", b_srv, slot, torch.ones(3))
    assert not isinstance(real, ErrorReply)
    with pytest.raises(pt.PointerError) as reported:
        bob.sync()  # eve's delivery was refused, and the client hears of it
    assert f"refused a delivery of object {slot} from peer 'eve'" in str(reported.value)
    assert torch.equal(bob.objects[slot], torch.ones(3))  # alice's, not eve's
    late = _deliver_as(certs, "eve", b_srv, slot, torch.zeros(3))  # after: refused too
    assert isinstance(late, ErrorReply)
    with pytest.raises(pt.PointerError, match=f"object {slot} from peer 'eve'"):
        bob.sync()
    bob.sync()  # (each refusal is reported once)


def test_a_refused_delivery_into_a_promised_slot_is_reported(victim, certs):
    """The issue's attack: eve fills an id bob's program promised, whose delivery is
    alice's; the real delivery is then refused, and the client is told (it was not)."""
    b_srv, bob = victim
    slot, program = bob.new_id(), bob.new_id()
    forged = _deliver_as(certs, "eve", b_srv, slot, torch.zeros(3))
    assert not isinstance(forged, ErrorReply)
    bob.post(StoreProgram(program, []))
    bob.post(RunProgram(program, [], [slot]))  # the program promises the slot
    bob.sync()
    real = _deliver_as(certs, "alice", b_srv, slot, torch.ones(3))
    assert isinstance(real, ErrorReply)
    with pytest.raises(pt.PointerError) as reported:
        bob.sync()
    assert f"refused a delivery of object {slot} from peer 'alice'" in str(reported.value)


def test_a_promised_slot_delivered_by_two_peers_takes_neither(victim, certs):
    b_srv, bob = victim
    slot, program = bob.new_id(), bob.new_id()
    for party, value in (("eve", torch.zeros(3)), ("alice", torch.ones(3))):
        assert not isinstance(_deliver_as(certs, party, b_srv, slot, value), ErrorReply)
    bob.post(StoreProgram(program, []))
    bob.post(RunProgram(program, [], [slot]))
    with pytest.raises(pt.PointerError) as reported:
        bob.sync()
    for party in ("eve", "alice"):
        assert f"object {slot} from peer {party!r} (2 peers delivered it)" in str(reported.value)
    assert slot not in bob.objects


# -- peer channels are bounded and end with their sessions (issue 28, finding 7) -------


def test_a_session_names_a_bounded_number_of_peers(served):
    from pointers.network.served import MAX_PEER_LINKS

    start, connect = served
    alice = connect(start("alice"))
    for k in range(MAX_PEER_LINKS):  # names at addresses that are never dialled
        alice.post(ConnectPeer(f"p{k}", f"127.0.0.1:{1000 + k}"))
    alice.sync()
    alice.post(ConnectPeer("p0", "127.0.0.1:2000"))  # (naming one again is no new peer)
    alice.sync()
    alice.post(ConnectPeer("one-more", "127.0.0.1:999"))
    with pytest.raises(pt.LimitExceeded, match=f"at most {MAX_PEER_LINKS} peers"):
        alice.sync()


def test_peer_channels_close_with_the_session(served):
    from pointers.network.context import ClientContext

    start, connect = served
    a_srv, b_srv = start("alice", lease=1.0), start("bob")
    ctx = ClientContext()
    alice, bob = connect(a_srv, context=ctx), connect(b_srv, context=ctx)
    assert torch.equal(pt.send(torch.ones(2), alice).move(bob).get(), torch.ones(2))
    assert a_srv._channels  # alice -> bob, for this session
    alice.close()  # the client goes away: its lease runs out, and the channel goes with it
    deadline = time.monotonic() + 10
    while a_srv._channels and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not a_srv._channels
    # a peer that never proved to be a party never got a channel (nothing reconnects)
    again = connect(a_srv, context=ClientContext())
    again.post(ConnectPeer("ghost", "127.0.0.1:9"))
    again.post(SendToPeer(pt.send(torch.ones(1), again).id_at_location, "ghost", 77, False))
    with pytest.raises(pt.PartyUnavailable):
        again.sync()
    assert not a_srv._channels


def test_announcements_cost_nothing_per_held_delivery(victim, certs):
    """Issue 28, finding 8: each announced id looked at every held delivery, under the
    namespace's store lock (20k held and 3 x 65,536 ids held it for 56 s)."""
    b_srv, bob = victim
    channel = open_channel(
        b_srv.address,
        worker_id="bob",
        credentials=load_credentials(certs, "eve"),
        max_message_bytes=1 << 20,
    )
    to = {"client": "client", "from": "eve", "session": session_of(DEFAULT_CONTEXT)}
    deliver = channel.unary_unary(DELIVER)
    try:
        for k in range(3000):  # held: nobody announced them
            store = encode_message(Store(1 << 40 | k, torch.zeros(1), [], ""))
            deliver(encode_envelope(to, [(0, *store)]), timeout=10)
    finally:
        channel.close()
    began = time.monotonic()
    bob._conn.expects.extend(("alice", 1 << 41 | k) for k in range(65536))
    bob.sync()
    took = time.monotonic() - began
    print(f"65,536 announcements with 3000 deliveries held: {took:.3f} s")
    assert took < 3.0  # (6 s before: 3000 x 65,536 steps under the lock)
