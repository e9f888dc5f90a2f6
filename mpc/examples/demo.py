"""The main demo: encrypted inference of a CNN trained on scikit-learn's digits.

Run with ``python -m mpc.examples.demo`` (or ``make demo``). Three in-process workers: ``alice``
and ``bob`` hold the shares, ``carol`` is the crypto provider. The model owner shares the
trained model, the data owner shares the test images, the parties evaluate the unmodified
``nn.Sequential`` on shares, and only the logits are reconstructed at the caller.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import torch

import mpc
import pointers as pt
from mpc.examples.digits import load_digits_split, train_digits_cnn


def encrypted_inference(parties: int = 2, batch: int = 150, seed: int = 0) -> dict[str, float]:
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model, plain_acc = train_digits_cnn(seed=seed)
    _, _, x_test, y_test = load_digits_split(seed=seed)
    train_s = time.perf_counter() - t0
    print(f"trained the digits CNN in {train_s:.1f} s: plaintext test accuracy {plain_acc:.2%}")
    with torch.no_grad():
        plain_pred = model(x_test).argmax(dim=1)

    workers = [pt.VirtualWorker(name) for name in ("alice", "bob", "dave", "erin", "frank")]
    party_list = workers[:parties]
    carol = pt.VirtualWorker("carol")
    mpc.share(model, *party_list, crypto_provider=carol)

    preds = []
    t1 = time.perf_counter()
    with mpc.stats() as s:
        for start in range(0, len(x_test), batch):
            x = mpc.share(x_test[start : start + batch], *party_list, crypto_provider=carol)
            logits = model(x).get()
            preds.append(logits.argmax(dim=1))
            done = min(start + batch, len(x_test))
            print(f"  encrypted inference: {done}/{len(x_test)} images", end="\r", flush=True)
    secs = time.perf_counter() - t1
    print()
    enc_pred = torch.cat(preds)
    enc_acc = (enc_pred == y_test).float().mean().item()
    agree = (enc_pred == plain_pred).float().mean().item()
    per_party = s.max_bytes_per_party
    print(f"encrypted test accuracy {enc_acc:.2%} (plaintext {plain_acc:.2%})")
    print(f"argmax agreement encrypted vs plaintext: {agree:.2%} of {len(x_test)} images")
    print(
        f"{len(x_test)} images in {secs:.2f} s ({secs / len(x_test) * 1e3:.1f} ms/image), "
        f"{parties} parties + crypto provider"
    )
    print(
        f"communication: {s.rounds} rounds, {per_party / 2**20:.1f} MiB sent per party, "
        f"{s.dealer_bytes / 2**20:.1f} MiB from the crypto provider, "
        f"{s.client_messages} client messages"
    )
    return {"accuracy": enc_acc, "plain_accuracy": plain_acc, "agreement": agree, "seconds": secs}


def _done(t: torch.Tensor) -> torch.Tensor:
    """Apply a pending truncation now, so that the timing includes it."""
    return t.materialize() if isinstance(t, mpc.SharedTensor) else t


# (name, size, make the plaintext inputs, the op)
_Case = tuple[str, str, Callable[[], tuple[torch.Tensor, ...]], Callable[..., Any]]


def quick_benchmarks(n: int = 100_000, matmul: int = 256) -> list[dict[str, Any]]:
    """A short table: elementwise mul, matmul, comparison, ReLU on 2 parties; returns its
    rows. Each row's time, rounds and bytes are those of the whole op: work the engine
    defers (a ReLU runs at its first read) runs by the end of the ``mpc.stats`` block."""
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))

    def share(t: torch.Tensor) -> mpc.SharedTensor:
        return mpc.share(t, alice, bob, crypto_provider=carol)

    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(0)  # plaintext demo inputs, not shares

    def randn(*shape: int) -> torch.Tensor:
        return torch.empty(shape).normal_(generator=gen)

    cases: list[_Case] = [
        ("mul", f"n={n:.0e}", lambda: (randn(n), randn(n)), lambda a, b: _done(a * b)),
        (
            "matmul",
            f"{matmul}x{matmul}",
            lambda: (randn(matmul, matmul), randn(matmul, matmul)),
            lambda a, b: _done(a @ b),
        ),
        ("compare", f"n={n:.0e}", lambda: (randn(n), randn(n)), torch.lt),
        ("relu", f"n={n:.0e}", lambda: (randn(n),), torch.relu),
    ]
    for name, size, make, op in cases:
        inputs = make()
        shared = [share(t) for t in inputs]
        op(*shared)  # warm up
        t0 = time.perf_counter()
        with mpc.stats() as s:  # (a deferred ReLU runs by the block's end, timed here)
            out = op(*shared)
        secs = time.perf_counter() - t0
        out.get()
        t0 = time.perf_counter()
        op(*inputs)
        plain = time.perf_counter() - t0
        rows.append(
            {
                "name": name,
                "size": size,
                "seconds": secs,
                "x_plain": secs / max(plain, 1e-9),
                "rounds": s.rounds,
                "bytes_per_party": s.max_bytes_per_party,
            }
        )
    print(
        f"\n{'workload':<10}{'size':<10}{'time':>10}{'x plain':>10}{'rounds':>8}{'MiB/party':>11}"
    )
    for r in rows:
        print(
            f"{r['name']:<10}{r['size']:<10}{r['seconds'] * 1e3:>8.1f}ms{r['x_plain']:>10.0f}"
            f"{r['rounds']:>8}{r['bytes_per_party'] / 2**20:>11.2f}"
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parties", type=int, default=2, help="computing parties (2-5)")
    parser.add_argument("--batch", type=int, default=150, help="images per encrypted batch")
    parser.add_argument("--no-bench", action="store_true", help="skip the benchmark table")
    args = parser.parse_args(argv)
    encrypted_inference(parties=args.parties, batch=args.batch)
    if not args.no_bench:
        quick_benchmarks()


if __name__ == "__main__":
    main()
