"""gRPC plumbing shared by the server and the client: method names, channels, credentials.

The service has three bytes-in/bytes-out unary methods (no generated stubs: the payload is
a :mod:`~pointers.network.framing` envelope, so msgpack stays the only format):

* ``Exec``: a batch of a client's messages, run in order in the client's namespace;
* ``Deliver``: a peer worker delivers one object into a client's namespace;
* ``Inspect``: hello, counters, object ids, reset, waiting for the client's programs (not
  counted as messages).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import ssl
import time
from pathlib import Path
from typing import Any

import grpc

from pointers.errors import LimitExceeded, PartyUnavailable, PointerError
from pointers.network.certs import Credentials, check_party_certificate, party_name

SERVICE = "pointers.Worker"
EXEC = f"/{SERVICE}/Exec"
DELIVER = f"/{SERVICE}/Deliver"
INSPECT = f"/{SERVICE}/Inspect"
IDENTITY_METADATA = "pointers-identity"  # the claimed identity, insecure mode only
SYNC = 1  # request flag: a reply is awaited; skip it if an earlier frame of the batch failed
STALE = 2  # request flag: the client ignores this frame's error (it does not skip a SYNC)
DEFAULT_MAX_MESSAGE = 256 << 20
LOOPBACK_NAMES = ("localhost",)
# HTTP/2 keepalive: a hung (stopped) or partitioned worker answers no ping, so its calls
# fail within KEEPALIVE_MS + KEEPALIVE_TIMEOUT_MS (about 5 s) instead of at the timeout
KEEPALIVE_MS = 2000
KEEPALIVE_TIMEOUT_MS = 3000
# what a served worker accepts from its callers (their pings, also between calls)
SERVER_KEEPALIVE_OPTIONS: list[tuple[str, Any]] = [
    ("grpc.keepalive_time_ms", KEEPALIVE_MS * 5),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_recv_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
]


# Benchmarks only (python -m benchmarks --bandwidth): a simulated link speed in Mbit/s.
# Every call a process sends then waits len(request) / bandwidth before it leaves, as on
# a link of that speed; calls sent side by side do not share it, and replies are not
# delayed. Unset (the default): no delay.
BANDWIDTH_ENV = "POINTERS_SIMULATED_MBIT"


def simulated_bytes_per_s() -> float:
    """The simulated bandwidth in bytes per second from :data:`BANDWIDTH_ENV` (0: none)."""
    text = os.environ.get(BANDWIDTH_ENV, "")
    try:
        mbit = float(text) if text else 0.0
    except ValueError:
        return 0.0
    return mbit * 1e6 / 8 if mbit > 0 else 0.0


def is_loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) -> (host, port)."""
    if not isinstance(address, str) or ":" not in address:
        raise ValueError(f"an address is 'host:port', got {address!r}")
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"an address is 'host:port' with a port in 1..65535, got {address!r}")
    return host, int(port)


def bind_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def channel_options(
    max_message_bytes: int, target_name: str | None = None
) -> list[tuple[str, Any]]:
    opts: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # a restarted worker is found again quickly
        ("grpc.initial_reconnect_backoff_ms", 100),
        # (gRPC core also takes this as the least time one connection attempt, the TLS
        # handshake included, is given: at 100 ms every connect to a busy worker failed)
        ("grpc.min_reconnect_backoff_ms", 2_000),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.enable_retries", 0),
        # a worker that stopped answering (hung, partitioned) fails the call in seconds
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.http2.ping_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]
    if target_name is not None:  # the server must present this identity's certificate
        opts.append(("grpc.ssl_target_name_override", target_name))
    return opts


def open_channel(
    address: str,
    *,
    worker_id: str,
    credentials: Credentials | None,
    max_message_bytes: int,
) -> grpc.Channel:
    """A channel to ``worker_id`` at ``address``: mutual TLS with ``credentials``, or
    plaintext (loopback only) when ``credentials`` is None."""
    host, _ = split_address(address)
    if credentials is None:
        if not is_loopback(host):
            raise PointerError(
                f"an insecure connection may only go to a loopback address, not {address!r}"
            )
        return grpc.insecure_channel(address, options=channel_options(max_message_bytes))
    creds = grpc.ssl_channel_credentials(
        root_certificates=credentials.ca,
        private_key=credentials.key,
        certificate_chain=credentials.cert,
    )
    # TLS checks, at every connection of the channel (reconnections included), that the
    # worker presents the party certificate of worker_id: only that one names party_name
    return grpc.secure_channel(
        address,
        creds,
        options=channel_options(max_message_bytes, target_name=party_name(worker_id)),
    )


class PeerRefused(PointerError):
    """A worker's peer did not prove that it is the party the client named (the TLS
    handshake failed, or it presented another certificate): nothing was sent to it."""


class PeerUnreachable(PointerError):
    """A worker's peer could not be reached to check its certificate."""


def check_party(
    address: str,
    peer: str,
    *,
    ca: bytes,
    cert_file: str | os.PathLike[str],
    key_file: str | os.PathLike[str],
    timeout: float,
) -> None:
    """Connect to ``address`` with mutual TLS, read the certificate the server presents,
    and close: raise :class:`PeerRefused` unless it is the party certificate of ``peer``
    (CA-signed, extended key usage serverAuth, role URI ``role:party``, CN ``peer``, the
    name :func:`~pointers.network.certs.party_name`), :class:`PeerUnreachable` when no
    handshake could be made. Nothing but the TLS handshake is sent (no HTTP/2 preface,
    no gRPC call): a worker runs this before it opens a channel to a peer the client
    named, so nothing of a session reaches a server that is not that party."""
    host, port = split_address(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # (the names are checked below, from the certificate)
    ctx.verify_mode = ssl.CERT_REQUIRED  # the CA's signature and the serverAuth usage
    ctx.load_verify_locations(cadata=ca.decode())
    ctx.load_cert_chain(str(Path(cert_file)), str(Path(key_file)))
    ctx.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection((host, port), timeout=timeout) as sock:
            with ctx.wrap_socket(sock, server_hostname=party_name(peer)) as tls:
                der = tls.getpeercert(binary_form=True)
    except ssl.SSLCertVerificationError as e:
        raise PeerRefused(
            f"its certificate does not verify as a party's: {e.verify_message or e}"
        ) from None
    except ssl.SSLError as e:
        raise PeerRefused(f"the TLS handshake failed: {e.reason or e}") from None
    except OSError as e:
        raise PeerUnreachable(f"unreachable: {e.strerror or e}") from None
    if not der:
        raise PeerRefused("it presented no certificate")
    try:
        check_party_certificate(ssl.DER_cert_to_PEM_cert(der).encode(), peer)
    except ValueError as e:
        raise PeerRefused(str(e)) from None


def rpc_error(e: grpc.RpcError, worker: str, address: str, what: str) -> PointerError:
    """A clear error for a failed call, without gRPC's internals."""
    code = e.code() if hasattr(e, "code") else None
    details = (e.details() if hasattr(e, "details") else None) or str(code)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return LimitExceeded(
            f"{what} to worker {worker!r} at {address} went past a message size limit "
            f"({details}); send smaller tensors or raise --max-message-mb / max_message_bytes"
        )
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PartyUnavailable(
            f"worker {worker!r} at {address} did not answer {what} in time", worker
        )
    if code == grpc.StatusCode.UNAUTHENTICATED or code == grpc.StatusCode.PERMISSION_DENIED:
        return PartyUnavailable(f"worker {worker!r} at {address} refused us: {details}", worker)
    low = details.lower()
    if "ping timeout" in low or "handshake read failed" in low or "endpoint closing" in low:
        return PartyUnavailable(
            f"worker {worker!r} at {address} stopped answering (hung, stopped, out of "
            f"connections or file descriptors, or cut off by the network: no answer to "
            f"keepalive pings within seconds): {details}",
            worker,
        )
    if _is_tls_failure(low):
        return PartyUnavailable(
            f"the TLS handshake with worker {worker!r} at {address} failed (is its certificate "
            f"from the same CA, and does it serve {worker!r}?): {details}",
            worker,
        )
    return PartyUnavailable(f"worker {worker!r} at {address} is unreachable: {details}", worker)


class Call:
    """A unary call on a channel that waits once for a lost connection to come back.

    When a call could not even be sent (the channel is not connected: the worker is down,
    or restarting), it is tried once more, waiting up to ``reconnect_wait`` seconds for
    the channel, at most once a second: a restarted worker is found again at the next
    call, while calls to a dead one keep failing fast.
    """

    def __init__(self, channel: grpc.Channel, method: str, reconnect_wait: float = 1.5) -> None:
        self._call = channel.unary_unary(method)
        self.reconnect_wait = reconnect_wait
        self._last_retry = -1e9
        self._rate = simulated_bytes_per_s()

    def future(
        self, data: bytes, timeout: float, metadata: Any = None, wait_for_ready: bool = False
    ) -> Any:
        """The call without waiting for its answer (a gRPC future). Not retried here: a
        caller whose call was not sent (:func:`not_sent`) may send it again with
        ``wait_for_ready``, as :meth:`__call__` does."""
        self.pace(len(data))
        return self._call.future(
            data, timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready
        )

    def pace(self, size: int) -> None:
        """Wait the time ``size`` bytes take on the simulated link (no wait without one)."""
        if self._rate:
            time.sleep(size / self._rate)

    def blocking(
        self, data: bytes, timeout: float, metadata: Any = None, wait_for_ready: bool = False
    ) -> bytes:
        """The call, waiting for its answer in this thread, once, without pacing (the
        caller paced it): for a thread that sends on another's behalf."""
        return self._call(data, timeout=timeout, metadata=metadata, wait_for_ready=wait_for_ready)

    def __call__(self, data: bytes, timeout: float, metadata: Any = None) -> bytes:
        if self._rate:
            time.sleep(len(data) / self._rate)
        try:
            return self._call(data, timeout=timeout, metadata=metadata)
        except grpc.RpcError as e:
            if not _not_sent(e) or time.monotonic() - self._last_retry < 1.0:
                raise
            first = e
        try:
            return self._call(
                data,
                timeout=min(timeout, self.reconnect_wait),
                metadata=metadata,
                wait_for_ready=True,
            )
        except grpc.RpcError as e:
            if e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise first from None
            raise
        finally:
            self._last_retry = time.monotonic()


def not_sent(e: grpc.RpcError) -> bool:
    """The call never reached the worker, for a reason a reconnection may cure."""
    return _not_sent(e)


def _not_sent(e: grpc.RpcError) -> bool:
    """The call never reached the worker, for a reason a reconnection may cure."""
    code = e.code() if hasattr(e, "code") else None
    details = ((e.details() if hasattr(e, "details") else "") or "").lower()
    return (
        code == grpc.StatusCode.UNAVAILABLE
        and "failed to connect" in details
        and not _is_tls_failure(details)
    )


def _is_tls_failure(details: str) -> bool:
    return any(w in details for w in ("ssl", "handshake", "certificate", "tls", "verif"))


class ChannelWatch:
    """Set when the channel left READY: the worker may have restarted behind it. Held by
    the channel's connectivity callback (not the worker, so a dropped worker still closes)."""

    __slots__ = ("dropped", "_ready")

    def __init__(self) -> None:
        self.dropped = False
        self._ready = False

    def __call__(self, state: grpc.ChannelConnectivity) -> None:
        if state is grpc.ChannelConnectivity.READY:
            self._ready = True
        elif self._ready:
            self.dropped = True
            self._ready = False
