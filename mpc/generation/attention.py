"""The attention of a generation's programs, registered with ``transformers`` as the
attention implementation :data:`NAME` (its seam for one replaced function,
``AttentionInterface.register``) and selected only while a generation runs the model.

The keys and values are the whole capacity of a :class:`~mpc.generation.cache.
SharedStaticCache`. In the prefill, the positions are public and the same at every run
(query i sees keys 0..i), so the mask is a public selection, exact in the softmax
(:mod:`mpc.ops.masking`). In a step, each party masks with its own view of the positions
(:meth:`~mpc.generation.cache.PartyPositions.mask_scores`); a rotary model's queries are
rotated there too (its keys when the cache writes them)."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from mpc.errors import MPCError, UnsupportedOpError
from mpc.generation.cache import PartyPositions
from mpc.ops.attention import (
    FUSED_SCORES_UP_TO,
    repeat_heads,
    scaled_scores,
    truncated_in_place,
)
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten, result_dtype
from mpc.ops.masking import select_public
from mpc.ops.softmax_product import softmax_matmul
from mpc.protocols.approx import Fx
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.shared import SharedTensor

NAME = "mpc_static_cache"
STATE = "mpc_generation"  # the keyword the attention finds the generation's state under


def static_cache_attention(
    module: Any,
    query: Any,
    key: Any,
    value: Any,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Any, None]:
    """softmax(q k^T scaling + mask) v over the cache's capacity; returns (b, L, h, d)."""
    state = kwargs.get(STATE)
    if state is None:
        raise MPCError(f"attention {NAME!r} runs inside a generation (mpc.generation) only")
    if dropout:
        raise UnsupportedOpError("attention", "dropout (call model.eval())")
    if not isinstance(query, SharedTensor):
        raise MPCError("a generation's attention takes shared queries")
    positions, rotary = state.positions, state.rotary
    if not state.prefill and rotary is not None:
        query = rotary.rotate(query)
    fused = None
    new = None if state.prefill else state.cache.take(getattr(module, "layer_idx", -1))
    if new is not None:  # the step's key and value, still to be truncated
        fused = scores_with_writes(query, key, value, new[0], new[1], positions)
    heads = query.shape[-3]
    key, value = repeat_heads(key, heads), repeat_heads(value, heads)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    if fused is None:
        fused = bilinear_op(query, key.transpose(-2, -1), "matmul", {})
    scores = scaled_scores(fused, scale)
    length, capacity = query.shape[-2], key.shape[-2]
    if state.prefill:  # query i sees 0..i: public, the same at every prefill of L tokens
        keep = torch.ones(length, capacity, dtype=torch.bool).tril()
        scores = select_public(keep, scores, float("-inf"))
    else:
        scores = state.mask_extra(positions.mask_scores(scores))
    out = softmax_matmul(aten._softmax.default, scores, value)
    return out.transpose(1, 2), None


def scores_with_writes(
    q: SharedTensor,
    keys: SharedTensor,
    values: SharedTensor,
    k: SharedTensor,
    v: SharedTensor,
    positions: PartyPositions,
) -> SharedTensor | None:
    """A decoding step's q K^T over the cache, formed in the round that truncates q and
    the step's new key k and value v (:func:`mpc.protocols.truncated_products.run.
    truncate_and_multiply`): q times the cache with the step's rows zeroed (a plain
    operand: its masked opening rides in that round) plus q k scattered to the step's
    rows (a product of truncated values), where the truncation and then the Beaver
    product took a round each. k and v are then written (:meth:`PartyPositions.write`),
    truncated. Returns the scores (their truncation pending), or None where it does not
    apply (k and v written as before, nothing else run)."""
    heads, kv, lq, d = q.shape[-3], keys.shape[-3], q.shape[-2], q.shape[-1]
    cap, lead = keys.shape[-2], tuple(q.shape[:-3])
    fits = (
        q.pending
        and k.pending
        and q.dim() == keys.dim() == k.dim() == 4
        and heads % kv == 0
        and tuple(k.shape) == (*lead, kv, lq, d)
        and tuple(keys.shape[:-2]) == (*lead, kv)
        and keys.pending == 0
        and q.frac_bits - q.pending + keys.frac_bits
        == q.frac_bits - q.pending + k.frac_bits - k.pending
        and math.prod(lead) * heads * lq * cap * d <= FUSED_SCORES_UP_TO
    )
    if not fits:
        positions.write(keys, k)
        positions.write(values, v)
        return None
    group = heads // kv
    session = q.session
    qv = q.reshape(*lead, kv, group, lq, 1, d)
    kn = k.reshape(*lead, kv, 1, 1, lq, d)
    old = [  # the cache with the step's rows zeroed (each party's own positions)
        (s * (1 - sel.sum(0)).reshape(-1, 1)).reshape(*lead, kv, 1, 1, cap, d)
        for s, sel in zip(keys.shares, positions.sel)
    ]
    todo = [qv, kn] + ([v] if v.pending else [])
    fx = [Fx(session, list(t.shares), t.frac_bits) for t in todo]
    done, (with_new, with_old) = truncate_and_multiply(
        fx,
        [t.frac_bits - t.pending for t in todo],
        [0.0] * len(todo),
        [(0, 1)],
        plain=Fx(session, old, keys.frac_bits),
        plain_pairs=[0],
    )
    truncated_in_place(q, k, v, done)
    shares = [
        (o.sum(-1) + torch.matmul(n.sum(-1), sel)).reshape(*lead, heads, lq, cap)
        for o, n, sel in zip(with_old.shares, with_new.shares, positions.sel)
    ]
    positions.write(keys, k)
    positions.write(values, v)
    f = session.config.frac_bits
    scale = with_old.scale
    return SharedTensor(shares, session, scale, result_dtype(q, keys), pending=scale - f)


def register() -> None:
    """Register :func:`static_cache_attention` with ``transformers`` (once)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if NAME not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(NAME, static_cache_attention)


@contextmanager
def selected(model: Any) -> Iterator[None]:
    """While the block runs, ``model`` (and its sub-configs) uses this attention."""
    register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield
    finally:
        config._attn_implementation = before


__all__ = ["NAME", "STATE", "register", "selected", "static_cache_attention"]
