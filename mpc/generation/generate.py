"""``mpc.generate``: greedy decoding of a shared causal language model, one recorded
program per token (:mod:`mpc.generation.decoding`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.generation.decoding import PlainPrograms, embedding, one_hot_rows
from mpc.generation.held import HeldPrograms
from mpc.hf import session_of
from mpc.offered import HeldShared


def programs(
    model: nn.Module, prompt_length: int, max_length: int, batch: int = 1
) -> PlainPrograms | HeldPrograms:
    """The prefill's and the step's programs of ``model`` (held: as its owner approved
    them, for that prompt length, maximum length and batch)."""
    session = session_of(model)
    if any(isinstance(p, HeldShared) for p in model.parameters()):
        return HeldPrograms(model, session, prompt_length, max_length, batch)
    return PlainPrograms(model, session, max_length)


def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    max_length: int | None = None,
    eos_token_id: int | None = None,
    progress: Any = None,
) -> torch.Tensor:
    """Greedy decoding of a shared causal language model (GPT-2 or Llama style, from
    ``transformers``) on the caller's prompt ``input_ids`` (batch, length): returns the
    new tokens (batch, n), the only values the caller learns. The prompt goes in as shared
    one-hot rows; the prefill and every token are one recorded program per party (one
    message per worker to start, plus the sharing of the token's row and the fetch of
    the argmax). The parties learn the shapes and the number of tokens.

    ``max_length``: the cache's capacity (prompt and new tokens); on a model its owner
    shares from its worker, the maximum length the owner approved
    (:func:`mpc.generation.approve_generation`), which the client must pass. Default
    (a model the client shared): the prompt's length plus ``max_new_tokens``.
    ``eos_token_id`` stops once every sequence produced it. ``progress``: called with the
    number of tokens generated so far after each token."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise MPCError("input_ids is the caller's prompt: an integer tensor (batch, length)")
    batch, length = input_ids.shape
    held = any(isinstance(p, HeldShared) for p in model.parameters())
    if max_length is None:
        if held:
            raise MPCError(
                "a model its owner shares generates up to the maximum length the owner "
                "approved: pass max_length= (approve_generation's max_length)"
            )
        max_length = length + max_new_tokens
    if length + max_new_tokens > max_length:
        raise MPCError(
            f"a prompt of {length} tokens and {max_new_tokens} new ones exceed the maximum "
            f"length {max_length}"
        )
    progs = programs(model, length, max_length, batch)
    session = session_of(model)
    vocab = embedding(model).weight.shape[0]
    new: list[torch.Tensor] = []
    with torch.no_grad():
        token = progs.prefill(one_hot_rows(input_ids, vocab, session)).get()
        new.append(token)
        while len(new) < max_new_tokens:
            if progress is not None:
                progress(len(new))
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
            token = progs.step(one_hot_rows(token, vocab, session)).get()
            new.append(token)
    if progress is not None:
        progress(len(new))
    return torch.cat(new, dim=1)


__all__ = ["generate", "programs"]
