"""Fixed-point encoding of real tensors into the ring Z/2^64 (stored as ``torch.int64``).

A float ``x`` is encoded as the ring element ``round(x * 2**frac_bits)``; integer and bool
tensors are encoded exactly, without scaling (callers share them with ``frac_bits=0``).

Encoded magnitudes must stay below ``2**62``, so the float range that encodes safely is
``|x| < 2**(62 - frac_bits)`` (see :func:`max_safe_value`). That is one bit below the signed
64-bit limit, so the sum or difference of two encoded values still decodes correctly.

Products need more room: the product of two encoded values is ``x * y * 2**(2 f)`` before
its truncation, which is right only while that stays below ``2**62``, i.e.
``|x * y| < 2**(62 - 2 f)`` (``2**30`` at 16 bits). Encoding a large value is not wrong
in itself; an op whose result can leave the range warns when it runs
(:class:`FixedPointRangeWarning`, from the magnitudes the client knows: :mod:`mpc.ranges`).
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "EncodingError",
    "FixedPointRangeWarning",
    "abs_sums",
    "decode",
    "encode",
    "max_safe_value",
    "product_safe_value",
]

_SAFE_BITS = 62
_PRODUCT_BITS = 31  # two encodings below 2**31: their product stays below 2**62


class EncodingError(ValueError):
    """A value cannot be encoded into, or decoded from, the ring."""


class FixedPointRangeWarning(UserWarning):
    """An op on shared values can leave the fixed-point range, from the magnitudes the
    client knows, so its result can come back wrong without an error (:mod:`mpc.ranges`)."""


def _check_frac_bits(frac_bits: int) -> None:
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int):
        raise EncodingError(f"frac_bits must be an int, got {type(frac_bits).__name__}")
    if not 0 <= frac_bits <= _SAFE_BITS:
        raise EncodingError(f"frac_bits must be in [0, {_SAFE_BITS}], got {frac_bits}")


def max_safe_value(frac_bits: int) -> float:
    """The exclusive bound on ``|x|`` that :func:`encode` accepts for floats."""
    _check_frac_bits(frac_bits)
    return float(2.0 ** (_SAFE_BITS - frac_bits))


def product_safe_value(frac_bits: int) -> float:
    """The bound on ``|x|`` below which every product of two encoded values is right:
    ``2**(31 - frac_bits)`` (``|x * y| < 2**(62 - 2 frac_bits)``; 32768 at 16 bits)."""
    _check_frac_bits(frac_bits)
    return float(2.0 ** (_PRODUCT_BITS - frac_bits))


def _as_tensor(x: torch.Tensor | float | int) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, (bool, int, float)):
        try:
            return torch.tensor(x, dtype=torch.float64 if isinstance(x, float) else None)
        except (OverflowError, RuntimeError, ValueError) as e:
            raise EncodingError(f"integer {x} does not fit in int64") from e
    raise EncodingError(f"expected a tensor, float or int, got {type(x).__name__}")


def encode(x: torch.Tensor | float | int, frac_bits: int) -> torch.Tensor:
    """Encode ``x`` as int64 ring elements.

    Floating tensors (and Python floats) become ``round(x * 2**frac_bits)``, rounded half to
    even in float64. Integer and bool tensors (and Python ints) are converted to int64 exactly
    and are NOT scaled, whatever ``frac_bits`` is: share integers with ``frac_bits=0`` so that
    :func:`decode` gives them back.

    Raises:
        EncodingError: for NaN/inf, for a float with ``|x| >= max_safe_value(frac_bits)``, for
            a uint64 value above the int64 range, or for an unsupported dtype.
    """
    _check_frac_bits(frac_bits)
    t = _as_tensor(x)
    if t.dtype == torch.bool or not (t.is_floating_point() or t.is_complex()):
        if t.dtype == torch.uint64 and t.numel() > 0:
            # uint64 values >= 2**63 would silently wrap to negative int64
            wrapped = t.to(torch.int64)
            if bool((wrapped < 0).any()):
                raise EncodingError("uint64 tensor holds values >= 2**63, outside int64")
            return wrapped
        return t.detach().to(torch.int64)
    if t.is_complex():
        raise EncodingError(f"cannot encode complex tensor of dtype {t.dtype}")
    t64 = t.detach().to(torch.float64)
    if t64.numel() > 0:
        lo, hi = torch.aminmax(t.detach())  # (one pass; NaN propagates to both)
        max_abs = max(-float(lo), float(hi))
        if math.isnan(float(lo)):
            max_abs = math.nan
        if not math.isfinite(max_abs):
            raise EncodingError("cannot encode a tensor containing NaN or infinity")
        bound = max_safe_value(frac_bits)
        if max_abs >= bound:
            raise EncodingError(
                f"value out of the safe range: max |x| = {max_abs!r} but frac_bits="
                f"{frac_bits} allows only |x| < 2**{_SAFE_BITS - frac_bits} = {bound!r}; "
                "scale the input down or use fewer fractional bits"
            )
    # x * 2**f is exact in float64 (a power-of-two scale), so only the rounding is inexact
    # (in place only on a converted copy: a float64 input shares its memory with t64)
    scale = float(2**frac_bits)
    scaled = t64.mul_(scale) if t.dtype != torch.float64 else t64 * scale
    return scaled.round_().to(torch.int64)


def decode(x: torch.Tensor, frac_bits: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode int64 ring elements into ``dtype``.

    For a floating ``dtype`` this is ``x / 2**frac_bits`` computed in float64, then cast. With
    ``frac_bits == 0`` an integer (or bool) ``dtype`` gives the ring elements back exactly.
    """
    _check_frac_bits(frac_bits)
    if not isinstance(x, torch.Tensor) or x.dtype != torch.int64:
        found = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise EncodingError(f"decode expects an int64 tensor of ring elements, got {found}")
    if dtype == torch.float32:
        # (one rounding either way: float32(x) * 2^-f is exact scaling of the rounded x,
        # the same value as float32(x / 2^f) for |x| < 2^53)
        return x.to(torch.float32).mul_(2.0**-frac_bits)
    if dtype.is_floating_point or dtype.is_complex:
        return x.to(torch.float64, copy=True).div_(float(2**frac_bits)).to(dtype)
    if frac_bits != 0:
        raise EncodingError(
            f"decoding to integer dtype {dtype} needs frac_bits=0, got frac_bits={frac_bits}"
        )
    return x.to(dtype)


def abs_sums(t: torch.Tensor) -> tuple[float, float] | None:
    """For a matrix (or a batch of them) the client shares: the largest sum of |t| down a
    column (over dim -2) and along a row (over dim -1). A matmul's result is bounded by
    the other operand's bound times the sum along the contraction: exact for inputs at
    their bound with t's signs, where bound times bound times the length is not."""
    if t.dim() < 2 or t.numel() == 0 or not t.is_floating_point():
        return None
    a = t.detach().abs().double()
    return float(a.sum(dim=-2).max()), float(a.sum(dim=-1).max())
