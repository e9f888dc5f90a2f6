"""Peer links: how a served worker delivers protocol data to its peers, and takes theirs.

* :class:`PeerLink`: one session's deliveries to one peer, posted without waiting for the
  answer (over gRPC, or over the data plane for a large tensor when both workers serve
  one, :mod:`pointers.network.dataplane`), bounded in bytes in flight;
* :class:`PeerLinks`: the part of :class:`~pointers.network.server.WorkerServer` that
  dials peers (a channel opens only once the server there proved to hold the party
  certificate of the peer the client named), counts the sessions' links per channel, and
  takes peers' deliveries into the session that accepted them.

Imports the data plane, the wire helpers (certs, framing, transport), the served namespace
(:mod:`pointers.network.served`) and lower layers; never :mod:`pointers.network.server`.
"""

from __future__ import annotations

import math
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from pointers.errors import LimitExceeded, NotAllowedError, PartyUnavailable, PointerError
from pointers.network.certs import PARTY, Credentials, check_identity
from pointers.network.config import ServerConfig
from pointers.network.dataplane import (
    DataLink,
    DataPlaneServer,
)
from pointers.network.framing import (
    FrameError,
    decode_envelope,
    encode_envelope,
    info_field,
)
from pointers.network.peerlink import OK_NONE
from pointers.network.peerlink import DeliveryFailed as DeliveryFailed  # (re-exported)
from pointers.network.peerlink import PeerLink as PeerLink  # (re-exported)
from pointers.network.served import ServedWorker
from pointers.network.transport import (
    DELIVER,
    Call,
    PeerRefused,
    PeerUnreachable,
    bind_address,
    check_party,
    open_channel,
    split_address,
)
from pointers.wire.messages import Store

# distinct (peer, address) pairs the sessions of one client identity may link this worker
# to at once (each may hold a channel and a data connection: two descriptors here, one at
# the peer)
MAX_IDENTITY_PEERS = 64
DATA_PLANE_RETRY = 5.0  # s a worker delivers over gRPC after failing to open a data link,
DATA_PLANE_RETRY_MAX = 120.0  # doubled at each failure in a row, up to this


@dataclass
class _NoLink:
    """No data link to a peer: deliver over gRPC until ``until`` (infinite while one is
    being opened); ``wait``: the time last waited after a failure."""

    until: float
    wait: float = 0.0


class PeerLinks:
    """The peers of a :class:`~pointers.network.server.WorkerServer` (a base class of
    it): the channels it dials, the data links it opens, and the deliveries it takes.
    The server's ``_lock`` guards the channels, the link counts and ``_peers``."""

    id: str
    config: ServerConfig
    credentials: Credentials | None
    call_metadata: Any
    data_plane: DataPlaneServer | None
    post_pool: futures.ThreadPoolExecutor
    _lock: threading.Lock
    _namespaces: dict[tuple[str, str], ServedWorker]
    _peers: set[str]

    def _init_peers(self) -> None:
        """The peer state of a new server (called by its ``__init__``)."""
        self._channels: dict[tuple[str, str], Any] = {}
        self._checking: dict[tuple[str, str], threading.Lock] = {}  # peers being checked
        self._check_failed: dict[tuple[str, str], tuple[float, str]] = {}  # when, why
        self._link_count: dict[tuple[str, str], int] = {}  # open sessions' links per channel
        # per client identity, its sessions' links per (peer, address)
        self._identity_links: dict[str, dict[tuple[str, str], int]] = {}
        # the data links to peers by (peer, address), or until when to deliver without
        self._data_links: dict[tuple[str, str], DataLink | _NoLink] = {}
        self._data_lock = threading.Lock()

    def peer_call(self, peer: str, address: str) -> Any:
        """The delivery call to ``peer`` at ``address``. A channel is opened only once
        the server there proved to be the party certificate of ``peer``
        (:meth:`_check_peer`): a peer that did not, or could not be reached, gets nothing
        (no channel, no session token, no object), and the next delivery checks again.
        A channel exists only while an open session's link to ``(peer, address)`` does
        (:meth:`_link`, :meth:`release_link`): a delivery still in flight when its link
        closed opens none, so every connection this worker holds is counted against a
        session and its identity, and goes with the last of their links."""
        key = (peer, address)
        with self._lock:
            entry = self._channels.get(key)
            if entry is not None:
                return entry[1]
            if not self._link_count.get(key):
                raise _link_closed(self.id, peer)
            checking = self._checking.setdefault(key, threading.Lock())
        with checking:  # one check per peer at a time; the others take its outcome
            with self._lock:
                entry = self._channels.get(key)
                failed = self._check_failed.get(key)
            if entry is None and failed is not None and time.monotonic() - failed[0] < 1.0:
                raise PartyUnavailable(failed[1], peer)
            if entry is None:
                try:
                    self._check_peer(peer, address)
                except PartyUnavailable as e:
                    with self._lock:
                        if len(self._check_failed) >= 1024:
                            self._check_failed.clear()
                        self._check_failed[key] = (time.monotonic(), str(e))
                    raise
                finally:
                    with self._lock:
                        self._checking.pop(key, None)
                channel = open_channel(
                    address,
                    worker_id=peer,
                    credentials=self.credentials,
                    max_message_bytes=self.config.max_message_bytes,
                )
                with self._lock:
                    if self._link_count.get(key):
                        entry = self._channels.setdefault(key, (channel, Call(channel, DELIVER)))
                    else:  # the last link closed during the check
                        entry = None
                if entry is None or entry[0] is not channel:
                    channel.close()
                if entry is None:
                    raise _link_closed(self.id, peer)
        return entry[1]

    def data_link(self, peer: str, address: str) -> DataLink | None:
        """The data connection to ``peer`` at ``address``, opened at the first delivery
        once the gRPC channel's check passed (:meth:`peer_call`): the peer tells its data
        port over that channel, and the connection must present the party certificate of
        ``peer`` (:meth:`DataLink.connect`). None (deliver over gRPC) when this worker or
        the peer serves no data plane, while one is being opened, or for a while after
        opening one failed (:data:`DATA_PLANE_RETRY` seconds, doubled at each failure in
        a row up to :data:`DATA_PLANE_RETRY_MAX`)."""
        if self.data_plane is None or self.credentials is None:
            return None
        key = (peer, address)
        with self._data_lock:
            link = self._data_links.get(key)
            if isinstance(link, DataLink) and link.broken is None:
                return link
            if isinstance(link, _NoLink) and time.monotonic() < link.until:
                return None
            wait = link.wait if isinstance(link, _NoLink) else 0.0
            dialing = self._data_links[key] = _NoLink(math.inf, wait)
        # opened without the lock: meanwhile, deliveries to other peers do not wait for
        # this one (a data port a firewall drops takes the whole connect timeout), and
        # this peer's go over gRPC
        new: DataLink | None = None
        try:
            call = self.peer_call(peer, address)
            ask = encode_envelope({"from": self.id, "ask": "data-port"}, [])
            info, _ = decode_envelope(
                call.blocking(ask, timeout=self.config.deadline, metadata=self.call_metadata)
            )
            port = info_field(info, "data_port", int, 0)
            if not port:
                raise PartyUnavailable(f"{peer!r} serves no data plane", peer)
            host, _ = split_address(address)
            new = DataLink.connect(
                bind_address(host, port),
                peer,
                credentials=self.credentials,
                cert_dir=self.config.certs or "",
                owner=self.id,
                timeout=min(self.config.deadline, 5.0),
            )
        except (PointerError, grpc.RpcError, OSError, ValueError):
            pass  # (the gRPC path reports what is wrong with the peer)
        with self._data_lock:
            if self._data_links.get(key) is dialing and self.data_plane is not None:
                if new is not None:
                    self._data_links[key] = new
                    return new
                wait = min(max(2 * wait, DATA_PLANE_RETRY), DATA_PLANE_RETRY_MAX)
                self._data_links[key] = _NoLink(time.monotonic() + wait, wait)
                return None
        if new is not None:  # the server stopped, or the peer's last session ended
            new.close()
        return None

    def _check_peer(self, peer: str, address: str) -> None:
        """Before anything is sent to ``peer`` at ``address``: the server there must
        present the party certificate of ``peer`` (role URI ``role:party``, CN ``peer``),
        checked here after a TLS handshake of its own; the channel opened afterwards asks
        TLS for the same certificate at every connection (``party_name``). Raises
        :class:`PartyUnavailable` otherwise (with the reason when the deployment
        configured its peers, ``serve --peer``; one uniform message for a client-given
        address, whose network this worker does not describe)."""
        if self.credentials is None:  # --insecure: identities on trust, loopback only
            return
        certs = Path(self.config.certs or "")
        try:
            check_party(
                address,
                peer,
                ca=self.credentials.ca,
                cert_file=certs / f"{self.id}.pem",
                key_file=certs / f"{self.id}.key",
                timeout=min(self.config.deadline, 5.0),
            )
        except (PeerRefused, PeerUnreachable) as e:
            refused = isinstance(e, PeerRefused)
            if refused:
                print(
                    f"pointers: worker {self.id!r} refused to deliver to {peer!r} at "
                    f"{address}: {e}",
                    file=sys.stderr,
                    flush=True,
                )
            if self.config.peers:
                rule = "; a worker delivers only to the party certificate of its peer"
                raise PartyUnavailable(
                    f"worker {self.id!r} will not deliver to its peer {peer!r} at "
                    f"{address}: {e}{rule if refused else ''}",
                    peer,
                ) from None
            raise PartyUnavailable(
                f"worker {self.id!r} could not deliver to its peer {peer!r} at {address} "
                f"(unreachable, or not that worker: a worker delivers only to a server "
                f"that presents the party certificate of {peer!r})",
                peer,
            ) from None

    def _link(
        self,
        peer: str,
        address: str,
        client: str,
        session: str = "",
        replacing: str | None = None,
    ) -> PeerLink:
        """A new link of ``client``'s session to ``peer`` at ``address``: counted against
        the connections that ``client``, all its sessions together, may have this worker
        open (:data:`MAX_IDENTITY_PEERS` distinct ``(peer, address)`` pairs; a session
        holds at most :data:`~pointers.network.served.MAX_PEER_LINKS` links).
        ``replacing``: the address of this session's link to ``peer`` that the new one
        replaces (closed right after: its room counts as free)."""
        check_identity(peer)
        if self.config.peers:  # dial only what the deployment configured
            configured = dict(self.config.peers).get(peer)
            if configured is None:
                raise NotAllowedError(
                    f"worker {self.id!r} dials only its configured peers (serve --peer): "
                    f"{sorted(dict(self.config.peers))}, not {peer!r}"
                )
            address = configured
        else:
            split_address(address)
        key = (peer, address)
        with self._lock:
            mine = self._identity_links.get(client, {})
            freed = int(replacing is not None and mine.get((peer, replacing)) == 1)
            if key not in mine and len(mine) - freed >= MAX_IDENTITY_PEERS:
                raise LimitExceeded(
                    f"worker {self.id!r}: the sessions of client {client!r} link it to at most "
                    f"{MAX_IDENTITY_PEERS} distinct peer addresses at once; a session's links "
                    "close with it (or when it connects the same peer again)"
                )
            mine[key] = mine.get(key, 0) + 1
            self._identity_links[client] = mine
            self._link_count[key] = self._link_count.get(key, 0) + 1
        return PeerLink(self, peer, address, client, session)

    def release_link(self, peer: str, address: str, client: str = "") -> None:
        """A session's link to ``peer`` at ``address`` closed: the channel goes with the
        last one (a session that ended leaves no connection open behind it)."""
        key = (peer, address)
        with self._lock:
            mine = self._identity_links.get(client)
            if mine is not None and key in mine:
                mine[key] -= 1
                if not mine[key]:
                    del mine[key]
                    if not mine:
                        del self._identity_links[client]
            left = self._link_count.get(key, 0) - 1
            if left > 0:
                self._link_count[key] = left
                return
            self._link_count.pop(key, None)
            entry = self._channels.pop(key, None)
        if entry is not None:
            entry[0].close()
        with self._data_lock:
            data = self._data_links.pop(key, None)
        if isinstance(data, DataLink):
            data.close()

    # -- deliveries from peers -------------------------------------------------------------
    @staticmethod
    def _party(who: str, role: str | None) -> None:
        if role is not None and role != PARTY:
            raise NotAllowedError(
                f"identity {who!r} holds a {role} certificate: only a party delivers"
            )

    def _delivery_namespace(self, who: str, role: str | None, info: dict[str, Any]) -> ServedWorker:
        """The namespace a delivery from ``who`` (its certificate's identity and role)
        goes into, from the delivery's ``info`` (client, from, session): only a party
        delivers, as itself, into the session of a client that accepted it. The same
        checks for a gRPC delivery and a data-plane frame (before its body is read)."""
        self._party(who, role)
        client = info_field(info, "client", str, None)
        source = info_field(info, "from", str, None)
        if client is None or source is None:
            raise FrameError("a delivery names its client and its source worker")
        if source != who:
            raise NotAllowedError(f"identity {who!r} cannot deliver as {source!r}")
        session = info_field(info, "session", str, "")
        ns = self._namespaces.get((client, session))
        if ns is None or source not in ns.accepted:
            raise NotAllowedError(
                f"client {client!r} has not asked worker {self.id!r} to accept "
                f"deliveries from {source!r}"
            )
        if who not in self._peers:
            with self._lock:
                self._peers.add(who)
        return ns

    @staticmethod
    def _store_delivery(ns: ServedWorker, who: str, msg: Any, nbytes: int) -> bool:
        """Store a peer's decoded delivery under the namespace's rules (announced ids,
        sealed labels, the storage limit), and count it. True: the sender should pause
        (flow control, see :class:`PeerLink`)."""
        if type(msg) is not Store:
            raise NotAllowedError(f"a peer may only deliver objects, not {msg.KIND!r}")
        pause = ns.store.receive(who, msg.obj_id, msg.value, msg.sealed)
        stats = ns.stats  # as a VirtualWorker counts what its peers hand it
        stats.messages_received += 1
        stats.bytes_received += nbytes
        stats.messages_sent += 1
        stats.bytes_sent += len(OK_NONE)
        return pause

    @staticmethod
    def _room(ns: ServedWorker, who: str, info: dict[str, Any]) -> bytes:
        """The answer to a paused sender's question (``ask: room``): may ``id`` come now."""
        obj_id = info_field(info, "id", int, 0)
        size = info_field(info, "size", int, 0)
        return encode_envelope({"room": ns.store.room(who, obj_id, max(size, 0))}, [])


def _link_closed(worker: str, peer: str) -> PartyUnavailable:
    return PartyUnavailable(
        f"worker {worker!r}: no open session links it to {peer!r} at this address any more "
        "(the session's link was closed or replaced)",
        peer,
    )
