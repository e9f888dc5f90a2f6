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
from mpc.protocols.streams import TAG_A, TAG_B, TAG_C, consume, derive, last_share, sum_derived
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
