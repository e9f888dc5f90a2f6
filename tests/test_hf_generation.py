"""Greedy decoding of GPT-2 on shared weights with the KV cache (issue 23, point 7): the
client learns each next token and nothing else; the token is shared again before it goes
back into the model."""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch

import mpc
import pointers as pt
from mpc.generation.cache import SharedStaticCache
from mpc.hf import greedy_generate

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()


@pytest.fixture(
    scope="module",
    params=[2, pytest.param(3, marks=pytest.mark.slow)],
    ids=lambda n: f"{n}parties",
)
def group(request: pytest.FixtureRequest) -> Any:
    """2 parties in the default suite; 3 in the slow one (each test takes 5-13 s)."""
    names = ["alice", "bob", "dave"][: request.param]
    return [pt.VirtualWorker(n) for n in names], pt.VirtualWorker("carol")


def gpt2(seed: int = 0) -> Any:
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(
        vocab_size=99,
        n_embd=64,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return transformers.GPT2LMHeadModel(cfg).eval()


def test_greedy_decoding_matches_plaintext_and_reveals_only_tokens(
    group: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = gpt2()
    prompt = torch.randint(0, 99, (1, 6), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected = model.generate(prompt, max_new_tokens=4, do_sample=False, pad_token_id=0)
    mpc.share(model, *group[0], crypto_provider=group[1])

    revealed: list[tuple[int, ...]] = []
    get = mpc.SharedTensor.get

    def spy(self: mpc.SharedTensor) -> torch.Tensor:
        revealed.append(tuple(self.shape))
        return get(self)

    shared_ids: list[bool] = []
    logits_rows: list[int] = []
    base = model.base_model
    forward = type(base).forward
    head = model.get_output_embeddings()
    head_forward = type(head).forward
    d_model = model.config.n_embd

    @functools.wraps(forward)
    def spy_forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = kwargs.get("input_ids", args[0] if args else None)
        if given is None:
            given = kwargs.get("inputs_embeds")
        shared_ids.append(isinstance(given, mpc.SharedTensor))
        cache = kwargs["past_key_values"]
        out = forward(self, *args, **kwargs)
        if isinstance(cache, SharedStaticCache):  # one program per token (mpc.generate)
            keys, values = cache.keys[0], cache.values[0]
        else:
            keys, values = cache.layers[0].keys, cache.layers[0].values
        assert isinstance(keys, mpc.SharedTensor) and isinstance(values, mpc.SharedTensor)
        return out

    def spy_head(self: Any, x: Any) -> Any:
        if self is head:  # the rows the LM head computes logits for
            logits_rows.append(x.numel() // d_model)
        return head_forward(self, x)

    monkeypatch.setattr(mpc.SharedTensor, "get", spy)
    monkeypatch.setattr(type(base), "forward", spy_forward)
    monkeypatch.setattr(type(head), "forward", spy_head)
    for lookup in ("one_hot", "compare"):
        revealed.clear()
        shared_ids.clear()
        logits_rows.clear()
        tokens = greedy_generate(model, prompt, 4, lookup=lookup)
        assert torch.equal(tokens, expected[:, 6:]), lookup
        assert revealed == [(1, 1)] * 4  # the client opens each next token, nothing else
        # the prompt and every token go in shared (one_hot: the model's code runs for the
        # prefill and the first step only, as they are recorded; later steps replay)
        runs = 2 if lookup == "one_hot" else 4
        assert shared_ids == [True] * runs
        # the prefill computes the LM head for the prompt's last position only
        assert logits_rows == [1] * runs


def test_greedy_decoding_with_a_padded_batch_and_eos(group: Any) -> None:
    model = gpt2(1)
    prompt = torch.randint(1, 99, (2, 5), generator=torch.Generator().manual_seed(4))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    with torch.no_grad():
        expected = model.generate(
            prompt, attention_mask=mask, max_new_tokens=3, do_sample=False, pad_token_id=0
        )
    mpc.share(model, *group[0], crypto_provider=group[1])
    tokens = greedy_generate(model, prompt, 3, attention_mask=mask, lookup="public")
    assert torch.equal(tokens, expected[:, 5:])
    first = int(tokens[0, 0])
    stopped = greedy_generate(model, prompt[:1], 3, eos_token_id=first)
    assert stopped.shape == (1, 1)
