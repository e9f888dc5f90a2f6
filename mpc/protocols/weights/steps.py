"""Weight instances: a fixed shared weight keeps its Beaver mask across queries.

A Beaver product with a shared operand W opens f = W - B on every call. For a model's
weights that is the whole model per query (880 MB per party for BERT-base). A *weight
instance* opens F = W - B once, under its own nonce ``weight``; every later product
x * W (or W * x: ``w_first``) under a fresh nonce takes a fresh activation mask A and
C = op(A, B) from the dealer, and opens only e = x - A:

    op(x, W) = op(e + A, W) = op(e, W) + op(A, F) + op(A, B),

so each party's share is op(e, W_i) + op(A_i, F) + C_i (F is public among the parties,
and op(A, F) sums to the right term because the A_i sum to A). Per query the traffic is
the activation's e and the dealer's C, not the parameter count.

What is reused, and why it is safe: B masks W only. It is drawn once (the stream
``(weight, TAG_B)`` of every seed, consumed at the parties and the dealer when the
instance is made) and F = W - B is opened once; a party's later view per query is e
(masked by a fresh A: the stream ``(nonce, TAG_A)`` is consumed as for any product) and
its own C_i (a fresh stream, or the dealer's correction, which the other parties' fresh
C_j mask). The rules bind the instance to the share W it
masked: a product must use that same, unmodified tensor, so F is never combined with
another value (an in-place update of W ends the instance: the client makes a new one,
with a fresh B).

The dealer keeps B (the sum of the parties' streams) as a sealed object of its own for
the instance's lifetime, so a query costs it one product op(A, B), not a re-expansion of
the weight's streams.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from mpc.math.ring import (
    COLUMNS_FROM,
    ring_bilinear,
    settle_layout,
    settle_pays,
    speeds_measured,
)
from mpc.protocols.rules import (
    OPENED,
    dealer_seeds,
    instance_of,
    int_of,
    kept,
    make_instance,
    nonce_of,
    party_seed,
)
from mpc.protocols.sizes import (
    WORD,
    bilinear,
    declared,
    elementwise,
    numel,
    row_major,
    shape_of,
    stream_records,
)
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_B,
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
    narrow_of,
    narrow_words,
    pack_trunc_correction,
    trunc_correction_dtype,
    unpack_trunc_correction,
)
from pointers.worker.sealing import ProtocolCall, seal


def _bilinear(op: str, params: dict[str, Any], w_first: bool, m: Any, w: Any) -> torch.Tensor:
    """op(m, w), or op(w, m) where the weight is the first operand."""
    return ring_bilinear(op, params, w, m) if w_first else ring_bilinear(op, params, m, w)


def _rows(shape: Any) -> int:
    """Rows of an activation of ``shape`` in a matmul by a weight (0 if not a shape)."""
    if not isinstance(shape, list | tuple) or len(shape) < 1:
        return 0
    n = 1
    for d in shape:
        n *= int(d)
    return n // max(int(shape[-1]), 1)


def _settles(op: Any, w_first: Any, rows: int, w: Any) -> bool:
    """Whether a product of ``rows`` rows by the kept 2-D weight operand ``w`` may lay it
    out anew first (:func:`_settle`): a matmul with the weight second, where this process
    measured that it pays (before it measured its speeds: the larger case, as in
    :func:`mpc.protocols.sizes.bilinear`)."""
    if not (op == "matmul" and w_first is False and isinstance(w, torch.Tensor) and w.dim() == 2):
        return False
    if not speeds_measured():  # (the speeds are measured by a product, not here)
        return 0 < rows < COLUMNS_FROM
    return settle_pays(rows, tuple(w.shape), row_major(w))


def _uses(t: torch.Tensor) -> int:
    """Tensors using ``t``'s memory, as torch's private counter sees it from here (-1 if
    that counter is gone)."""
    try:
        return int(torch._C._storage_Use_Count(t.untyped_storage()._cdata))
    except (AttributeError, RuntimeError):
        return -1


@functools.cache
def _lone_uses() -> int:
    """What :func:`_uses` says of a tensor whose memory nothing else uses (measured once:
    the count differs between torch versions)."""
    return _uses(torch.empty(2))


def _alone(t: torch.Tensor) -> bool:
    """Whether ``t`` is all of its memory and no other tensor uses it (a view of it would
    keep the old memory alive if ``t`` were laid out anew)."""
    if t.untyped_storage().nbytes() != t.numel() * t.element_size():
        return False
    uses = _uses(t)
    return uses != -1 and uses == _lone_uses()


def _settle(op: str, w_first: bool, rows: int, operand: torch.Tensor) -> None:
    """Lay a weight instance's kept operand (the dealer's B, a party's F or its share W)
    out anew, in place, where the products of ``rows`` rows by it are faster in the other
    layout (:func:`mpc.math.ring.settle_layout`; a decoding step's one-row products by a
    row-major weight: about 2x). Once: the later products of as many rows find it laid out
    so. The values, and so every share and opening, are unchanged."""
    if op == "matmul" and not w_first:
        settle_layout(operand, rows)


def _weights(call: ProtocolCall) -> dict[int, Any]:
    out: dict[int, Any] = call.state.setdefault("mpc.weight_instances", {})
    return out


# -- the dealer ----------------------------------------------------------------------------


def _dealer_weight_rule(call: ProtocolCall) -> Any:
    """The instance's mask B stays at the dealer (it is never sent)."""
    dealer_seeds(call)
    return [seal("dealer.weight", int_of(call, "weight"), deliveries=0)]


def _dealer_weight_size(p: dict[str, Any]) -> int:
    """B and one party's stream."""
    return declared(2 * WORD * numel(p.get("shape")))


@step(
    rule=_dealer_weight_rule, size=_dealer_weight_size, keeps=stream_records(1), makes_material=True
)
def dealer_weight(ctx: Any, seeds: list[torch.Tensor], weight: int, shape: list[int]) -> Any:
    """The weight instance's mask B = sum of the parties' ``(weight, TAG_B)`` streams, kept
    at the dealer (sealed) for the instance's products (:func:`dealer_weight_triple`)."""
    consume(ctx, seeds, weight, TAG_B)
    return sum_derived(seeds, weight, TAG_B, list(shape))


def _dealer_weight_triple_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    b = call.material("b", "dealer.weight", local=True)
    assert b is not None
    w_first = call.value("w_first")
    if type(w_first) is not bool:
        raise call.refuse("parameter 'w_first' is a bool")
    return [seal("dealer.wtriple", nonce_of(call), deliveries=1, extra=(b.nonce, w_first))]


def _dealer_weight_triple_size(p: dict[str, Any]) -> int:
    """A, C, the others' derived shares of C, the product's temporaries."""
    x_shape, b = p.get("x_shape"), p.get("b")
    w_first = p.get("w_first") is True
    first, second = (shape_of(b), x_shape) if w_first else (x_shape, shape_of(b))
    out, temp = bilinear(p.get("op"), p.get("params"), first, second, w_first or row_major(b))
    if _settles(p.get("op"), p.get("w_first"), _rows(x_shape), b):  # B laid out anew
        temp += WORD * numel(shape_of(b))
    return declared(WORD * numel(x_shape, "x_shape") + 2 * out + temp)


@step(
    rule=_dealer_weight_triple_rule,
    size=_dealer_weight_triple_size,
    keeps=stream_records(2),
    makes_material=True,
)
def dealer_weight_triple(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    b: torch.Tensor,
    x_shape: list[int],
    w_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """C = op(A, B) (op(B, A) with ``w_first``) for a fresh A: the last party's share."""
    consume(ctx, seeds, nonce, TAG_A, TAG_C)
    a = sum_derived(seeds, nonce, TAG_A, list(x_shape))
    if _alone(b):  # (B is the dealer's own: the tensor dealer_weight made)
        _settle(op, w_first, _rows(x_shape), b)
    c = _bilinear(op, params, w_first, a, b)
    return last_share(c, seeds, nonce, TAG_C)


# -- the parties ---------------------------------------------------------------------------


def _weight_mask_rule(call: ProtocolCall) -> Any:
    """Make instance ``weight`` of the share ``w``: once per weight nonce, bound to ``w``
    (its F is combined with that tensor only, unmodified)."""
    weight = int_of(call, "weight")
    party_seed(call)
    w = call.share("w")
    make_instance(call, _weights(call), weight, w)
    return [seal("weight.f", weight)]


@step(
    rule=_weight_mask_rule,
    size=elementwise(2, "w"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"weight.f": SUM},
)
def weight_mask(ctx: Any, seed: torch.Tensor, weight: int, w: torch.Tensor) -> torch.Tensor:
    """Party i: f_i = W_i - B_i, opened once to make the instance ``weight``."""
    consume(ctx, [seed], weight, TAG_B)
    return torch.sub(w, derive(seed, weight, TAG_B, list(w.shape)))


def _weight_product_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    return [seal("wprod.e", nonce), kept("wprod.a", nonce)]


@step(
    rule=_weight_product_mask_rule,
    size=elementwise(2, "x"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"wprod.e": SUM},
)
def weight_product_mask(
    ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor
) -> list[torch.Tensor]:
    """Party i: e_i = x_i - A_i (to open) and its A_i."""
    consume(ctx, [seed], nonce, TAG_A)
    a = derive(seed, nonce, TAG_A, list(x.shape))
    return [torch.sub(x, a), a]


def _weight_product_rule(call: ProtocolCall) -> Any:
    nonce, weight = nonce_of(call), int_of(call, "weight")
    party_seed(call, "c")
    w_first = call.value("w_first")
    c = call.material("c", "dealer.wtriple", nonce, local=False, optional=True, consume=True)
    if c is not None and c.extra != (weight, w_first):
        raise call.refuse(f"the dealer's product is not for weight instance {weight}")
    call.material("a", "wprod.a", nonce, local=True, consume=True)
    call.material("e", OPENED + "wprod.e", nonce, local=True, consume=True)
    call.material("f", OPENED + "weight.f", weight, local=True)  # (kept: the instance's F)
    w = call.share("w")
    instance_of(call, _weights(call), weight, w)
    return None


def _weight_product_size(p: dict[str, Any]) -> int:
    """The two products and their temporaries."""
    x, w = p.get("a"), p.get("w")
    w_first = p.get("w_first") is True
    first, second = (shape_of(w), shape_of(x)) if w_first else (shape_of(x), shape_of(w))
    out, temp = bilinear(p.get("op"), p.get("params"), first, second, w_first or row_major(w))
    rows = _rows(shape_of(x))
    for operand in (w, p.get("f")):  # W and F laid out anew (F's old memory may stay)
        if _settles(p.get("op"), p.get("w_first"), rows, operand):
            temp += WORD * numel(shape_of(operand))
    return declared(2 * out + temp)


@step(rule=_weight_product_rule, size=_weight_product_size, keeps=stream_records(1))
def weight_product(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    weight: int,
    c: torch.Tensor | None,
    w: torch.Tensor,
    f: torch.Tensor,
    a: torch.Tensor,
    e: torch.Tensor,
    w_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Party i's share of op(x, W): op(e, W_i) + op(A_i, F) + C_i (see the module doc)."""
    if type(w_first) is not bool:
        raise TypeError("parameter 'w_first' is a bool")
    consume(ctx, [seed], nonce, TAG_C)
    rows = _rows(list(e.shape))
    _settle(op, w_first, rows, f)  # (F: the instance's own, opened once for it)
    if _alone(w):  # (W: unless a view of it, or it of another tensor, would keep the old)
        _settle(op, w_first, rows, w)
    z = _bilinear(op, params, w_first, e, w)
    z += _bilinear(op, params, w_first, a, f)
    z += derive(seed, nonce, TAG_C, list(z.shape)) if c is None else c
    return z


# -- a product whose operand is truncated in the same round --------------------------------
#
# A product with a weight instance whose operand is truncated in the same round (the
# client's side: :func:`mpc.protocols.weights.run.trunc_fixed_product`): the truncation's
# opening is the product's only one.
#
# The truncation of z by f opens c = z + r (:func:`mpc.protocols.truncation.steps.
# trunc_mask`) and gives z >> f = p + U + m D per element, p = c >> f and m = msb(c) public,
# U and D = 2^(64-f) s the dealer's (:func:`mpc.protocols.truncation.steps.dealer_trunc`).
# With the instance W = F + B (F public at the parties, B the dealer's):
#
#     (z >> f) @ W = p @ W + (U + m D) @ F + U @ B + sum_k m_k D_k B_kj,
#
# where p @ W is each party's p @ W_i, (U + m D) @ F its share of the truncated value times
# F, and the dealer deals U @ B (a product element a word) and, because m is known only
# once c is open, D_k B_kj for every k of a row (K x N words a row: this is for few rows,
# a decoding step's). So "truncate, then multiply by the weight" is one round, not two.
#
# Instance: the truncation's nonce (its r, U and D, derived as for any truncation) and
# the weight instance's; the dealer's step makes the truncation's correction too (r is
# derived once).

#: the dealer's delivery to the last party
DEALER_TRUNC_WEIGHT = "dealer.truncw"


def _trunc_shapes(x_shape: Any, b_shape: Any, bits: Any) -> tuple[int, int, int]:
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


def trunc_material_words(x_shape: list[int], b_shape: list[int], bits: int) -> int:
    """The last party's words: the truncation's packed correction, U @ B, the D_k B_kj
    (each a multiple of 2^(64 - f): f bits of it, in the narrowest dtype that holds them,
    padded to whole words)."""
    rows, k, n = _trunc_shapes(x_shape, b_shape, bits)
    size = trunc_correction_dtype(bits).itemsize
    return rows * k + (rows * k * size + 7) // 8 + rows * n + (rows * k * n * size + 7) // 8


def _narrow(t: torch.Tensor, bits: int) -> torch.Tensor:
    """A share of a multiple of 2^(64 - f) as its f low bits, sign-extended, in the
    narrowest dtype that holds them, its bytes padded to whole int64 words (flat)."""
    t = t.bitwise_left_shift(64 - bits).bitwise_right_shift_(64 - bits)
    return narrow_words(t.to(trunc_correction_dtype(bits)))


def _widen(words: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """The inverse of :func:`_narrow` (int64, still to be shifted left by 64 - f)."""
    return narrow_of(words, count, bits).to(torch.int64)


def _dealer_trunc_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    b = call.material("b", "dealer.weight", local=True)
    assert b is not None
    bits = call.value("bits")
    return [seal(DEALER_TRUNC_WEIGHT, nonce_of(call), deliveries=1, extra=(b.nonce, bits))]


def _dealer_trunc_size(p: dict[str, Any]) -> int:
    """r, U, s and their derived shares (6 words an element of x), U @ B and its share,
    the s_k B_kj, one party's derived copy and the narrow copies (2.5 words each; 21.8
    MiB measured for 1 x 1,024 x 1,024 at 16 bits, with B laid out anew first or not: its
    copy is gone before the rest is made)."""
    x = numel(p.get("x_shape"), "x_shape")
    b = shape_of(p.get("b"))
    n = int(b[-1]) if len(b) == 2 else 0
    rows = x // max(int(b[0]), 1) if len(b) == 2 else 0
    temp = WORD * numel(b) if _settles("matmul", False, rows, p.get("b")) else 0
    return declared(max(WORD * (6 * x + 2 * rows * n) + 20 * x * n, temp))


@step(
    rule=_dealer_trunc_rule, size=_dealer_trunc_size, keeps=stream_records(5), makes_material=True
)
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
    rows, k, n = _trunc_shapes(x_shape, list(b.shape), bits)
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_D, TAG_C, TAG_A)
    r = sum_derived(seeds, nonce, TAG_R, list(x_shape)).sub_(1 << 62)
    s = (r >> 63).add_(1)  # 1 - msb(r')
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    if _alone(b):  # (B is the dealer's own: the tensor dealer_weight made)
        _settle("matmul", False, rows, b)
    ub = ring_bilinear("matmul", {}, u.reshape(rows, k), b)
    table = s.reshape(rows, k, 1) * b.unsqueeze(0)  # s_k B_kj: D_k B_kj = 2^(64-f) of it
    u, s = last_share(u, seeds, nonce, TAG_U), last_share(s, seeds, nonce, TAG_D)
    s = s.bitwise_left_shift_(64 - bits).bitwise_right_shift_(64 - bits)
    corr = pack_trunc_correction(u, s.to(trunc_correction_dtype(bits)))
    ub = last_share(ub, seeds, nonce, TAG_C)
    table = _narrow(last_share(table, seeds, nonce, TAG_A), bits)
    return torch.cat([corr, ub.reshape(-1), table])


def _trunc_product_rule(call: ProtocolCall) -> Any:
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


def _trunc_product_size(p: dict[str, Any]) -> int:
    """The truncated value and its parts (4 words an element), the D_k B_kj (derived, or
    the dealt narrow ones widened: a word each; 7.9 MiB measured for 1 x 1,024 x 1,024),
    the products."""
    c = numel(shape_of(p.get("c")))
    w = shape_of(p.get("w"))
    n = int(w[-1]) if len(w) == 2 else 0
    rows = c // max(int(w[0]), 1) if len(w) == 2 else 0
    temp = 0
    for operand in (p.get("w"), p.get("f")):  # W or F laid out anew, one after the other
        if _settles("matmul", False, rows, operand):  # (16.0 MiB measured at 1,024^2)
            temp = max(temp, WORD * numel(shape_of(operand)))
    return declared(WORD * (4 * c + c * n + 4 * rows * n) + temp)


@step(rule=_trunc_product_rule, size=_trunc_product_size, keeps=stream_records(4))
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
    rows, k, n = _trunc_shapes([int(d) for d in c.shape], list(w.shape), bits)
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
        if material.numel() != trunc_material_words(shape, list(w.shape), bits):
            raise ValueError(f"the dealer's material is not for x {shape} and W {list(w.shape)}")
        u, s = unpack_trunc_correction(material[:head], shape, bits)
        u, s = u.clone(), s.to(torch.int64)
        ub = material[head : head + rows * n].view(rows, n)
        table = _widen(material[head + rows * n :], rows * k * n, bits).view(rows, k, n)
    table = table.bitwise_left_shift_(64 - bits)  # D_k B_kj
    _settle("matmul", False, rows, f)  # (F: the instance's own, opened once for it)
    if _alone(w):
        _settle("matmul", False, rows, w)
    wrap = c >> 63  # all ones where msb(c) = 1
    mine = u + (s.bitwise_left_shift(64 - bits) & wrap)  # (z >> f) less p, this party's
    out = ring_bilinear("matmul", {}, mine.reshape(rows, k), f)
    p = c >> bits
    out += ring_bilinear("matmul", {}, p.reshape(rows, k), w)
    out += ub
    m = (wrap & 1).reshape(rows, 1, k)
    out += torch.bmm(m, table).reshape(rows, n)  # sum_k m_k (D_k B_kj)
    return out.reshape([*shape[:-1], n])
