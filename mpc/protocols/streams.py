"""Seed expansion: the streams of correlated randomness, and their single use.

A party's 16-byte seed ``s`` and a public ``(nonce, tag)`` give the key
``AES_s(nonce || tag)`` of a fresh AES counter-mode stream (AES as a PRF), so each piece of
material has its own stream and the dealer and a party derive it without talking. Every
worker derives each ``(seed, nonce, tag)`` at most once (:func:`consume`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from mpc.math.prg import PRG
from pointers.errors import NotAllowedError

# tags of the streams derived for one nonce
(
    TAG_A,
    TAG_B,
    TAG_C,
    TAG_R,
    TAG_U,
    TAG_D,
    TAG_RBITS,
    TAG_T_ARITH,
    TAG_T_BIN,
    TAG_TRIG,
    TAG_PAIRS,
    TAG_FSS_ROOT,  # the parties' DCF root seeds (mpc.protocols.fss.steps)
    TAG_TABLE,  # a lookup table's shares (mpc.protocols.low_bits.steps)
) = range(13)


def _seed_bytes(seed: torch.Tensor) -> bytes:
    if seed.numel() != 16:
        raise ValueError("a seed must hold 16 bytes")
    return bytes(seed.to(torch.uint8).tolist())


def consume(ctx: Any, seeds: list[torch.Tensor], nonce: int, *tags: int) -> None:
    """Mark the streams ``(nonce, tag)`` of each seed as used at this worker, refusing any
    that was used before: whatever a client sends, no mask or triple is derived twice.

    Keyed by the seed's bytes (a copy of a seed shares its history), kept per worker (per
    client namespace on a served worker) in ``ctx.function_state``."""
    if not isinstance(nonce, int) or isinstance(nonce, bool):
        raise TypeError(f"a nonce must be an int, got {type(nonce).__name__}")
    if not 0 <= nonce < 1 << 96:
        raise ValueError(f"parameter 'nonce' is an int in [0, 2^96), got {nonce}")
    if not seeds:
        raise ValueError("parameter 'seeds' takes at least one seed")
    used: dict[bytes, set[tuple[int, int]]] = ctx.function_state.setdefault("mpc.streams", {})
    keys = [_seed_bytes(s) for s in seeds]
    for key in keys:
        seen = used.get(key)
        if seen is not None:
            for tag in tags:
                if (nonce, tag) in seen:
                    raise NotAllowedError(
                        f"nonce {nonce} was already used for stream {tag} of this seed at "
                        f"worker {ctx.id!r}: a mask or triple is never used twice"
                    )
    for key in keys:
        used.setdefault(key, set()).update((nonce, tag) for tag in tags)


def stream(seed: torch.Tensor, nonce: int, tag: int) -> PRG:
    """The stream of ``seed`` for the public ``(nonce, tag)``: successive ``int64`` calls
    continue it, so pieces drawn in order are the pieces of one :func:`derive` of their
    whole (what lets a step work through a large tensor a slice at a time)."""
    key = _seed_bytes(seed)
    block = nonce.to_bytes(12, "little", signed=False) + tag.to_bytes(4, "little")
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return PRG(enc.update(block) + enc.finalize())


def derive(seed: torch.Tensor, nonce: int, tag: int, shape: list[int]) -> torch.Tensor:
    """Uniform int64 tensor from ``seed`` for the public ``(nonce, tag)``."""
    return stream(seed, nonce, tag).int64(tuple(shape))


def sum_derived(seeds: list[torch.Tensor], nonce: int, tag: int, shape: list[int]) -> torch.Tensor:
    out = derive(seeds[0], nonce, tag, shape)
    for s in seeds[1:]:
        out += derive(s, nonce, tag, shape)
    return out


def xor_derived(seeds: list[torch.Tensor], nonce: int, tag: int, shape: list[int]) -> torch.Tensor:
    out = derive(seeds[0], nonce, tag, shape)
    for s in seeds[1:]:
        out ^= derive(s, nonce, tag, shape)
    return out


def last_share(
    value: torch.Tensor, seeds: list[torch.Tensor], nonce: int, tag: int
) -> torch.Tensor:
    """The dealer's side of an additive sharing of ``value``: the last party's share, the
    value minus what the other parties derive (stream ``tag``), in place."""
    for s in seeds[:-1]:
        value -= derive(s, nonce, tag, list(value.shape))
    return value


def last_xor_share(
    value: torch.Tensor, seeds: list[torch.Tensor], nonce: int, tag: int, mask: int = -1
) -> torch.Tensor:
    """The same for an XOR sharing: ``value`` XOR the others' derived words (each ANDed with
    ``mask``: 1 for shares of single bits), in place."""
    for s in seeds[:-1]:
        value ^= derive(s, nonce, tag, list(value.shape)) & mask
    return value


# -- dealt lookup tables (mpc.protocols.low_bits, mpc.protocols.rank_select): 2^bits words an
# element; the parties before the last derive their shares (one tag a table), the last
# party's come from the dealer, every table of an instance in one delivery


def last_shares(
    tables: list[torch.Tensor], seeds: list[torch.Tensor], nonce: int, tags: list[int]
) -> torch.Tensor:
    """The dealer's side: the last party's shares of ``tables`` (each [*shape, 2^bits]),
    each table minus the other parties' derived shares (stream ``tags[k]`` for table k),
    flat and in order: one delivery."""
    out = [last_share(table, seeds, nonce, tag).reshape(-1) for table, tag in zip(tables, tags)]
    return torch.cat(out) if len(out) > 1 else out[0]  # (one table: no copy)


def party_tables(
    seed: torch.Tensor,
    nonce: int,
    tags: list[int],
    dealt: torch.Tensor | None,
    shape: list[int],
    bits: int,
) -> list[torch.Tensor]:
    """A party's shares of the tables of ``tags``, each [*shape, 2^bits]: derived from its
    seed, or (the last party) split from the dealer's delivery ``dealt``."""
    full = [*shape, 1 << bits]
    if dealt is None:
        return [derive(seed, nonce, tag, full) for tag in tags]
    n = math.prod(full)
    if dealt.dtype != torch.int64 or dealt.numel() != len(tags) * n:
        raise ValueError(
            f"{len(tags)} table(s) of {bits} bits for {shape} are {len(tags) * n} int64 "
            f"words, got {dealt.dtype} {list(dealt.shape)}"
        )
    return [dealt[k * n : (k + 1) * n].view(full) for k in range(len(tags))]


def entries_at(tables: list[torch.Tensor], c: torch.Tensor, bits: int) -> list[torch.Tensor]:
    """Each table's entry at c mod 2^bits (c of the tables' shape without their last
    dim)."""
    at = (c & ((1 << bits) - 1)).unsqueeze(-1)
    return [t.gather(-1, at).squeeze(-1) for t in tables]
