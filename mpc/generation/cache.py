"""A fixed-capacity KV cache of shared keys and values, and a generation's position held
by the parties, so that every decoding step runs the same recorded program.

Where a step writes its keys and values, which cache positions its queries see, and (for
rotary models) the rotation of its queries and keys depend on the position. Were the
client to compute them, each token's program would carry other constants. Here each party
holds the position itself: ``t``, a one-element int64 tensor that the prefill's run makes
and each step's run advances in place. A step derives from it, with ordinary ops at each
party (each on its own copy, no communication):

* ``idx = t + arange(L)``, the positions of the step's L queries; a look-up of ``idx`` in
  ``arange(C)`` fails the run past the capacity C (the maximum length the program was
  made for);
* ``sel[l, j] = (j == idx[l])``, a public 0/1 selection of the cache rows the step writes:
  ``K <- K * (1 - colsum(sel)) + sel^T @ k`` on every share (exact: integer products);
* ``keep[l, j] = (j <= idx[l])``, the rows each query sees: every other score becomes the
  masked value (shares times 0, and the masked constant at party 0), and weighs e^-16 of
  the row's largest in the softmax, on a row of values that is still zero;
* rotary models: the rows ``idx`` of the cos and sin tables (public, encoded), which rotate
  the step's queries and keys on each share (a product with a public value: one
  truncation, applied with the product's own).

The client learns nothing from this (the position is public anyway: the parties know how
many tokens a generation has produced), and a client cannot choose the position: in a
model its owner shares, ``t`` and the cache are the owner's held objects, which only the
approved programs read, in the order they run.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.errors import MPCError
from mpc.math.encoding import encode
from mpc.ops.masking import MASKED_VALUE
from mpc.session import Session
from mpc.shared import SharedTensor


class PartyPositions:
    """A generation's position at the parties (see the module's docstring)."""

    def __init__(self, session: Session, capacity: int) -> None:
        self.session, self.capacity = session, capacity
        self.t: list[Any] | None = None  # per party, [t]
        self.arange = torch.arange(capacity)
        self.length = 0  # the step's queries (1 when decoding)
        self.sel: list[Any] = []  # per party, (L, C) int64 0/1
        self.keep: list[Any] = []
        self.idx: list[Any] = []
        self.seen = 0  # the client's count, for the model's code (get_seq_length)

    def start(self, like: SharedTensor, written: int) -> None:
        """The prefill's run makes t = ``written`` at each party (from a share of its
        input, so that the run made it)."""
        if written > self.capacity:
            raise MPCError(f"a prompt of {written} tokens exceeds the capacity {self.capacity}")
        self.t = [s.new_full((1,), written, dtype=torch.int64) for s in like.shares]
        self.seen = written

    def begin_step(self, length: int) -> None:
        """Compute, at each party, the positions, writes and views of a step of
        ``length`` queries."""
        if self.t is None:
            raise MPCError("a step runs after its generation's prefill")
        self.length = length
        offsets = torch.arange(length)
        self.idx, self.sel, self.keep = [], [], []
        rows = self.arange.unsqueeze(0)
        for t in self.t:
            idx = t + offsets
            self.arange.index_select(0, idx)  # (fails the run past the capacity)
            self.idx.append(idx)
            self.sel.append((rows == idx.unsqueeze(1)).to(torch.int64))
            self.keep.append((rows <= idx.unsqueeze(1)).to(torch.int64))

    def end_step(self) -> None:
        assert self.t is not None
        for t in self.t:
            t.add_(self.length)
        self.seen += self.length
        # the step's positions and views are its own temporaries: dropped here, the
        # recorded step deletes them (kept, every run of it would leave them at the parties)
        self.idx, self.sel, self.keep = [], [], []

    def mask_scores(self, scores: SharedTensor) -> SharedTensor:
        """Scores (..., L, C) with the positions a query does not see masked (a pending
        truncation stays pending: the softmax reads the scores at their full scale)."""
        masked = int(encode(MASKED_VALUE, scores.frac_bits))
        shares = []
        for i, (s, keep) in enumerate(zip(scores.shares, self.keep)):
            out = s * keep
            if i == 0:
                out = out + (1 - keep) * masked
            shares.append(out)
        return scores.with_shares(shares)

    def write(self, cache: SharedTensor, new: SharedTensor) -> None:
        """cache (b, h, C, d) <- new (b, h, L, d) at the step's positions, in place."""
        new.materialize()
        if new.frac_bits != cache.frac_bits:
            raise MPCError("internal: a cache write at another scale")
        for c, n, sel in zip(cache.shares, new.shares, self.sel):
            unsel = (1 - sel.sum(0)).reshape(-1, 1)  # (C, 1)
            c.copy_(c * unsel + sel.transpose(0, 1) @ n)

    def rows_of(self, table: torch.Tensor) -> list[Any]:
        """Per party, the rows ``idx`` of a public table (C, ...)."""
        return [table.index_select(0, idx) for idx in self.idx]


class Rotary:
    """The cos and sin tables of a rotary model over the capacity, encoded, and the
    rotation of a shared query or key at the party-side positions."""

    def __init__(self, model: Any, positions: PartyPositions, frac_bits: int) -> None:
        emb = _rotary_module(model)
        ids = torch.arange(positions.capacity).unsqueeze(0)
        probe = torch.zeros(1, positions.capacity, 1)
        with torch.no_grad():
            cos, sin = emb(probe, position_ids=ids)
        self.frac_bits = frac_bits
        self.cos = encode(cos[0].double(), frac_bits)  # (C, d)
        self.sin = encode(sin[0].double(), frac_bits)
        self.positions = positions
        self.rows: tuple[list[Any], list[Any]] | None = None

    def begin_step(self) -> None:
        self.rows = (self.positions.rows_of(self.cos), self.positions.rows_of(self.sin))

    def rotate(self, x: SharedTensor) -> SharedTensor:
        """x (b, h, L, d) rotated at the step's positions: x cos + rotate_half(x) sin."""
        assert self.rows is not None
        x.materialize()
        half = x.shape[-1] // 2
        shares = []
        for s, cos, sin in zip(x.shares, *self.rows):
            turned = torch.cat([-s[..., half:], s[..., :half]], dim=-1)
            shares.append(s * cos + turned * sin)
        return SharedTensor(
            shares, x.session, x.frac_bits + self.frac_bits, x.dtype, self.frac_bits
        )


def _rotary_module(model: Any) -> Any:
    base = getattr(model, "model", model)
    emb = getattr(base, "rotary_emb", None)
    if emb is None:
        raise MPCError(f"{type(model).__name__} has no rotary embedding (model.rotary_emb)")
    return emb


def positional_kind(model: Any) -> str:
    """How a causal language model encodes positions: "learned" (GPT-2's ``wpe``) or
    "rotary" (Llama's ``rotary_emb``); anything else is refused."""
    base = getattr(model, "transformer", None)
    if base is not None and hasattr(base, "wpe"):
        return "learned"
    if getattr(getattr(model, "model", model), "rotary_emb", None) is not None:
        return "rotary"
    raise MPCError(
        f"{type(model).__name__}: generation as one program per token supports models with "
        "learned positions (GPT-2's transformer.wpe) or rotary ones (Llama's rotary_emb)"
    )


class SharedStaticCache:
    """A fixed-capacity cache of shared keys and values for ``transformers`` models
    (``past_key_values=``): the prefill writes its L positions and pads with zeros to the
    capacity; a step writes at the party-side positions (:class:`PartyPositions`), in
    place, so that every step's program is the same. ``update`` returns the whole
    capacity; the attention (:mod:`mpc.generation.attention`) masks what a query does not
    see."""

    is_compileable = False

    def __init__(self, positions: PartyPositions, rotary: Rotary | None = None) -> None:
        self.positions, self.rotary = positions, rotary
        self.keys: dict[int, SharedTensor] = {}
        self.values: dict[int, SharedTensor] = {}
        self.prefill = True
        # a step's new keys and values still to be truncated, by layer: written by the
        # attention in the round that truncates them (mpc.generation.attention)
        self.pending: dict[int, tuple[SharedTensor, SharedTensor]] = {}

    # -- what the models' code asks of a cache --------------------------------------------
    def update(
        self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[SharedTensor, SharedTensor]:
        if not isinstance(key, SharedTensor) or not isinstance(value, SharedTensor):
            raise MPCError("the shared cache takes shared keys and values")
        if self.prefill:
            self.keys[layer_idx] = _padded(key, self.positions.capacity)
            self.values[layer_idx] = _padded(value, self.positions.capacity)
        else:
            if self.rotary is not None:
                key = self.rotary.rotate(key)
            if key.pending:  # (the attention writes it, :meth:`take`)
                self.pending[layer_idx] = (key, value)
            else:
                self.positions.write(self.keys[layer_idx], key)
                self.positions.write(self.values[layer_idx], value)
        return self.keys[layer_idx], self.values[layer_idx]

    def take(self, layer_idx: int) -> tuple[SharedTensor, SharedTensor] | None:
        """The step's new key and value of ``layer_idx`` not yet written (the caller
        writes them: :meth:`PartyPositions.write`), or None."""
        return self.pending.pop(layer_idx, None)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0 if self.prefill else self.positions.seen

    def get_mask_sizes(self, *args: Any, **kwargs: Any) -> tuple[int, int]:
        return self.positions.capacity, 0

    def get_max_cache_shape(self, layer_idx: int = 0) -> int:
        return self.positions.capacity

    def __len__(self) -> int:
        return len(self.keys)


def _padded(x: SharedTensor, capacity: int) -> SharedTensor:
    """x (b, h, L, d) followed by zeros to ``capacity`` positions (every share: zeros)."""
    x.materialize()
    length = x.shape[-2]
    if length > capacity:
        raise MPCError(f"{length} positions exceed the cache's capacity {capacity}")
    shape = (*x.shape[:-2], capacity - length, x.shape[-1])
    shares: list[Any] = [torch.cat([s, s.new_zeros(shape)], dim=-2) for s in x.shares]
    return x.with_shares(shares)


__all__ = ["PartyPositions", "Rotary", "SharedStaticCache", "positional_kind"]
