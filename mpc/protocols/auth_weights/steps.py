"""The steps of authenticated weight instances (the protocol:
:mod:`mpc.protocols.auth_weights.run`), the malicious mode's counterpart of
:mod:`mpc.protocols.weights`.

An authenticated Beaver product x * W opens e = x - A and f = W - B on every call: for a
model's weights, the whole model per query. An *instance* of a weight W opens F = W - B
once (all 128 bits, checked like every authenticated opening), under its own nonce
``weight``; every later product under a fresh nonce takes a fresh authenticated A and
C = op(A, B) (mod 2^64, authenticated) from the dealer and opens only e = x - A:

    op(x, W) = op(e, W) + op(A, F) + C     (op(W, e) + op(F, A) + C for W first),

value and MAC alike (e and F public, W, A and C authenticated), so the result is an
authenticated share like any product's.

What is reused, and why it is safe: B masks W only. It is drawn once (the streams
``(weight, TAG_AW_B)``, consumed when the instance is made; the dealer keeps B's low
word, sealed, for the instance's products) and F opens once. A party's later view per
query is e (masked by a fresh A) and its own dealt shares. The rules bind the instance to
the share W it masked: a product must use that same, unmodified tensor, under the same MAC
key, so F is never combined with another value. A party that deviates (an error in its
piece of F or of e, in its shares of A or C, or in its output) adds an error that the MAC
check catches, as in any authenticated product.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.math.ring import ring_bilinear
from mpc.protocols.auth_shares.steps import (
    OPENED,
    PIECE,
    PIECE_MAC,
    TAG_AW_A,
    TAG_AW_B,
    TAG_AW_C,
    VM,
    W128,
    WORD,
    alpha_of,
    bilinear_vm,
    deal_value,
    kept_share,
    pack,
    party_value,
    share_elems,
    share_of,
    unpack,
)
from mpc.protocols.rules import (
    dealer_seeds,
    instance_of,
    int_of,
    kept,
    make_instance,
    nonce_of,
    party_seed,
)
from mpc.protocols.sizes import SLACK, bilinear, numel, shape_of, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume
from pointers.worker.sealing import ProtocolCall, seal

B_KEPT = "dealer.aweight"  # the dealer's B (its low word), kept for the instance
B_CORR = "dealer.aweight_corr"  # the last party's MAC share of B
TRIPLE = "dealer.awtriple"  # the last party's corrections of A and C
A, C = "auth.wprod.a", "auth.wprod.c"
RECORDS = "mpc.auth.weight_instances"


def triple_words(x_shape: list[int], out_shape: list[int]) -> int:
    """int64 words of the last party's corrections for one product (A's MAC, C's low word
    and MAC)."""
    return 2 * math.prod(x_shape) + 3 * math.prod(out_shape)


def _bilinear(op: str, params: dict[str, Any], w_first: bool, m: Any, w: Any) -> torch.Tensor:
    return ring_bilinear(op, params, w, m) if w_first else ring_bilinear(op, params, m, w)


def _w_first(call: ProtocolCall) -> bool:
    w_first = call.value("w_first")
    if type(w_first) is not bool:
        raise call.refuse("parameter 'w_first' is a bool")
    return w_first


def _records(call: ProtocolCall) -> dict[int, Any]:
    out: dict[int, Any] = call.state.setdefault(RECORDS, {})
    return out


# -- the dealer ----------------------------------------------------------------------------


def _dealer_weight_rule(call: ProtocolCall) -> Any:
    """B's low word stays at the dealer; the last party gets B's MAC share."""
    dealer_seeds(call)
    alpha_of(call)
    numel(call.value("shape"))
    weight = int_of(call, "weight")
    return [seal(B_KEPT, weight, deliveries=0), seal(B_CORR, weight, deliveries=1)]


@step(
    rule=_dealer_weight_rule,
    size=lambda p: 8 * VM * numel(p.get("shape")) + SLACK,
    keeps=stream_records(1),
    makes_material=True,
)
def dealer_auth_weight(
    ctx: Any, seeds: list[torch.Tensor], alpha: torch.Tensor, weight: int, shape: list[int]
) -> list[torch.Tensor]:
    """An instance's authenticated mask B: its low word (kept here for the instance's
    products) and the last party's MAC share of it."""
    consume(ctx, seeds, weight, TAG_AW_B)
    (b_mac,), b = deal_value(seeds, weight, TAG_AW_B, shape, alpha)
    return [b[0].clone(), b_mac]


def _dealer_triple_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    b = call.material("b", B_KEPT, local=True)
    assert b is not None
    w_first = _w_first(call)
    return [seal(TRIPLE, nonce_of(call), deliveries=1, extra=(b.nonce, w_first))]


def _dealer_triple_size(p: dict[str, Any]) -> int:
    x_shape, b = p.get("x_shape"), p.get("b")
    w_first = p.get("w_first") is True
    first, second = (shape_of(b), x_shape) if w_first else (x_shape, shape_of(b))
    out, temp = bilinear(p.get("op"), p.get("params"), first, second, True)
    n = max(len(p.get("seeds") or []), 2)
    return (n + 4) * VM * numel(x_shape, "x_shape") + (n + 6) * 4 * out + temp + SLACK


@step(
    rule=_dealer_triple_rule, size=_dealer_triple_size, keeps=stream_records(2), makes_material=True
)
def dealer_auth_weight_triple(
    ctx: Any,
    seeds: list[torch.Tensor],
    alpha: torch.Tensor,
    nonce: int,
    b: torch.Tensor,
    x_shape: list[int],
    w_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """A fresh authenticated A and C = op(A, B) (op(B, A) with ``w_first``) mod 2^64,
    authenticated: the last party's corrections, packed (A's MAC, C's word and MAC)."""
    consume(ctx, seeds, nonce, TAG_AW_A, TAG_AW_C)
    (a_mac,), a = deal_value(seeds, nonce, TAG_AW_A, list(x_shape), alpha)
    c = _bilinear(op, params, w_first, a[0], b)
    c_parts, _ = deal_value(seeds, nonce, TAG_AW_C, list(c.shape), alpha, target=c)
    return pack([a_mac, *c_parts])


# -- the parties ---------------------------------------------------------------------------


def _weight_mask_rule(call: ProtocolCall) -> Any:
    """Make instance ``weight`` of the share ``w``: once per weight nonce, bound to that
    tensor, unmodified, and its MAC key."""
    weight = int_of(call, "weight")
    party_seed(call, "corr")
    key = share_of(call, "w").nonce
    call.material("corr", B_CORR, weight, local=False, optional=True, consume=True)
    make_instance(call, _records(call), weight, call.value("w"), key)
    return [seal(PIECE + "aweight", weight), seal(PIECE_MAC + "aweight", weight, deliveries=0)]


@step(
    rule=_weight_mask_rule,
    size=lambda p: 4 * VM * share_elems(p, "w") + SLACK,
    keeps=stream_records(1),
    makes_material=True,
)
def auth_weight_mask(
    ctx: Any, seed: torch.Tensor, weight: int, w: torch.Tensor, corr: torch.Tensor | None
) -> list[torch.Tensor]:
    """Party i's piece of F = W - B (value share, to open once) and its MAC share."""
    consume(ctx, [seed], weight, TAG_AW_B)
    f = r128.sub(w, party_value(seed, weight, TAG_AW_B, list(w.shape[2:]), mac=corr))
    return [f[:, 0].contiguous(), f[:, 1].contiguous()]


def _product_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corr")
    key = share_of(call, "x").nonce
    call.material("corr", TRIPLE, nonce, local=False, optional=True, consume=True)
    return [
        seal(PIECE + "awprod", nonce),
        seal(PIECE_MAC + "awprod", nonce, deliveries=0),
        kept(A, nonce),
        kept(C, nonce, extra=(key,)),
    ]


def _product_mask_size(p: dict[str, Any]) -> int:
    c = p.get("c_shape")
    nc = numel(c, "c_shape") if isinstance(c, list) else 1
    return 4 * VM * share_elems(p, "x") + 2 * VM * nc + SLACK


@step(
    rule=_product_mask_rule, size=_product_mask_size, keeps=stream_records(2), makes_material=True
)
def auth_wprod_mask(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    x: torch.Tensor,
    c_shape: list[int],
    corr: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Party i's piece of e = x - A (to open) and its MAC share, and its shares of A and
    C (kept for the combination)."""
    consume(ctx, [seed], nonce, TAG_AW_A, TAG_AW_C)
    x_shape = list(x.shape[2:])
    a_mac = c_word = c_mac = None
    if corr is not None:
        na, nc = math.prod(x_shape), math.prod(c_shape)
        a_mac, c_word, c_mac = unpack(corr, [2 * na, nc, 2 * nc])
    a = party_value(seed, nonce, TAG_AW_A, x_shape, mac=a_mac)
    c = party_value(seed, nonce, TAG_AW_C, list(c_shape), word=c_word, mac=c_mac)
    e = r128.sub(x, a)
    return [e[:, 0].contiguous(), e[:, 1].contiguous(), a, c]


def _product_rule(call: ProtocolCall) -> Any:
    nonce, weight = nonce_of(call), int_of(call, "weight")
    call.material("a", A, nonce, local=True, consume=True)
    c = call.material("c", C, nonce, local=True, consume=True)
    call.material("e", OPENED + "awprod", nonce, local=True, consume=True)
    call.material("f", OPENED + "aweight", weight, local=True)  # (kept: the instance's F)
    assert c is not None
    key = instance_of(call, _records(call), weight, call.value("w"))[2]
    share_of(call, "w", key)
    if c.extra != (key,):
        raise call.refuse("the product's C was made for another MAC key")
    _w_first(call)
    return [kept_share(key)]


def _product_size(p: dict[str, Any]) -> int:
    c = p.get("c")
    nc = c.numel() // 4 if isinstance(c, torch.Tensor) else 1
    na, nw = share_elems(p, "a"), share_elems(p, "w")
    return 40 * VM * nc + 4 * W128 * (na + nw) + 8 * WORD * (na + nw) + SLACK


@step(rule=_product_rule, size=_product_size)
def auth_wprod(
    ctx: Any,
    nonce: int,
    weight: int,
    w: torch.Tensor,
    f: torch.Tensor,
    a: torch.Tensor,
    c: torch.Tensor,
    e: torch.Tensor,
    w_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Party i's authenticated share of op(x, W) (op(W, x) with ``w_first``): C + op(e, W)
    + op(A, F), from the opened e and the instance's F (see the module docstring)."""
    if tuple(e.shape) != (2, *a.shape[2:]) or tuple(f.shape) != (2, *w.shape[2:]):
        raise ValueError("the opened e and F do not fit the shares of A and W")
    if w_first:  # op(W, x) = op(W, e) + op(F, A) + op(B, A)
        z = r128.add(c, bilinear_vm(op, params, e, w, False))
        return r128.add(z, bilinear_vm(op, params, f, a, True))
    z = r128.add(c, bilinear_vm(op, params, e, w, True))  # op(x, W) = op(e, W) + op(A, F) + C
    return r128.add(z, bilinear_vm(op, params, f, a, False))
