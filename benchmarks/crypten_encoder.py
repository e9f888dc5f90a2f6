"""BERT-base encoder layers: CrypTen 0.4.1 written by hand against ours, in one run.

Run by hand only (the test suite never imports it). CrypTen lives in its own virtual
environment (see ``benchmarks/crypten_side_by_side.py`` for why and for the stand-in
module it needs under torch 2.13)::

    python3 -m venv /tmp/cvenv
    SKLEARN_ALLOW_DEPRECATED_SKLEARN_PACKAGE_INSTALL=True \\
        /tmp/cvenv/bin/pip install -c constraints.txt torch==2.13.0 crypten==0.4.1
    .venv/bin/python benchmarks/crypten_encoder.py --layers 1     # a few minutes
    .venv/bin/python benchmarks/crypten_encoder.py                # 12 layers, tens of minutes

CrypTen cannot convert the Hugging Face model (docs/benchmarks.md, "CrypTen on the same
models"), so issue 23's W14 goal compares against BERT-base's encoder written by hand in
CrypTen's tensor API. This script (in the project's environment) builds
``BertModel(BertConfig())`` after ``torch.manual_seed(0)`` (W14's model,
``benchmarks.workloads.hf.hf_model``), takes its first ``--layers`` encoder layers
(hidden 768, 12 heads, intermediate 3072, layer-norm eps 1e-12) and a (1, ``--seq``, 768)
input ``torch.randn`` after ``torch.manual_seed(0)``, and computes the float32 reference:
those layers as transformers runs them (checked against the same math written out in
torch below). Then it runs itself in CrypTen's environment (``--crypten-python``) once
per provider: 2 ranks over gloo, one torch thread each, weights encrypted from rank 0, the
input from rank 1, CrypTen's default settings (16 fractional bits), with

- **TTP**: ``crypten.cfg.mpc.provider = "TTP"``: ``run_multiprocess`` starts CrypTen's
  ``TTPServer`` as a third process that deals, the trust model ours has (a separate
  crypto provider);
- **TFP**: CrypTen's default trusted first party: rank 0 deals (insecure with 2 parties;
  a reference only).

The layer, post-norm as BERT's: ``q, k, v = x Wq + bq, ...``; per head (the 12 heads as
one batched matmul) ``softmax(q k^T / 8)`` (CrypTen's ``softmax``: max, exp, reciprocal)
times ``v``; ``O``; ``LN(x + attn)``; ``FF = GELU(y W1 + b1) W2 + b2`` with the exact,
erf-based GELU ``0.5 h (1 + erf(h / sqrt 2))`` that BERT uses; erf is CrypTen's Taylor
series at its default length (``erf_iterations`` 8: good for |h / sqrt 2| up to about 2,
where these pre-activations lie: 2e-3 max error on the layer in float32), written out here
(``taylor_erf``) because CrypTen's own ``erf`` is wrong: it computes the odd powers with
``pow(2n + 1)``, and CrypTen 0.4.1's ``pow`` of an odd p > 3 returns x^(3(p - 1)/2)
(``x.square().mul_(x).pow((p - 1) // 2)``), so its GELU was off by up to 3.9 on one
layer's pre-activations (``--gelu crypten`` uses it anyway); ``LN(y + FF)``; each layer norm written out: the mean, the
variance, CrypTen's ``inv_sqrt`` of ``var + eps``, times gamma plus beta.

One untimed run first (the warm-up; its output, revealed, gives the max and mean abs error
against the float32 reference), then ``--repeat`` timed runs of all the layers (rank 0's
wall clock after a barrier; the median, and each layer's time within the runs). Then ours,
in this process (``--ours``):

- ``layers`` (default): the same layers and input, ``mpc.share``d (weights and input from
  the client, 2 parties and the crypto provider in process, one torch thread), run as
  transformers' ``BertEncoder`` on the shared input: one warm-up, ``--repeat`` timed runs,
  the rounds and bytes of one more run, its error against the same reference;
- ``w14``: ``python -m benchmarks --workloads W14 --repeat 1`` as a subprocess (the whole
  model, embeddings of private ids and the pooler included: the goal's workload; with
  ``--layers 12`` only);
- ``both``, or ``none``.

It prints one table: time per layer and for all the layers, error, and the ratios
ours / CrypTen TTP and ours / CrypTen TFP. The processes share this machine's cores, so
times compare only within one run; the load average is printed. Memory at 12 layers:
CrypTen's ranks about 1.6 GB each; ours peaks at about 6.1 GB in this process (``layers``)
and 7.4 GB in W14's (``w14``, run first, while this one holds about 0.9 GB).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HIDDEN, HEADS = 768, 12

# our name: (transformers' BertLayer key, transposed: stored as in x out)
KEYS = {
    "q_w": ("attention.self.query.weight", True),
    "q_b": ("attention.self.query.bias", False),
    "k_w": ("attention.self.key.weight", True),
    "k_b": ("attention.self.key.bias", False),
    "v_w": ("attention.self.value.weight", True),
    "v_b": ("attention.self.value.bias", False),
    "o_w": ("attention.output.dense.weight", True),
    "o_b": ("attention.output.dense.bias", False),
    "ln1_g": ("attention.output.LayerNorm.weight", False),
    "ln1_b": ("attention.output.LayerNorm.bias", False),
    "i_w": ("intermediate.dense.weight", True),
    "i_b": ("intermediate.dense.bias", False),
    "f_w": ("output.dense.weight", True),
    "f_b": ("output.dense.bias", False),
    "ln2_g": ("output.LayerNorm.weight", False),
    "ln2_b": ("output.LayerNorm.bias", False),
}


# ----------------------------------------------------------------------- the layer


def encoder_layer(x: Any, p: dict[str, Any], eps: float, erf: Any, heads: int = HEADS) -> Any:
    """One post-norm BERT layer on ``x`` of shape (seq, hidden), in whichever tensor API
    ``x`` and ``p`` belong to (torch or CrypTen: the same methods); ``erf(t)`` computes
    erf elementwise."""
    seq, hidden = x.size(0), x.size(1)
    hd = hidden // heads

    def split(t: Any) -> Any:  # (seq, hidden) -> (heads, seq, hd)
        return t.view(seq, heads, hd).transpose(0, 1)

    q = split(x.matmul(p["q_w"]) + p["q_b"])
    k = split(x.matmul(p["k_w"]) + p["k_b"])
    v = split(x.matmul(p["v_w"]) + p["v_b"])
    scores = q.matmul(k.transpose(1, 2)).div(hd**0.5)
    ctx = scores.softmax(dim=-1).matmul(v).transpose(0, 1).reshape(seq, hidden)
    y = layer_norm(x + ctx.matmul(p["o_w"]) + p["o_b"], p["ln1_g"], p["ln1_b"], eps)
    h = y.matmul(p["i_w"]) + p["i_b"]
    gelu = h * (erf(h * 2**-0.5) + 1) * 0.5
    return layer_norm(y + gelu.matmul(p["f_w"]) + p["f_b"], p["ln2_g"], p["ln2_b"], eps)


def taylor_erf(t: Any, terms: int = 8) -> Any:
    """erf as CrypTen's Taylor series, 2/sqrt(pi) sum_n (-1)^n t^(2n+1) / (n! (2n+1)), n up
    to ``terms``, with each odd power the previous times t^2 (one multiply per term)."""
    t2 = t * t
    power, out = t, t
    for n in range(1, terms + 1):
        power = power * t2
        out = out + power * ((-1) ** n / (math.factorial(n) * (2 * n + 1)))
    return out * (2 / math.sqrt(math.pi))


def layer_norm(y: Any, gamma: Any, beta: Any, eps: float) -> Any:
    c = y - y.mean(-1, keepdim=True)
    var = (c * c).mean(-1, keepdim=True)
    var = var + eps
    inv = var.inv_sqrt() if hasattr(var, "inv_sqrt") else var.rsqrt()  # CrypTen's, torch's
    return c * inv * gamma + beta


# ----------------------------------------------------------------------- CrypTen side


def _crypten_worker(data_path: str, repeat: int, gelu: str) -> dict[str, Any]:
    """Runs in each CrypTen rank: rank 0 returns its times and the error, every rank its
    CPU seconds per timed run."""
    import crypten
    import crypten.communicator as comm
    import torch

    torch.set_num_threads(1)
    data = torch.load(data_path)
    rank = comm.get().get_rank()
    eps = data["eps"]
    layers = [
        {k: crypten.cryptensor(v.contiguous(), src=0) for k, v in sd.items()}
        for sd in data["layers"]
    ]
    x = crypten.cryptensor(data["x"].view(-1, HIDDEN).contiguous(), src=1)
    ref = data["ref"].view(-1, HIDDEN)
    erf = (lambda t: t.erf()) if gelu == "crypten" else taylor_erf

    def forward(marks: list[float] | None = None) -> Any:
        h = x
        for p in layers:
            h = encoder_layer(h, p, eps, erf)
            if marks is not None:
                marks.append(time.perf_counter())
        return h

    out = forward().get_plain_text()
    err = (out.double() - ref.double()).abs()
    times, per_layer = [], []
    cpu = 0.0
    for _ in range(repeat):
        comm.get().barrier()
        c = time.process_time()
        t = time.perf_counter()
        marks = [t]
        forward(marks)
        times.append(time.perf_counter() - t)
        cpu += time.process_time() - c
        per_layer += [b - a for a, b in zip(marks, marks[1:])]
    res: dict[str, Any] = {f"cpu{rank}": cpu / repeat}
    if rank == 0:
        res.update(
            median_s=statistics.median(times),
            times=times,
            per_layer=per_layer,
            max_abs_err=float(err.max()),
            mean_abs_err=float(err.mean()),
        )
    return res


def crypten_only(data_path: str, repeat: int, out: str, provider: str, gelu: str) -> None:
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
    results: dict[str, Any] = {}

    @crypten.mpc.run_multiprocess(world_size=2)
    def job() -> dict[str, Any]:
        return _crypten_worker(data_path, repeat, gelu)

    for r in job():
        if r:
            results.update(r)
    Path(out).write_text(json.dumps(results))


# ----------------------------------------------------------------------- our side


def _build(layers: int, seq: int, data_path: str) -> tuple[Any, Any, Any]:
    """W14's model, its first ``layers`` encoder layers as a ``BertEncoder``, the input and
    the float32 reference; writes the layers' weights (in x out), input and reference to
    ``data_path`` for the CrypTen side."""
    import torch

    from benchmarks.workloads.hf import hf_model

    model = hf_model("bert")
    encoder = model.encoder
    encoder.layer = encoder.layer[:layers]
    encoder.config.num_hidden_layers = layers
    del model
    torch.manual_seed(0)
    x = torch.randn(1, seq, HIDDEN)
    with torch.no_grad():
        ref = encoder(x).last_hidden_state
    eps = float(encoder.layer[0].output.LayerNorm.eps)
    sds = []
    for layer in encoder.layer:
        sd = layer.state_dict()
        sds.append({k: (sd[n].t() if tr else sd[n]).contiguous() for k, (n, tr) in KEYS.items()})
    with torch.no_grad():  # the hand-written math must be the model's
        h = x.view(seq, HIDDEN)
        for p in sds:
            h = encoder_layer(h, p, eps, torch.erf)
        diff = float((h - ref.view(seq, HIDDEN)).abs().max())
    if diff > 1e-3:
        raise AssertionError(f"the hand-written layer differs from transformers' by {diff:.2e}")
    torch.save({"layers": sds, "x": x, "ref": ref, "eps": eps}, data_path)
    return encoder, x, ref


def _ours_layers(encoder: Any, x: Any, ref: Any, repeat: int) -> dict[str, Any]:
    """The same layers in our engine, in process: the median of ``repeat`` runs, rounds
    and bytes per party of one more run, the error of its output."""
    import torch

    import mpc
    from benchmarks.workloads import workers
    from benchmarks.workloads.workers import _parties

    torch.set_num_threads(1)
    ws, carol = _parties(2)
    shared = mpc.share(encoder, *ws, crypto_provider=carol, config=workers.CONFIG)
    xs = mpc.share(x, *ws, crypto_provider=carol)

    def run() -> Any:
        with torch.no_grad():
            return shared(xs).last_hidden_state

    out = run().get()  # the warm-up
    err = (out.double() - ref.double()).abs()
    times = []
    cpu = 0.0
    for _ in range(repeat):
        c = time.process_time()
        t = time.perf_counter()
        run()
        times.append(time.perf_counter() - t)
        cpu += time.process_time() - c
    with mpc.stats() as s:
        run()
    return {
        "median_s": statistics.median(times),
        "cpu": cpu / repeat,
        "max_abs_err": float(err.max()),
        "mean_abs_err": float(err.mean()),
        "rounds": s.rounds,
        "bytes_per_party": s.max_bytes_per_party,
    }


def _ours_w14(repeat: int) -> dict[str, Any]:
    """``python -m benchmarks --workloads W14`` (BERT-base, 128 private ids), its row."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "ours.json")
        cmd = [sys.executable, "-m", "benchmarks", "--no-progress", "--workloads", "W14"]
        cmd += ["--repeat", str(repeat), "--json", path]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        row = json.loads(Path(path).read_text())["rows"][0]
    return {
        "median_s": row["median_s"],
        "cpu": row.get("cpu_median_s"),
        "max_abs_err": row.get("max_abs_err"),
        "mean_abs_err": row.get("mean_abs_err"),
        "rounds": row.get("rounds"),
        "bytes_per_party": max((row.get("bytes_per_party") or {0: 0}).values()),
    }


# ----------------------------------------------------------------------- the table


def _s(t: float | None) -> str:
    return f"{t:.2f} s" if t else "-"


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a and b else "-"


def _table(
    n: int, seq: int, theirs: dict[str, dict[str, Any]], ours: dict[str, dict[str, Any]]
) -> None:
    ttp = theirs.get("TTP", {}).get("median_s")
    tfp = theirs.get("TFP", {}).get("median_s")
    print(
        f"| {n} BERT-base layers, seq {seq} | per layer | {n} layers | CPU per run "
        "| max / mean abs err | rounds | bytes/party | ours/TTP | ours/TFP |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    rows = [(f"CrypTen 0.4.1 {p}", theirs[p]) for p in ("TTP", "TFP") if p in theirs]
    labels = {"layers": f"ours, the same {n} layers", "w14": "ours, W14 (whole BertModel)"}
    rows += [(labels[k], v) for k, v in ours.items()]
    for label, r in rows:
        t = r["median_s"]
        if label.startswith("CrypTen"):
            cpu = sum(r.get(f"cpu{k}", 0.0) for k in (0, 1))
            per = r.get("per_layer") or [t / n]
            per_s = f"{statistics.median(per):.2f} s ({min(per):.2f}-{max(per):.2f})"
            ratios = "- | -"
            rounds, mb = "-", "-"
        else:
            cpu = r.get("cpu")
            per_s = f"{t / n:.2f} s"
            ratios = f"{_ratio(t, ttp)} | {_ratio(t, tfp)}"
            rounds = str(r.get("rounds", "-"))
            b = r.get("bytes_per_party")
            mb = f"{b / 1e6:,.0f} MB" if b else "-"
        err = f"{r['max_abs_err']:.2e} / {r['mean_abs_err']:.2e}"
        print(f"| {label} | {per_s} | {_s(t)} | {_s(cpu)} | {err} | {rounds} | {mb} | {ratios} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--crypten-python", default="/tmp/cvenv/bin/python")
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per side (default 1)")
    ap.add_argument("--providers", default="TTP,TFP", help="CrypTen's, comma-separated")
    ap.add_argument("--ours", choices=["layers", "w14", "both", "none"], default="layers")
    ap.add_argument(
        "--gelu",
        choices=["taylor", "crypten"],
        default="taylor",
        help="CrypTen's erf: its Taylor series written out (default) or its own x.erf()",
    )
    ap.add_argument("--crypten-only", metavar="JSON", help=argparse.SUPPRESS)
    ap.add_argument("--data", help=argparse.SUPPRESS)
    ap.add_argument("--provider", default="TTP", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.crypten_only:
        crypten_only(args.data, args.repeat, args.crypten_only, args.provider, args.gelu)
        return 0
    if str(ROOT) not in sys.path:  # run as a script: the project's packages
        sys.path.insert(0, str(ROOT))
    if args.ours in ("w14", "both") and (args.layers != 12 or args.seq != 128):
        ap.error("--ours w14 runs W14: 12 layers, sequence 128")
    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    theirs: dict[str, dict[str, Any]] = {}
    ours: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as d:
        data = os.path.join(d, "layers.pt")
        encoder, x, ref = _build(args.layers, args.seq, data)
        for provider in [p for p in args.providers.split(",") if p]:
            out = os.path.join(d, f"crypten-{provider}.json")
            cmd = [args.crypten_python, __file__, "--crypten-only", out, "--data", data]
            cmd += ["--repeat", str(args.repeat), "--provider", provider, "--gelu", args.gelu]
            subprocess.run(cmd, check=True)
            theirs[provider] = json.loads(Path(out).read_text())
            print(f"CrypTen {provider}: {theirs[provider]}", file=sys.stderr, flush=True)
    if args.ours in ("w14", "both"):  # first: this process holds little while it runs
        ours["w14"] = _ours_w14(args.repeat)
        print(f"ours, W14: {ours['w14']}", file=sys.stderr, flush=True)
    if args.ours in ("layers", "both"):
        ours["layers"] = _ours_layers(encoder, x, ref, args.repeat)
        print(f"ours, layers: {ours['layers']}", file=sys.stderr, flush=True)
    load_after = os.getloadavg()
    print(
        f"started {started}, ended {time.strftime('%H:%M:%S')}; load average before "
        f"{load_before}, after {load_after} on {os.cpu_count()} cores; repeat {args.repeat}; "
        f"GELU's erf: {args.gelu}"
    )
    _table(args.layers, args.seq, theirs, ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
