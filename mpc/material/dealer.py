"""The dealer's (crypto provider's) steps: it expands every party's seed, computes the
correlated material and returns the last party's corrections (the others derive theirs).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.material.streams import (
    TAG_A,
    TAG_B,
    TAG_C,
    TAG_D,
    TAG_R,
    TAG_RBITS,
    TAG_T_ARITH,
    TAG_T_BIN,
    TAG_U,
    consume,
    derive,
    sum_derived,
    xor_derived,
)
from mpc.math.prg import PRG
from mpc.math.ring import ring_bilinear
from pointers.worker.sealing import protocol_function


@protocol_function(sealed_outputs=True)
def new_seed(ctx: Any) -> torch.Tensor:
    """A fresh 16-byte seed from the operating system (stored at the dealer)."""
    return torch.tensor(list(os.urandom(16)), dtype=torch.uint8)


@protocol_function(material=("seeds",), sealed_outputs=True)
def dealer_triple(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    a_shape: list[int],
    b_shape: list[int],
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Beaver triple c = op(a, b): the last party's share of c (the others derive theirs)."""
    consume(ctx, seeds, nonce, TAG_A, TAG_B, TAG_C)
    a = sum_derived(seeds, nonce, TAG_A, a_shape)
    b = sum_derived(seeds, nonce, TAG_B, b_shape)
    c = a.mul_(b) if op == "mul" and a_shape == b_shape else ring_bilinear(op, params, a, b)
    for s in seeds[:-1]:
        c -= derive(s, nonce, TAG_C, list(c.shape))
    return c


@protocol_function(material=("seeds",), sealed_outputs=True)
def dealer_and_triple(ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int]) -> Any:
    """Binary (XOR-shared, bitwise) triple c = a & b: the last party's share of c."""
    consume(ctx, seeds, nonce, TAG_A, TAG_B, TAG_C)
    a = xor_derived(seeds, nonce, TAG_A, shape)
    b = xor_derived(seeds, nonce, TAG_B, shape)
    c = a & b
    for s in seeds[:-1]:
        c ^= derive(s, nonce, TAG_C, shape)
    return c


@protocol_function(material=("seeds",), sealed_outputs=True)
def dealer_trunc(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int
) -> list[torch.Tensor]:
    """Truncation material for the mask r = sum of derived shares (see :func:`trunc_finish`):
    the last party's shares of U = -(r' >> f) - 2^(62-f) and D = 2^(64-f) (1 - msb(r')),
    where r' = r - 2^62."""
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_D)
    r = sum_derived(seeds, nonce, TAG_R, shape).sub_(1 << 62)
    d = (r >> 63).add_(1).bitwise_left_shift_(64 - bits)  # 2^(64-f) (1 - h)
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    for s in seeds[:-1]:
        u -= derive(s, nonce, TAG_U, shape)
        d -= derive(s, nonce, TAG_D, shape)
    return [u, d]


@protocol_function(material=("seeds",), sealed_outputs=True)
def dealer_compare(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int]
) -> list[torch.Tensor]:
    """Comparison material: r (arithmetic, derived by all) shared bitwise as well, and a
    random bit t shared both ways (a "daBit"): the last party's binary share of r, its
    arithmetic share of t and its binary share of t."""
    consume(ctx, seeds, nonce, TAG_R, TAG_RBITS, TAG_T_ARITH, TAG_T_BIN)
    r = sum_derived(seeds, nonce, TAG_R, shape)
    r_bits = r.clone()
    for s in seeds[:-1]:
        r_bits ^= derive(s, nonce, TAG_RBITS, shape)
    t = PRG(os.urandom(16)).int64(tuple(shape)) & 1
    t_arith = t.clone()
    t_bin = t.clone()
    for s in seeds[:-1]:
        t_arith -= derive(s, nonce, TAG_T_ARITH, shape)
        t_bin ^= derive(s, nonce, TAG_T_BIN, shape) & 1
    return [r_bits, t_arith, t_bin]
