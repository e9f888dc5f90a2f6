"""Trigonometric series on the ring: the fits and the harmonics (no I/O, no shares).

A function f on [-T, T] is approximated by a *periodic* one of period P = 2^p (P > 2T),
F(x) = a_0 + sum_k a_k cos(2 pi k x / P) + b_k sin(2 pi k x / P), k = 1..K, fitted by
least squares on [-T, T] only: outside it F is free (no reflection, no Gibbs jump at
+-T), so a smooth f needs few terms. A ring element z read at s fractional bits is the
real z / 2^s, so the angle 2 pi k x / P is 2 pi k z / 2^(s + p): periodic in the ring
element modulo 2^(s + p), which is what makes the series cheap on shares (see
:func:`mpc.protocols.fourier.run.fourier_series`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

MAX_TERMS = 32  # harmonics per series (the dealer's work and bytes grow with it)


@dataclass(frozen=True)
class Series:
    """F(x) = const + sum_k cos_k cos(2 pi k x / 2^period_bits) + sin_k sin(...)."""

    period_bits: int  # log2 of the period P, in real units
    half_width: float  # T: F approximates f on [-T, T]
    const: float
    cos: tuple[float, ...]  # a_1..a_K
    sin: tuple[float, ...]  # b_1..b_K
    max_error: float  # max |F - f| on a fine grid of [-T, T] (float64)
    # evaluate in float32 (the dealer's and the parties' trigonometry): about 2.5 times
    # faster, and about 1e-5 more error for coefficients summing to ~10 (sigmoid's)
    single: bool = False

    @property
    def terms(self) -> int:
        return len(self.sin)


def chebyshev_nodes(lo: float, hi: float, n: int) -> torch.Tensor:
    """The n Chebyshev nodes of [lo, hi] (float64): they crowd the ends, so that a
    least-squares fit on them is near minimax (used by the series and polynomial fits)."""
    j = torch.arange(n, dtype=torch.float64)
    return (lo + hi) / 2 + (hi - lo) / 2 * torch.cos((2 * j + 1) / (2 * n) * math.pi)


def fit_series(
    f: Callable[[torch.Tensor], torch.Tensor],
    half_width: float,
    period_bits: int,
    terms: int,
    odd: bool = False,
) -> Series:
    """Least-squares fit of f on [-T, T] by K harmonics of period 2^period_bits
    (``odd``: f is odd, sines only). Chebyshev-like nodes crowd the ends, as in a
    near-minimax polynomial fit; the error is then measured on a uniform grid."""
    if not 1 <= terms <= MAX_TERMS:
        raise ValueError(f"a series has 1 to {MAX_TERMS} terms, got {terms}")
    period = 2.0**period_bits
    if not 0 < 2 * half_width < period:
        raise ValueError(f"the fit interval [-{half_width}, {half_width}] must lie in a period")
    x = chebyshev_nodes(-half_width, half_width, 4096)
    k = torch.arange(1, terms + 1, dtype=torch.float64)

    def basis(t: torch.Tensor) -> torch.Tensor:
        ang = 2 * math.pi * t[:, None] * k[None, :] / period
        cols = (
            [torch.sin(ang)]
            if odd
            else [torch.ones_like(t)[:, None], torch.cos(ang), torch.sin(ang)]
        )
        return torch.cat(cols, 1)

    coef = torch.linalg.lstsq(basis(x), f(x)[:, None]).solution[:, 0]
    grid = torch.linspace(-half_width, half_width, 20001, dtype=torch.float64)
    err = float((basis(grid) @ coef - f(grid)).abs().max())
    if odd:
        const, cos, sin = 0.0, [0.0] * terms, coef.tolist()
    else:
        const, cos, sin = float(coef[0]), coef[1 : terms + 1].tolist(), coef[terms + 1 :].tolist()
    return Series(period_bits, half_width, const, tuple(cos), tuple(sin), err)


def harmonics(angle: torch.Tensor, terms: int) -> torch.Tensor:
    """e^(i k a) for k = 1..K, stacked as [K, *angle.shape] (complex128 for a float64
    angle, complex64 for float32), by K - 1 complex products from e^(i a): one pair of
    transcendental calls, not 2K (the rounding grows about linearly in k: ~1e-15 at K = 32
    in float64, ~1e-6 in float32). ``torch.view_as_real`` of the result gives
    (cos k a, sin k a) pairs in a trailing dimension of 2."""
    cdtype = torch.complex64 if angle.dtype == torch.float32 else torch.complex128
    out = torch.empty((terms, *angle.shape), dtype=cdtype)
    out[0] = torch.polar(torch.ones_like(angle), angle)
    for k in range(1, terms):
        torch.mul(out[k - 1], out[0], out=out[k])
    return out


def harmonic_steps(angle: torch.Tensor, terms: int) -> Iterator[torch.Tensor]:
    """e^(i k a) for k = 1..K one at a time: the values of :func:`harmonics` (the same
    products in the same order, so the same roundings), without its [K, *angle.shape]
    array. A step that consumes each harmonic at once then keeps its temporaries the size
    of one harmonic: large ones cost a page fault a page each time they are allocated."""
    base = torch.polar(torch.ones_like(angle), angle)
    h = base
    for k in range(terms):
        if k:
            h = h * base
        yield h


def ring_angle(z: torch.Tensor, bits: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """2 pi (z mod 2^bits) / 2^bits (float64, or ``dtype``): the angle of ring elements,
    period 2^bits. In float32 an angle is off by up to 2^-24 of a period: a shift of the
    input by P 2^-24 real units, not an error in F's values."""
    if not 1 <= bits <= 62:
        raise ValueError(f"a ring period of 2^1 to 2^62, got 2^{bits}")
    low = z & ((1 << bits) - 1)
    return low.to(dtype).mul_(2 * math.pi / 2.0**bits)


def check_series_params(bits: int, terms: int, scale: int, single: bool = False) -> None:
    """The public parameters of a trigonometric series step, as a worker accepts them."""
    if type(single) is not bool:
        raise ValueError(f"a series' precision flag is a bool, got {single!r}")
    for name, v, lo, hi in (("period bits", bits, 1, 62), ("terms", terms, 1, MAX_TERMS)):
        if type(v) is not int or not lo <= v <= hi:
            raise ValueError(f"a series' {name} must be an int in [{lo}, {hi}], got {v!r}")
    if type(scale) is not int or not 8 <= scale <= 30:
        raise ValueError(f"a series' value scale must be an int in [8, 30], got {scale!r}")
