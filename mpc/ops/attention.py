"""Attention: torch's fused CPU kernel (``scaled_dot_product_attention``) decomposed into
secure ops: two Beaver matmuls and a softmax (:func:`mpc.ops.functions.softmax`), with a
public mask as a public selection (:mod:`mpc.ops.masking`). The pending truncations of q,
k and v are applied in one round, and a power-of-two scale joins the scores' truncation
(issue 25: 3 rounds fewer a layer)."""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.errors import UnsupportedOpError
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten, check_public
from mpc.ops.local import add_shared, mul_public
from mpc.ops.masking import select_public
from mpc.ops.softmax_product import softmax_matmul
from mpc.protocols import approx
from mpc.protocols.approx import Fx
from mpc.registry import register
from mpc.shared import SharedTensor


def repeat_heads(t: Any, heads: int) -> Any:
    """Grouped-query attention: each of t's key/value heads (dim -3) serves heads / h query
    heads (``repeat_interleave``; a view and a copy on every share)."""
    h = t.shape[-3]
    if h == heads:
        return t
    if heads % h:
        raise UnsupportedOpError("scaled_dot_product_attention", f"{heads} heads over {h}")
    lead = tuple(t.shape[:-3])
    t = t.unsqueeze(-3).expand(*lead, h, heads // h, *t.shape[-2:])
    return t.reshape(*lead, heads, *t.shape[-2:])


def attention(
    q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False, scale: float | None = None
) -> SharedTensor:
    """softmax(q k^T scale + mask) v, as torch's scaled_dot_product_attention: two Beaver
    matmuls (or local products with a public operand) and a softmax. A public mask is a
    public selection (:mod:`mpc.ops.masking`): a bool mask's False positions, a float
    mask's finfo.min / -inf entries, and the causal mask's upper triangle weigh exactly 0
    in the softmax. Key/value heads fewer than the query's are repeated (grouped-query
    attention)."""
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if q.dim() >= 3:
        k, v = repeat_heads(k, heads), repeat_heads(v, heads)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = bilinear_op(q, k.transpose(-2, -1), "matmul", {})
    if not isinstance(scores, SharedTensor):
        raise UnsupportedOpError("scaled_dot_product_attention", "expects a shared operand")
    scores = scaled_scores(scores, scale)
    lq, lk = q.shape[-2], k.shape[-2]
    if causal:  # torch's is_causal: the upper-left triangle (position i sees 0..i)
        keep = torch.ones(lq, lk, dtype=torch.bool).tril()
        scores = select_public(keep, scores, float("-inf"))
    if mask is not None:
        if isinstance(mask, SharedTensor):
            raise UnsupportedOpError("scaled_dot_product_attention", "the mask must be public")
        check_public(mask, "scaled_dot_product_attention")
        if mask.dtype == torch.bool:
            scores = select_public(mask, scores, float("-inf"))
        else:
            scores = add_shared(scores, mask, 1)
    # (_safe_softmax: a row masked entirely by -inf or False weighs nothing, as in torch)
    return softmax_matmul(aten._safe_softmax.default, scores, v)


def scaled_scores(scores: SharedTensor, scale: float) -> SharedTensor:
    """scores * scale. A power of two 2^-j on scores still to be truncated (a product's)
    joins that truncation: the same shares read at j more bits (no round; a separate
    product with the scale took one)."""
    j = -math.log2(scale) if scale > 0 else 0.5
    if scores.pending and j == int(j) and 0 < j <= 8:
        j = int(j)
        return SharedTensor(
            list(scores.shares), scores.session, scores.frac_bits + j, scores.dtype,
            scores.pending + j,
        )  # fmt: skip
    return mul_public(scores, scale)


def _materialize_together(*ts: Any) -> None:
    """Apply the pending truncations of several operands in one round (q, k and v are views
    of one projection: three materialisations took three)."""
    todo = [t for t in ts if isinstance(t, SharedTensor) and t.pending]
    if len(todo) < 2:
        for t in todo:
            t.materialize()
        return
    fx = [Fx(t.session, list(t.shares), t.frac_bits) for t in todo]
    with todo[0].session.concurrently(max(t.numel() for t in todo)):
        done = approx.truncate_many(fx, [t.frac_bits - t.pending for t in todo])
    for t, d in zip(todo, done):
        t.shares, t.frac_bits, t.pending = d.shares, d.scale, 0


@register(aten._scaled_dot_product_flash_attention_for_cpu.default, lazy=True)
def sdpa_flash_cpu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The fused attention kernel torch picks on CPU, decomposed into secure ops
    (:func:`attention`). The logsumexp output is a meta tensor (nothing in inference
    reads it). Pending truncations of q, k and v are applied together (one round)."""
    q, k, v = args[0], args[1], args[2]
    _materialize_together(q, k, v, kwargs.get("attn_mask"))
    dropout = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    if dropout:
        raise UnsupportedOpError(str(func), "dropout in attention (call model.eval())")
    out = attention(q, k, v, kwargs.get("attn_mask"), bool(causal), kwargs.get("scale"))
    lse = torch.empty(tuple(q.shape[:-1]), dtype=torch.float32, device="meta")
    return out, lse
