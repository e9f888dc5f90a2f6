"""Client sessions at a served worker: one namespace per (identity, session token).

:class:`Sessions` is the part of :class:`~pointers.network.server.WorkerServer` that
knows who calls (the identity and role of the caller's certificate, its session token:
:mod:`pointers.network.lease`), opens the caller's namespace (a
:class:`~pointers.network.served.ServedWorker`, at most ``--max-sessions`` per identity),
keeps it busy during a call, and frees it once its lease ran out (``--lease``).

Imports the peer links (its base class), the served namespace, the quotas, the lease
tokens and the wire helpers; never :mod:`pointers.network.server`.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from pointers.errors import LimitExceeded, NotAllowedError
from pointers.network.certs import PARTY, certificate_role, check_identity
from pointers.network.lease import SESSION_METADATA, check_session
from pointers.network.peers import PeerLinks
from pointers.network.quotas import FairProgramPool
from pointers.network.served import ServedWorker
from pointers.network.transport import IDENTITY_METADATA
from pointers.worker import policy as owner_policy
from pointers.worker.memory import trim_heap


class Sessions(PeerLinks):
    """The client sessions of a :class:`~pointers.network.server.WorkerServer` (a base
    class of it, over its peers). The server's ``_lock`` guards ``_namespaces`` and
    ``_expired``."""

    functions: dict[str, Callable[..., Any]]
    programs: FairProgramPool
    _stopping: threading.Event
    _expired: dict[tuple[str, str], float]

    def _enter(self, client: str, session: str) -> ServedWorker:
        """The namespace of ``(client, session)`` (made on its first call), marked busy
        until :meth:`_leave`: a namespace is never freed during a call of its client."""
        key = (client, session)
        with self._lock:
            ns = self._namespaces.get(key)
            if ns is None:
                cfg = self.config
                open_now = sum(1 for c, _ in self._namespaces if c == client)
                if open_now >= cfg.max_sessions:
                    # (how many sessions of this identity are open is theirs: not told)
                    raise LimitExceeded(
                        f"client {client!r} reached its limit of open sessions at worker "
                        f"{self.id!r} (serve --max-sessions); the sessions of clients that "
                        f"stopped are freed {cfg.lease:g} s after their last call (serve "
                        "--lease)"
                    )
                ns = ServedWorker(
                    self.id,
                    client,
                    functions=self.functions,
                    link_factory=self._link,
                    deadline=cfg.deadline,
                    max_stored_bytes=cfg.max_stored_bytes,
                    session=session,
                    max_objects=cfg.max_objects,
                    programs=self.programs,
                    max_held_bytes=cfg.max_held_bytes,
                )
                if cfg.offer is not None:  # the owner's policy (held values), not the client's
                    owner_policy.set_policy(ns, cfg.offer)
                if cfg.data_owners is not None:  # data owners: the deployment's, never a client's
                    ns.data_policy = cfg.data_owners
                    cfg.data_owners.place(ns, client)
                if self._expired.pop(key, None) is not None:
                    ns.store.note = (
                        f" (this client's earlier objects here were freed when its session's "
                        f"lease expired: no call for {cfg.lease:g} s, serve --lease)"
                    )
                self.programs.own(ns.programs, client)  # (slots are shared per identity)
                self._namespaces[key] = ns
            ns.calls += 1
            ns.seen = time.monotonic()
        return ns

    def _leave(self, ns: ServedWorker) -> None:
        with self._lock:
            ns.calls -= 1
            ns.seen = time.monotonic()

    def _reap(self) -> None:
        """Free the namespaces whose lease expired (no call for ``config.lease`` s)."""
        lease = self.config.lease
        while not self._stopping.wait(min(lease / 8, 1.0)):
            now = time.monotonic()
            with self._lock:
                expired = [
                    (key, ns)
                    for key, ns in self._namespaces.items()
                    if not ns.calls and now - ns.seen > lease
                ]
                for key, _ in expired:
                    del self._namespaces[key]
                    self._expired[key] = now
                if len(self._expired) > 4096:  # remembered for the error message only
                    for key in list(self._expired)[:2048]:
                        del self._expired[key]
            for (client, session), ns in expired:
                idle = now - ns.seen
                try:
                    objects, nbytes = ns.close(
                        f"the session of client {client!r} at worker {self.id!r} expired "
                        f"(no call for {lease:g} s, serve --lease)"
                    )
                except Exception as e:  # never let the reaper die
                    print(f"pointers: freeing a session failed: {e!r}", file=sys.stderr)
                    continue
                trim_heap()  # hand the freed memory back to the system where possible
                print(
                    f"pointers: worker {self.id!r}: the lease of client {client!r} session "
                    f"{session[:8] or '-'} expired ({idle:.1f} s without a call): freed "
                    f"{objects} objects, {nbytes} bytes",
                    file=sys.stderr,
                    flush=True,
                )

    def sessions(self) -> list[tuple[str, str]]:
        """The open client sessions, (identity, token)."""
        with self._lock:
            return list(self._namespaces)

    def stored_bytes(self) -> int:
        """The bytes all sessions count against their limits, together."""
        with self._lock:
            spaces = list(self._namespaces.values())
        return sum(ns.store.bytes for ns in spaces)

    # -- identity ------------------------------------------------------------------------
    def _caller(self, context: grpc.ServicerContext) -> tuple[str, str | None]:
        """The caller's identity and role (``party`` or ``client``; None when insecure),
        from its certificate: a malformed identity or a missing role is refused."""
        if self.config.insecure:
            for key, value in context.invocation_metadata() or ():
                if key == IDENTITY_METADATA and isinstance(value, str):
                    check_identity(value)
                    return value, None
            return "anonymous", None
        pems = context.auth_context().get("x509_pem_cert")
        if not pems:
            raise NotAllowedError("no client certificate")
        try:
            return certificate_role(pems[0])
        except ValueError as e:
            raise NotAllowedError(f"worker {self.id!r} refuses the certificate: {e}") from None

    def _identity(self, context: grpc.ServicerContext) -> str:
        return self._caller(context)[0]

    @staticmethod
    def _session(context: grpc.ServicerContext) -> str:
        """The caller's session token ("" for a client that sends none: one namespace
        for all such clients of an identity)."""
        for key, value in context.invocation_metadata() or ():
            if key == SESSION_METADATA:
                try:
                    return check_session(value)
                except ValueError as e:
                    raise NotAllowedError(str(e)) from None
        return ""

    def _client_key(self, context: grpc.ServicerContext, what: str) -> tuple[str, str]:
        who, role = self._caller(context)
        if role == PARTY or who in self._peers:
            raise NotAllowedError(
                f"identity {who!r} is a peer worker of {self.id!r} (a party certificate): it "
                f"may deliver protocol messages but not {what}; a client connects with a "
                f"client certificate (`python -m pointers certs DIR --client NAME`, then "
                f"pointers.connect(..., identity=NAME))"
            )
        return who, self._session(context)

    def _client(self, context: grpc.ServicerContext, what: str) -> ServedWorker:
        """The caller's namespace, busy until :meth:`_leave`."""
        return self._enter(*self._client_key(context, what))
