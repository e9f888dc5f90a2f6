"""Ours against CrypTen 0.4.1 (2 processes over gloo), in one run.

Run by hand only (the test suite never imports it). CrypTen lives in its own virtual
environment, since it pins old dependencies::

    python3 -m venv /tmp/cvenv
    SKLEARN_ALLOW_DEPRECATED_SKLEARN_PACKAGE_INSTALL=True \\
        /tmp/cvenv/bin/pip install -c constraints.txt torch==2.13.0 crypten==0.4.1
    .venv/bin/python benchmarks/crypten_side_by_side.py --crypten-python /tmp/cvenv/bin/python

CrypTen 0.4.1 needs the deprecated ``sklearn`` placeholder package (hence the variable
above), and its ONNX converter imports ``torch.onnx._internal.registration``, which torch
2.13 no longer has: this script puts an empty stand-in module there before importing
crypten (only ``crypten.nn.from_onnx``/``from_pytorch`` would need it; LeNet is built
from ``crypten.nn`` modules instead).

The script first times CrypTen's workloads (this file run by ``--crypten-python`` with
``--crypten-only``: 2 ranks, one torch thread each, gloo over loopback, CrypTen's default
trusted-first-party provider (TFP, insecure with 2 parties: rank 0 deals), then again
with its trusted third party (TTP: ``crypten.mpc.provider.TTPServer`` as a third process,
rank 2, dealing as our crypto provider does; ``--functions`` runs TFP only); each op timed
at rank 0, median of ``--repeat`` runs after one warm-up), then ours (``python -m benchmarks --network``: 3 worker processes, mutual
TLS), and prints both with the ratio ours / CrypTen, and the CPU time per run of each
side (every process and thread: our client and 3 workers, CrypTen's 2 ranks; on a machine
with C cores a run takes at least its CPU time / C). Same workloads as docs/workloads.md: W1 mul
1e5 and 1e6 (with truncation), W2 matmul 256, W3 compare 1e4 and 1e6 (revealing the 0/1
result), W5 LeNet batch 1 (model and input private), W6 share + reconstruct 1e6.

``--functions`` compares the non-linear workloads instead, ours in process (``python -m
benchmarks`` without ``--network``: 2 parties and the crypto provider in one process) against
the same CrypTen setup, CrypTen's functions at its default settings: W9 ``x.sigmoid()`` of
4 randn 1e5, W10 ``x.softmax(dim=1)`` of 2 randn (1000, 100), W12 one training step
(forward, ``crypten.nn.CrossEntropyLoss`` on one-hot labels, backward,
``update_parameters(0.1)``) of the MLP 64-128-10 from ``crypten.nn`` on a batch of 64
random inputs in [0, 1] (model src 0, data src 1), W13 the ``TransformerEncoderLayer(64, 4,
256)`` (relu, post-norm, batch first) on a (1, 32, 64) input, written out in CrypTen's
tensor API (CrypTen cannot convert the torch module; weights encrypted from rank 0,
checked once against torch's layer before timing, error printed to stderr). CrypTen's
``x.reciprocal()`` on U(0.01, 100) and ``x.exp()`` on U(-8, 4) at 1e5 are printed after
the table, CrypTen only: ours times W11 as one row for its whole table of functions. The
table adds rounds: ours as ``mpc.stats()`` counts them, CrypTen's as the communicator
calls of rank 0 in one extra untimed run (``communicator.verbose``; each send, receive or
collective counts one, so the two are not quite the same measure).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

CASES = [("W1", 100_000), ("W1", 1_000_000), ("W2", 256), ("W3", 10_000), ("W3", 1_000_000)]
CASES += [("W5", 1), ("W6", 1_000_000)]
FUNCTION_CASES = [("W9", 100_000), ("W10", 1000), ("W12", 64), ("W13", 32)]
FUNCTION_CASES += [("W11r", 100_000), ("W11e", 100_000)]  # CrypTen only, after the table
FUNCTION_LABELS = {
    "W9": "W9 sigmoid 1e5",
    "W10": "W10 softmax 1000x100",
    "W12": "W12 train step b64",
    "W13": "W13 transformer 1x32x64",
    "W11r": "reciprocal 1e5",
    "W11e": "exp 1e5",
}
ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------- CrypTen side


def _crypten_worker(cases: list[list[Any]], repeat: int, rounds: bool = False) -> dict[str, float]:
    """Runs in each CrypTen rank; returns rank 0's medians by case id (and with ``rounds``
    the communicator calls of one more run, untimed, as ``<case id>:rounds``), and from
    every rank its CPU seconds per timed run (all its threads: ``<case id>:cpu<rank>``)."""
    import crypten
    import crypten.communicator as comm
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    out: dict[str, float] = {}
    for wid, n in cases:
        run = _crypten_case(crypten, torch, wid, n)
        run()
        times = []
        cpu = 0.0
        for _ in range(repeat):
            comm.get().barrier()
            c = time.process_time()
            t = time.perf_counter()
            run()
            times.append(time.perf_counter() - t)
            cpu += time.process_time() - c
        out[f"{wid}-{n}"] = statistics.median(times)
        out[f"{wid}-{n}:cpu{comm.get().get_rank()}"] = cpu / repeat
        if rounds:
            with crypten.cfg.temp_override({"communicator.verbose": True}):
                comm.get().reset_communication_stats()
                run()
                out[f"{wid}-{n}:rounds"] = comm.get().get_communication_stats()["rounds"]
    if comm.get().get_rank() == 0:
        return out
    return {k: v for k, v in out.items() if ":cpu" in k}


def _crypten_case(crypten: Any, torch: Any, wid: str, n: int) -> Any:
    if wid in ("W1", "W3"):
        x = crypten.cryptensor(torch.randn(n), src=0)
        y = crypten.cryptensor(torch.randn(n), src=1)
        if wid == "W1":
            return lambda: x * y
        return lambda: (x < y).get_plain_text()
    if wid == "W2":
        a = crypten.cryptensor(torch.randn(n, n), src=0)
        b = crypten.cryptensor(torch.randn(n, n), src=1)
        return lambda: a.matmul(b)
    if wid == "W5":
        cnn = crypten.nn
        model = cnn.Sequential(
            cnn.Conv2d(1, 16, 5),
            cnn.ReLU(),
            cnn.MaxPool2d(2),
            cnn.Conv2d(16, 16, 5),
            cnn.ReLU(),
            cnn.MaxPool2d(2),
            cnn.Flatten(),
            cnn.Linear(256, 100),
            cnn.ReLU(),
            cnn.Linear(100, 10),
        )
        model.encrypt(src=0)
        model.eval()
        x = crypten.cryptensor(torch.rand(n, 1, 28, 28), src=1)
        return lambda: model(x)
    if wid == "W6":
        plain = torch.randn(n)
        return lambda: crypten.cryptensor(plain, src=0).get_plain_text()
    if wid in ("W9", "W10", "W11r", "W11e"):
        if wid == "W9":
            x = crypten.cryptensor(4 * torch.randn(n), src=0)
            return lambda: x.sigmoid()
        if wid == "W10":
            x = crypten.cryptensor(2 * torch.randn(n, 100), src=0)
            return lambda: x.softmax(dim=1)
        if wid == "W11r":
            x = crypten.cryptensor(torch.rand(n) * (100 - 0.01) + 0.01, src=0)
            return lambda: x.reciprocal()
        x = crypten.cryptensor(torch.rand(n) * 12 - 8, src=0)
        return lambda: x.exp()
    if wid == "W12":
        return _crypten_train_step(crypten, torch, n)
    if wid == "W13":
        return _crypten_transformer(crypten, torch, n)
    raise ValueError(f"unknown workload {wid}")


def _crypten_train_step(crypten: Any, torch: Any, batch: int) -> Any:
    """W12: one SGD step (lr 0.1) of the MLP 64-128-10, model from rank 0, data from 1."""
    cnn = crypten.nn
    model = cnn.Sequential(cnn.Linear(64, 128), cnn.ReLU(), cnn.Linear(128, 10))
    model.encrypt(src=0)
    model.train()
    x = crypten.cryptensor(torch.rand(batch, 64), src=1)
    labels = torch.randint(0, 10, (batch,))
    y = crypten.cryptensor(torch.nn.functional.one_hot(labels, 10).float(), src=1)
    loss_fn = cnn.CrossEntropyLoss()

    def step() -> Any:
        model.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        model.update_parameters(0.1)
        return loss

    return step


def _crypten_transformer(crypten: Any, torch: Any, seq: int) -> Any:
    """W13: ``nn.TransformerEncoderLayer(64, 4, 256)`` (relu, post-norm, batch first) on a
    (1, seq, 64) input in CrypTen's tensor API, weights from rank 0, input from rank 1;
    checked once against torch's layer (max abs error printed to stderr by rank 0)."""
    d, heads = 64, 4
    hd = d // heads
    layer = torch.nn.TransformerEncoderLayer(d, heads, 256, dropout=0.0, batch_first=True)
    layer.eval()
    sd = {k: v.detach().clone() for k, v in layer.state_dict().items()}

    def enc(t: Any) -> Any:
        return crypten.cryptensor(t.contiguous(), src=0)

    w_in, b_in = sd["self_attn.in_proj_weight"], sd["self_attn.in_proj_bias"]
    wq, wk, wv = (enc(w_in[i * d : (i + 1) * d].t()) for i in range(3))
    bq, bk, bv = (enc(b_in[i * d : (i + 1) * d]) for i in range(3))
    wo, bo = enc(sd["self_attn.out_proj.weight"].t()), enc(sd["self_attn.out_proj.bias"])
    w1, b1 = enc(sd["linear1.weight"].t()), enc(sd["linear1.bias"])
    w2, b2 = enc(sd["linear2.weight"].t()), enc(sd["linear2.bias"])
    g1, be1 = enc(sd["norm1.weight"]), enc(sd["norm1.bias"])
    g2, be2 = enc(sd["norm2.weight"]), enc(sd["norm2.bias"])
    plain = torch.randn(1, seq, d)
    x = crypten.cryptensor(plain, src=1)

    def norm(y: Any, gamma: Any, beta: Any) -> Any:
        c = y - y.mean(-1, keepdim=True)
        var = (c * c).mean(-1, keepdim=True)
        return c * (var + layer.norm1.eps).inv_sqrt() * gamma + beta

    def forward() -> Any:
        x2 = x.view(seq, d)
        q, k, v = x2.matmul(wq) + bq, x2.matmul(wk) + bk, x2.matmul(wv) + bv
        outs = []
        for h in range(heads):
            s = slice(h * hd, (h + 1) * hd)
            scores = q[:, s].matmul(k[:, s].t()).div(hd**0.5)
            outs.append(scores.softmax(dim=-1).matmul(v[:, s]))
        y = norm(x2 + crypten.cat(outs, dim=1).matmul(wo) + bo, g1, be1)
        f = (y.matmul(w1) + b1).relu().matmul(w2) + b2
        return norm(y + f, g2, be2).view(1, seq, d)

    with torch.no_grad():
        ref = layer(plain)
    err = float((forward().get_plain_text() - ref).abs().max())
    if crypten.communicator.get().get_rank() == 0:
        verdict = "ok" if err <= 5e-2 else "TOO LARGE (> 5e-2)"
        print(f"W13 check: max abs err vs torch's layer {err:.2e}: {verdict}", file=sys.stderr)
    return forward


def crypten_only(
    cases: list[list[Any]], repeat: int, out: str, rounds: bool = False, provider: str = "TFP"
) -> None:
    """CrypTen's medians in ``out``; ``provider`` "TTP" runs CrypTen's trusted third party
    (``crypten.mpc.provider.TTPServer``, a third process that deals, as ours does)."""
    import types

    # crypten 0.4.1's ONNX converter imports a module torch 2.13 no longer has
    sys.modules.setdefault(
        "torch.onnx._internal.registration",
        types.ModuleType("torch.onnx._internal.registration"),
    )
    sys.modules["torch.onnx._internal.registration"].registry = None  # type: ignore[attr-defined]
    import crypten
    import crypten.mpc

    # run_multiprocess starts the TTPServer process (rank 2) when the provider is TTP;
    # the forked ranks inherit this setting
    crypten.cfg.mpc.provider = provider
    results: dict[str, float] = {}

    @crypten.mpc.run_multiprocess(world_size=2)
    def job() -> dict[str, float]:
        return _crypten_worker(cases, repeat, rounds)

    for r in job():
        if r:
            results.update(r)
    Path(out).write_text(json.dumps({"crypten": results}))


def _ours_functions(repeat: int) -> tuple[dict[str, float], dict[str, Any], list[str]]:
    """Ours in process on W9, W10, W12, W13 at the sizes of FUNCTION_CASES: medians and
    rounds by case id, and the rows' notes."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ours.json")
        cmd = [
            sys.executable, "-m", "benchmarks", "--no-progress", "--repeat", str(repeat),
            "--json", path, "--workloads", "W9,W10,W12,W13", "--sizes", "W9=1e5",
            "--sizes", "W10=1000", "--sizes", "W12=64", "--sizes", "W13=32",
        ]  # fmt: skip
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows = json.loads(Path(path).read_text())["rows"]
    sizes = dict(FUNCTION_CASES)
    times, rounds, notes = {}, {}, []
    for r in rows:
        wid = r["workload"]
        if wid not in sizes:
            continue
        key = f"{wid}-{sizes[wid]}"
        times[key], rounds[key] = r["median_s"], r.get("rounds")
        if r.get("notes"):
            notes.append(f"{wid} (ours): {r['notes']}")
        if r.get("error"):
            notes.append(f"{wid} (ours): error {r['error']}")
    return times, rounds, notes


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _ranks_cpu(theirs: dict[str, Any], key: str) -> float | None:
    cpus = [theirs.get(f"{key}:cpu{rank}") for rank in (0, 1)]
    return sum(c for c in cpus if c is not None) if all(c is not None for c in cpus) else None


def _ms(t: float | None) -> str:
    return f"{t * 1e3:.1f} ms" if t else "-"


def _functions_table(
    theirs: dict[str, Any], ours: dict[str, float], our_rounds: dict[str, Any]
) -> None:
    print(
        "| workload | ours, in process | CrypTen 0.4.1 | ratio | rounds, ours | rounds, CrypTen |"
    )
    print("|---|---|---|---|---|---|")
    for wid, n in FUNCTION_CASES:
        if wid.startswith("W11"):
            continue
        key = f"{wid}-{n}"
        a, b = ours.get(key), theirs.get(key)
        ratio = f"{a / b:.2f}x" if a and b else "-"
        ra, rb = our_rounds.get(key), theirs.get(f"{key}:rounds")
        ra, rb = "-" if ra is None else ra, "-" if rb is None else rb
        print(f"| {FUNCTION_LABELS[wid]} | {_ms(a)} | {_ms(b)} | {ratio} | {ra} | {rb} |")
    only = [
        f"{FUNCTION_LABELS[w]} {_ms(theirs.get(f'{w}-{n}'))}"
        f" ({theirs.get(f'{w}-{n}:rounds', '-')} rounds)"
        for w, n in FUNCTION_CASES
        if w.startswith("W11")
    ]
    print(
        "\nCrypTen only (W11; ours times its whole function table as one row): " + ", ".join(only)
    )


# ----------------------------------------------------------------------- both sides


def _ours(repeat: int, latency: float) -> dict[str, float]:
    """Our medians by case id, and our CPU per run (client and worker processes
    together) as ``<case id>:cpu``."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ours.json")
        cmd = [
            sys.executable, "-m", "benchmarks", "--network", "--no-progress",
            "--repeat", str(repeat), "--json", path,
            "--workloads", "W1,W2,W3,W5,W6", "--sizes", "1e5,1e6", "--sizes", "W2=256",
            "--sizes", "W3=1e4,1e6", "--sizes", "W5=1", "--sizes", "W6=1e6",
        ]  # fmt: skip
        if latency:
            cmd += ["--latency-ms", f"{latency:g}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows = json.loads(Path(path).read_text())["rows"]
    out = {}
    for r in rows:
        if r["workload"] == "W6" and r["elements"] != 1_000_000:
            continue
        if r["workload"] == "W1" and r["elements"] not in (100_000, 1_000_000):
            continue
        n = r["elements"] if r["workload"] != "W2" else 256
        n = 1 if r["workload"] == "W5" else n
        out[f"{r['workload']}-{n}"] = r["median_s"]
        if r.get("cpu_median_s") is not None:
            out[f"{r['workload']}-{n}:cpu"] = r["cpu_median_s"]
        moved = sum((r.get("bytes_per_party") or {}).values()) + (r.get("dealer_bytes") or 0)
        if moved:
            out[f"{r['workload']}-{n}:mb"] = moved / 1e6
    return out


def record_crypten(
    crypten_python: str, repeat: int, path: str, argv: list[str] | None = None
) -> None:
    """Time CrypTen's side of W1-W6 and W9, W10, W12, W13 (2 ranks over gloo, its default
    trusted-first-party provider) and add them to the results file at ``path`` as a run of
    their own (engine "CrypTen 0.4.1"), rows named as ours so the report sets them side
    by side."""
    from benchmarks import report, results
    from benchmarks.workloads import OPS, Case

    cases = [(w, n) for w, n in CASES + FUNCTION_CASES if w in OPS]
    meta: dict[str, Any] = report.machine_info()
    words = sys.argv[1:] if argv is None else argv
    meta.update(
        engine="CrypTen 0.4.1",
        workers="2 processes over gloo, its default trusted first party (rank 0 deals)",
        command=" ".join(["python -m benchmarks.crypten_side_by_side", *words]),
        repeat=repeat,
        torch_threads=1,
        load_before=meta.pop("load"),
    )
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "crypten.json")
        cmd = [crypten_python, __file__, "--crypten-only", out, "--repeat", str(repeat)]
        subprocess.run(cmd + ["--functions-rounds"], check=True)
        theirs = json.loads(Path(out).read_text())["crypten"]
    meta["load_after"] = report.load_average()
    rows = []
    for wid, n in cases:
        key = f"{wid}-{n}"
        if key not in theirs:
            continue
        case = Case(wid, n)
        rows.append(
            {
                "workload": wid,
                "op": OPS[wid],
                "size": case.id.rsplit("-", 1)[1],
                "name": case.id,
                "elements": n * n if wid == "W2" else n,
                "median_s": theirs[key],
                "cpu_median_s": _ranks_cpu(theirs, key),
                "rounds": theirs.get(f"{key}:rounds"),
            }
        )
    results.record(path, meta, rows)
    print(f"added CrypTen's {len(rows)} rows to {path}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crypten-python", default="/tmp/cvenv/bin/python")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument(
        "--functions",
        action="store_true",
        help="W9, W10, W12, W13 (ours in process) and CrypTen's reciprocal and exp "
        "instead of W1-W6 (ours over the network)",
    )
    ap.add_argument(
        "--record",
        metavar="FILE",
        help="time CrypTen alone (its default provider, W1-W6 and W9, W10, W12, W13) and add "
        "the rows to a results file (benchmarks/results/latest.json), beside ours",
    )
    ap.add_argument("--crypten-only", metavar="JSON", help=argparse.SUPPRESS)
    ap.add_argument("--provider", default="TFP", help=argparse.SUPPRESS)
    ap.add_argument("--functions-rounds", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cases = [[w, n] for w, n in (FUNCTION_CASES if args.functions else CASES)]
    if args.record:
        record_crypten(args.crypten_python, args.repeat, args.record, argv)
        return 0
    if args.crypten_only and args.functions_rounds:  # (--record: every case, with rounds)
        every = [[w, n] for w, n in CASES + FUNCTION_CASES if not w.startswith("W11")]
        crypten_only(every, args.repeat, args.crypten_only, True, args.provider)
        return 0
    if args.crypten_only:
        crypten_only(cases, args.repeat, args.crypten_only, args.functions, args.provider)
        return 0
    load_before = os.getloadavg()
    providers = ["TFP"] if args.functions else ["TFP", "TTP"]
    by_provider: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        for provider in providers:
            path = os.path.join(d, f"crypten-{provider}.json")
            cmd = [args.crypten_python, __file__, "--crypten-only", path]
            cmd += ["--repeat", str(args.repeat), "--provider", provider]
            subprocess.run(cmd + (["--functions"] if args.functions else []), check=True)
            by_provider[provider] = json.loads(Path(path).read_text())["crypten"]
    theirs = by_provider["TFP"]
    if args.functions:
        ours, our_rounds, notes = _ours_functions(args.repeat)
    else:
        ours = _ours(args.repeat, 0.0)
    load_after = os.getloadavg()
    print(f"load before {load_before}, after {load_after}; {time.strftime('%Y-%m-%d %H:%M')}")
    if args.functions:
        _functions_table(theirs, ours, our_rounds)
        for line in notes:
            print(line)
        return 0
    ttp = by_provider["TTP"]
    print(
        "| workload | ours, network | CrypTen TFP | CrypTen TTP | ours/TFP | ours/TTP "
        "| CPU per run, ours | CPU per MB moved, ours | CPU, CrypTen TFP | CPU, CrypTen TTP |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for wid, n in CASES:
        key = f"{wid}-{n}"
        a, b, c = ours.get(key), theirs.get(key), ttp.get(key)
        ca = ours.get(f"{key}:cpu")
        mb = ours.get(f"{key}:mb")
        per_mb = f"{ca * 1e3 / mb:.2f} ms" if ca and mb else "-"
        size = f"1e{len(str(n)) - 1}" if n >= 1000 and str(n).strip("0") == "1" else str(n)
        print(
            f"| {wid} {size} | {_ms(a)} | {_ms(b)} | {_ms(c)} | {_ratio(a, b)} | {_ratio(a, c)} "
            f"| {_ms(ca)} | {per_mb} | {_ms(_ranks_cpu(theirs, key))} "
            f"| {_ms(_ranks_cpu(ttp, key))} |"
        )
    print(
        "CPU per run: user + system seconds of every thread; ours: the client and the 3 worker "
        "processes (the mean of the timed runs), CrypTen: its 2 computing processes (rank 0 "
        "and 1; the TTP process is not counted). CPU per MB moved: ours, divided by the "
        "megabytes all our parties and the dealer sent in one run."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
