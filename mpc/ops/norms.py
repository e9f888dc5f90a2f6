"""Normalisations of a row: layer norm (``aten.native_layer_norm``) and RMSNorm (the fused
op a shared Llama's ``LlamaRMSNorm`` calls, :func:`mpc.api.fuse_activations`). Both divide
by the square root of the row's sum of squares with fine bins and a polynomial
(:func:`mpc.protocols.inverse.times_inverse_power`), the squares riding on the input's
truncation (:mod:`mpc.protocols.truncated_products`) and the sum's truncation riding in the
bins' comparison (:mod:`mpc.protocols.riders`)."""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.ops.common import aten
from mpc.ops.functions import as_fx, from_fx, session_frac
from mpc.ops.row_scaled import at_scale, row_scaled
from mpc.protocols import approx
from mpc.protocols.approx import Fx
from mpc.protocols.inverse import times_inverse_power
from mpc.protocols.inverse_product import row_factor
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.registry import register
from mpc.shared import SharedTensor


def _input(x: SharedTensor) -> Fx:
    """x at its full scale where a truncation is pending (it rides in the first round),
    else at the session's scale."""
    wide = x.pending and x.dtype.is_floating_point and x.frac_bits - x.pending >= 16
    return Fx(x.session, list(x.shares), x.frac_bits) if wide else as_fx(x)


def _lifted(values: list[Fx], scales: list[int]) -> list[Fx]:
    """Each value with bits to lose down to its scale: a value with none is lifted by one
    bit (its truncation is then exact or one unit more)."""
    return [v if v.scale > t else v.lift(t + 1) for v, t in zip(values, scales)]


@register(aten.native_layer_norm.default, lazy=True)
def layer_norm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """(x - mean) rsqrt(var + eps) weight + bias over the last dims: x and the mean
    truncated to the input's scale + 4 with the products of the squared deviations (and of
    the weighted deviations, for a shared weight) riding on that round (1: (x - mu)^2 =
    x^2 - 2 x mu + mu^2 exactly in the ring, no Beaver opening), then (x - mean) weight /
    sqrt(S / n + eps) for the squares' sum S by fine bins on S and a polynomial (8; 7 for
    few rows, such as a decoding step's one: :func:`mpc.protocols.inverse.
    times_inverse_power`, relative error 2.2e-6), S's and the weighted deviations'
    truncations riding in its comparison: 9 rounds (8 for few rows; 6 and 5 with FSS
    comparisons; 23 and 25 with rsqrt and a product). Domain: variance in [2^-14, 2^16),
    n var < 4e6. An input still to be truncated (a residual stream after a projection) is
    read at its full scale: its truncation is the first round's (then |sum of x| < 2^14 m,
    m the odd part of n); a value with no bits to lose there (an input at the session's
    scale, a weight) is lifted by one bit, so it comes out exact or one unit more. Returns
    (out, mean, rstd) like torch, rstd as a meta tensor (never formed)."""
    x, shape, weight, bias, eps = args[:5]
    for t in (weight, bias):
        if isinstance(t, SharedTensor):
            t.materialize()
    dims = list(range(x.dim() - len(shape), x.dim()))
    n = 1
    for d in dims:
        n *= x.shape[d]
    fx = _input(x)
    # the deviations at the input's scale + 4 (16 + 4 for an input wider than the session's
    # scale, e.g. tanh's 24 bits: their squares summed at twice that pass 2^62 otherwise;
    # GPT-2 small's last layers, variance ~0.1 over 768 features, came out wrong by ~1e2)
    dev_scale = min(fx.scale, 16) + 4  # (n var 2^40 < 2^62: n var up to 4e6)
    total = fx.with_shares([s.sum(dims, keepdim=True) for s in fx.shares])
    # 1/n = 2^-j / m with the odd part m at 16 significant bits (at 16 bits, 1/768 was
    # 0.4% off: a mean of 1 came out 4e-3 off, 0.2 after the division by a deviation of
    # 0.02), within the room of the sum; the 2^-j is a free change of scale
    odd = n // (n & -n)
    inv = max(16, min(16 + odd.bit_length(), 44 - fx.scale))
    mean_n = total.times_public(1.0 / odd, inv) if odd > 1 else total
    mean_n = mean_n.halve((n & -n).bit_length() - 1)
    # x, the mean and a shared weight truncated in one round, with the products that the
    # squared deviations and the weighted deviations are made of riding on it
    # (mpc.protocols.truncated_products: x^2 - 2 x mu + mu^2 and x w - mu w, exact in the
    # ring): no Beaver round. A value with no bits to lose is lifted by one bit first (the
    # truncation is then floor or one more: at most one unit of its scale)
    values = [fx, mean_n]
    scales = [dev_scale, dev_scale]
    shared_weight = isinstance(weight, SharedTensor)
    if shared_weight:
        values.append(as_fx(weight))
        scales.append(session_frac(x))
    pairs = [(0, 0), (0, 1), (1, 1)] + ([(0, 2), (1, 2)] if shared_weight else [])
    trunc, prods = truncate_and_multiply(
        _lifted(values, scales), scales, [0.0] * len(values), pairs
    )
    xt, mu = trunc[0], trunc[1]
    xx, xmu, mumu = prods[:3]
    sq = xx.add(xmu.with_shares([2 * t for t in xmu.shares]), -1)
    sq = sq.with_shares([t.sum(dims, keepdim=True) for t in sq.shares]).add(
        mumu.with_shares([t * n for t in mumu.shares])
    )
    dev = xt.add(mu, -1)
    weighted = [prods[3].add(prods[4], -1)] if shared_weight else []
    # dev / sqrt(S / n + eps) = dev sqrt(n) (S + n eps)^-1/2 by fine bins on the squares'
    # sum S and a cubic (mpc.protocols.inverse: 8 rounds). The bins compare S at its full
    # scale (2 dev_scale: S < 2^22, n var < 4e6, the domain), while S comes down to WORK
    # bits (at most 36 - log2 n: the bins' slopes 1/S keep 8 significant bits at 60 bits)
    # and the weighted deviations to the session's scale in truncations that ride in the
    # comparison's first round (mpc.protocols.riders): no round of their own
    s_bits = sq.scale - min(approx.WORK, 36 - math.ceil(math.log2(n)))
    lo = approx.SQ_JMIN + math.log2(n)
    hi = min(approx.SQ_JTOP + math.log2(n), 62 - sq.scale)
    s_eps = sq.add_public(float(eps) * n)
    f = session_frac(x)
    v = weighted[0] if shared_weight else dev
    # few rows (a decoding step's): the result stays S v + b, S = 1 / std per row, until
    # it is read; a product with a weight then takes S after it (mpc.ops.row_scaled)
    factor = None
    if (weight is None or shared_weight) and (bias is None or at_scale(bias, f)):
        factor = row_factor(v, s_eps, 0.5, lo, hi, math.sqrt(n), (v.scale - f, s_bits))
    if factor is not None:
        out = row_scaled(x, factor, bias, f)
    else:
        v_bits = v.scale - f if shared_weight else 0
        out = from_fx(
            x, times_inverse_power(v, s_eps, 0.5, lo, hi, f, math.sqrt(n), pending=(v_bits, s_bits))
        )
        if weight is not None and not shared_weight:
            out = out * weight
        if bias is not None:
            out = out + bias
    mean = from_fx(x, mu)
    # rstd is not computed (the fused division never forms it): a meta tensor, so that a
    # use of it fails loudly (nothing in inference reads it)
    return out, mean, torch.empty(tuple(mu.shape), dtype=torch.float32, device="meta")


def rms_norm(x: SharedTensor, weight: Any, eps: float) -> SharedTensor:
    """x / sqrt(mean(x^2) + eps) * weight over the last dim (Llama's RMSNorm, fused): x
    (and a shared weight) truncated to the session's scale with x^2 (and x w) riding on
    that round (1), then x w sqrt(n) / sqrt(S + n eps) for the squares' sum S by fine bins
    and a polynomial (8, 7 for few rows: :func:`mpc.protocols.inverse.times_inverse_power`),
    S's and x w's truncations riding in its comparison: 9 rounds (8 for a decoding step's
    row; 6 and 5 with FSS comparisons) where pow, mean, rsqrt and the products took 25.
    Domain: mean(x^2) in [2^-14, 2^16), as rsqrt's; outside it saturates."""
    if isinstance(weight, SharedTensor):
        weight.materialize()
    n = int(x.shape[-1])
    f = session_frac(x)
    fx = _input(x)
    values, scales = [fx], [f]
    shared_weight = isinstance(weight, SharedTensor)
    if shared_weight:
        values.append(as_fx(weight))
        scales.append(f)
    pairs = [(0, 0)] + ([(0, 1)] if shared_weight else [])
    trunc, prods = truncate_and_multiply(
        _lifted(values, scales), scales, [0.0] * len(values), pairs
    )
    sq = prods[0].with_shares([t.sum(-1, keepdim=True) for t in prods[0].shares])
    lo = approx.SQ_JMIN + math.log2(n)
    hi = min(approx.SQ_JTOP + math.log2(n), 62 - sq.scale)
    # S comes down to at most 52 - hi bits (the bins' slopes 1/S keep 8 significant bits
    # at 60 bits), x w to the session's scale
    s_bits = sq.scale - min(approx.WORK, math.floor(52 - hi))
    v, v_bits = (prods[1], prods[1].scale - f) if shared_weight else (trunc[0], 0)
    s_eps = sq.add_public(float(eps) * n)
    factor = None
    if weight is None or shared_weight:  # (few rows: S v until read, mpc.ops.row_scaled)
        factor = row_factor(v, s_eps, 0.5, lo, hi, math.sqrt(n), (v_bits, s_bits))
    if factor is not None:
        return row_scaled(x, factor, None, f)
    out = from_fx(
        x, times_inverse_power(v, s_eps, 0.5, lo, hi, f, math.sqrt(n), pending=(v_bits, s_bits))
    )
    if weight is not None and not shared_weight:
        out = out * weight
    return out
