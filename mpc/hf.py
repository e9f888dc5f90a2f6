"""Helpers for Hugging Face ``transformers`` models on shared weights (docs/transformers.md).

The models themselves need nothing from here: after ``mpc.share(model, ...)`` they run
unmodified. This module adds what sits around a model call: greedy decoding that reveals
only each next token to the client, and the one-hot sharing of private token ids.
``transformers`` is imported lazily (the ``[hf]`` extra); ``import mpc`` never imports it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.session import Session
from mpc.shared import SharedTensor, share_tensor


def session_of(model: nn.Module) -> Session:
    """The session a shared model's weights live in."""
    for p in model.parameters():
        if isinstance(p, SharedTensor):
            return p.session
    raise MPCError("the model is not shared: call mpc.share(model, ...) first")


def share_token_ids(ids: torch.Tensor, model: nn.Module) -> SharedTensor:
    """Share the caller's token ids (integers) with the parties of ``model``: the parties
    then look them up without learning them (:func:`mpc.ops.transformer.embedding`)."""
    if ids.is_floating_point():
        raise MPCError("token ids are integers")
    return share_tensor(ids.to(torch.int64), session_of(model))


def greedy_generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    attention_mask: torch.Tensor | None = None,
    eos_token_id: int | None = None,
    private_ids: bool = True,
) -> torch.Tensor:
    """Greedy decoding with the KV cache on a shared causal language model (GPT-2, Llama).

    The prompt is shared by the caller (``private_ids``; a :class:`SharedTensor` is used
    as it is); every step runs the model on the new ids with a ``DynamicCache`` that holds
    the shared keys and values, takes the argmax of the last logits on shares (a
    comparison tree), and reveals only that token to the caller, who shares it again as
    the next step's input. Returns the new tokens, ``(batch, n)``, as a plain tensor:
    what the caller learns. The parties learn the shapes and the number of steps.
    ``eos_token_id`` stops once every sequence has produced it (the caller's decision,
    on tokens it holds). ``private_ids=False`` sends the ids in the clear (public ids:
    cheaper lookups, but the parties see the text).
    """
    from transformers import DynamicCache

    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    config = getattr(model, "config", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    ids: Any = input_ids
    if private_ids and not isinstance(ids, SharedTensor):
        ids = share_token_ids(ids, model)
    mask = attention_mask
    new: list[torch.Tensor] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            out = model(input_ids=ids, attention_mask=mask, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            token = out.logits[:, -1].argmax(-1, keepdim=True).get()  # the one value revealed
            new.append(token)
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
            ids = share_token_ids(token, model) if private_ids else token
            if mask is not None:
                mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return torch.cat(new, dim=1)
