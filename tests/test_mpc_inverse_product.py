"""A product scaled by an inverse power of a per-row value, in the same rounds
(mpc/protocols/inverse_product.py) and attention's softmax(scores) @ V on it
(mpc/ops/softmax_product.py): against float64 torch over the domain with its edges and
saturation, for 2 and 3 parties and with FSS comparisons; two rounds fewer than the
division followed by the product; masks as torch has them; the fallback where the
factor does not fit."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.ops.attention import scaled_scores
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten
from mpc.ops.functions import softmax
from mpc.protocols.approx import Fx
from mpc.protocols.inverse import fine_bins
from mpc.protocols.inverse_product import (
    BeaverProduct,
    fused_factor_fits,
    times_product_inverse_power,
)
from mpc.shared import share_tensor

MODES = [(2, "default"), (3, "default"), (2, "fss")]
#: layer norm's factor over 768 features: sqrt(768) / sqrt(S), S over 30 octaves (three
#: pieces of H)
LN = (0.5, -14 + math.log2(768), 22.0, math.sqrt(768))


def _session(n: int, comparison: str) -> Any:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    config = MPCConfig(comparison=comparison)
    dealer = pt.VirtualWorker("dealer")
    return mpc.share(torch.zeros(1), *parties, crypto_provider=dealer, config=config).session


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from(MODES),
    st.sampled_from([(1.0, -1, 9, 1.0), (1.0, -1, 12, 1.0), (0.5, -1, 3, 2.0), LN]),
    st.integers(1, 4),
    st.integers(1, 9),
    st.randoms(use_true_random=False),
)
def test_product_times_inverse_power(mode, case, rows, k, rnd) -> None:
    """S (v @ y), S = mult x^-p per row: within 3e-5 (the line's fit) of float64 plus
    a few output units, for x over [2^lo, 2^hi) with its ends, a bin edge and values
    outside (0, negative, above: saturated as the division saturates), in the comparison
    and two rounds; softmax's sums up to 4,096 (two pieces of H) and layer norm's
    variances (three)."""
    (n, comparison), (p, lo, hi, mult) = mode, case
    session = _session(n, comparison)
    picks = [2.0 ** rnd.uniform(lo, hi) for _ in range(rows)]
    picks[0] = rnd.choice(
        [2.0**lo, 2.0 ** (hi - 1e-3), 2.0 ** (lo + rnd.randint(0, 64) / 32), 0.0, -2.0, 2.0**hi]
    )
    xs = torch.tensor(picks, dtype=torch.float64)
    gen = torch.Generator().manual_seed(rows * 10 + k)
    v = torch.randn(rows, k, dtype=torch.float64, generator=gen)
    y = torch.randn(k, 3, dtype=torch.float64, generator=gen)
    x_sh = share_tensor(xs[:, None].float(), session, 24)
    v_sh = share_tensor(v.float(), session, 16)
    y_sh = share_tensor(y.float(), session, 16)
    yfx = Fx(session, y_sh.shares, 16)
    with mpc.stats() as s:
        out = times_product_inverse_power(
            Fx(session, v_sh.shares, 16),
            Fx(session, x_sh.shares, 24),
            p,
            lo,
            hi,
            lambda vt: BeaverProduct(vt, yfx, "matmul", (rows, 3)),
            16,
            mult,
        )
    assert out is not None
    # with FSS the fine bins' comparison (1 round), then two (H x with the product, the
    # truncation); by default (at most 847 bins x 4 rows, within 2^13) its digit look-ups
    # (2 rounds: the product opens in the second, H x from the selections), then one
    assert s.rounds == (1 + 2 if comparison == "fss" else 2 + 1)
    sp, bits = out
    got = mpc.SharedTensor(sp.shares, session, sp.scale, torch.float32).get().double()
    xq = torch.round(xs * 2**24) / 2**24
    vq = torch.round(v.float().double() * 2**16) / 2**16
    yq = torch.round(y.float().double() * 2**16) / 2**16
    factor = mult * xq.clamp(2.0**lo, 2.0**hi)[:, None] ** -p
    want = factor * (vq @ yq)
    # the fit's 3e-5 of S, the product's truncation to 16 bits (one unit, times S) and
    # the output's rounding
    bound = 3e-5 * want.abs() + factor * 2.0**-15 + 2.0**-20
    excess = (got - want).abs() - bound
    assert excess.max() <= 0, excess.max()


def test_what_does_not_fit_is_refused_before_any_round() -> None:
    """x over 50 octaves would split H in more than three pieces, and many rows pass the
    fine bins' budget: the fused step declines (None) and costs nothing; the caller
    divides first."""
    session = _session(2, "default")
    assert not fused_factor_fits(1.0, -20, 30, 24, 1.0)
    assert fused_factor_fits(*LN[:3], 24, LN[3])
    x = Fx(session, share_tensor(torch.ones(256, 1), session, 24).shares, 24)
    v = Fx(session, share_tensor(torch.ones(256, 4), session, 16).shares, 16)
    with mpc.stats() as s:
        out = times_product_inverse_power(
            v, x, *LN[:3], lambda vt: BeaverProduct(vt, vt, "mul", (256, 4)), 16, LN[3]
        )
    assert out is None and s.rounds == 0


def _attention_case(b: int, h: int, lq: int, lk: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, h, n, d, generator=g) * 1.5 for n in (lq, lk, lk)]


@pytest.mark.parametrize(("n", "comparison"), MODES)
def test_attention_fused_against_torch_and_two_rounds_fewer(n: int, comparison: str) -> None:
    """scaled_dot_product_attention of shared q, k, v (a decoding step's shape: 12 heads,
    one query, 56 keys) as torch computes it, within 1e-4; two rounds fewer than the
    softmax followed by the product, the same inputs (three by default)."""
    session_args = _session(n, comparison)
    parties, dealer = session_args.parties, session_args.dealer
    config = MPCConfig(comparison=comparison)
    q, k, v = _attention_case(1, 12, 1, 56, 16, 3)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    sh = [mpc.share(t, *parties, crypto_provider=dealer, config=config) for t in (q, k, v)]
    with mpc.stats() as fused:
        out = F.scaled_dot_product_attention(*sh)
        out.materialize()
    got = out.get().double()
    assert (got - want).abs().max() < 1e-4
    sh = [mpc.share(t, *parties, crypto_provider=dealer, config=config) for t in (q, k, v)]
    with mpc.stats() as apart:
        scores = scaled_scores(bilinear_op(sh[0], sh[1].transpose(-2, -1), "matmul", {}), 0.25)
        attn = softmax(aten._safe_softmax.default, (scores, -1), {})
        bilinear_op(attn, sh[2], "matmul", {}).materialize()
    # (three by default: the sums' comparison by digit look-ups gives the factor)
    assert fused.rounds == apart.rounds - (2 if comparison == "fss" else 3)


def test_attention_masks_as_torch() -> None:
    """A boolean mask with a row masked entirely (that row weighs nothing, as torch's
    scaled_dot_product_attention gives 0 there), and the causal mask."""
    alice, bob, carol = (pt.VirtualWorker(s) for s in ("alice", "bob", "carol"))
    q, k, v = _attention_case(1, 2, 3, 6, 4, 5)
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 2:] = False
    mask[2, :] = False
    sh = [mpc.share(t, alice, bob, crypto_provider=carol) for t in (q, k, v)]
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask)
    want = torch.nan_to_num(want, nan=0.0)
    got = F.scaled_dot_product_attention(*sh, attn_mask=mask).get().double()
    assert (got - want).abs().max() < 1e-4
    assert got[..., 2, :].abs().max() == 0
    sh = [mpc.share(t, alice, bob, crypto_provider=carol) for t in (q, k, v)]
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    got = F.scaled_dot_product_attention(*sh, is_causal=True).get().double()
    assert (got - want).abs().max() < 1e-4


def test_many_rows_fall_back_to_the_division_first() -> None:
    """12 heads x 16 queries over 600 keys: their bins pass the comparisons' budget (the
    rows take coarse bins); the attention is the softmax then the product, as torch."""
    alice, bob, carol = (pt.VirtualWorker(s) for s in ("alice", "bob", "carol"))
    session = mpc.share(torch.zeros(1), alice, bob, crypto_provider=carol).session
    assert not fine_bins(session, 12 * 16, -1, math.floor(math.log2(600)) + 1, 1.0)
    q, k, v = _attention_case(1, 12, 16, 600, 4, 7)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double())
    sh = [mpc.share(t, alice, bob, crypto_provider=carol) for t in (q, k, v)]
    got = F.scaled_dot_product_attention(*sh).get().double()
    assert (got - want).abs().max() < 1e-3
