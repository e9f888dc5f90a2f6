"""``python -m benchmarks.speculative``: speculative verification against plain greedy
decoding, in one run, on a tiny GPT-2 trained in plaintext on the standard library's
docstrings (:mod:`benchmarks.tiny_lm`), held by its owner (the deployment of
docs/transformers.md, "Generation as deployed"), 2 parties and a crypto provider in
process.

For each of a few prompts (windows of the corpus), it generates the same number of
tokens twice: one program a token (``mpc.generate``), and k drafts verified a pass
(``mpc.generate(..., drafts=k)``, prompt lookup: no second model). It prints the tokens
revealed per forward pass, the time per generated token of each, and checks every token
against the plaintext model's greedy decoding.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import torch


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.speculative", description=__doc__)
    p.add_argument("--train-steps", type=int, default=2000, help="steps of the tiny GPT-2")
    p.add_argument("--prompts", type=int, default=3, help="prompts (windows of the corpus)")
    p.add_argument("--prompt-length", type=int, default=16)
    p.add_argument("--tokens", type=int, default=24, help="tokens generated per prompt")
    p.add_argument("--drafts", type=int, default=4, help="draft tokens verified a pass")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if args.tokens < 2 or args.prompts < 1 or args.drafts < 1 or args.train_steps < 1:
        parser.error("--tokens takes 2 or more; --prompts, --drafts, --train-steps 1 or more")
    import mpc
    import pointers as pt
    from benchmarks.tiny_lm import train

    k, n, length = args.drafts, args.tokens, args.prompt_length
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"python -m benchmarks.speculative: load {load}", file=sys.stderr)
    t0 = time.perf_counter()
    lm = train(args.train_steps)
    trained = time.perf_counter() - t0
    print(
        f"tiny GPT-2 (2 layers, width 64, vocabulary {len(lm.vocab)}) trained on "
        f"{len(lm.data)} words of standard-library docstrings: {args.train_steps} steps, "
        f"loss {lm.loss:.2f}, {trained:.0f} s",
        file=sys.stderr,
    )
    plain_model = lm.model
    capacity = length + n * (k + 1)
    parties = ["alice", "bob"]
    approval = mpc.approve_generation(
        plain_model, prompt_length=length, max_length=capacity, parties=parties,
        crypto_provider="carol",
    )  # fmt: skip
    with_drafts: Any = mpc.approve_generation(
        plain_model, prompt_length=length, max_length=capacity, parties=parties,
        crypto_provider="carol", drafts=k,
    )  # fmt: skip
    for party in parties:  # the owner approves both: one program a token, and k drafts
        approval[party] += with_drafts[party]
    import copy

    owners = copy.deepcopy(plain_model)
    model_ptr = mpc.offer(owners, pt.VirtualWorker("owner"), approval)
    alice, bob, carol = (pt.VirtualWorker(p) for p in (*parties, "carol"))
    held = mpc.share(model_ptr, alice, bob, crypto_provider=carol)

    rows: list[dict[str, Any]] = []
    for j in range(args.prompts):
        prompt = lm.prompt(1000 + 3000 * j, length)
        with torch.no_grad():
            expected = plain_model.generate(
                prompt, max_new_tokens=n, do_sample=False, pad_token_id=0
            )[0, length:].tolist()
        row: dict[str, Any] = {"prompt": lm.text(prompt[0].tolist())}
        for mode, drafts in (("one program a token", 0), (f"{k} drafts a pass", k)):
            # the prefill (it gives the first token) alone, then the whole generation
            start = time.perf_counter()
            mpc.generate(held, prompt, 1, max_length=capacity, drafts=drafts)
            prefill = time.perf_counter() - start
            passes: list[int] = []
            start = time.perf_counter()
            out = mpc.generate(held, prompt, n, max_length=capacity, drafts=drafts, passes=passes)[
                0
            ].tolist()
            took = time.perf_counter() - start
            row[mode] = {
                "prefill_s": prefill,
                "s_per_token": max(took - prefill, 0.0) / max(n - 1, 1),
                "passes": passes[0],
                "tokens_per_pass": n / passes[0],
                "equal": out == expected,
            }
        row["text"] = lm.text(expected)
        rows.append(row)
    _print(rows, k)
    ok = all(r[m]["equal"] for r in rows for m in r if isinstance(r[m], dict))
    print("every token equals plaintext greedy decoding:", "yes" if ok else "NO")
    return 0 if ok else 1


def _print(rows: list[dict[str, Any]], k: int) -> None:
    modes = [m for m in rows[0] if isinstance(rows[0][m], dict)]
    print(
        "time a generated token after the prefill (the prefill's time apart), tokens a "
        "pass after the prefill"
    )
    print(f"{'prompt':<4} " + " ".join(f"{m:>34}" for m in modes))
    for i, r in enumerate(rows):
        cells = []
        for m in modes:
            c = r[m]
            cells.append(
                f"{c['s_per_token']:7.3f} s/token {c['tokens_per_pass']:4.2f} tokens/pass"
                f"{'' if c['equal'] else ' WRONG'}"
            )
        print(f"{i:<4} " + " ".join(f"{c:>34}" for c in cells))
        print(f"     greedy: {r['text'][:100]}")
    for m in modes:
        per = sum(r[m]["s_per_token"] for r in rows) / len(rows)
        tpp = sum(r[m]["tokens_per_pass"] for r in rows) / len(rows)
        pre = sum(r[m]["prefill_s"] for r in rows) / len(rows)
        print(f"mean, {m}: {per:.3f} s a token, {tpp:.2f} tokens a pass (prefill {pre:.2f} s)")


if __name__ == "__main__":
    sys.exit(main())
