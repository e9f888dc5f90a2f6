"""Network workers: each party in its own process, over gRPC with mutual TLS.

* ``python -m pointers certs DIR ID...``: a development CA and one certificate per identity
  (:mod:`pointers.network.certs`);
* ``python -m pointers serve --id alice --port 7001 --certs DIR``: serve a worker
  (:mod:`pointers.network.server`);
* ``pointers.connect("alice", "127.0.0.1:7001", certs=DIR, identity="client")``: a
  :class:`NetworkWorker` that pointers and protocols use like a ``VirtualWorker``
  (:mod:`pointers.network.client`).

See ``docs/deployment.md``.
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
