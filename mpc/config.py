"""Configuration of a sharing session: a frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

RING_BITS = 64


@dataclass(frozen=True)
class MPCConfig:
    """``frac_bits``: fractional bits of the fixed-point encoding of floats (default 16).

    Products are exact in the ring while |value| < 2^(62 - 2 * frac_bits) before
    truncation (2^30 at 16 bits); see docs/secret-sharing.md for the error bounds.
    """

    frac_bits: int = 16

    def __post_init__(self) -> None:
        if not isinstance(self.frac_bits, int) or isinstance(self.frac_bits, bool):
            raise TypeError(f"frac_bits must be an int, got {type(self.frac_bits).__name__}")
        if not 0 <= self.frac_bits <= 28:
            raise ValueError(f"frac_bits must be in [0, 28], got {self.frac_bits}")
