"""Network workers: each party in its own process, over gRPC with mutual TLS.

* ``python -m pointers certs DIR ID...``: a development CA and one certificate per identity
  (:mod:`pointers.network.certs`);
* ``python -m pointers serve --id alice --port 7001 --certs DIR``: serve a worker
  (:mod:`pointers.network.server`);
* ``pointers.connect("alice", "127.0.0.1:7001", certs=DIR, identity="client")``: a
  :class:`NetworkWorker` that pointers and protocols use like a ``VirtualWorker``
  (:mod:`pointers.network.client`).

See ``docs/deployment.md``. One concept per module; each imports only the modules listed
before it (``tests/test_layering.py`` checks this order, and that no circle remains). The
client side and the server side share the first five and never import each other.

Shared by both sides:

* ``certs``: the project CA, identities, party and client certificates;
* ``transport``: gRPC channels and method names, keepalives, peer checks, errors;
* ``framing``: the envelope of a call (frames of messages), ``is_error_header``;
* ``context``: the message clock and error order of a client's connections;
* ``lease``: session tokens, and the client's heartbeat that renews its leases.

The client connection and its pipelining:

* ``replies``: what a client accepts in a reply, ``WorkerRestartedError``;
* ``calls``: queued items, calls in flight, and how a call's answer resolves them;
* ``connection``: one channel, its ordered queue and sender thread, pipelining, holds;
* ``client``: :class:`NetworkWorker` and :func:`connect`.

The served worker:

* ``config``: :class:`ServerConfig` and the worker functions packages declare;
* ``limits``: what objects and ops cost, and the store that counts them (limits);
* ``quotas``: program slots and handler threads, shared fairly among clients;
* ``waiting``: a namespace's store, whose lookups wait for deliveries and programs;
* ``served``: :class:`~pointers.network.served.ServedWorker`, one client session's namespace;
* ``dataplane``: bulk deliveries over persistent TLS sockets (the data plane);
* ``peers``: peer links, dialing peers, and taking their deliveries;
* ``sessions``: who calls, and the sessions and leases of their namespaces;
* ``server``: the control service (:class:`WorkerServer`) and :func:`serve`.

Then ``cluster`` (local worker processes for tests and benchmarks), which uses the client.
"""

import os


def _quiet_grpc_core() -> None:
    """gRPC core logs every failed TLS handshake at info level, and our errors already say
    what happened. It reads GRPC_VERBOSITY once, when grpc loads, so this runs here, before
    any module of this package imports grpc (an explicit GRPC_VERBOSITY wins). This package
    loads on first use of network workers, not with ``import pointers``."""
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")


_quiet_grpc_core()

from pointers.network.certs import create_certs, load_credentials  # noqa: E402
from pointers.network.client import NetworkWorker, connect  # noqa: E402
from pointers.network.config import ServerConfig  # noqa: E402
from pointers.network.context import DEFAULT_CONTEXT, ClientContext  # noqa: E402
from pointers.network.framing import FrameError, decode_envelope, encode_envelope  # noqa: E402
from pointers.network.server import WorkerServer, serve  # noqa: E402

__all__ = [
    "DEFAULT_CONTEXT",
    "ClientContext",
    "FrameError",
    "NetworkWorker",
    "ServerConfig",
    "WorkerServer",
    "connect",
    "create_certs",
    "decode_envelope",
    "encode_envelope",
    "load_credentials",
    "serve",
]
