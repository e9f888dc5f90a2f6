"""W14-W16 (issue 23): unmodified Hugging Face models at their real size, every party, the
crypto provider and the plaintext reference in this one process. Minutes per case, so
they run only when named (``--workloads W14``); ``tiny=True`` (``--hf-tiny``, the smoke
test) builds 2-layer, 64-wide models with a vocabulary of 99 instead. ``transformers``
is imported only when a model is built (the registry adds W14-W16 where it is installed).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

import mpc
from benchmarks.workloads import workers
from benchmarks.workloads.rss import reset_peak_rss
from benchmarks.workloads.workers import WorkerFactory, _parties
from benchmarks.workloads.workload import SEED, Workload, _gen

# The op and the size format of each (the registry takes them from here; W16 and W17,
# generation, are benchmarks.workloads.generation's).
HF_OPS = {"W14": "bert", "W15": "gpt2"}
HF_SIZES = {"W14": "s{}", "W15": "s{}"}

TINY_BERT: dict[str, Any] = {
    "vocab_size": 99,
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "intermediate_size": 37,
}
TINY_GPT2: dict[str, Any] = {
    "vocab_size": 99,
    "n_embd": 64,
    "n_layer": 2,
    "n_head": 4,
    "n_positions": 256,
    "bos_token_id": 0,
    "eos_token_id": 0,
}


def hf_model(kind: str, tiny: bool = False) -> Any:
    """docs/workloads.md's W14 (``kind="bert"``: ``BertModel(BertConfig())``) or W15/W16 model
    (``"gpt2"``: ``GPT2LMHeadModel(GPT2Config())``), random weights after
    ``torch.manual_seed(0)``; nothing is downloaded. ``tiny``: the tiny configs above."""
    import transformers
    from transformers.utils import logging

    logging.set_verbosity_error()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        if kind == "bert":
            bert = transformers.BertConfig(**TINY_BERT) if tiny else transformers.BertConfig()
            return transformers.BertModel(bert).eval()
        gpt2 = transformers.GPT2Config(**TINY_GPT2) if tiny else transformers.GPT2Config()
        return transformers.GPT2LMHeadModel(gpt2).eval()


def _errors(out: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    err = (out.double() - ref.double()).abs()
    return {"max_abs_err": float(err.max()), "mean_abs_err": float(err.mean())}


def _hf_shared(
    kind: str, tiny: bool, parties: int, factory: WorkerFactory | None
) -> tuple[Any, Any, list[Any], Any]:
    """The plaintext model and a shared copy of it (the weights shared from here: the
    benchmark is the model owner), the parties and the crypto provider. Starts the peak
    memory count first."""
    reset_peak_rss()
    model = hf_model(kind, tiny)
    ws, carol = _parties(parties, factory)
    return (
        model,
        mpc.share(copy.deepcopy(model), *ws, crypto_provider=carol, config=workers.CONFIG),
        ws,
        carol,
    )


def _prefill(
    wid: str,
    kind: str,
    seq: int,
    parties: int,
    factory: WorkerFactory | None,
    tiny: bool,
) -> Workload:
    """W14 (BERT, last hidden state) and W15 (GPT-2 prefill, logits): one forward over a
    ``(1, seq)`` prompt of private ids. The ids' owner shares them as one-hot rows
    (``mpc.hf.share_one_hot``, before the timer, as every input); the timed run looks them
    up (the one-hot rows times the shared embedding table) and runs the model. GPT-2's
    prefill computes the logits of the prompt's last position only (``logits_to_keep=1``,
    as transformers' ``generate`` and ``mpc.hf.greedy_generate`` call it): the next token
    is all a prefill is for, and the other 127 rows of the 50,257-wide LM head would cost
    as much as the embedding lookup."""
    from mpc.hf import private_embeddings, share_one_hot

    model, shared, ws, carol = _hf_shared(kind, tiny, parties, factory)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, seq), generator=_gen())
    onehot = share_one_hot(ids, shared)

    keep: dict[str, Any] = {} if kind == "bert" else {"logits_to_keep": 1}

    def output(out: Any) -> Any:
        return out.last_hidden_state if kind == "bert" else out.logits

    def run() -> Any:
        with torch.no_grad():
            return output(shared(inputs_embeds=private_embeddings(shared, onehot), **keep))

    def plain() -> torch.Tensor:
        with torch.no_grad():
            return output(model(input_ids=ids, **keep))

    ref = plain()

    def check() -> dict[str, Any]:
        return _errors(run().get(), ref)

    return Workload(
        wid,
        HF_OPS[wid],
        ("tiny-" if tiny else "") + HF_SIZES[wid].format(seq),
        run=run,
        plain=plain,
        check=check,
        workers=ws,
        dealer=carol,
        notes="ids private (one-hot rows from their owner), weights private",
        elements=seq,
        shape=(1, seq),
        track_rss=True,
    )


def w14_bert(
    seq: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W14: ``BertModel`` at BERT-base shape (``tiny``: 2 layers, width 64) on ``seq``
    private token ids, weights private; the last hidden state stays shared. Throughput
    counts tokens."""
    return _prefill("W14", "bert", seq, parties, factory, tiny)


def w15_gpt2(
    seq: int, parties: int = 2, factory: WorkerFactory | None = None, tiny: bool = False
) -> Workload:
    """W15: ``GPT2LMHeadModel`` at GPT-2 small shape, one forward over a prompt of ``seq``
    private ids (prefill: the KV cache and the last position's logits, which stay shared).
    Throughput counts tokens."""
    return _prefill("W15", "gpt2", seq, parties, factory, tiny)
