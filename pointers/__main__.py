"""``python -m pointers``: certificates and served workers.

python -m pointers certs ./certs alice bob carol --client client
python -m pointers serve --id alice --host 127.0.0.1 --port 7001 --certs ./certs
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pointers.errors import NotAllowedError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pointers", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("certs", help="create a development CA and one certificate per identity")
    c.add_argument("directory", help="where ca.pem, ca.key and <id>.pem/<id>.key are written")
    c.add_argument("ids", nargs="*", metavar="ID", help="parties (workers: role:party)")
    c.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="ID",
        help="a client identity (role:client; repeatable)",
    )
    c.add_argument("--days", type=int, default=365, help="validity of each certificate")
    c.add_argument(
        "--host",
        action="append",
        default=[],
        metavar="NAME_OR_IP",
        help="an extra DNS name or IP the certificates are valid for (repeatable); "
        "localhost, 127.0.0.1 and ::1 are always included",
    )

    s = sub.add_parser("serve", help="serve a worker over gRPC with mutual TLS")
    s.add_argument("--id", required=True, help="the worker's id (its certificate's identity)")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    s.add_argument("--port", type=int, default=7001, help="port (0: any free port)")
    s.add_argument("--certs", help="directory made by `python -m pointers certs`")
    s.add_argument(
        "--insecure",
        action="store_true",
        help="no TLS and no authentication; allowed on loopback addresses only",
    )
    s.add_argument(
        "--deadline",
        type=float,
        default=10.0,
        help="seconds to wait for an object a peer delivers before failing (default 10)",
    )
    s.add_argument(
        "--max-message-mb", type=float, default=256, help="largest message accepted (MiB)"
    )
    s.add_argument(
        "--max-stored-mb",
        type=float,
        default=4096,
        help="most bytes each client session may store at this worker, programs, plans and "
        "tags included; an op is refused before it runs if its output would pass it "
        "(MiB; 0: no limit)",
    )
    s.add_argument(
        "--max-objects",
        type=int,
        default=100_000,
        help="most objects each client session may store at this worker (0: no limit)",
    )
    s.add_argument(
        "--lease",
        type=float,
        default=60.0,
        help="seconds after a client session's last call (a living client renews its lease "
        "in the background) until the worker frees its objects, programs, plans and tags "
        "(default 60)",
    )
    s.add_argument(
        "--max-sessions",
        type=int,
        default=16,
        help="open sessions per client identity (each process of a client is one; default 16)",
    )
    s.add_argument(
        "--programs-per-client",
        type=int,
        default=4,
        help="programs (mpc.plan) one client session runs at once (default 4)",
    )
    s.add_argument(
        "--programs-per-worker",
        type=int,
        default=32,
        help="programs the worker runs at once, all clients together (default 32)",
    )
    s.add_argument(
        "--max-queued-programs",
        type=int,
        default=256,
        help="programs a client session may have waiting to run (default 256)",
    )
    s.add_argument("--threads", type=int, default=32, help="gRPC server threads")
    s.add_argument(
        "--peer",
        action="append",
        default=[],
        metavar="NAME=HOST:PORT",
        help="a peer worker this one may deliver to (repeatable); when given, clients can "
        "only introduce these peers, at these addresses",
    )
    s.add_argument(
        "--watch-stdin",
        action="store_true",
        help="stop when standard input closes (a supervisor or test harness holds it open)",
    )
    s.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="milliseconds to sleep before handling each command batch (Exec) or peer "
        "delivery (Deliver) call received; replies and inspections are not delayed "
        "(benchmarks: the cost of rounds)",
    )
    s.add_argument(
        "--torch-threads", type=int, default=0, help="torch intra-op threads (0: default)"
    )
    s.add_argument(
        "--data-plane",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="deliver bulk tensors (64 KiB and more) to peers that serve one too over "
        "persistent mutual-TLS sockets instead of gRPC (the default; --no-data-plane or "
        "POINTERS_DATA_PLANE=0: every delivery over gRPC)",
    )
    s.add_argument(
        "--data-port", type=int, default=0, help="TCP port of the data plane (0: a free one)"
    )
    s.add_argument(
        "--offer",
        metavar="FILE",
        help="a model owner's policy for the values it shares from this worker: its "
        "approvals and its registered values, as mpc.save_offer writes them (held values, "
        "docs/security.md)",
    )
    s.add_argument(
        "--data",
        metavar="FILE",
        help="a data owner's data, served from this worker as the owner's (pointers.save_data "
        "writes the file): clients find it by its tags and use it only as the owner allows "
        "(docs/security.md)",
    )
    s.add_argument(
        "--owner",
        action="append",
        default=[],
        metavar="NAME",
        help="a data owner of this deployment (repeatable): as a party, this worker adds "
        "shares of listed owners' values only; never a --peer worker",
    )
    s.add_argument(
        "--min-owners",
        type=int,
        default=2,
        help="the least number of distinct listed owners an aggregate spans (default 2)",
    )
    s.add_argument(
        "--max-weight",
        type=int,
        default=1 << 16,
        help="the largest weight (an owner's count) of a value this party adds into an "
        "aggregate (default 65536)",
    )
    s.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="NAME:OUTPUT:ERROR[:INDEX]",
        help="for tests of the malicious mode only (refused unless the environment sets "
        "POINTERS_ALLOW_FAULTS=1): function NAME adds ERROR to a word of its output OUTPUT "
        "at INDEX (comma-separated), as a cheating party would (repeatable)",
    )
    return p


def _peer(text: str) -> tuple[str, str]:
    name, sep, address = text.partition("=")
    if not sep or not name or not address:
        raise ValueError(f"--peer takes NAME=HOST:PORT, got {text!r}")
    return name, address


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "certs":
        from pointers.network.certs import DEFAULT_HOSTS, create_certs

        try:
            written = create_certs(
                args.directory,
                args.ids,
                clients=args.client,
                days=args.days,
                hosts=[*DEFAULT_HOSTS, *args.host],
            )
        except ValueError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for path in written:
            print(path)
        return 0

    import torch

    from pointers.network.config import ServerConfig
    from pointers.network.server import serve

    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    try:
        faults: tuple[Any, ...] = ()
        if args.fault:
            from pointers.worker.faults import check_allowed, parse_fault

            check_allowed()
            faults = tuple(parse_fault(f) for f in args.fault)
        offer = None
        if args.offer:
            from pointers.worker.policy import load_offer

            offer = load_offer(args.offer)
        from pointers.worker.owners import DataPolicy, load_data

        data_owners = DataPolicy(
            args.owner,
            min_owners=args.min_owners,
            max_weight=args.max_weight,
            data=load_data(args.data) if args.data else (),
        )
        config = ServerConfig(
            worker_id=args.id,
            host=args.host,
            port=args.port,
            certs=args.certs,
            insecure=args.insecure,
            deadline=args.deadline,
            max_message_bytes=int(args.max_message_mb * (1 << 20)),
            max_stored_bytes=int(args.max_stored_mb * (1 << 20)) or None,
            threads=args.threads,
            latency=args.latency_ms / 1000,
            peers=tuple(_peer(p) for p in args.peer),
            lease=args.lease,
            max_sessions=args.max_sessions,
            max_objects=args.max_objects or None,
            programs_per_client=args.programs_per_client,
            programs_per_worker=args.programs_per_worker,
            max_queued_programs=args.max_queued_programs,
            data_port=args.data_port,
            offer=offer,
            data_owners=data_owners,
            faults=faults,
            **({} if args.data_plane is None else {"data_plane": args.data_plane}),
        )
        serve(config, watch_stdin=args.watch_stdin, exit_when_stopped=True)
    except (ValueError, OSError, FileNotFoundError, NotAllowedError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
