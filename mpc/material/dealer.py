"""The dealer's (crypto provider's) steps: it expands every party's seed, computes the
correlated material and returns the last party's corrections (the others derive theirs).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.material import rules, sizes
from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.protocols.sizes import stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import (
    TAG_R,
    TAG_TRIG,
    consume,
    stream,
    sum_derived,
)


@step(rule=rules.new_seed, size=sizes.new_seed, makes_material=True)
def new_seed(ctx: Any, index: int, parties: int) -> torch.Tensor:
    """A fresh 16-byte seed from the operating system (stored at the dealer) for party
    ``index`` of ``parties`` (its label records the party's place)."""
    return torch.tensor(list(os.urandom(16)), dtype=torch.uint8)


# the most values one comparison selects (:func:`mpc.protocols.compare.select_by_msb`)
@step(
    rule=rules.dealer_fourier,
    size=sizes.dealer_fourier,
    keeps=stream_records(2),
    makes_material=True,
)
def dealer_fourier(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int, terms: int,
    scale: int, single: bool,
) -> torch.Tensor:  # fmt: skip
    """Material of a trigonometric series (see :func:`~mpc.material.party.fourier_finish`):
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
