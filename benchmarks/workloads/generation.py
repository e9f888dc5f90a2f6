"""W16-W17: private generation as deployed. The model's owner shares it from its own
worker, having approved the prefill and the step (``mpc.approve_generation``); the client
shares its prompt as one-hot rows and learns only the generated tokens
(:mod:`mpc.generation`). Before the timer: the owner's approval and offer, the client's
recording of the two programs (on stand-in weights) and the prompt's prefill. Timed: one
decoding step, a recorded program per worker: the client shares the last token's
one-hot row, starts the step at every worker and fetches the argmax, the one value
opened. Each timed step continues the same generation (the next position), so every
step is checked against the plaintext model's greedy tokens at that position.

W16: GPT-2 small (``GPT2LMHeadModel(GPT2Config())``); W17: a Llama of SmolLM-135M's
shape (30 layers, hidden 576, 9 heads, 3 key/value heads, intermediate 1536, vocabulary
49,152, tied embeddings). Random weights after ``torch.manual_seed(0)``: nothing is
downloaded. On served workers (``--network``) the owner's worker is served with the
owner's offer file (:func:`write_offer`, ``serve --offer``), and the client holds only
the architecture (``mpc.offered``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch

import mpc
import pointers as pt
from benchmarks.workloads import workers
from benchmarks.workloads.by_module import by_module
from benchmarks.workloads.rss import reset_peak_rss
from benchmarks.workloads.workers import (
    DEALER_NAME,
    OWNERS,
    PARTY_NAMES,
    WorkerFactory,
    _parties,
)
from benchmarks.workloads.workload import SEED, Workload, _gen

STEPS = 24  # positions the cache holds after the prompt: the timed steps and the checks
GEN_OPS = {"W16": "decode", "W17": "decode-llama"}
GEN_SIZES = {"W16": "p{}", "W17": "p{}"}

TINY_LLAMA: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
    "tie_word_embeddings": True,
}
SMOLLM: dict[str, Any] = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "tie_word_embeddings": True,
}


def gen_model(wid: str, tiny: bool = False) -> Any:
    """W16's GPT-2 small or W17's SmolLM-shaped Llama (``tiny``: 2 layers, width 64),
    random weights after ``torch.manual_seed(0)``."""
    import transformers
    from transformers.utils import logging

    from benchmarks.workloads.hf import hf_model

    if wid == "W16":
        return hf_model("gpt2", tiny)
    logging.set_verbosity_error()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        cfg = transformers.LlamaConfig(**(TINY_LLAMA if tiny else SMOLLM))
        return transformers.LlamaForCausalLM(cfg).eval()


def _approve(
    wid: str, model: Any, prompt: int, parties: int, configs: list[Any] | None = None
) -> Any:
    """The owner's approval of the generation for each of ``configs`` (default: the
    sessions' config, ``workers.CONFIG``), merged: each config records other programs."""
    approval = None
    for config in configs if configs is not None else [workers.CONFIG]:
        one = mpc.approve_generation(
            model,
            prompt_length=prompt,
            max_length=prompt + STEPS,
            parties=list(PARTY_NAMES[:parties]),
            crypto_provider=DEALER_NAME,
            config=config,
        )
        if approval is None:
            approval = one
            continue
        for party, digests in one.items():
            approval[party] = approval[party] + [d for d in digests if d not in approval[party]]
    return approval


def offer_path(directory: Path, wid: str, prompt: int, parties: int, tiny: bool) -> Path:
    return directory / f"{wid}-p{prompt}-n{parties}{'-tiny' if tiny else ''}.offer"


def write_offer(
    directory: Path,
    wid: str,
    prompt: int,
    parties: int = 2,
    tiny: bool = False,
    configs: list[Any] | None = None,
) -> Path:
    """The owner's side for served workers: approve the model's generation (for each of
    ``configs``: the run's modes; default the sessions' config) and write its values and
    approvals to a file for ``serve --offer`` (returns its path)."""
    model = gen_model(wid, tiny)
    path = offer_path(directory, wid, prompt, parties, tiny)
    mpc.save_offer(model, _approve(wid, model, prompt, parties, configs), path)
    return path


def _decode(
    wid: str, prompt: int, parties: int, factory: WorkerFactory | None, tiny: bool
) -> Workload:
    from mpc.generation import HeldPrograms, programs
    from mpc.generation.decoding import one_hot_rows
    from mpc.hf import session_of

    reset_peak_rss()
    model = gen_model(wid, tiny)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, prompt), generator=_gen())
    with torch.no_grad():  # the plaintext greedy tokens every step is checked against
        greedy = model.generate(
            ids, max_new_tokens=STEPS, do_sample=False, pad_token_id=0, eos_token_id=None
        )[0, prompt:].tolist()
    ws, carol = _parties(parties, factory)
    owned = copy.deepcopy(model)
    if factory is None:  # the owner's worker in this process
        owner = pt.VirtualWorker(OWNERS[wid])
        model_ptr = mpc.offer(owned, owner, _approve(wid, owned, prompt, parties))
    else:  # served with the owner's offer file (python -m benchmarks --network)
        model_ptr = mpc.offered(owned, factory(OWNERS[wid]))
    held = mpc.share(model_ptr, *ws, crypto_provider=carol, config=workers.CONFIG)
    session = session_of(held)
    with by_module(owned) as breakdown:  # (the client records both programs here)
        progs = programs(held, prompt, prompt + STEPS)
    assert isinstance(progs, HeldPrograms)
    step_by_kind = dict(breakdown.last.by_kind)  # the step's pass, recorded after the prefill's
    step_dealt = breakdown.last.dealt_table()  # (its LM head and argmax recorded after it)
    with torch.no_grad():
        first = progs.prefill(one_hot_rows(ids, vocab, session)).get()
    produced: list[int] = [int(first)]  # the tokens the client learned, in order

    def run() -> torch.Tensor:
        if len(produced) >= STEPS:
            raise RuntimeError(f"{wid}: the cache holds {STEPS} tokens after the prompt")
        last = torch.tensor([[produced[-1]]])
        with torch.no_grad():
            token = progs.step(one_hot_rows(last, vocab, session)).get()
        produced.append(int(token))
        return token

    def plain() -> torch.Tensor:  # one plaintext step with the cache, for the ratio
        with torch.no_grad():
            out = model(input_ids=ids, use_cache=True)
            return model(
                input_ids=torch.tensor([[greedy[0]]]), past_key_values=out.past_key_values
            ).logits[:, -1]

    def check() -> dict[str, Any]:
        run()
        wrong = sum(1 for p, g in zip(produced, greedy) if p != g)
        return {
            "token_mismatches": wrong,
            "tokens_checked": len(produced),
            "rounds_by_module": step_by_kind,
            "dealt_by_module": step_dealt,
        }

    return Workload(
        wid,
        GEN_OPS[wid],
        ("tiny-" if tiny else "") + GEN_SIZES[wid].format(prompt),
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        notes="held by its owner; one program per worker a token; only the token revealed",
        elements=1,
        shape=(1, 1),
        programs=True,
        revealed=True,
        track_rss=True,
        preprocess=progs.preprocess,
    )


def w16_decode(
    prompt: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W16: one greedy decoding step of GPT-2 small, held by its owner, after a
    ``prompt``-token private prompt."""
    return _decode("W16", prompt, parties, factory, tiny)


def w17_decode(
    prompt: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W17: one greedy decoding step of a SmolLM-135M-shaped Llama, held by its owner,
    after a ``prompt``-token private prompt."""
    return _decode("W17", prompt, parties, factory, tiny)


__all__ = ["OWNERS", "gen_model", "w16_decode", "w17_decode", "write_offer"]
