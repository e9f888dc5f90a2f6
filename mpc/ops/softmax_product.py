"""Attention's ``softmax(scores) @ V`` as one fused step: the product e V of the
exponentials opens with the division's own product, and the division's factor 1 / sum e
multiplies its result in the truncation round after it
(:func:`mpc.protocols.inverse_product.times_product_inverse_power`): two rounds fewer
than the softmax followed by the product, where the rows' sums take fine bins (few rows:
a decoding step's) and a row holds at most a few hundred keys. Elsewhere the softmax, then
the product, as before."""

from __future__ import annotations

import math
from typing import Any

from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten, matmul_shape, result_dtype
from mpc.ops.functions import hi_scale, session_frac, softmax, softmax_parts
from mpc.ops.masking import keep_in_softmax
from mpc.protocols.approx import Fx
from mpc.protocols.fourier import run as trig
from mpc.protocols.inverse import fine_bins
from mpc.protocols.inverse_product import (
    BeaverProduct,
    ProductRun,
    fused_factor_fits,
    times_product_inverse_power,
)
from mpc.shared import SharedTensor


def _fusable(scores: SharedTensor, value: Any) -> bool:
    """Whether softmax(scores) @ value takes the fused step: a shared fixed-point value,
    rows whose sums take fine bins, and a factor that fits one scale."""
    if not isinstance(value, SharedTensor) or scores.dim() < 2 or value.dim() < 2:
        return False
    if not (value.dtype.is_floating_point and value.frac_bits - value.pending > 0):
        return False
    k = int(scores.shape[-1])
    rows = math.prod(scores.shape) // max(k, 1)
    hi = math.floor(math.log2(k)) + 1
    return fine_bins(scores.session, rows, -1, hi, 1.0) and fused_factor_fits(
        1.0, -1, hi, hi_scale(scores), 1.0
    )


def softmax_matmul(func: Any, scores: SharedTensor, value: Any) -> SharedTensor:
    """softmax(scores, -1) @ value (``func``: ``aten._softmax`` or ``aten._safe_softmax``,
    whose rows masked entirely by -inf weigh nothing); the result keeps a pending
    truncation, as a product's does."""
    if not _fusable(scores, value):
        attn = softmax(func, (scores, -1, False), {})
        return bilinear_op(attn, value, "matmul", {})
    k = int(scores.shape[-1])
    hi = math.floor(math.log2(k)) + 1
    wide = hi + trig.SERIES_SCALE <= 62
    _, e, total, _ = softmax_parts(scores, scores.dim() - 1, wide)
    bits = e.scale - hi_scale(scores)
    value.materialize()
    v = Fx(value.session, list(value.shares), value.frac_bits)
    out_shape = matmul_shape(e.shape, value.shape)

    def product(ev: Fx) -> ProductRun:
        return BeaverProduct(ev, v, "matmul", out_shape)

    f = session_frac(scores)
    fused = times_product_inverse_power(
        e, total, 1.0, -1, hi, product, f, pending=(bits, bits) if wide else (0, 0)
    )
    if fused is None:  # (_fusable said it fits)
        raise AssertionError("internal: the fused softmax product did not apply")
    sp, s_bits = fused
    shares = sp.shares
    factors = keep_in_softmax(scores, scores.dim() - 1)
    if func is aten._safe_softmax.default and factors is not None and not factors[1].all():
        shares = [s * factors[1] for s in shares]  # rows all -inf: 0
    dtype = result_dtype(scores, value)
    return SharedTensor(shares, scores.session, sp.scale, dtype, pending=sp.scale - f)


__all__ = ["softmax_matmul"]
