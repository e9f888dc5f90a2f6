"""Unmodified Hugging Face transformers models on shared weights (issue 23, point 1).

Tiny configs with random weights (nothing is downloaded), both attention
implementations, 2 and 3 parties, called exactly as in plaintext. Every hidden state and
the model's first output must be within 5e-2 max and 5e-3 mean absolute error of float32.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

import mpc

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

VOCAB = 99


def build(kind: str, impl: str) -> Any:
    t = transformers
    bert = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "intermediate_size": 37,
        "attn_implementation": impl,
    }
    gpt2 = {
        "vocab_size": VOCAB,
        "n_embd": 64,
        "n_layer": 2,
        "n_head": 4,
        "n_positions": 64,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "attn_implementation": impl,
    }
    llama = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention
        "max_position_embeddings": 64,
        "attn_implementation": impl,
    }
    models = {
        "BertModel": lambda: t.BertModel(t.BertConfig(**bert)),
        "BertForSequenceClassification": lambda: t.BertForSequenceClassification(
            t.BertConfig(**bert, num_labels=3)
        ),
        "GPT2Model": lambda: t.GPT2Model(t.GPT2Config(**gpt2)),
        "GPT2LMHeadModel": lambda: t.GPT2LMHeadModel(t.GPT2Config(**gpt2)),
        "LlamaForCausalLM": lambda: t.LlamaForCausalLM(t.LlamaConfig(**llama)),
    }
    return models[kind]().eval()


def inputs(kind: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (2, 10), generator=gen)
    mask = torch.ones(2, 10, dtype=torch.long)
    if kind.startswith("Bert"):
        mask[1, -3:] = 0  # right padding
        return {"input_ids": ids, "attention_mask": mask, "token_type_ids": (ids > 50).long()}
    mask[1, :3] = 0  # left padding, as for generation
    return {"input_ids": ids, "attention_mask": mask}


def outputs(out: Any) -> list[torch.Tensor]:
    got = [out[0], *out.hidden_states]
    # (GPT-2's output is also its last hidden state: one object, opened once, as get()
    # frees its shares)
    opened: dict[int, torch.Tensor] = {}
    for t in got:
        if isinstance(t, mpc.SharedTensor) and id(t) not in opened:
            opened[id(t)] = t.get()
    return [opened.get(id(t), t) for t in got]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "kind",
    [
        "BertModel",
        "BertForSequenceClassification",
        "GPT2Model",
        "GPT2LMHeadModel",
        "LlamaForCausalLM",
    ],
)
def test_model_matches_float32(kind: str, impl: str, group: Any) -> None:
    torch.manual_seed(0)
    model = build(kind, impl)
    assert model.config._attn_implementation == impl
    kw = inputs(kind)
    with torch.no_grad():
        expected = outputs(model(**kw, output_hidden_states=True))
    mpc.share(model, *group[0], crypto_provider=group[1])
    # the buffer rule: BERT's position and token-type ids and Llama's rotary inv_freq
    # (non-persistent) stay public; these models have no other buffers
    for name, b in model.named_buffers():
        assert not isinstance(b, mpc.SharedTensor), name
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", mpc.math.encoding.FixedPointRangeWarning)  # masks
        got = outputs(model(**kw, output_hidden_states=True))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        err = (g - e).abs()
        assert err.max() <= 5e-2 and err.mean() <= 5e-3, (kind, err.max(), err.mean())


def test_model_without_attention_mask_and_an_overridden_buffer(group: Any) -> None:
    """GPT-2 called with ids alone (sdpa's is_causal path; tied embeddings shared once),
    and BERT with its token-type ids buffer overridden to be shared: the gather on it is
    local, and the lookup with shared ids a one-hot product."""
    torch.manual_seed(0)
    model = build("GPT2LMHeadModel", "sdpa")
    ids = torch.randint(0, VOCAB, (1, 7))
    with torch.no_grad():
        expected = model(ids).logits
    mpc.share(model, *group[0], crypto_provider=group[1])
    assert model.lm_head.weight is model.transformer.wte.weight  # tied, shared once
    with torch.no_grad():
        got = model(ids).logits.get()
    assert (got - expected).abs().max() <= 5e-2
    bert = build("BertModel", "eager")
    with torch.no_grad():
        expected = bert(input_ids=ids).last_hidden_state
    name = "embeddings.token_type_ids"
    mpc.share(bert, *group[0], crypto_provider=group[1], shared_buffers=[name])
    assert isinstance(bert.get_buffer(name), mpc.SharedTensor)
    with torch.no_grad():
        got = bert(input_ids=ids).last_hidden_state.get()
    assert (got - expected).abs().max() <= 5e-2
