"""Greedy decoding as two recorded programs per party: the prefill's and the step's.

A :class:`Decoder` holds one generation's state (:mod:`mpc.generation.cache`: the shared
cache of a fixed capacity and the position at the parties) and the two computations:

* the **prefill**: the prompt's one-hot rows (shared by the client) through the model,
  which writes the prompt's keys and values and sets the position at the parties, then
  the argmax of the last logits (a comparison tree on shares);
* the **step**: one token's one-hot rows through the model, which writes at the position
  the parties hold and advances it, then the argmax.

Each is recorded once into one program per party and the crypto provider (``mpc.plan``'s
machinery); the step's program refers to the prefill's objects (the cache, the position,
the weights' instances) through carried slots, bound at each run to what the last
prefill's run made. A token then costs the client one message per worker to start the
step, the sharing of its one-hot row, and the fetch of the argmax: the only value opened.

On a model the client shared itself (:class:`PlainPrograms`), the first prefill and the
first step are recorded as they run (the recording run is the real one). On a model its
owner shares from its worker (:class:`HeldPrograms`, on :class:`mpc.held.HeldPlan`), both
are recorded on stand-in weights, as the owner recorded them to approve them
(:func:`mpc.generation.approve_generation`), and each run binds the owner's held shares;
every party checks each run against the owner's approvals, holds the cache and the
position as the owner's (no client reads or binds them elsewhere), and releases only the
argmax.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.api import fuse_activations
from mpc.errors import MPCError
from mpc.generation import attention
from mpc.generation.cache import PartyPositions, Rotary, SharedStaticCache, positional_kind
from mpc.plan import Programs, SharedPlan
from mpc.protocols.weights import run as weights
from mpc.session import Session
from mpc.shared import SharedTensor


def embedding(model: nn.Module) -> Any:
    get = getattr(model, "get_input_embeddings", None)
    emb = get() if get is not None else None
    if emb is None:
        raise MPCError(f"{type(model).__name__} has no get_input_embeddings()")
    return emb


def last_logits(model: nn.Module, hidden: Any, n: int = 1) -> Any:
    """The logits (b, n, vocab) of the last ``n`` positions of the base model's
    ``hidden`` states (b, L, d): the model's output embeddings (its LM head) on those rows
    only, as one matrix (b n, d). (Through the LM head model's own ``logits_to_keep``, the
    prefill's rows are a strided view and a step's are not: torch lays the head's weight
    out two ways for them, so two weight instances, and every step made its own.)"""
    head = model.get_output_embeddings()  # type: ignore[operator]
    if head is None:
        raise MPCError(f"{type(model).__name__} has no output embeddings (an LM head)")
    b, d = hidden.shape[0], hidden.shape[-1]
    return head(hidden[:, -n:, :].reshape(b * n, d)).reshape(b, n, -1)


class Decoder:
    """One generation's state and its two computations (see the module's docstring):
    ``prefill(model, rows)`` and ``step(model, rows)``, each returning the argmax of the
    last position's logits, shared. ``capacity``: the most tokens (prompt and generated)
    the cache holds; a step past it fails at the parties."""

    def __init__(self, model: nn.Module, session: Session, capacity: int) -> None:
        if capacity < 2:
            raise ValueError(f"capacity must be at least 2 tokens, got {capacity}")
        fuse_activations(model)  # (a held model's GELU too: the owner's and the client's)
        self.kind = positional_kind(model)
        self.capacity = capacity
        self.positions = PartyPositions(session, capacity)
        frac = session.config.frac_bits
        self.rotary = Rotary(model, self.positions, frac) if self.kind == "rotary" else None
        self.cache = SharedStaticCache(self.positions, self.rotary)

    # (the attention reads this, the positions and the rotary through the model's keyword
    # arguments)
    @property
    def prefill(self) -> bool:
        return self.cache.prefill

    def mask_extra(self, scores: SharedTensor) -> SharedTensor:
        """A step's scores after the positions' mask (a subclass masks more)."""
        return scores

    def run_prefill(self, model: nn.Module, rows: SharedTensor) -> SharedTensor:
        """The prompt's one-hot rows (b, T, vocab) through the model; the argmax (b, 1)."""
        b, length = rows.shape[0], rows.shape[1]
        self.cache.prefill = True
        self.cache.keys.clear()
        self.cache.values.clear()
        self.positions.start(rows, length)
        embeds = rows @ embedding(model).weight
        mask = torch.zeros(b, 1, length, self.capacity)  # (ignored: it skips HF's own mask)
        with attention.selected(model):
            out = model.base_model(  # type: ignore[operator]
                inputs_embeds=embeds,
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
                **{attention.STATE: self},
            )
        self.cache.prefill = False
        logits = last_logits(model, out.last_hidden_state)
        return logits[:, -1].argmax(-1, keepdim=True)  # type: ignore[no-any-return]

    def run_step(self, model: nn.Module, rows: SharedTensor) -> SharedTensor:
        """L tokens' one-hot rows (b, L, vocab) through the model at the position the
        parties hold; the argmax of the last (b, 1)."""
        b, length = rows.shape[0], rows.shape[1]
        self.positions.begin_step(length)
        if self.rotary is not None:
            self.rotary.begin_step()
        embeds = rows @ embedding(model).weight
        if self.kind == "learned":  # wpe at the parties' positions (the model adds wpe[0])
            wpe: Any = model.transformer.wpe.weight  # type: ignore[union-attr]
            shares = [
                w.index_select(0, idx) - w[0] for w, idx in zip(wpe.shares, self.positions.idx)
            ]
            embeds = embeds + wpe.with_shares(shares)
        mask = torch.zeros(b, 1, length, self.capacity)
        with attention.selected(model):
            out = model.base_model(  # type: ignore[operator]
                inputs_embeds=embeds,
                position_ids=torch.zeros(b, length, dtype=torch.int64),
                attention_mask=mask,
                past_key_values=self.cache,
                use_cache=True,
                **{attention.STATE: self},
            )
        self.positions.end_step()
        logits = last_logits(model, out.last_hidden_state)
        return logits[:, -1].argmax(-1, keepdim=True)  # type: ignore[no-any-return]


def one_hot_rows(ids: torch.Tensor, vocab: int, session: Session) -> SharedTensor:
    """The client's token ids (b, L) as shared one-hot rows (b, L, vocab)."""
    from mpc.shared import share_tensor

    if ids.is_floating_point() or ids.dim() != 2:
        raise MPCError("token ids are an integer tensor of shape (batch, length)")
    if int(ids.min()) < 0 or int(ids.max()) >= vocab:
        raise MPCError(f"token ids must lie in [0, {vocab})")
    return share_tensor(torch.nn.functional.one_hot(ids.to(torch.int64), vocab), session)


def _recorded_bindings(variant: Programs) -> list[int]:
    """The bindings of a recording's own run (each slot bound to its recorded value)."""
    out = [0] * len(variant.slots)
    for value, k in variant.slots.index.items():
        out[k] = value
    return out


def drop_generation(
    first: Programs, later: Programs, carry: list[int] | None, workers: list[Any]
) -> None:
    """Delete, at their workers, what a prefill's program run (its bindings ``carry``)
    kept for its steps: the cache, the position, the weights' instances and the dealer's
    masks of those (the objects ``later``'s carried slots take). For a new prefill, which
    starts a new generation: no step takes them again (a step takes what the last
    prefill's run kept), and no pointer of the client's refers to them (a program run's
    objects have none), so they would stay at the parties and the dealer for good."""
    if carry is None:
        return
    by_id = {w.id: w for w in workers}
    for kind, arg in later.slots.kind:
        if kind == "carried" and first.slots.kind[arg][0] == "new":
            by_id[first.slots.kind[arg][1]].queue_delete(carry[arg])
    for w in workers:
        w.flush_deletes()


def deal_steps(plan: SharedPlan, later: Programs, steps: int) -> None:
    """Deal the crypto provider's material for the next ``steps`` runs of the step program
    ``later`` now (the offline phase, :meth:`mpc.plan.SharedPlan.preprocess`): each such
    step then runs the parties' programs only, and the dealer's work and deliveries leave
    the token. The sets refer to what the last prefill kept (``later.carry``)."""
    if type(steps) is not int or steps < 0:
        raise ValueError(f"steps must be an int of at least 0, got {steps!r}")
    plan._preprocess(later, steps)


def drop_dealt(later: Programs | None, workers: list[Any]) -> None:
    """Forget the steps' material dealt ahead and not used (a new prefill starts a new
    generation, whose steps take what it keeps: the old sets are of no use), and delete
    the dealer's deliveries of those sets at the parties."""
    if later is None or not later.prepared:
        return
    by_id = {w.id: w for w in workers}
    while later.prepared:
        bindings = later.prepared.popleft()
        for party, slot in later.dealt:
            by_id[party].queue_delete(bindings[slot])
    for w in workers:
        w.flush_deletes()


class PlainPrograms:
    """A client-shared model's prefill and step programs (recorded as they first run).
    ``decoder``: another :class:`Decoder` (a speculative one), whose ``later`` method is
    the later program (default ``run_step``)."""

    def __init__(
        self,
        model: nn.Module,
        session: Session,
        capacity: int,
        decoder: Decoder | None = None,
        later: str = "run_step",
    ) -> None:
        self.model, self.session = model, session
        self.decoder = decoder or Decoder(model, session, capacity)
        self.later_name = later
        self.plan: SharedPlan | None = None
        self.later: Programs | None = None
        self.prefills = 0
        self.carry: list[int] | None = None  # the last prefill's bindings
        self.ran = False  # whether those are a program run's (not the recording's)

    def prefill(self, rows: SharedTensor) -> SharedTensor:
        if self.plan is None or (self.later is None and self.prefills):
            # (a step not yet recorded records on the state of the prefill recorded last)
            model, dec = self.model, self.decoder
            # the weights' instances another shape's programs made go: this recording
            # makes its own, which its step carries
            for param in model.parameters():
                weights.drop_instances(param)  # type: ignore[arg-type]
            with weights.held_instances():  # (the step takes the instances the prefill made)
                self.plan = SharedPlan(lambda x: dec.run_prefill(model, x), rows)
            self.later = None
            out: SharedTensor = self.plan.example_output
            self.plan.example_output = None  # type: ignore[assignment]
            self.carry = _recorded_bindings(self.plan._first)
            self.ran = False  # (its objects: the client's pointers hold them)
        else:
            drop_dealt(self.later, self.plan.workers)
            if self.later is not None and self.ran:  # (the last generation's)
                drop_generation(self.plan._first, self.later, self.carry, self.plan.workers)
            out = self.plan._run(self.plan._first, (rows,))
            self.carry, self.ran = self.plan.last_bindings, True
            if self.later is not None:
                self.later.carry = self.carry
        self.prefills += 1
        return out

    def step(self, rows: SharedTensor, *more: SharedTensor) -> SharedTensor:
        if self.plan is None:
            raise MPCError("a step runs after its generation's prefill")
        if self.later is None:
            model, fn = self.model, getattr(self.decoder, self.later_name)
            with weights.held_instances():
                self.later = Programs(
                    lambda *xs: fn(model, *xs), self.plan.workers, (rows, *more), self.plan._first
                )
            self.later.carry = self.carry
            out: SharedTensor = self.later.output
            self.later.output = None  # type: ignore[assignment]
            return out
        return self.plan._run(self.later, (rows, *more))

    def preprocess(self, steps: int) -> None:
        """Deal the crypto provider's material for this generation's next ``steps``
        steps now (:func:`deal_steps`). A client-shared model's step program is recorded by
        its first run: the steps after the first can be dealt ahead."""
        if not self.dealable:
            raise MPCError(
                "the steps' material is dealt ahead once the step program exists: after "
                "the generation's first step (it is recorded as it runs)"
            )
        assert self.plan is not None and self.later is not None
        deal_steps(self.plan, self.later, steps)

    @property
    def dealable(self) -> bool:
        """Whether the steps' material can be dealt now: once the step program exists."""
        return self.plan is not None and self.later is not None

    @property
    def prepared(self) -> int:
        """How many steps have their material dealt ahead."""
        return 0 if self.later is None else len(self.later.prepared)


__all__ = [
    "deal_steps",
    "drop_dealt",
    "Decoder",
    "PlainPrograms",
    "drop_generation",
    "embedding",
    "last_logits",
    "one_hot_rows",
]
