"""Several tokens per forward pass: the client's drafts verified on shares.

The client knows its prompt and every token revealed so far, so it may propose k draft
tokens by any rule of its own, in plaintext (:func:`prompt_lookup`: the tokens that
followed the last occurrence of the current n-gram). One pass of the model on shares
takes the last revealed token and the k drafts (L = k + 1 positions) and computes, at
each position i, a_i, the argmax of the logits: what greedy decoding would output after
the first i drafts. Then, on shares:

* eq_i = (a_i == d_(i+1)) for i < k (a comparison of the shared ids);
* the prefix AND p_i = eq_0 ... eq_i (k - 1 products in sequence);
* r_0 = 1, r_i = p_(i-1): whether greedy decoding outputs a_i at all (every draft before
  it was right);
* o_i = r_i (a_i + 1) - 1, opened: a_i where r_i = 1, and -1 elsewhere.

**What the client learns** is a_0, ..., a_j, where d_1..d_j are the accepted drafts and
a_j the first correction: exactly the next j + 1 tokens of greedy decoding, and the
count j (which those tokens and the client's own drafts tell anyway). Nothing about a
position after the first wrong draft opens (its o is -1, whatever a_i is). So a client
learns by speculation what it would learn by j + 1 plain steps.

**What the parties learn**: nothing more than the shapes and the number of passes. The
number of accepted drafts stays secret: the cache is written at public rows (each pass
takes the next L rows, whatever is accepted), and each party holds, shared, which rows
hold accepted tokens (v, 0 or 1 a row) and the one-hot of the next token's position
(P, for the position embedding). A query sees the earlier rows where v is 1 (a product
with the shared v), its pass's own earlier rows and itself; its position embedding is
``shift(P, i) @ wpe`` (a product with the shared one-hot). After the pass, v gets r at
the pass's rows and P moves by the number of revealed tokens (sum_m (r_(m-1) - r_m)
shift(P, m): one product). The rows of rejected drafts keep their keys and values, and
weigh e^-16 relative in the softmax, like every masked position (:mod:`mpc.ops.masking`).

Models with learned absolute positions (GPT-2) only: a rotary model's rotation at a
secret position needs products of the queries and keys with shared cos and sin, not done
yet.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from mpc.errors import MPCError
from mpc.generation import attention
from mpc.generation.decoding import Decoder, embedding, last_logits
from mpc.ops.masking import MASKED_VALUE
from mpc.session import Session
from mpc.shared import SharedTensor


def _shift(s: Any, m: int) -> Any:
    """A share of a vector (C,) moved m places right, zeros in front (local)."""
    if m == 0:
        return s
    return torch.cat([s.new_zeros(m), s[:-m]])


class SpeculativeDecoder(Decoder):
    """A :class:`~mpc.generation.decoding.Decoder` whose later program verifies k drafts
    a pass (``run_pass``); its prefill also makes the shared row validity v and position
    one-hot P. GPT-2 style models (learned positions) only."""

    def __init__(self, model: nn.Module, session: Session, capacity: int, drafts: int) -> None:
        super().__init__(model, session, capacity)
        if self.kind != "learned":
            raise MPCError(
                "speculative verification needs learned absolute positions (GPT-2's "
                "transformer.wpe); for rotary models use mpc.generate without drafts"
            )
        if not 1 <= drafts < capacity:
            raise ValueError(f"drafts must be in [1, {capacity}), got {drafts}")
        self.drafts = drafts
        self.session = session
        # the logical positions a token may take: the position table's rows (a pass takes
        # k + 1 cache rows, but a token only one position)
        wpe: Any = model.transformer.wpe  # type: ignore[union-attr]
        self.npos: int = min(capacity, int(wpe.weight.shape[0]))
        self.valid: SharedTensor | None = None  # (C,) 0/1: the rows holding accepted tokens
        self.where: SharedTensor | None = None  # (C,) one-hot of the next token's position
        self.validity: SharedTensor | None = None  # (this pass: v and the pass's own rows)

    def _made(self, like: SharedTensor, party0: torch.Tensor) -> SharedTensor:
        """A sharing of the public vector ``party0`` made by the run: party 0 holds it,
        every other party zeros (from a share of the run's input)."""
        shares = []
        for i, s in enumerate(like.shares):
            z = s.new_zeros(len(party0))
            shares.append(z + party0 if i == 0 else z)
        return SharedTensor(shares, self.session, 0, torch.int64)

    def run_prefill(self, model: nn.Module, rows: SharedTensor) -> SharedTensor:
        out = super().run_prefill(model, rows)
        length = rows.shape[1]
        c = torch.arange(self.capacity)
        self.valid = self._made(rows, (c < length).to(torch.int64))
        self.where = self._made(rows, (torch.arange(self.npos) == length).to(torch.int64))
        return out

    def mask_extra(self, scores: SharedTensor) -> SharedTensor:
        """Scores already masked past each query's own row: the earlier passes' rows
        whose drafts were rejected masked too (a product with the shared validity)."""
        if self.validity is None:
            return scores
        m = torch.full((), MASKED_VALUE, dtype=torch.float64)
        return (scores - m) * self.validity + m  # type: ignore[no-any-return]

    def run_pass(self, model: nn.Module, rows: SharedTensor, drafts: SharedTensor) -> SharedTensor:
        """The last token and k drafts (b, k + 1, vocab), the drafts' ids (b, k): the
        opened o (b, k + 1) of the module's docstring."""
        assert self.valid is not None and self.where is not None
        b, length = rows.shape[0], rows.shape[1]
        if length != self.drafts + 1 or tuple(drafts.shape) != (b, self.drafts):
            raise MPCError(f"a pass takes the last token and {self.drafts} drafts")
        positions = self.positions
        positions.begin_step(length)
        # the rows this pass sees besides the valid ones: its own (public: from t on)
        ahead = [(positions.arange >= t).to(torch.int64) for t in positions.t]  # type: ignore[union-attr]
        shares = [v + a if i == 0 else v for i, (v, a) in enumerate(zip(self.valid.shares, ahead))]
        self.validity = self.valid.with_shares(shares)
        embeds = rows @ embedding(model).weight
        wpe: Any = model.transformer.wpe.weight  # type: ignore[union-attr]
        rows_of: list[Any] = [
            torch.stack([_shift(p, i) for i in range(length)]) for p in self.where.shares
        ]
        one_hot = self.where.with_shares(rows_of)  # (L, C): each position's one-hot, shared
        base = wpe.with_shares([w[0] for w in wpe.shares])
        embeds = embeds + (one_hot @ wpe[: self.npos] - base)
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
        self.validity = None
        a = last_logits(model, out.last_hidden_state, length).argmax(-1)  # (b, L)
        eq = (a[:, :-1] == drafts).long()  # (b, k)
        prefix = [eq[:, :1]]
        for i in range(1, self.drafts):
            prefix.append(prefix[-1] * eq[:, i : i + 1])
        ones = a[:, :1] * 0 + 1
        r = torch.cat([ones, *prefix], dim=1)  # (b, L): greedy outputs a_i
        # the state first (v at this pass's rows, P moved by the count revealed; b = 1),
        # the output last: when the client holds the output, the next pass may start
        r0: Any = r[0]
        for v, s, sel in zip(self.valid.shares, r0.shares, positions.sel):
            v.copy_(v + sel.transpose(0, 1) @ s)
        nxt = torch.cat([r0[1:], r0[:1] * 0])
        moved = r0 - nxt  # (L,): one-hot of the count revealed, minus one
        moves: list[Any] = [
            torch.stack([_shift(p, m + 1) for m in range(length)]) for p in self.where.shares
        ]
        shifted = self.where.with_shares(moves)
        new_where = (shifted * moved.unsqueeze(1)).sum(0)
        for p, n in zip(self.where.shares, new_where.shares):
            p.copy_(n)
        positions.end_step()
        opened = r * (a + 1) - 1
        return opened  # type: ignore[no-any-return]


def prompt_lookup(tokens: list[int], k: int, ngram: int = 3) -> list[int]:
    """k draft tokens from the text so far: the tokens that followed the latest earlier
    occurrence of its last n-gram (n from ``ngram`` down to 1), padded with the last
    token; no model needed."""
    for n in range(min(ngram, len(tokens) - 1), 0, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start : start + n] == tail:
                follow = tokens[start + n : start + n + k]
                return follow + [follow[-1] if follow else tokens[-1]] * (k - len(follow))
    return [tokens[-1]] * k


__all__ = ["SpeculativeDecoder", "prompt_lookup"]
