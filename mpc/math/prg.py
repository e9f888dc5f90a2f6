"""Cryptographically secure pseudorandom ring elements: an AES-128 counter-mode keystream.

A :class:`PRG` is keyed by a 16-byte seed; its output is the AES-128 keystream in counter
mode, read as little-endian int64 words: AES_seed(0^96 || 2), AES_seed(0^96 || 3), ...
(the counter blocks GCM uses for a zero 96-bit IV; the stream is produced by encrypting
zeros with AES-GCM, whose OpenSSL code path is about 1.7 times faster than plain CTR on
CPUs with vector AES, and the GHASH tag is never used). Each seed keys one stream; a
stream is at most 2^32 blocks (64 GiB), far more than any tensor. Two parties holding
the same seed draw the same tensors in the same order, which is how pairwise seeds give
correlated randomness without communication. Never use torch's, numpy's or Python's PRNG for
shares, masks or triples.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["PRG", "SEED_BYTES", "new_seed", "random_ring"]

SEED_BYTES = 16
_BLOCK = 16
# output of one update_into() may need up to block_size - 1 spare bytes (cryptography < 43)
_SPARE = _BLOCK - 1
_ZERO_CHUNK = 1 << 20  # keystream is produced in pieces of at most 1 MiB

ShapeLike = int | Sequence[int] | torch.Size


@functools.cache
def _zeros() -> memoryview:
    """The all-zero plaintext whose encryption is the keystream (shared, read-only)."""
    return memoryview(bytes(_ZERO_CHUNK))


def new_seed() -> bytes:
    """A fresh 16-byte seed from the operating system's CSPRNG."""
    return os.urandom(SEED_BYTES)


def _numel(shape: ShapeLike) -> tuple[tuple[int, ...], int]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int) or d < 0:
            raise ValueError(f"shape must be non-negative ints, got {shape!r}")
    n = 1
    for d in dims:
        n *= d
    return dims, n


class PRG:
    """AES-128 counter-mode keystream generator; successive calls continue the stream."""

    __slots__ = ("_encryptor", "_tail")

    def __init__(self, seed: bytes) -> None:
        if not isinstance(seed, (bytes, bytearray)):
            raise TypeError(f"seed must be bytes, got {type(seed).__name__}")
        if len(seed) != SEED_BYTES:
            raise ValueError(f"seed must be exactly {SEED_BYTES} bytes, got {len(seed)}")
        cipher = Cipher(algorithms.AES(bytes(seed)), modes.GCM(bytes(12)))
        self._encryptor = cipher.encryptor()
        self._tail = bytearray(_BLOCK + _SPARE)

    def __repr__(self) -> str:  # never show the key
        return "PRG(<seeded>)"

    def _fill(self, out: memoryview) -> None:
        """Write the next ``len(out)`` keystream bytes into ``out``."""
        n, pos, zeros = len(out), 0, _zeros()
        # update_into may demand len(data) + 15 bytes of room (cryptography < 43): run the bulk
        # straight into ``out`` keeping a block of room, then the last block through a scratch
        while n - pos > _BLOCK:
            step = min(len(zeros), n - pos - _BLOCK)
            self._encryptor.update_into(zeros[:step], out[pos:])
            pos += step
        if pos < n:
            rest = n - pos
            self._encryptor.update_into(zeros[:rest], self._tail)
            out[pos:] = self._tail[:rest]

    def randbytes(self, n: int) -> bytes:
        """The next ``n`` keystream bytes (e.g. to derive a child seed)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be a non-negative int, got {n!r}")
        buf = bytearray(n)
        self._fill(memoryview(buf))
        return bytes(buf)

    def int64(self, shape: ShapeLike) -> torch.Tensor:
        """Uniform int64 ring elements of ``shape`` (a fresh tensor the caller owns)."""
        dims, n = _numel(shape)
        out = np.empty(dims, dtype=np.int64)  # shaped here: the tensor is not a view
        if n:
            self._fill(out.data.cast("B"))  # (ndarray.data: its memoryview)
        if sys.byteorder == "big":  # little-endian words: same seed, same tensor on any host
            out.byteswap(inplace=True)
        return torch.from_numpy(out)

    def bits(self, shape: ShapeLike) -> torch.Tensor:
        """Uniform bits (int64 zeros and ones) of ``shape``, 8 per keystream byte."""
        dims, n = _numel(shape)
        raw = np.empty((n + 7) // 8, dtype=np.uint8)
        if raw.size:
            self._fill(raw.data)
        bits = np.unpackbits(raw, count=n, bitorder="little")
        return torch.from_numpy(bits).to(torch.int64).reshape(dims)


def random_ring(shape: ShapeLike) -> torch.Tensor:
    """Uniform int64 ring elements from a fresh one-time seed."""
    return PRG(new_seed()).int64(shape)


def split_additive(value: torch.Tensor, n: int) -> list[torch.Tensor]:
    """``n`` additive shares of the int64 ``value`` (which is consumed: the last share
    is computed in its place): the first n - 1 uniform from fresh seeds."""
    shares = []
    for _ in range(n - 1):
        r = random_ring(tuple(value.shape))
        value -= r
        shares.append(r)
    shares.append(value)
    return shares
