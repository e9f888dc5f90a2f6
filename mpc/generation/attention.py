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

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

from mpc.errors import MPCError, UnsupportedOpError
from mpc.ops.attention import repeat_heads, scaled_scores
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten
from mpc.ops.masking import select_public
from mpc.ops.softmax_product import softmax_matmul
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
    heads = query.shape[-3]
    key, value = repeat_heads(key, heads), repeat_heads(value, heads)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    scores = scaled_scores(bilinear_op(query, key.transpose(-2, -1), "matmul", {}), scale)
    length, capacity = query.shape[-2], key.shape[-2]
    if state.prefill:  # query i sees 0..i: public, the same at every prefill of L tokens
        keep = torch.ones(length, capacity, dtype=torch.bool).tril()
        scores = select_public(keep, scores, float("-inf"))
    else:
        scores = state.mask_extra(positions.mask_scores(scores))
    out = softmax_matmul(aten._softmax.default, scores, value)
    return out.transpose(1, 2), None


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
