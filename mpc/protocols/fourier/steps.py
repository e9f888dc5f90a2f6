"""The steps of a masked Fourier series (the protocol:
:func:`mpc.protocols.fourier.run.fourier_series`): the dealer's shares of cos k theta and
sin k theta for its mask r (theta the angle of r), and each party's local evaluation from
the opened c = x + r (masked by :func:`mpc.protocols.comparison.steps.cmp_mask`).

Instance: one nonce. The dealer's shares go to the last party (the others derive theirs).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch

from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.protocols.rules import OPENED, dealer_seeds, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, int_param, numel, stream_records, tensor_elems
from mpc.protocols.step import step
from mpc.protocols.streams import TAG_R, TAG_TRIG, consume, stream, sum_derived
from pointers.worker.sealing import ProtocolCall, seal


def _terms(p: dict[str, Any]) -> int:
    if "terms" in p:
        return int_param(p["terms"], "terms", 1, 1 << 12)
    sin = p.get("sin")
    return min(len(sin), 1 << 12) if isinstance(sin, list) else 1


# -- the dealer ----------------------------------------------------------------------------


def _dealer_fourier_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.fourier", nonce_of(call), deliveries=1)]


def _dealer_fourier_size(p: dict[str, Any]) -> int:
    """The output (two words a harmonic), the mask, its angle and a harmonic's terms:
    2 K + 6 words an element in float32 (``single``), 2 K + 8 in float64."""
    words = 2 * _terms(p) + (6 if p.get("single") is True else 8)
    return declared(words * WORD * numel(p.get("shape")))


# the most values one comparison selects (:func:`mpc.protocols.compare.select_by_msb`)
@step(
    rule=_dealer_fourier_rule,
    size=_dealer_fourier_size,
    keeps=stream_records(2),
    makes_material=True,
)
def dealer_fourier(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int, terms: int,
    scale: int, single: bool,
) -> torch.Tensor:  # fmt: skip
    """Material of a trigonometric series (see :func:`fourier_finish`):
    the mask r (arithmetic, derived by all), and cos(k theta), sin(k theta) for k = 1..K
    at ``scale`` fractional bits, theta = 2 pi (r mod 2^bits) / 2^bits, shared additively:
    the last party's shares, shape [K, *shape, 2] (cos, sin pairs). ``single``: computed
    in float32 (the values then carry about 1e-6 of rounding)."""
    check_series_params(bits, terms, scale, single)
    consume(ctx, seeds, nonce, TAG_R, TAG_TRIG)
    r = sum_derived(seeds, nonce, TAG_R, shape)
    angle = ring_angle(r, bits, torch.float32 if single else torch.float64)
    out = torch.empty([terms, *shape, 2], dtype=torch.int64)
    others = [stream(s, nonce, TAG_TRIG) for s in seeds[:-1]]  # their shares, harmonic by
    for k, h in enumerate(harmonic_steps(angle, terms)):  # harmonic (no K-sized temporary)
        piece = out[k]
        piece.copy_(torch.view_as_real(h).mul(2.0**scale).round_())
        for other in others:
            piece -= other.int64(piece.shape)
    return out


# -- the parties ---------------------------------------------------------------------------


def check_coefficients(
    bits: int, const: float, cos: list[float], sin: list[float], coef_bits: int, scale: int,
    single: bool,
) -> int:  # fmt: skip
    """The public parameters of a series' evaluation, as a worker accepts them; its terms."""
    terms = len(sin)
    check_series_params(bits, terms, scale, single)
    if len(cos) != terms or type(coef_bits) is not int or not 8 <= coef_bits <= 30:
        raise ValueError("a series needs as many cosine as sine terms and 8-30 coefficient bits")
    if not all(math.isfinite(v) and abs(v) <= 2.0**20 for v in [const, *cos, *sin]):
        raise ValueError("a series' coefficients must be finite, at most 2^20 in magnitude")
    return terms


def harmonic_coefficients(
    c: torch.Tensor, bits: int, cos: list[float], sin: list[float], coef_bits: int, single: bool
) -> Iterator[tuple[int, torch.Tensor]]:
    """Per harmonic k, the public (P_k, Q_k) of the opened c at ``coef_bits``, [*c.shape, 2]
    int64 (see :func:`fourier_finish`), in one buffer reused from harmonic to harmonic."""
    terms = len(sin)
    real = torch.float32 if single else torch.float64
    g = torch.complex(torch.tensor(cos, dtype=real), -torch.tensor(sin, dtype=real))
    g = g.mul_(2.0**coef_bits).view([terms] + [1] * c.dim())
    buf = torch.empty([*c.shape, 2], dtype=torch.int64)
    for k, h in enumerate(harmonic_steps(ring_angle(c, bits, real), terms)):
        buf.copy_(torch.view_as_real(h * g[k]).round_())
        yield k, buf


def _fourier_finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "trig")
    call.material("trig", "dealer.fourier", nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return None


def _fourier_finish_size(p: dict[str, Any]) -> int:
    """One harmonic at a time into one buffer: 7.5 words an element in float32
    (``single``), 10 in float64, whatever the terms."""
    words = 7.5 if p.get("single") is True else 10
    return declared(words * WORD * tensor_elems(p, "c"))


@step(rule=_fourier_finish_rule, size=_fourier_finish_size, keeps=stream_records(1))
def fourier_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    trig: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
    const: float,
    cos: list[float],
    sin: list[float],
    coef_bits: int,
    scale: int,
    single: bool,
) -> torch.Tensor:
    """Party i's share of F(x) = const + sum_k a_k cos(k alpha) + b_k sin(k alpha), alpha =
    2 pi (x mod 2^bits) / 2^bits, at ``coef_bits + scale`` fractional bits, from the opened
    c = x + r. With phi the angle of c and theta that of r, alpha = phi - theta, and
    a cos(k alpha) + b sin(k alpha) = Re[(a - i b) e^(i k phi) e^(-i k theta)]
                                    = P cos k theta + Q sin k theta
    for P + i Q = (a - i b) e^(i k phi): public coefficients (encoded at ``coef_bits``)
    times the shares of cos k theta and sin k theta (``trig``, shape [K, *x.shape, 2]: the
    dealer's at the last party; derived elsewhere). Local. ``single``: the trigonometry in
    float32 (about 2.5 times faster; see :class:`mpc.math.fourier.Series`)."""
    terms = check_coefficients(bits, const, cos, sin, coef_bits, scale, single)
    consume(ctx, [seed], nonce, TAG_TRIG)
    piece = [*c.shape, 2]  # one harmonic's (cos, sin) pairs
    pieces = stream(seed, nonce, TAG_TRIG)  # (read only where the dealer sent none)
    if trig is not None and list(trig.shape) != [terms, *piece]:
        raise ValueError(f"series material of shape {list(trig.shape)} for {list(c.shape)}")
    # one harmonic at a time, into one buffer: a [K, *c.shape, 2] temporary (63 MB for
    # GELU's 10 harmonics at (1, 128, 3072)) cost more in page faults than in arithmetic
    out = torch.zeros(c.shape, dtype=torch.int64)
    for k, buf in harmonic_coefficients(c, bits, cos, sin, coef_bits, single):
        buf.mul_(pieces.int64(piece) if trig is None else trig[k])
        out += buf[..., 0]
        out += buf[..., 1]
    if first:
        out += round(const * 2.0 ** (coef_bits + scale))
    return out
