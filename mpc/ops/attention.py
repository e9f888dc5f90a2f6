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
from mpc.ops.common import aten, check_public, result_dtype
from mpc.ops.local import add_shared, mul_public
from mpc.ops.masking import select_public
from mpc.ops.softmax_product import softmax_matmul
from mpc.protocols import approx
from mpc.protocols.approx import Fx
from mpc.protocols.truncated_products.run import truncate_and_multiply
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
    q: Any,
    k: Any,
    v: Any,
    mask: Any = None,
    causal: bool = False,
    scale: float | None = None,
    scores: SharedTensor | None = None,
) -> SharedTensor:
    """softmax(q k^T scale + mask) v, as torch's scaled_dot_product_attention: two Beaver
    matmuls (or local products with a public operand) and a softmax. A public mask is a
    public selection (:mod:`mpc.ops.masking`): a bool mask's False positions, a float
    mask's finfo.min / -inf entries, and the causal mask's upper triangle weigh exactly 0
    in the softmax. Key/value heads fewer than the query's are repeated (grouped-query
    attention). ``scores``: q k^T already formed (:func:`scores_in_truncation`)."""
    heads = q.shape[-3] if q.dim() >= 3 else 1
    if q.dim() >= 3:
        v = repeat_heads(v, heads)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    if scores is None:
        k = repeat_heads(k, heads) if q.dim() >= 3 else k
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


#: the most product elements (query rows x keys x head size, all heads) whose scores ride
#: in the truncation round of q, k and v (:func:`scores_in_truncation`): the dealer deals 3
#: words each (24 MiB at most), where the Beaver matmul's triple is about one a score
FUSED_SCORES_UP_TO = 1 << 20


def scores_in_truncation(q: Any, k: Any, v: Any) -> SharedTensor | None:
    """q k^T (untruncated, its truncation pending) formed in the round that truncates q, k
    and v (:func:`mpc.protocols.truncated_products.run.truncate_and_multiply`: each
    score the sum over the head dim of elementwise products of freshly truncated values,
    no Beaver opening), where q and k are both still to be truncated (a decoding step's:
    the new token's projection, and the cache joined to it at the projection's scale) and
    the products are few (:data:`FUSED_SCORES_UP_TO`: a decoding step's 12 heads x 56 keys
    x 64, 43,008). One round fewer than the truncations and then the product, and the
    Beaver opening of k (a word a key and head dim) is not sent. q, k and v (if pending)
    are left truncated in place, as :func:`_materialize_together` leaves them; None (and
    nothing run) elsewhere. Grouped-query attention's key heads serve their query heads by
    broadcasting (no copies)."""
    if not all(isinstance(t, SharedTensor) for t in (q, k)) or q.dim() < 3 or k.dim() != q.dim():
        return None
    if not (q.pending and k.pending) or (isinstance(v, SharedTensor) and v.dim() != q.dim()):
        return None
    heads, kv, lq, lk, d = q.shape[-3], k.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    lead = tuple(q.shape[:-3])
    if heads % kv or tuple(k.shape[:-3]) != lead or k.shape[-1] != d:
        return None
    if math.prod(lead) * heads * lq * lk * d > FUSED_SCORES_UP_TO:
        return None
    group = heads // kv
    # q as [.., kv, group, lq, 1, d] against k as [.., kv, 1, 1, lk, d]
    qv = q.reshape(*lead, kv, group, lq, 1, d)
    kv_ = k.reshape(*lead, kv, 1, 1, lk, d)
    todo = [qv, kv_] + ([v] if isinstance(v, SharedTensor) and v.pending else [])
    fx = [Fx(t.session, list(t.shares), t.frac_bits) for t in todo]
    done, (prod,) = truncate_and_multiply(
        fx, [t.frac_bits - t.pending for t in todo], [0.0] * len(todo), [(0, 1)]
    )
    truncated_in_place(q, k, v, done)
    shares = [s.sum(-1).reshape(*lead, heads, lq, lk) for s in prod.shares]
    f = q.session.config.frac_bits
    return SharedTensor(shares, q.session, prod.scale, result_dtype(q, k), pending=prod.scale - f)


def truncated_in_place(q: SharedTensor, k: SharedTensor, v: Any, done: list[Fx]) -> None:
    """q, k and v (if it was truncated too: ``done`` holds 2 or 3) take the truncated
    values of their round, q and k reshaped back from the products' broadcast views."""
    for t, got, shape in zip([q, k, v], done, [q.shape, k.shape, None]):
        t.shares = [s.reshape(shape) for s in got.shares] if shape is not None else got.shares
        t.frac_bits, t.pending = got.scale, 0


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
    scores = scores_in_truncation(q, k, v)
    if scores is None:
        _materialize_together(q, k, v, kwargs.get("attn_mask"))
    dropout = args[3] if len(args) > 3 else kwargs.get("dropout_p", 0.0)
    causal = args[4] if len(args) > 4 else kwargs.get("is_causal", False)
    if dropout:
        raise UnsupportedOpError(str(func), "dropout in attention (call model.eval())")
    mask, scale = kwargs.get("attn_mask"), kwargs.get("scale")
    out = attention(q, k, v, mask, bool(causal), scale, scores)
    lse = torch.empty(tuple(q.shape[:-1]), dtype=torch.float32, device="meta")
    return out, lse
