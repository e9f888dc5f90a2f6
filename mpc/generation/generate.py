"""``mpc.generate``: greedy decoding of a shared causal language model, one recorded
program per token (:mod:`mpc.generation.decoding`)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.generation.decoding import PlainPrograms, embedding, one_hot_rows
from mpc.generation.held import HeldPrograms
from mpc.generation.speculative import SpeculativeDecoder, prompt_lookup
from mpc.offered import HeldShared
from mpc.shared import session_of, share_tensor

_CACHE = "_mpc_generation_programs"  # a model's programs by their shape (see programs())
MAX_CACHED = 8


def programs(
    model: nn.Module, prompt_length: int, max_length: int, batch: int = 1, drafts: int = 0
) -> PlainPrograms | HeldPrograms:
    """The prefill's and the step's programs of ``model`` (held: as its owner approved
    them, for that prompt length, maximum length, batch and drafts). ``drafts``: the step
    verifies that many drafts (:mod:`mpc.generation.speculative`). Recorded once per
    model and shape: a later call with the same shape reuses them (each generation's
    prefill then starts a new cache and position at the parties)."""
    cache: dict[Any, Any] = model.__dict__.setdefault(_CACHE, {})
    key = (session_of(model), prompt_length, max_length, batch, drafts)
    if key not in cache:
        if len(cache) >= MAX_CACHED:
            cache.pop(next(iter(cache)))
        cache[key] = _new_programs(model, prompt_length, max_length, batch, drafts)
    return cache[key]  # type: ignore[no-any-return]


def _new_programs(
    model: nn.Module, prompt_length: int, max_length: int, batch: int, drafts: int
) -> PlainPrograms | HeldPrograms:
    session = session_of(model)
    if any(isinstance(p, HeldShared) for p in model.parameters()):
        return HeldPrograms(model, session, prompt_length, max_length, batch, drafts)
    if drafts:
        decoder = SpeculativeDecoder(model, session, max_length, drafts)
        return PlainPrograms(model, session, max_length, decoder, later="run_pass")
    return PlainPrograms(model, session, max_length)


def generate(
    model: nn.Module,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    max_length: int | None = None,
    eos_token_id: int | None = None,
    progress: Any = None,
    drafts: int = 0,
    draft: Any = None,
    passes: list[int] | None = None,
    preprocess: bool = False,
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
    number of tokens generated so far after each token.

    ``drafts=k`` (batch 1, GPT-2 style models): each pass after the prefill verifies k
    draft tokens of the caller's (``draft(tokens, k)``: the caller's rule on the prompt
    and the tokens so far, default :func:`~mpc.generation.speculative.prompt_lookup`) and
    reveals the accepted ones and the first correction: the same tokens as greedy
    decoding, often several a pass. Each pass takes k + 1 cache positions whatever it
    accepts, so ``max_length`` must hold the prompt and k + 1 positions a new token.
    ``passes``: a list the number of passes is appended to.

    ``preprocess=True``: the crypto provider deals the material of all the remaining
    steps at once, as soon as they can be dealt (on a model its owner shares: after the
    prefill; on a model the client shared: after the first step, whose run records the
    step program); each later token then runs the parties' programs only (the online
    phase). Sets not used (an ``eos_token_id`` stop) are dropped at the next prefill."""
    if max_new_tokens < 1:
        raise ValueError("max_new_tokens must be at least 1")
    if not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2:
        raise MPCError("input_ids is the caller's prompt: an integer tensor (batch, length)")
    batch, length = input_ids.shape
    held = any(isinstance(p, HeldShared) for p in model.parameters())
    per_token = drafts + 1  # cache positions a new token may take
    if max_length is None:
        if held:
            raise MPCError(
                "a model its owner shares generates up to the maximum length the owner "
                "approved: pass max_length= (approve_generation's max_length)"
            )
        max_length = length + max_new_tokens * per_token
    if length + max_new_tokens > max_length:
        raise MPCError(
            f"a prompt of {length} tokens and {max_new_tokens} new ones exceed the maximum "
            f"length {max_length}"
        )
    if drafts and batch != 1:
        raise MPCError("speculative verification takes one sequence (batch 1)")
    if drafts and preprocess:
        raise MPCError(
            "preprocess=True deals one set per step; with drafts the number of passes is "
            "not known ahead: call progs.preprocess(passes) on mpc.generation.programs(...)"
        )
    progs = programs(model, length, max_length, batch, drafts)
    session = session_of(model)
    vocab = embedding(model).weight.shape[0]
    if drafts:
        return _speculate(
            progs, input_ids, max_new_tokens, max_length, vocab, session, drafts,
            draft or prompt_lookup, eos_token_id, progress, passes,
        )  # fmt: skip
    new: list[torch.Tensor] = []
    with torch.no_grad():
        token = progs.prefill(one_hot_rows(input_ids, vocab, session)).get()
        new.append(token)
        while len(new) < max_new_tokens:
            if progress is not None:
                progress(len(new))
            if eos_token_id is not None and bool((token == eos_token_id).all()):
                break
            if preprocess and not progs.prepared and progs.dealable:
                progs.preprocess(max_new_tokens - len(new))
            token = progs.step(one_hot_rows(token, vocab, session)).get()
            new.append(token)
    if progress is not None:
        progress(len(new))
    if passes is not None:
        passes.append(len(new))
    return torch.cat(new, dim=1)


def _speculate(
    progs: Any, input_ids: torch.Tensor, n: int, max_length: int, vocab: int, session: Any,
    k: int, draft: Any, eos: int | None, progress: Any, passes: list[int] | None,
) -> torch.Tensor:  # fmt: skip
    """Greedy decoding with k drafts verified a pass (see :func:`generate`)."""
    prompt = input_ids[0].tolist()
    count = 1
    with torch.no_grad():
        new = [int(progs.prefill(one_hot_rows(input_ids, vocab, session)).get())]
        written = len(prompt) + 1
        while len(new) < n and (eos is None or new[-1] != eos):
            if written + k + 1 > max_length:
                raise MPCError(
                    f"the cache's {max_length} positions are used up after {len(new)} tokens "
                    f"(each pass takes {k + 1}): pass a larger max_length"
                )
            guesses = [int(t) for t in draft(prompt + new, k)]
            if len(guesses) != k or not all(0 <= t < vocab for t in guesses):
                raise MPCError(f"the draft rule must give {k} token ids in [0, {vocab})")
            rows = one_hot_rows(torch.tensor([[new[-1], *guesses]]), vocab, session)
            ids = share_tensor(torch.tensor([guesses]), session)
            opened = progs.step(rows, ids).get()[0].tolist()
            new += [t for t in opened if t >= 0]
            written += k + 1
            count += 1
            if progress is not None:
                progress(min(len(new), n))
    if passes is not None:
        passes.append(count)
    if eos is not None and eos in new:
        new = new[: new.index(eos) + 1]
    return torch.tensor([new[:n]])


__all__ = ["generate", "programs"]
