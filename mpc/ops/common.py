"""Helpers shared by the op implementations."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

import pointers as pt
from mpc.errors import MPCError
from mpc.math.encoding import encode
from mpc.shared import SharedTensor

aten = torch.ops.aten
_DEFAULT = ELEMENTWISE_TYPE_PROMOTION_KIND.DEFAULT


def first_shared(args: Any) -> SharedTensor:
    for a in args:
        if isinstance(a, SharedTensor):
            return a
        if isinstance(a, list | tuple):
            for b in a:
                if isinstance(b, SharedTensor):
                    return b
    raise MPCError("no secret-shared operand")


def result_dtype(*xs: Any) -> torch.dtype:
    """Logical dtype of an arithmetic result: the first floating operand's dtype (float32
    for a Python float); otherwise torch's promotion of the integer operands (a uint8
    tensor times 2 is uint8; bool and bool stay bool). Integer results hold the unreduced
    ring value, which reconstruction reduces to the dtype with torch's wrap-around
    (:meth:`mpc.shared.SharedTensor.get`)."""
    operands: list[Any] = []
    for x in xs:
        if isinstance(x, torch.Tensor):
            if x.dtype.is_floating_point:
                return x.dtype
            shape = () if x.dim() == 0 else (1,)  # (the rank class is what promotion reads)
            operands.append(torch.empty(shape, dtype=x.dtype, device="meta"))
        elif isinstance(x, float):
            return torch.float32
        elif isinstance(x, bool | int):
            operands.append(x)
    if not operands:
        return torch.int64
    return elementwise_dtypes(*operands, type_promotion_kind=_DEFAULT)[1]


def rescale(x: SharedTensor, frac_bits: int) -> list[pt.PointerTensor]:
    """x's shares at a larger scale (exact: multiply every share by 2^(f - f_x))."""
    if frac_bits == x.frac_bits:
        return list(x.shares)
    if frac_bits < x.frac_bits:
        raise MPCError("internal: cannot lower a scale without truncation")
    k = 1 << (frac_bits - x.frac_bits)
    return [s * k for s in x.shares]


def is_integral(p: Any) -> bool:
    """A public operand that multiplies shares exactly (no truncation needed)."""
    if isinstance(p, bool | int):
        return True
    if isinstance(p, float):
        return math.isfinite(p) and p == int(p) and abs(p) < 2**31
    if isinstance(p, torch.Tensor):
        if not p.dtype.is_floating_point:
            return True
        return bool(torch.isfinite(p).all() and (p == p.round()).all() and p.abs().max() < 2**31)
    return False


def public_int(p: Any) -> Any:
    if isinstance(p, torch.Tensor):
        return p.detach().to(torch.int64)
    return int(p)


def matmul_shape(a: Any, b: Any) -> tuple[int, ...]:
    """The shape of ``a @ b`` for operands of shapes ``a`` and ``b`` (torch's rules, no
    data: meta tensors)."""
    return tuple(
        torch.matmul(
            torch.empty(tuple(a), device="meta"), torch.empty(tuple(b), device="meta")
        ).shape
    )


def encode_public(p: Any, frac_bits: int) -> torch.Tensor:
    t = p.detach() if isinstance(p, torch.Tensor) else torch.tensor(p)
    if t.dtype == torch.bool or not t.dtype.is_floating_point:
        if frac_bits == 0:  # exact: float64 would round integers above 2**53
            return t.to(torch.int64)
        t = t.to(torch.float64)
    return encode(t.to(torch.float64), frac_bits)


def check_public(p: Any, op: str) -> None:
    if isinstance(p, pt.PointerTensor):
        raise MPCError(
            f"{op}: an operand is a PointerTensor at {p.location.id!r}; secret-share it or "
            "get() it first"
        )
    if isinstance(p, torch.Tensor) and p.device.type != "cpu":
        raise MPCError(f"{op}: public operands must be CPU tensors")


def wrap(
    x: SharedTensor, shares: list[pt.PointerTensor], frac_bits: int, dtype: torch.dtype
) -> SharedTensor:
    return SharedTensor(shares, x.session, frac_bits, dtype)
