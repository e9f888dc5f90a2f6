"""Attention's scores formed in the round that truncates q, k and v
(mpc.ops.attention.scores_in_truncation): q and k both still to be truncated (fresh
projections), each score the sum of elementwise products of freshly truncated values
(mpc.protocols.truncated_products), one round fewer than truncating and then multiplying.
Against torch (hypothesis, 2 and 3 parties), with a mask, grouped-query heads and the
fallback where the products are too many."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.ops import attention


def _projections(n: int, heads: int, kv: int, lq: int, lk: int, d: int, seed: int) -> Any:
    """q, k, v as a model computes them: products of shared inputs and weights (each
    still to be truncated), and the same in plaintext."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("dealer")
    gen = torch.Generator().manual_seed(seed)
    xq, xk = torch.randn(1, lq, 32, generator=gen), torch.randn(1, lk, 32, generator=gen)
    wq = torch.randn(32, heads * d, generator=gen) * 0.3
    wk, wv = (torch.randn(32, kv * d, generator=gen) * 0.3 for _ in range(2))
    plain = (xq @ wq, xk @ wk, xk @ wv)
    shared = [mpc.share(t, *parties, crypto_provider=dealer) for t in (xq, xk, wq, wk, wv)]
    for t in shared:
        t.materialize()
    sq, sk, swq, swk, swv = shared
    got = (sq @ swq, sk @ swk, sk @ swv)

    def heads_of(t: Any, h: int, length: int) -> Any:
        return t.reshape(1, length, h, d).transpose(1, 2)

    out = [heads_of(t, h, ln) for t, h, ln in zip(got, (heads, kv, kv), (lq, lk, lk))]
    ref = [heads_of(t, h, ln) for t, h, ln in zip(plain, (heads, kv, kv), (lq, lk, lk))]
    return out, ref


@settings(max_examples=8, deadline=None)
@given(
    st.sampled_from([2, 3]),
    st.sampled_from([(4, 4), (4, 2), (6, 1)]),
    st.integers(1, 6),
    st.integers(1, 12),
    st.integers(0, 2**16),
)
def test_fused_scores_against_torch(n, heads_kv, lq, lk, seed) -> None:
    """One round fewer than the unfused path, the same result within 1e-3 of torch
    (grouped-query heads broadcast)."""
    heads, kv = heads_kv
    rounds = []
    for limit in (attention.FUSED_SCORES_UP_TO, 0):  # (0: the unfused path)
        (q, k, v), (rq, rk, rv) = _projections(n, heads, kv, lq, lk, 8, seed)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(attention, "FUSED_SCORES_UP_TO", limit)
            with mpc.stats() as s:
                out = F.scaled_dot_product_attention(q, k, v, enable_gqa=heads != kv)
                out.materialize()
        rounds.append(s.rounds)
        want = F.scaled_dot_product_attention(rq, rk, rv, enable_gqa=heads != kv)
        assert float((out.get() - want).abs().max()) < 1e-3
    assert rounds[0] == rounds[1] - 1


def test_fused_scores_with_a_mask_and_causal() -> None:
    (q, k, v), (rq, rk, rv) = _projections(2, 4, 4, 5, 5, 8, 1)
    mask = torch.zeros(5, 5)
    mask[:, -1] = float("-inf")
    got = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).get()
    assert (
        float((got - F.scaled_dot_product_attention(rq, rk, rv, attn_mask=mask)).abs().max()) < 1e-3
    )
    (q, k, v), _ = _projections(2, 4, 4, 5, 5, 8, 1)
    got = F.scaled_dot_product_attention(q, k, v, is_causal=True).get()
    assert (
        float((got - F.scaled_dot_product_attention(rq, rk, rv, is_causal=True)).abs().max()) < 1e-3
    )


def test_truncated_operands_keep_their_values() -> None:
    """q, k and v come back truncated in place (a cache that holds k keeps its value)."""
    (q, k, v), (rq, rk, rv) = _projections(2, 4, 4, 1, 7, 8, 2)
    scores = attention.scores_in_truncation(q, k, v)
    assert scores is not None
    assert q.pending == k.pending == v.pending == 0
    for t, r in ((q, rq), (k, rk), (v, rv)):
        assert float((t.get() - r).abs().max()) < 1e-3
    want = rq @ rk.transpose(-1, -2)
    assert float((scores.get() - want).abs().max()) < 1e-3


def test_many_products_keep_the_matmul() -> None:
    """Past FUSED_SCORES_UP_TO product elements (or with operands already truncated):
    nothing fused, nothing run."""
    (q, k, v), _ = _projections(2, 4, 4, 3, 4, 8, 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(attention, "FUSED_SCORES_UP_TO", 4 * 3 * 4 * 8 - 1)
        with mpc.stats() as s:
            assert attention.scores_in_truncation(q, k, v) is None
    assert s.rounds == 0 and q.pending
    k.materialize()
    assert attention.scores_in_truncation(q, k, v) is None
