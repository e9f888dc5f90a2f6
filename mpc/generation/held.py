"""Generation on a model its owner shares from its own worker: the owner approves the
prefill and the step once, for a prompt length and a maximum length of its choosing; the
client learns the generated tokens and nothing else.

The owner (its side, in process): ``approval = approve_generation(model, prompt_length=32,
max_length=64, parties=[...], crypto_provider=...)``, then ``mpc.offer(model, worker,
approval)`` (or ``mpc.save_offer`` for ``serve --offer``). The client:
``mpc.generate(mpc.share(model_ptr, ...), ids, max_new_tokens)``.

Every party, on every run (:mod:`pointers.worker.holding`): the program is one the owner
approved (its commands, the parameters and the digests of their values, the output, the
roles of what the prefill keeps and the step takes); the prefill's run keeps the cache,
the position and the weights' instances for the owner; a step's run takes what one
prefill's run kept, by role, reads the position the parties hold (a step past the
maximum length fails), writes the cache in place, and releases only the argmax. The
client can read no cache entry, logit or intermediate, choose no position, and bind no
material or kept object twice or elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

import pointers as pt
from mpc.config import MPCConfig
from mpc.errors import MPCError
from mpc.generation.decoding import (
    Decoder,
    deal_steps,
    drop_dealt,
    drop_generation,
    embedding,
    one_hot_rows,
)
from mpc.generation.speculative import SpeculativeDecoder
from mpc.held import Approval, HeldPlan, recording_dropped, registered_values, wait_for_runs
from mpc.offered import HeldShared, secret_slots, tensor_at
from mpc.session import Session
from mpc.shared import SharedTensor, share_tensor


def _plan(model: nn.Module, session: Session, prompt_length: int, capacity: int, batch: int,
          owner_session: Session | None = None, drafts: int = 0,
          ) -> tuple[HeldPlan, Decoder]:  # fmt: skip
    """The prefill's and the step's programs, recorded on stand-in weights (as the owner
    records them to approve them, and as the client records them to run them); with
    ``drafts``, the step is a pass that verifies that many drafts
    (:mod:`mpc.generation.speculative`)."""
    if not 0 < prompt_length < capacity:
        raise ValueError(
            f"the prompt length ({prompt_length}) must be at least 1 and below the maximum "
            f"length ({capacity})"
        )
    vocab = embedding(model).weight.shape[0]
    prompt = one_hot_rows(torch.zeros(batch, prompt_length, dtype=torch.int64), vocab, session)
    decoder: Decoder
    later: Any
    later_examples: tuple[SharedTensor, ...]
    if drafts:
        decoder = SpeculativeDecoder(model, session, capacity, drafts)
        rows = one_hot_rows(torch.zeros(batch, drafts + 1, dtype=torch.int64), vocab, session)
        ids = share_tensor(torch.zeros(batch, drafts, dtype=torch.int64), session)
        later, later_examples = decoder.run_pass, (rows, ids)  # type: ignore[attr-defined]
    else:
        decoder = Decoder(model, session, capacity)
        token = one_hot_rows(torch.zeros(batch, 1, dtype=torch.int64), vocab, session)
        later, later_examples = decoder.run_step, (token,)
    plan = HeldPlan(
        model,
        prompt,
        call=decoder.run_prefill,
        owner_session=owner_session,
        later_call=later,
        later_examples=later_examples,
    )
    return plan, decoder


def approve_generation(
    model: nn.Module,
    *,
    prompt_length: int | Sequence[int],
    max_length: int,
    parties: Sequence[str],
    crypto_provider: str,
    config: MPCConfig | None = None,
    batch: int = 1,
    drafts: int = 0,
) -> Approval:
    """The owner's side: record greedy decoding of ``model`` (a causal language model of
    ``transformers``, GPT-2 or Llama style) for prompts of ``prompt_length`` tokens (one
    length or several) and at most ``max_length`` tokens in all, on in-process workers
    named as the deployment's, and return per party the digests of the prefill's
    program (one per prompt length) and of the step's. ``drafts``: the step verifies that
    many drafts of the client's (:mod:`mpc.generation.speculative`; approve both modes by
    merging two approvals). Pass it to ``mpc.offer`` (or ``mpc.save_offer``). The
    client's generation must use the same lengths, batch, drafts and config."""
    lengths = [prompt_length] if isinstance(prompt_length, int) else list(prompt_length)
    cfg = config or MPCConfig()
    values = registered_values(model, cfg.frac_bits)
    approval = Approval({p: [] for p in parties})
    for length in lengths:
        workers = [pt.VirtualWorker(p) for p in parties]
        session = Session(workers, pt.VirtualWorker(crypto_provider), cfg)
        plan, _ = _plan(model, session, length, max_length, batch, session, drafts)
        for w in workers:
            for d in plan.digests(w, values):
                if d not in approval[w.id]:
                    approval[w.id].append(d)
        del plan, session, workers
        recording_dropped()
    approval.frac_bits, approval.params = cfg.frac_bits, values
    return approval


class HeldPrograms:
    """A held model's prefill and step, recorded on stand-ins, run on the owner's shares."""

    def __init__(self, model: nn.Module, session: Session, prompt_length: int, capacity: int,
                 batch: int = 1, drafts: int = 0) -> None:  # fmt: skip
        self.model, self.session = model, session
        self.prompt_length, self.batch = prompt_length, batch
        with torch.no_grad():
            self.plan, self.decoder = _plan(
                model, session, prompt_length, capacity, batch, drafts=drafts
            )
        self.ready = False  # a prefill ran: steps take what it kept

    def _weights(self) -> list[HeldShared]:
        ws = [tensor_at(m, a, p) for m, a, p, _ in secret_slots(self.model)]
        if not all(isinstance(w, HeldShared) for w in ws):
            raise MPCError(
                "held generation runs on the owner's held weights (mpc.share(model_ptr))"
            )
        return ws  # type: ignore[return-value]

    def _run(self, first: bool, *inputs: SharedTensor) -> SharedTensor:
        plan = self.plan
        variant = plan._first if first else plan.later
        if first:  # a new generation: the last one's cache, position and instances go
            drop_dealt(plan.later, plan.workers)
            drop_generation(plan._first, plan.later, plan.later.carry, plan.workers)
        out = plan._run(variant, (*inputs, *self._weights()), plan._held_fields(variant))
        if first:
            plan.later.carry = plan.last_bindings
        wait_for_runs(self.session.parties)  # (the output is released when the run ends)
        return out

    def prefill(self, rows: SharedTensor) -> SharedTensor:
        if tuple(rows.shape[:2]) != (self.batch, self.prompt_length):
            raise MPCError(
                f"the owner approved prompts of {self.prompt_length} tokens (batch "
                f"{self.batch}), not shape {tuple(rows.shape[:2])}"
            )
        out = self._run(True, rows)
        self.ready = True
        return out

    def step(self, rows: SharedTensor, *more: SharedTensor) -> SharedTensor:
        if not self.ready:
            raise MPCError("a step runs after its generation's prefill")
        return self._run(False, rows, *more)

    def preprocess(self, steps: int) -> None:
        """Deal the crypto provider's material for this generation's next ``steps``
        steps now, after its prefill (:func:`~mpc.generation.decoding.deal_steps`): the
        steps take what the prefill kept. A new prefill drops the sets not used."""
        if not self.dealable:
            raise MPCError(
                "the steps' material is dealt after the generation's prefill (the steps "
                "take what it keeps)"
            )
        deal_steps(self.plan, self.plan.later, steps)

    @property
    def dealable(self) -> bool:
        """Whether the steps' material can be dealt now: after the generation's prefill."""
        return self.ready

    @property
    def prepared(self) -> int:
        """How many steps have their material dealt ahead."""
        return len(self.plan.later.prepared)


__all__ = ["HeldPrograms", "approve_generation"]
