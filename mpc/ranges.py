"""The fixed-point range: how large each result can be, from magnitudes the client knows.

A shared float is the ring element round(x 2^f). A product of two such values is
x y 2^(2f) until its truncation, which is right while that stays below 2^62 (|x y| < 2^30
at f = 16); a sum or a comparison is right while the ring value stays below 2^63. Past
that the result comes back wrong without an error, and the parties cannot see it: the
value is secret.

The client can: what it shared itself, it knows the magnitude of (``max |x|``, taken at
:func:`mpc.share`), and it knows its public operands. Every op on shared values carries
that knowledge forward: each shared result has a :attr:`~mpc.SharedTensor.bound`, a
number its magnitude cannot exceed (the op's own rule, :mod:`mpc.range_rules`: a sum's
bound is the sum of the bounds, a product's their product, a matmul's times the
contracted length, a sigmoid's 1...; a function's, for inputs inside its domain).
:class:`FixedPointRangeWarning` fires at an op exactly when those bounds allow its result
to leave the range, so the result *can* be wrong, and never otherwise: the warning-free
results of values with known bounds are right.

What it cannot cover: a value whose magnitude the client does not know (shared by an
owner at its worker, an output of an ``mpc.plan`` call, or of an op whose output the
engine does not bound: ``log``, ``reciprocal``, ``rsqrt``, a division by a shared value,
batch norm, the backward pass) has no bound, and nothing computed from it is checked.
:func:`mpc.debug` checks every op of such code against plaintext, at the price of
revealing everything to the client. The non-linear functions' own input ranges are in
:data:`DOMAINS` (their docstrings say the same); the debug mode checks those too.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from typing import Any

import torch

from mpc.math.encoding import FixedPointRangeWarning
from mpc.range_rules import (
    COMPARISONS,
    IN_PLACE,
    PRODUCTS,
    RULES,
    SAME,
    SQUARES_INSIDE,
    Bound,
    bound_of,
    same_entries,
)
from mpc.registry import hook
from mpc.shared import SharedTensor

aten = torch.ops.aten

# (the rules live in mpc.range_rules; mpc.debugging reads them here)
__all__ = [
    "COMPARISONS",
    "DOMAINS",
    "IN_PLACE",
    "PRODUCTS",
    "PRODUCT_BITS",
    "RING_BITS",
    "RULES",
    "SAME",
    "SQUARES_INSIDE",
    "Bound",
    "Domain",
    "after_op",
    "bound_of",
    "check",
    "propagate",
    "same_entries",
]

PRODUCT_BITS = 62  # a product's ring value before its truncation stays below 2^62
RING_BITS = 63  # any other ring value (a sum, a compared difference) below 2^63


def _fixed_point(args: tuple[Any, ...]) -> SharedTensor | None:
    """The first shared float operand (None: the op is on integers, which wrap as
    torch's do)."""
    for a in args:
        for t in a if isinstance(a, list | tuple) else (a,):
            if isinstance(t, SharedTensor) and t.dtype.is_floating_point:
                return t
    return None


def _product_scale(func: Any, args: tuple[Any, ...], x: SharedTensor) -> int:
    """The scale of a product's ring value before its truncation: the sum of the
    operands' scales (a public non-integer operand is encoded at the session's scale)."""
    f = x.session.config.frac_bits
    if func in (aten.addmm.default, aten.baddbmm.default):
        args = args[1:]
    scales = []
    for a in args[:2]:
        if isinstance(a, SharedTensor):
            scales.append(a.frac_bits - a.pending)
        elif isinstance(a, torch.Tensor | float) and not _integral(a):
            scales.append(f)
        else:
            scales.append(0)
    if func is aten.pow.Tensor_Scalar:
        return 2 * (x.frac_bits - x.pending)
    return sum(scales)


def _integral(p: Any) -> bool:
    if isinstance(p, torch.Tensor):
        return not p.dtype.is_floating_point or bool((p == p.round()).all())
    return float(p) == int(p)


def check(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Bound:
    """The bound of ``func``'s result ``out`` from its operands' (None: not known), after
    warning (:class:`FixedPointRangeWarning`) if that bound lets the result leave the
    range. Called once the op ran (a scale is read as ``frac_bits - pending``, which
    running it does not change)."""
    base = IN_PLACE.get(func, func)
    x = _fixed_point(args)
    if x is None:
        return None
    if base in COMPARISONS:
        a, b = bound_of(args[0]), bound_of(args[1])
        if a is not None and b is not None:
            scale = max(t.frac_bits for t in args[:2] if isinstance(t, SharedTensor))
            _warn_if(func, a + b, scale, RING_BITS, "the compared difference")
        return 1.0
    rule = RULES.get(base)
    bound = rule(args, kwargs) if rule is not None else None
    if bound is None:
        return None
    if base in PRODUCTS:
        _warn_if(func, bound, _product_scale(base, args, x), PRODUCT_BITS, "the product")
    elif base in SQUARES_INSIDE:
        b = bound_of(args[0])
        if b is not None:
            scale = 2 * (x.frac_bits - x.pending)
            _warn_if(func, b * b, scale, PRODUCT_BITS, "a square inside it")
    else:
        first = out[0] if isinstance(out, list | tuple) and out else out
        if isinstance(first, SharedTensor):
            bits = PRODUCT_BITS if first.pending else RING_BITS  # (a product not truncated)
            _warn_if(func, bound, first.frac_bits, bits, "the result")
    return bound


def _warn_if(func: Any, value: float, scale: int, bits: int, what: str) -> None:
    if not math.isfinite(value) or value * 2.0**scale >= 2.0**bits:
        top = 2.0 ** (bits - scale)
        warnings.warn(
            f"{_name(func)}: {what} can reach {value:.4g} in magnitude (from what the client "
            f"knows: max |x| of the values it shared and its public operands), at or above "
            f"the fixed-point range 2**{bits - scale} = {top:.4g} of a ring value at scale "
            f"2**{scale}: the result can come back wrong without an error. Scale the values "
            "down, or share with fewer fractional bits (frac_bits=); mpc.debug() shows "
            "whether it does",
            FixedPointRangeWarning,
            stacklevel=_stacklevel(),
        )


def _name(func: Any) -> str:
    return str(getattr(func, "__name__", func)).split(".")[0]


# the caller outside mpc, pointers and torch is the line a warning names
_MPC = os.path.dirname(os.path.abspath(__file__))
_INTERNAL = tuple(
    os.path.join(d, "")
    for d in (
        _MPC,
        os.path.join(os.path.dirname(_MPC), "pointers"),
        os.path.dirname(torch.__file__),
    )
)


def _stacklevel() -> int:
    frame = sys._getframe(1)
    level = 1
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    return level


# -- the non-linear functions' valid input ranges (their docstrings say the same) ------------


class Domain:
    """Where a non-linear function is accurate, what it returns outside, and the fix."""

    def __init__(self, lo: float, hi: float, on_abs: bool, outside: str, fix: str) -> None:
        self.lo, self.hi, self.on_abs, self.outside, self.fix = lo, hi, on_abs, outside, fix

    def text(self) -> str:
        x = "|x|" if self.on_abs else "x"
        return f"{self.lo:.4g} <= {x} < {self.hi:.4g}"

    def outside_of(self, x: torch.Tensor) -> torch.Tensor:
        v = x.abs() if self.on_abs else x
        return ~((v >= self.lo) & (v < self.hi))


DOMAINS: dict[Any, Domain] = {
    aten.exp.default: Domain(
        -16.6,
        11.09,
        False,
        "0 below, 2^16 above",
        "subtract a known upper bound first (as softmax does: exp(x - max))",
    ),
    aten.log.default: Domain(
        2.0**-16,
        2.0**16,
        False,
        "-16 ln 2 below (x <= 0 too), 16 ln 2 above",
        "keep inputs positive and scaled into the range (log(x) = log(s x) - log(s))",
    ),
    aten.reciprocal.default: Domain(
        2.0**-12,
        2.0**12,
        True,
        "+-2^12 below (x = 0 gives 2^12), +-2^-12 above",
        "scale the divisor into the range (1/x = s / (s x)) and keep it away from 0",
    ),
    aten.div.Tensor: Domain(
        2.0**-12,
        2.0**12,
        True,
        "a * (+-2^12) for a divisor below, a * (+-2^-12) above",
        "scale the divisor into the range (a/b = (s a)/(s b)) and keep it away from 0",
    ),
    aten.rsqrt.default: Domain(
        2.0**-14,
        2.0**16,
        False,
        "2^7 below (x <= 0 too), 2^-8 above",
        "keep inputs positive and scaled into the range (add an epsilon)",
    ),
    aten.sqrt.default: Domain(
        0.0,
        2.0**16,
        False,
        "x 2^7 for x < 0 (-512 at -4), wrong above",
        "keep inputs non-negative (x.relu(), or x * x + eps) and below 2^16",
    ),
}


_KEEPS_MATRIX = {aten.detach.default, aten.alias.default, aten.clone.default}


def _swaps_last_two(func: Any, args: tuple[Any, ...]) -> bool:
    x = args[0]
    if func is aten.t.default:
        return True
    if func is aten.transpose.int:
        dims = {d % x.dim() for d in args[1:3]}
        return dims == {x.dim() - 1, x.dim() - 2}
    return False


@hook("result")
def after_op(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
    """Every op on shared tensors: check its result's range and give it its bound."""
    propagate(out, check(func, args, kwargs, out), func, args)


def propagate(out: Any, bound: Bound, func: Any = None, args: tuple[Any, ...] = ()) -> None:
    """Give the shared results of an op their bound (and a shared matrix's transpose or
    copy its :func:`abs_sums`)."""
    sums = None
    src = args[0] if args else None
    if isinstance(src, SharedTensor) and src.abs_sums is not None:
        if func in _KEEPS_MATRIX:
            sums = src.abs_sums
        elif _swaps_last_two(func, args):
            sums = (src.abs_sums[1], src.abs_sums[0])
    for t in out if isinstance(out, list | tuple) else (out,):
        if isinstance(t, SharedTensor) and t.dtype.is_floating_point:
            t.bound = bound
            t.abs_sums = sums
