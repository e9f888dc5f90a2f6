"""Helpers for Hugging Face ``transformers`` models on shared weights (docs/transformers.md).

The models themselves need nothing from here: after ``mpc.share(model, ...)`` they run
unmodified. This module adds what sits around a model call: greedy decoding that reveals
only each next token to the client, and the one-hot sharing of private token ids.
``transformers`` is imported lazily (the ``[hf]`` extra); ``import mpc`` never imports it.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.shared import SharedTensor, session_of, share_tensor


def share_token_ids(ids: torch.Tensor, model: nn.Module) -> SharedTensor:
    """Share the caller's token ids (integers) with the parties of ``model``: the parties
    then look them up without learning them (:func:`mpc.ops.transformer.embedding`)."""
    if ids.is_floating_point():
        raise MPCError("token ids are integers")
    return share_tensor(ids.to(torch.int64), session_of(model))


def share_one_hot(ids: torch.Tensor, model: nn.Module) -> SharedTensor:
    """The caller's token ids as shared one-hot rows, ``ids.shape + (vocab,)`` 0/1
    integers (the owner of the ids knows them, so no comparison is needed): from 64
    elements on, n - 1 parties expand a 16-byte seed and one party receives 8 bytes per
    vocabulary entry per token (0.24 MB at 30,522, 0.40 MB at 50,257)."""
    if ids.is_floating_point():
        raise MPCError("token ids are integers")
    vocab = _embedding(model).weight.shape[0]
    onehot = torch.nn.functional.one_hot(ids.to(torch.int64), vocab)
    return share_tensor(onehot, session_of(model))


def private_embeddings(model: nn.Module, ids: torch.Tensor | SharedTensor) -> Any:
    """The input embeddings of private token ids, for ``model(inputs_embeds=...)``: the
    caller's one-hot rows (:func:`share_one_hot`; a SharedTensor of one-hot rows is used
    as it is) times the shared embedding table, one Beaver matmul (8 rounds fewer and
    about ten times fewer bytes per token than comparing shared ids with every row)."""
    onehot = ids if isinstance(ids, SharedTensor) else share_one_hot(ids, model)
    return onehot @ _embedding(model).weight


def _embedding(model: nn.Module) -> Any:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if get is not None else None
    if emb is None:
        raise MPCError("the model has no get_input_embeddings()")
    return emb


def _keeps_last_logits(model: nn.Module) -> dict[str, Any]:
    """``{"logits_to_keep": 1}`` where ``model``'s forward takes it, else nothing."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return {}
    return {"logits_to_keep": 1} if "logits_to_keep" in params else {}


def greedy_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    eos_token_id: int | None = None,
    lookup: str = "one_hot",
) -> torch.Tensor:
    """Greedy decoding with the KV cache on a shared causal language model (GPT-2, Llama).

    The prompt is shared by the caller; every step runs the model on the new tokens with
    a cache that holds the shared keys and values, takes the argmax of the last logits on
    shares (a comparison tree), and reveals only that token to the caller, who shares it
    again as the next step's input. Returns the new tokens, ``(batch, n)``, as a plain
    tensor: what the caller learns. The parties learn the shapes and the number of steps.
    ``eos_token_id`` stops once every sequence has produced it (the caller's decision,
    on tokens it holds).

    ``lookup`` says how tokens go in: ``"one_hot"`` (the caller shares one-hot rows,
    :func:`private_embeddings`, passed as ``inputs_embeds=``), ``"compare"`` (the caller
    shares the ids, the parties compare them with every row: ``input_ids=``), or
    ``"public"`` (ids in the clear: cheapest, but the parties see the text).

    With ``"one_hot"`` and no padding mask this is :func:`mpc.generate`: one recorded
    program per party for the prefill and for every token. Otherwise each step runs op by
    op with a ``DynamicCache``.
    """
    from transformers import DynamicCache

    if lookup == "one_hot" and (attention_mask is None or bool(attention_mask.all())):
        from mpc.generation import generate

        return generate(model, input_ids, max_new_tokens, eos_token_id=eos_token_id)
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    if lookup not in ("one_hot", "compare", "public"):
        raise ValueError(f"lookup={lookup!r}: 'one_hot', 'compare' or 'public'")

    # only the last position's logits are used: a model that can skip the others (GPT-2,
    # Llama: ``logits_to_keep``, as transformers' own ``generate`` passes it) computes the
    # LM head for one position, not for the whole prompt (at GPT-2 small and a 128-token
    # prompt, 127 products of a row with the 50,257 x 768 head fewer)
    keep = _keeps_last_logits(model)

    def inputs(tokens: Any) -> dict[str, Any]:
        if lookup == "one_hot":
            return {"inputs_embeds": private_embeddings(model, tokens)}
        if lookup == "compare" and not isinstance(tokens, SharedTensor):
            return {"input_ids": share_token_ids(tokens, model)}
        return {"input_ids": tokens}

    step = inputs(input_ids)
    mask = attention_mask
    new: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(**step, attention_mask=mask, past_key_values=cache, use_cache=True, **keep)
            cache = out.past_key_values
            token = out.logits[:, -1].argmax(-1, keepdim=True).get()  # the one value revealed
            new.append(token)
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
            step = inputs(token)
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.cat(new, dim=1)
