"""The parties' steps of the protocols in :mod:`mpc.protocols` (one function per step,
run where the shares live; the party's own seed gives its share of the dealer's material).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.material import rules, sizes
from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.math.prg import PRG, SEED_BYTES
from mpc.protocols.sizes import INPUT_SEED_BYTES, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import (
    TAG_TRIG,
    consume,
    stream,
)
from pointers.errors import LimitExceeded, NotAllowedError

# -- trigonometric series, party side -------------------------------------------------


@step(rule=rules.fourier_finish, size=sizes.fourier_finish, keeps=stream_records(1))
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
    terms = len(sin)
    check_series_params(bits, terms, scale, single)
    if len(cos) != terms or type(coef_bits) is not int or not 8 <= coef_bits <= 30:
        raise ValueError("a series needs as many cosine as sine terms and 8-30 coefficient bits")
    if not all(math.isfinite(v) and abs(v) <= 2.0**20 for v in [const, *cos, *sin]):
        raise ValueError("a series' coefficients must be finite, at most 2^20 in magnitude")
    consume(ctx, [seed], nonce, TAG_TRIG)
    piece = [*c.shape, 2]  # one harmonic's (cos, sin) pairs
    pieces = stream(seed, nonce, TAG_TRIG)  # (read only where the dealer sent none)
    if trig is not None and list(trig.shape) != [terms, *piece]:
        raise ValueError(f"series material of shape {list(trig.shape)} for {list(c.shape)}")
    real = torch.float32 if single else torch.float64
    g = torch.complex(torch.tensor(cos, dtype=real), -torch.tensor(sin, dtype=real))
    g = g.mul_(2.0**coef_bits).view([terms] + [1] * c.dim())
    # one harmonic at a time, into one buffer: a [K, *c.shape, 2] temporary (63 MB for
    # GELU's 10 harmonics at (1, 128, 3072)) cost more in page faults than in arithmetic
    out = torch.zeros(c.shape, dtype=torch.int64)
    buf = torch.empty(piece, dtype=torch.int64)
    for k, h in enumerate(harmonic_steps(ring_angle(c, bits, real), terms)):
        buf.copy_(torch.view_as_real(h * g[k]).round_())
        buf.mul_(pieces.int64(piece) if trig is None else trig[k])
        out += buf[..., 0]
        out += buf[..., 1]
    if first:
        out += round(const * 2.0 ** (coef_bits + scale))
    return out


# -- comparison (MSB extraction), party side ---------------------------------------------


# An input share drawn from a seed: at most this many bytes (1 GiB), checked before the
# tensor is allocated (a sent tensor is bounded by the message size limit the same way).
MAX_SEEDED_BYTES = 1 << 30


@step(size=sizes.derive, keeps=INPUT_SEED_BYTES)
def share_from_seed(ctx: Any, seed: bytes, shape: list[int]) -> torch.Tensor:
    """Party i's input share, expanded from a 16-byte seed the data owner drew (os.urandom)
    and sent it instead of the share itself: the owner expands the same seed to compute the
    last party's share. Each seed gives one share at a worker; a second use is refused."""
    if type(seed) is not bytes or len(seed) != SEED_BYTES:
        raise ValueError(f"an input seed is {SEED_BYTES} bytes, got {type(seed).__name__}")
    if not (
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ValueError(f"an input share's shape is a list of sizes, got {shape!r}")
    numel = 1
    for d in shape:
        numel *= d
    if numel * 8 > MAX_SEEDED_BYTES:
        raise LimitExceeded(
            f"an input share of {numel} elements exceeds the {MAX_SEEDED_BYTES} bytes a "
            "seeded share may take"
        )
    used: set[bytes] = ctx.function_state.setdefault("mpc.input_seeds", set())
    if seed in used:
        raise NotAllowedError(
            f"worker {ctx.id!r}: this input seed was used before; a seed gives one share"
        )
    used.add(seed)
    return PRG(seed).int64(tuple(shape))
