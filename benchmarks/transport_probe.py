"""One 8 MB transfer between two processes on loopback: a gRPC unary call over mutual TLS
vs a plain TLS 1.3 socket (stdlib ``ssl``, 4 MB socket buffers, sent from a memoryview of
the tensor, ``recv_into`` a preallocated tensor). Median wall time and CPU at both ends.

Then the cipher alone, in this process: TLS 1.3 records sealed and opened by the ``ssl``
module's OpenSSL (two ``SSLObject``s over memory BIOs, no socket), against AES-GCM of
``cryptography``'s own OpenSSL (what :class:`mpc.math.prg.PRG` uses). The data plane's
CPU per megabyte is bounded below by the first.

    python -m benchmarks.transport_probe [--mb 8] [--runs 30]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import ssl
import statistics
import struct
import tempfile
import time
from concurrent import futures
from typing import Any

import grpc
import torch

from pointers.network.certs import create_certs, party_name

BUF = 4 << 20


def _cpu() -> float:
    return time.process_time()  # (all threads of the process)


def _ctx(certs: str, who: str, server: bool) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.load_verify_locations(os.path.join(certs, "ca.pem"))
    ctx.load_cert_chain(os.path.join(certs, f"{who}.pem"), os.path.join(certs, f"{who}.key"))
    return ctx


def _recv_exact(sock: Any, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if not n:
            raise EOFError
        got += n


def _tls_server(certs: str, port_q: Any, nbytes: int, runs: int) -> None:
    ctx = _ctx(certs, "bob", server=True)
    ls = socket.create_server(("127.0.0.1", 0))
    port_q.put(ls.getsockname()[1])
    raw, _ = ls.accept()
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
    sock = ctx.wrap_socket(raw, server_side=True)
    cpu = 0.0
    for _ in range(runs):
        _recv_exact(sock, memoryview(bytearray(8)))
        c0 = _cpu()
        t = torch.empty(nbytes // 8, dtype=torch.int64)
        _recv_exact(sock, t.numpy().data.cast("B"))
        cpu += _cpu() - c0
        sock.sendall(b"k")
    sock.sendall(struct.pack(">d", cpu / runs))
    sock.close()


def probe_tls(certs: str, nbytes: int, runs: int) -> tuple[float, float, float]:
    q: Any = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_tls_server, args=(certs, q, nbytes, runs))
    p.start()
    port = q.get()
    raw = socket.create_connection(("127.0.0.1", port))
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, BUF)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, BUF)
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock = _ctx(certs, "alice", server=False).wrap_socket(raw, server_hostname=party_name("bob"))
    x = torch.randint(-(2**62), 2**62, (nbytes // 8,))
    walls, cpus = [], []
    for _ in range(runs):
        t0, c0 = time.perf_counter(), _cpu()
        sock.sendall(struct.pack(">Q", nbytes))
        sock.sendall(x.numpy().data.cast("B"))
        _recv_exact(sock, memoryview(bytearray(1)))
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    rcpu = struct.unpack(">d", _recv_all(sock, 8))[0]
    sock.close()
    p.join()
    return statistics.median(walls), statistics.median(cpus), rcpu


def _recv_all(sock: Any, n: int) -> bytes:
    b = bytearray(n)
    _recv_exact(sock, memoryview(b))
    return bytes(b)


def _grpc_server(certs: str, port_q: Any, done: Any) -> None:
    cpu = [0.0]

    def handler(req: bytes, ctx: Any) -> bytes:
        c0 = _cpu()
        t = torch.frombuffer(bytearray(req), dtype=torch.int64)  # as serde decodes it
        del t
        cpu[0] += _cpu() - c0
        return b"k"

    def report(req: bytes, ctx: Any) -> bytes:
        return struct.pack(">d", _cpu())

    server = grpc.server(
        futures.ThreadPoolExecutor(4),
        options=[
            ("grpc.max_send_message_length", 256 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
        ],
    )
    h = {
        "D": grpc.unary_unary_rpc_method_handler(handler),
        "C": grpc.unary_unary_rpc_method_handler(report),
    }
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("p", h),))
    read = lambda n: open(os.path.join(certs, n), "rb").read()  # noqa: E731
    creds = grpc.ssl_server_credentials(
        [(read("bob.key"), read("bob.pem"))],
        root_certificates=read("ca.pem"),
        require_client_auth=True,
    )
    port_q.put(server.add_secure_port("127.0.0.1:0", creds))
    server.start()
    done.wait()
    server.stop(0)


def probe_grpc(certs: str, nbytes: int, runs: int) -> tuple[float, float, float]:
    spawn = mp.get_context("spawn")
    q: Any = spawn.Queue()
    done = spawn.Event()
    p = spawn.Process(target=_grpc_server, args=(certs, q, done))
    p.start()
    port = q.get()
    read = lambda n: open(os.path.join(certs, n), "rb").read()  # noqa: E731
    creds = grpc.ssl_channel_credentials(read("ca.pem"), read("alice.key"), read("alice.pem"))
    ch = grpc.secure_channel(
        f"127.0.0.1:{port}",
        creds,
        options=[
            ("grpc.max_send_message_length", 256 << 20),
            ("grpc.max_receive_message_length", 256 << 20),
            ("grpc.ssl_target_name_override", party_name("bob")),
        ],
    )
    call, cpu_call = ch.unary_unary("/p/D"), ch.unary_unary("/p/C")
    x = torch.randint(-(2**62), 2**62, (nbytes // 8,))
    call(b"warmwarm")
    walls, cpus, rcpus = [], [], []
    for _ in range(runs):
        r0 = struct.unpack(">d", cpu_call(b""))[0]
        t0, c0 = time.perf_counter(), _cpu()
        call(x.numpy().data.cast("B").tobytes())  # (gRPC takes bytes: one copy)
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
        rcpus.append(struct.unpack(">d", cpu_call(b""))[0] - r0)
    done.set()
    ch.close()
    p.join()
    return statistics.median(walls), statistics.median(cpus), statistics.median(rcpus)


def _pump(src: ssl.SSLObject, out: ssl.MemoryBIO, into: ssl.MemoryBIO) -> None:
    data = out.read()
    if data:
        into.write(data)
    del src


def probe_cipher(certs: str, nbytes: int, runs: int) -> dict[str, float]:
    """CPU seconds (medians) to seal ``nbytes`` into TLS records and to open them with the
    ``ssl`` module, and to AES-GCM encrypt them with ``cryptography``."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    client = _ctx(certs, "alice", server=False).wrap_bio(
        c_in, c_out, server_hostname=party_name("bob")
    )
    server = _ctx(certs, "bob", server=True).wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):  # the handshake, in memory
        for side in (client, server):
            try:
                side.do_handshake()
            except ssl.SSLWantReadError:
                pass
        _pump(client, c_out, s_in)
        _pump(server, s_out, c_in)
    x = torch.randint(-(2**62), 2**62, (nbytes // 8,))
    plain = x.numpy().data.cast("B")
    got = torch.empty_like(x)
    view = got.numpy().data.cast("B")
    seal, open_, aes = [], [], []
    key = os.urandom(16)
    spare = bytearray(nbytes + 16)
    for _ in range(runs):
        c0 = _cpu()
        client.write(plain)
        records = c_out.read()
        c1 = _cpu()
        s_in.write(records)
        done = 0
        while done < nbytes:
            k: Any = server.read(nbytes - done, view[done:])  # (with a buffer: a count)
            done += k
        c2 = _cpu()
        enc = Cipher(algorithms.AES(key), modes.GCM(os.urandom(12))).encryptor()
        enc.update_into(plain, spare)
        c3 = _cpu()
        seal.append(c1 - c0)
        open_.append(c2 - c1)
        aes.append(c3 - c2)
    assert torch.equal(got, x)
    return {
        "seal": statistics.median(seal),
        "open": statistics.median(open_),
        "aes": statistics.median(aes),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=8)
    ap.add_argument("--runs", type=int, default=30)
    a = ap.parse_args()
    nbytes = int(a.mb * (1 << 20)) // 8 * 8
    with tempfile.TemporaryDirectory() as certs:
        create_certs(certs, ["alice", "bob"], clients=[])
        print(f"load {os.getloadavg()[0]:.2f}; {nbytes} bytes, median of {a.runs}")
        for name, fn in (("gRPC unary, mTLS", probe_grpc), ("TLS 1.3 socket", probe_tls)):
            wall, cpu_s, cpu_r = fn(certs, nbytes, a.runs)
            print(
                f"{name:18s} wall {wall * 1e3:6.2f} ms  CPU sender {cpu_s * 1e3:6.2f} ms  "
                f"receiver {cpu_r * 1e3:6.2f} ms"
            )
        from cryptography.hazmat.backends.openssl import backend

        c = probe_cipher(certs, nbytes, a.runs)
        mb = nbytes / 1e6
        print(
            f"TLS 1.3 records ({ssl.OPENSSL_VERSION}): sealing {c['seal'] * 1e3:6.2f} ms "
            f"({mb / c['seal'] / 1e3:.2f} GB/s), opening {c['open'] * 1e3:6.2f} ms "
            f"({mb / c['open'] / 1e3:.2f} GB/s) of CPU"
        )
        print(
            f"AES-128-GCM of cryptography ({backend.openssl_version_text()}): "
            f"{c['aes'] * 1e3:6.2f} ms ({mb / c['aes'] / 1e3:.2f} GB/s) of CPU"
        )


if __name__ == "__main__":
    main()
