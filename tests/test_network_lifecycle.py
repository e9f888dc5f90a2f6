"""Integrity, identity, peers, leases and faults of real ``python -m pointers serve``
processes (issue 12): what a certificate holder of the deployment's CA cannot do to
another client's namespace, and how the workers' state follows the clients' lives."""

from __future__ import annotations

import datetime
import os
import re
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from network_fixtures import Cluster, ServerProcess

import pointers as pt
from pointers.network.certs import load_credentials
from pointers.network.context import DEFAULT_CONTEXT
from pointers.network.framing import decode_envelope, encode_envelope
from pointers.network.lease import session_of
from pointers.network.transport import DELIVER, open_channel
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ErrorReply,
    SendToPeer,
    Store,
    decode_message,
    encode_message,
)

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("lifecycle"), ["alice", "bob"], ["client", "other"])
    c.start()
    yield c
    c.stop()


def _deliver(cluster: Cluster, as_identity: str, worker: str, info: dict, frames: list) -> Any:
    """One raw Deliver call to ``worker`` with the certificate of ``as_identity``."""
    channel = open_channel(
        cluster.address(worker),
        worker_id=worker,
        credentials=load_credentials(cluster.certs, as_identity),
        max_message_bytes=1 << 20,
    )
    try:
        resp = channel.unary_unary(DELIVER)(encode_envelope(info, frames), timeout=10)
    finally:
        channel.close()
    _, out = decode_envelope(resp)
    return decode_message(out[0][1], out[0][2])


def test_a_peer_delivers_only_into_ids_announced_for_it(cluster):
    alice, bob = cluster.fresh("alice"), cluster.fresh("bob")
    x = pt.send(torch.tensor([1.0, 2.0]), bob)  # the client's own object at bob
    moved = pt.send(torch.ones(2), alice).move(bob)  # bob now accepts alice's deliveries
    alice.sync()  # the move is pipelined: wait until alice delivered
    before = sorted(bob.objects)
    assert before == sorted([x.id_at_location, moved.id_at_location])

    def deliver(obj_id: int) -> Any:
        store = encode_message(Store(obj_id, torch.full((2,), 666.0), [], ""))
        info = {"client": "client", "from": "alice", "session": session_of(DEFAULT_CONTEXT)}
        return _deliver(cluster, "alice", "bob", info, [(0, *store)])

    # overwrite the client's own object, or one alice already delivered: refused
    for target in (x.id_at_location, moved.id_at_location):
        reply = deliver(target)
        assert isinstance(reply, ErrorReply) and reply.kind == "NotAllowedError"
        assert "did not announce" in reply.message
    # an id nobody announced is kept aside, outside the namespace
    fresh_id = bob.new_id()
    assert not isinstance(deliver(fresh_id), ErrorReply)
    assert sorted(bob.objects) == before
    assert torch.equal(x.get(), torch.tensor([1.0, 2.0]))
    assert torch.equal(moved.get(), torch.ones(2))
    # announced for another sender than alice: not alice's to fill
    bob._conn.expects.append(("carol", fresh_id))
    assert fresh_id not in bob.objects


def _issue(certs: Path, file_name: str, subject: list[str], roles: list[str]) -> None:
    """A certificate signed by the deployment's CA with any CNs and role URIs."""
    ca_cert = x509.load_pem_x509_certificate((certs / "ca.pem").read_bytes())
    ca_key = serialization.load_pem_private_key((certs / "ca.key").read_bytes(), None)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    alt = [x509.DNSName("localhost"), *(x509.UniformResourceIdentifier(r) for r in roles)]
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [x509.NameAttribute(NameOID.COMMON_NAME, n, _validate=False) for n in subject]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName(alt), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (certs / f"{file_name}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (certs / f"{file_name}.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )


@pytest.mark.filterwarnings("ignore:Attribute's length")
@pytest.mark.parametrize(
    ("subject", "roles", "why"),
    [
        ([], ["role:client"], "exactly one identity"),
        ([""], ["role:client"], "must be a DNS label"),
        (["../../etc/passwd client"], ["role:client"], "must be a DNS label"),
        (["client", "alice"], ["role:client"], "exactly one identity"),
        (["nobody"], [], "exactly one role"),
        (["nobody"], ["role:client", "role:party"], "exactly one role"),
        (["nobody"], ["role:admin"], "exactly one role"),
    ],
)
def test_a_certificate_needs_a_well_formed_identity_and_one_role(cluster, subject, roles, why):
    _issue(cluster.certs, "odd", subject, roles)
    with pytest.raises(pt.PointerError, match=why):
        cluster.connect("alice", identity="odd")


def test_roles_come_from_the_certificate_not_the_name(cluster):
    # a client certificate cannot deliver as a peer, a party certificate cannot command
    store = encode_message(Store(5, torch.ones(1), [], ""))
    reply = _deliver(cluster, "client", "bob", {"client": "other", "from": "client"}, [(0, *store)])
    assert isinstance(reply, ErrorReply) and "only a party delivers" in reply.message
    as_alice = cluster.connect("bob", identity="alice")
    with pytest.raises(pt.RemoteError, match="party certificate"):
        pt.send(torch.ones(1), as_alice).get()
    # a party certificate named like a client is still a party
    _issue(cluster.certs, "client2", ["client2"], ["role:party"])
    with pytest.raises(pt.RemoteError, match="party certificate"):
        len(cluster.connect("bob", identity="client2").objects)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_client_given_peer_address_fails_uniformly(cluster):
    alice, bob = cluster.fresh("alice"), cluster.fresh("bob")
    assert torch.equal(pt.send(torch.ones(1), alice).move(bob).get(), torch.ones(1))
    errors = []
    # a closed port, and a TLS endpoint that is not bob (alice itself)
    for address in (f"127.0.0.1:{_closed_port()}", cluster.address("alice")):
        alice.post(ConnectPeer("bob", address))
        q = pt.send(torch.ones(1), alice).move(bob)
        with pytest.raises(pt.PartyUnavailable) as info:
            alice.sync()
        # (the object ids differ; what is said about the address must not)
        errors.append(
            re.sub(r"object \d+", "object N", str(info.value).replace(address, "ADDRESS"))
        )
        del q
    assert errors[0] == errors[1] and "could not deliver to its peer 'bob'" in errors[0]


def test_a_worker_dials_only_its_configured_peers(cluster, tmp_path):
    alice_address = cluster.address("alice")
    server = ServerProcess(
        "bob", cluster.certs, tmp_path / "bob.log", ["--peer", f"alice={alice_address}"]
    )
    server.start()
    try:
        server.wait_ready()
        assert server.address is not None
        bob = pt.connect("bob", server.address, certs=cluster.certs, identity="client")
        alice = cluster.fresh("alice")
        bob.post(ConnectPeer("carol", f"127.0.0.1:{_closed_port()}"))
        with pytest.raises(pt.RemoteError, match="dials only its configured peers"):
            bob.sync()
        # alice is configured: the client's address for it is replaced by alice's own
        bob.post(ConnectPeer("alice", f"127.0.0.1:{_closed_port()}"))
        alice.request(AcceptPeer("bob"))
        x = pt.send(torch.arange(3.0), bob)
        moved_id = alice.new_id()
        alice._conn.expects.append(("bob", moved_id))
        bob.post(SendToPeer(x.id_at_location, "alice", moved_id, False))
        bob.sync()
        assert torch.equal(alice.objects[moved_id], torch.arange(3.0))
        bob.close()
    finally:
        server.kill()


@pytest.mark.slow
def test_a_hung_worker_is_reported_within_seconds(cluster, tmp_path):
    """SIGSTOP: the process keeps its sockets but answers nothing (as when partitioned);
    keepalive pings report it in about 5 s (before: the 120 s call timeout), to the
    client and to a peer delivering to it; after SIGCONT the same connections work."""
    server = ServerProcess("bob", cluster.certs, tmp_path / "bob.log")
    server.start()
    try:
        server.wait_ready()
        assert server.address is not None and server.proc is not None
        bob = pt.connect("bob", server.address, certs=cluster.certs, identity="client")
        alice = cluster.fresh("alice")
        y = pt.send(torch.ones(2), bob)
        assert torch.equal(y.get(), torch.ones(2))
        y = pt.send(torch.ones(2), bob)
        x = pt.send(torch.ones(2), alice).move(bob)  # introduces alice to this bob
        alice.sync()
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            for what in ("client", "peer"):
                start = time.monotonic()
                with pytest.raises(pt.PartyUnavailable) as info:
                    if what == "client":
                        (y + 1).get()
                    else:
                        pt.send(torch.ones(2), alice).move(bob)
                        alice.sync()
                took = time.monotonic() - start
                assert took < 10, (what, took, str(info.value))
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        time.sleep(2)  # (the channels reconnect within their backoff, 1 s at most)
        assert torch.equal((y + 1).get(), torch.full((2,), 2.0))
        assert torch.equal(x.get(), torch.ones(2))
        bob.close()
    finally:
        server.kill()


def test_a_stopped_worker_exits_while_a_call_still_runs(tmp_path):
    """A served worker whose launcher goes away (its standard input closes) ends at once,
    even while a handler still runs: the interpreter used to wait for gRPC's handler
    threads, so a call waiting out its deadline kept the process, and its memory, alive
    for minutes after the client had died."""
    import threading

    c = Cluster(tmp_path, ["alice"], args=["--latency-ms", "9000"])  # each call sleeps 9 s
    c.start()
    server = c.servers["alice"]
    try:
        busy = threading.Thread(
            target=lambda: _quietly(lambda: pt.send(torch.ones(2), c.connect("alice"))),
            daemon=True,
        )
        busy.start()
        time.sleep(2.0)  # the call is now asleep in its handler
        assert server.proc is not None and server.proc.stdin is not None
        start = time.monotonic()
        server.proc.stdin.close()
        server.proc.wait(timeout=30)
        took = time.monotonic() - start
        assert took < 5.0, f"the stopped worker lived {took:.1f} s more"
        assert "stopped" in server.output()
    finally:
        c.stop()


def _quietly(fn: Any) -> None:
    try:
        fn()
    except Exception:
        pass  # the worker went away under the call: expected here
