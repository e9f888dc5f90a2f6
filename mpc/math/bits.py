"""0/1 values packed 64 to an int64 word (bit j of word w is element 64 w + j), so that a
shared bit travels as one bit, not as a ring word: the XOR of packed XOR shares is the
packed XOR of the bits."""

from __future__ import annotations

import torch

WORD_BITS = 64
_SHIFTS = torch.arange(WORD_BITS, dtype=torch.int64)


def words_for(n: int) -> int:
    """Words that hold ``n`` packed bits."""
    return -(-n // WORD_BITS)


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """The low bit of each element of ``bits`` (int64, any shape), packed in row-major
    order into ``words_for(bits.numel())`` int64 words; the last word's unused bits are 0."""
    if bits.dtype != torch.int64:
        raise TypeError(f"pack_bits takes int64 bits, got {bits.dtype}")
    flat = bits.reshape(-1) & 1
    n = flat.numel()
    pad = words_for(n) * WORD_BITS - n
    if pad:
        flat = torch.cat([flat, flat.new_zeros(pad)])
    # disjoint bits: their sum is their OR (bit 63's term wraps to the sign bit)
    return (flat.view(-1, WORD_BITS) << _SHIFTS).sum(1)


def unpack_bits(words: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """The 0/1 elements (int64, ``shape``) that :func:`pack_bits` packed into ``words``."""
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"a shape is a list of sizes, got {shape!r}")
    n = 1
    for d in shape:
        n *= d
    if words.dtype != torch.int64 or words.dim() != 1 or words.numel() != words_for(n):
        raise ValueError(
            f"{words_for(n)} packed int64 words hold {n} bits, got {list(words.shape)} "
            f"of {words.dtype}"
        )
    return ((words.view(-1, 1) >> _SHIFTS) & 1).reshape(-1)[:n].reshape(shape)


__all__ = ["WORD_BITS", "pack_bits", "unpack_bits", "words_for"]
