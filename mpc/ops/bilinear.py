"""Bilinear ops: mul, mm/bmm/addmm, convolution.

Shared x shared uses one generic Beaver routine (:func:`mpc.protocols.beaver.run.beaver`) with
the op as a parameter; shared x public is local (each party multiplies its share by the
encoded public operand with the exact ring kernels). Both are followed by one truncation
when both operands are fixed point.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.errors import ShapeError, UnsupportedOpError
from mpc.ops import row_scaled
from mpc.ops.common import (
    aten,
    check_public,
    encode_public,
    is_integral,
    matmul_shape,
    result_dtype,
    wrap,
)
from mpc.ops.local import add_shared, mul_public
from mpc.protocols.beaver.run import beaver
from mpc.protocols.beaver.steps import bilinear_public
from mpc.protocols.parties import I64, at_parties
from mpc.protocols.weights.run import fixed_product, trunc_fixed_product
from mpc.registry import register
from mpc.shared import SharedTensor


def _out_shape(op: str, params: dict[str, Any], a: Any, b: Any) -> tuple[int, ...]:
    try:
        return _meta_shape(op, params, a, b)
    except RuntimeError as e:
        first, second = (
            ("a shared", "a public") if isinstance(a, SharedTensor) else ("a public", "a shared")
        )
        if isinstance(b, SharedTensor) and isinstance(a, SharedTensor):
            second = "a shared"
        what = {
            "mul": "an elementwise product: expected shapes that broadcast (from the last "
            "dimension on, each pair equal or one of them 1)",
            "matmul": "a matrix product: expected the first's last dimension to equal the "
            "second's second-to-last",
            "conv2d": "a 2-D convolution: expected an input (N, C, H, W) whose C is the "
            "weight's in-channels times groups, and a kernel no larger than the padded input",
        }[op]
        raise ShapeError(
            f"{what}; found {first} operand of shape {tuple(a.shape)} and {second} of shape "
            f"{tuple(b.shape)} (torch: {e}). Fix: reshape, transpose or unsqueeze an operand "
            "so that the shapes fit, as the same op on plain tensors needs"
        ) from e


def _meta_shape(op: str, params: dict[str, Any], a: Any, b: Any) -> tuple[int, ...]:
    ma = torch.empty(a.shape, device="meta")
    mb = torch.empty(b.shape, device="meta")
    if op == "mul":
        return tuple(torch.broadcast_shapes(ma.shape, mb.shape))
    if op == "matmul":
        return matmul_shape(a.shape, b.shape)
    return tuple(
        torch.nn.functional.conv2d(
            ma, mb, None, params["stride"], params["padding"], params["dilation"], params["groups"]
        ).shape
    )


def bilinear_op(a: Any, b: Any, op: str, params: dict[str, Any]) -> SharedTensor:
    """op(a, b) with at least one shared operand, truncated back to one scale."""
    if op == "matmul":
        fused = row_scaled.fused_product(a, b)  # (a layer norm's result, not formed yet)
        if fused is not None:
            return fused
    out_shape = _out_shape(op, params, a, b)
    if isinstance(a, SharedTensor) and isinstance(b, SharedTensor):
        a.session.check_compatible(b.session)
        if op == "matmul" and a.pending and a.deferred is None and a.frac_bits - a.pending:
            # x still to be truncated times a model's weight: the truncation's opening is
            # the product's only one (mpc.protocols.weights.steps.trunc_weight_product)
            z = trunc_fixed_product(a, b)
            if z is not None:
                f = a.frac_bits - a.pending
                shift = min(f, b.frac_bits)
                return SharedTensor(
                    z, a.session, f + b.frac_bits, result_dtype(a, b), pending=shift
                )
        a.materialize()
        b.materialize()
        shift = min(a.frac_bits, b.frac_bits)
        # a model's weight keeps its mask across queries (mpc.protocols.weights)
        z = fixed_product(a, b, op, params, out_shape)
        if z is None:
            z = beaver(a.session, a.shares, b.shares, op, params, out_shape)
        # the truncation by `shift` stays pending: ReLU fuses it, get() decodes it exactly
        return SharedTensor(
            z, a.session, a.frac_bits + b.frac_bits, result_dtype(a, b), pending=shift
        )
    x, p, public_first = (a, b, False) if isinstance(a, SharedTensor) else (b, a, True)
    x.materialize()
    check_public(p, op)
    if op == "mul":
        return mul_public(x, p)
    integral = is_integral(p)
    f = 0 if integral else x.session.config.frac_bits
    enc = encode_public(p, f) if not integral else p.detach().to(torch.int64)
    (shares,) = at_parties(
        x.session,
        bilinear_public,
        lambda i: [x.shares[i], enc, public_first, op, params],
        [(out_shape, I64)],
    )
    if x.frac_bits and f:
        return SharedTensor(shares, x.session, x.frac_bits + f, result_dtype(a, b), pending=f)
    return wrap(x, shares, x.frac_bits + f, result_dtype(a, b))


@register(aten.mul.Tensor, aten.mul.Scalar)
def mul(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    a, b = args[0], args[1]
    if not isinstance(a, SharedTensor):
        a, b = b, a
    if not isinstance(b, SharedTensor):
        return mul_public(a, b)
    return bilinear_op(a, b, "mul", {})


# (lazy: an operand's pending truncation is applied here, unless the product takes a
# layer norm's result as it is, mpc.ops.row_scaled)
@register(aten.mm.default, aten.bmm.default, aten.mv.default, aten.dot.default, lazy=True)
def mm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return bilinear_op(args[0], args[1], "matmul", {})


@register(aten.addmm.default, aten.baddbmm.default, lazy=True)
def addmm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """beta bias + alpha (a @ b) (GPT-2's Conv1D: torch.addmm(bias, x, w); baddbmm: the
    batched form attention uses): one Beaver product (local with a public operand); public
    beta and alpha other than 1 are products with a public number."""
    bias, a, b = args[0], args[1], args[2]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    if beta == 1 and alpha == 1:
        fused = row_scaled.fused_product(a, b, bias)
        if fused is not None:
            return fused
    prod = bilinear_op(a, b, "matmul", {})
    if alpha != 1:
        prod = mul_public(prod, alpha)
    if beta == 0:
        return prod
    if beta != 1:
        bias = mul_public(bias, beta) if isinstance(bias, SharedTensor) else bias * beta
    return add_shared(prod, bias, 1)


def _pair(v: Any) -> list[int]:
    v = list(v) if isinstance(v, list | tuple) else [v]
    return v * 2 if len(v) == 1 else v


@register(aten.convolution.default)
def convolution(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, w, bias, stride, padding, dilation, transposed, _output_padding, groups = args[:9]
    if transposed:
        raise UnsupportedOpError(str(func), "transposed convolution is not supported yet")
    if len(x.shape) != 4 or len(w.shape) != 4:
        raise UnsupportedOpError(str(func), "only 2-D convolution (N, C, H, W) is supported")
    params = {
        "stride": _pair(stride),
        "padding": _pair(padding),
        "dilation": _pair(dilation),
        "groups": int(groups),
    }
    out = bilinear_op(x, w, "conv2d", params)
    if bias is not None:
        out = add_shared(
            out,
            bias.view(1, -1, 1, 1) if isinstance(bias, SharedTensor) else bias.view(1, -1, 1, 1),
            1,
        )
    return out
