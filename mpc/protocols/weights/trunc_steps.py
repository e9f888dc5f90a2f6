"""A product with a weight instance whose operand is truncated in the same round (the
client's side: :func:`mpc.protocols.weights.run.trunc_fixed_product`): the truncation's
opening is the product's only one.

The truncation of z by f opens c = z + r (:func:`mpc.protocols.truncation.steps.
trunc_mask`) and gives z >> f = p + U + m D per element, p = c >> f and m = msb(c) public,
U and D = 2^(64-f) s the dealer's (:func:`mpc.protocols.truncation.steps.dealer_trunc`).
With the instance W = F + B (F public at the parties, B the dealer's):

    (z >> f) @ W = p @ W + (U + m D) @ F + U @ B + sum_k m_k D_k B_kj,

where p @ W is each party's p @ W_i, (U + m D) @ F its share of the truncated value times
F, and the dealer deals U @ B (a product element a word) and, because m is known only
once c is open, D_k B_kj for every k of a row (K x N words a row: this is for few rows,
a decoding step's). So "truncate, then multiply by the weight" is one round, not two.

Instance: the truncation's nonce (its r, U and D, derived as for any truncation) and
the weight instance's; the dealer's step makes the truncation's correction too (r is
derived once).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.ring import ring_bilinear
from mpc.protocols.rules import OPENED, dealer_seeds, instance_of, int_of, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, numel, shape_of, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
    TAG_D,
    TAG_R,
    TAG_U,
    consume,
    derive,
    last_share,
    sum_derived,
)
from mpc.protocols.truncation.steps import (
    pack_trunc_correction,
    trunc_correction_dtype,
    unpack_trunc_correction,
)
from mpc.protocols.weights.steps import _weights
from pointers.worker.sealing import ProtocolCall, seal

#: the dealer's delivery to the last party
DEALER_TRUNC_WEIGHT = "dealer.truncw"


def _check(x_shape: Any, b_shape: Any, bits: Any) -> tuple[int, int, int]:
    """(rows, K, N) of x [..., K] @ B [K, N]; the bits dropped, 1 to 62."""
    if type(bits) is not int or not 1 <= bits <= 62:
        raise ValueError(f"a truncation drops 1 to 62 bits, got {bits!r}")
    if not (
        isinstance(x_shape, list)
        and len(x_shape) >= 1
        and all(type(d) is int and d >= 0 for d in x_shape)
        and len(b_shape) == 2
        and x_shape[-1] == b_shape[0]
    ):
        raise ValueError(f"x {x_shape!r} does not multiply a weight of shape {list(b_shape)}")
    k, n = int(b_shape[0]), int(b_shape[1])
    return numel(x_shape) // max(k, 1), k, n


def material_words(x_shape: list[int], b_shape: list[int], bits: int) -> int:
    """The last party's words: the truncation's packed correction, U @ B, the D_k B_kj
    (each a multiple of 2^(64 - f): f bits of it, in the narrowest dtype that holds them,
    padded to whole words)."""
    rows, k, n = _check(x_shape, b_shape, bits)
    size = trunc_correction_dtype(bits).itemsize
    return rows * k + (rows * k * size + 7) // 8 + rows * n + (rows * k * n * size + 7) // 8


def _narrow(t: torch.Tensor, bits: int) -> torch.Tensor:
    """A share of a multiple of 2^(64 - f) as its f low bits, sign-extended, in the
    narrowest dtype that holds them, its bytes padded to whole int64 words (flat)."""
    t = t.bitwise_left_shift(64 - bits).bitwise_right_shift_(64 - bits)
    raw = t.to(trunc_correction_dtype(bits)).reshape(-1).view(torch.uint8)
    return torch.cat([raw, raw.new_zeros((-raw.numel()) % 8)]).view(torch.int64)


def _widen(words: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """The inverse of :func:`_narrow` (int64, still to be shifted left by 64 - f)."""
    dtype = trunc_correction_dtype(bits)
    return words.view(torch.uint8)[: count * dtype.itemsize].view(dtype).to(torch.int64)


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    b = call.material("b", "dealer.weight", local=True)
    assert b is not None
    bits = call.value("bits")
    return [seal(DEALER_TRUNC_WEIGHT, nonce_of(call), deliveries=1, extra=(b.nonce, bits))]


def _dealer_size(p: dict[str, Any]) -> int:
    """r, U, s and their derived shares (6 words an element of x), U @ B and its share,
    the s_k B_kj, one party's derived copy and the narrow copies (2.5 words each; 20.0
    MiB measured for 1 x 1,024 x 1,024 at 16 bits)."""
    x = numel(p.get("x_shape"), "x_shape")
    b = shape_of(p.get("b"))
    n = int(b[-1]) if len(b) == 2 else 0
    rows = x // max(int(b[0]), 1) if len(b) == 2 else 0
    return declared(WORD * (6 * x + 2 * rows * n) + 20 * x * n)


@step(rule=_dealer_rule, size=_dealer_size, keeps=stream_records(5), makes_material=True)
def dealer_trunc_weight(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    b: torch.Tensor,
    x_shape: list[int],
    bits: int,
) -> torch.Tensor:
    """The last party's material, flat: its truncation correction (U and the narrow s of
    D, :func:`~mpc.protocols.truncation.steps.pack_trunc_correction`), its share of
    U @ B, then of D_k B_kj ([rows, K, N], D_k = 2^(64-f) s_k: the f low bits of its
    share of s_k B_kj, narrow, :func:`_narrow`) for the mask r of ``nonce``."""
    rows, k, n = _check(x_shape, list(b.shape), bits)
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_D, TAG_C, TAG_A)
    r = sum_derived(seeds, nonce, TAG_R, list(x_shape)).sub_(1 << 62)
    s = (r >> 63).add_(1)  # 1 - msb(r')
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    ub = ring_bilinear("matmul", {}, u.reshape(rows, k), b)
    table = s.reshape(rows, k, 1) * b.unsqueeze(0)  # s_k B_kj: D_k B_kj = 2^(64-f) of it
    u, s = last_share(u, seeds, nonce, TAG_U), last_share(s, seeds, nonce, TAG_D)
    s = s.bitwise_left_shift_(64 - bits).bitwise_right_shift_(64 - bits)
    corr = pack_trunc_correction(u, s.to(trunc_correction_dtype(bits)))
    ub = last_share(ub, seeds, nonce, TAG_C)
    table = _narrow(last_share(table, seeds, nonce, TAG_A), bits)
    return torch.cat([corr, ub.reshape(-1), table])


# -- the parties ---------------------------------------------------------------------------


def _product_rule(call: ProtocolCall) -> Any:
    nonce, weight = nonce_of(call), int_of(call, "weight")
    party_seed(call, "material")
    dealt = call.material(
        "material", DEALER_TRUNC_WEIGHT, nonce, local=False, optional=True, consume=True
    )
    if dealt is not None and dealt.extra != (weight, call.value("bits")):
        raise call.refuse(f"the dealer's material is not for weight instance {weight} and bits")
    call.material("c", OPENED + "trunc.c", nonce, local=True, consume=True)
    call.material("f", OPENED + "weight.f", weight, local=True)  # (kept: the instance's F)
    w = call.share("w")
    instance_of(call, _weights(call), weight, w)
    return None


def _product_size(p: dict[str, Any]) -> int:
    """The truncated value and its parts (4 words an element), the D_k B_kj (derived, or
    the dealt narrow ones widened: a word each; 7.9 MiB measured for 1 x 1,024 x 1,024),
    the products."""
    c = numel(shape_of(p.get("c")))
    w = shape_of(p.get("w"))
    n = int(w[-1]) if len(w) == 2 else 0
    rows = c // max(int(w[0]), 1) if len(w) == 2 else 0
    return declared(WORD * (4 * c + c * n + 4 * rows * n))


@step(rule=_product_rule, size=_product_size, keeps=stream_records(4))
def trunc_weight_product(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    weight: int,
    material: torch.Tensor | None,
    w: torch.Tensor,
    f: torch.Tensor,
    c: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """Party i's share of (z >> bits) @ W from the opened c (see the module docstring):
    p @ W_i + (its share of z >> bits without p) @ F + its shares of U @ B and of
    sum_k m_k D_k B_kj (derived, or the last party's ``material``)."""
    rows, k, n = _check([int(d) for d in c.shape], list(w.shape), bits)
    consume(ctx, [seed], nonce, TAG_U, TAG_D, TAG_C, TAG_A)
    shape = list(c.shape)
    if material is None:
        u = derive(seed, nonce, TAG_U, shape)
        s = derive(seed, nonce, TAG_D, shape)
        ub = derive(seed, nonce, TAG_C, [rows, n])
        table = derive(seed, nonce, TAG_A, [rows, k, n])
    else:
        narrow = rows * k * trunc_correction_dtype(bits).itemsize
        head = rows * k + (narrow + 7) // 8
        if material.numel() != material_words(shape, list(w.shape), bits):
            raise ValueError(f"the dealer's material is not for x {shape} and W {list(w.shape)}")
        u, s = unpack_trunc_correction(material[:head], shape, bits)
        u, s = u.clone(), s.to(torch.int64)
        ub = material[head : head + rows * n].view(rows, n)
        table = _widen(material[head + rows * n :], rows * k * n, bits).view(rows, k, n)
    table = table.bitwise_left_shift_(64 - bits)  # D_k B_kj
    wrap = c >> 63  # all ones where msb(c) = 1
    mine = u + (s.bitwise_left_shift(64 - bits) & wrap)  # (z >> f) less p, this party's
    out = ring_bilinear("matmul", {}, mine.reshape(rows, k), f)
    p = c >> bits
    out += ring_bilinear("matmul", {}, p.reshape(rows, k), w)
    out += ub
    m = (wrap & 1).reshape(rows, 1, k)
    out += torch.bmm(m, table).reshape(rows, n)  # sum_k m_k (D_k B_kj)
    return out.reshape([*shape[:-1], n])
