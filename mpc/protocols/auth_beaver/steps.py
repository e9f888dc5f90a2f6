"""The steps of an authenticated Beaver product (the protocol:
:func:`mpc.protocols.auth_beaver.run.auth_beaver`): the dealer's authenticated triple,
each party's masking and its combination.

Instance: one nonce. The dealer deals authenticated a, b and c with c = op(a, b) mod 2^64
(the value's low 64 bits; its high bits are the sum of the parties' derived shares, and
the MACs vouch for the whole 128 bits, so the product's high bits are as consistent as
its low ones); the last party gets the MAC shares of a, b and c and the low word of its
share of c. Each party masks x and y with a and b ([e | f], opened with all 128 bits and
checked), keeps a and c, and once [e | f] is open combines them with the very y it
masked: [z] = [c] + op(e, [y]) + op([a], f), value and MAC alike (sums to op(x, y)).
"""

from __future__ import annotations

import math
import weakref
from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.math.ring import ring_bilinear
from mpc.protocols.auth_shares.steps import (
    OPENED,
    PIECE,
    PIECE_MAC,
    TAG_TRIPLE_A,
    TAG_TRIPLE_B,
    TAG_TRIPLE_C,
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
from mpc.protocols.rules import dealer_seeds, kept, nonce_of, party_seed
from mpc.protocols.sizes import SLACK, bilinear, numel, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume
from pointers.worker.sealing import ProtocolCall, seal

A, C = "auth.beaver.a", "auth.beaver.c"


def correction_words(a_shape: list[int], b_shape: list[int], c_shape: list[int]) -> int:
    """int64 words of the last party's correction for one triple."""
    na, nb, nc = math.prod(a_shape), math.prod(b_shape), math.prod(c_shape)
    return 2 * na + 2 * nb + 3 * nc


# -- the dealer ----------------------------------------------------------------------------


def _triple_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    return [seal("auth.triple", nonce_of(call), deliveries=1)]


def _triple_size(p: dict[str, Any]) -> int:
    a_shape, b_shape = p.get("a_shape"), p.get("b_shape")
    out, temp = bilinear(p.get("op"), p.get("params"), a_shape, b_shape)
    ea, eb = numel(a_shape, "a_shape"), numel(b_shape, "b_shape")
    n = max(len(p.get("seeds") or []), 2)
    return (n + 4) * VM * (ea + eb) + (n + 6) * 4 * out + temp + SLACK


@step(rule=_triple_rule, size=_triple_size, keeps=stream_records(3), makes_material=True)
def dealer_auth_triple(
    ctx: Any,
    seeds: list[torch.Tensor],
    alpha: torch.Tensor,
    nonce: int,
    a_shape: list[int],
    b_shape: list[int],
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """An authenticated triple a, b, c = op(a, b) (mod 2^64): the last party's
    corrections, packed (MACs of a and b, the low word and MAC of c)."""
    consume(ctx, seeds, nonce, TAG_TRIPLE_A, TAG_TRIPLE_B, TAG_TRIPLE_C)
    (a_mac,), a = deal_value(seeds, nonce, TAG_TRIPLE_A, a_shape, alpha)
    (b_mac,), b = deal_value(seeds, nonce, TAG_TRIPLE_B, b_shape, alpha)
    c = ring_bilinear(op, params, a[0], b[0])
    c_parts, _ = deal_value(seeds, nonce, TAG_TRIPLE_C, list(c.shape), alpha, target=c)
    return pack([a_mac, b_mac, *c_parts])


# -- the parties ---------------------------------------------------------------------------


def _mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corr")
    key = share_of(call, "x").nonce
    y = share_of(call, "y", key)
    assert y is not None
    call.material("corr", "auth.triple", nonce, local=False, optional=True, consume=True)
    _record(call, nonce)
    return [
        seal(PIECE + "beaver", nonce),
        seal(PIECE_MAC + "beaver", nonce, deliveries=0),
        kept(A, nonce),
        kept(C, nonce, extra=(key,)),
    ]


def _record(call: ProtocolCall, nonce: int) -> None:
    """Remember the y this instance masked (the combination must take it, unchanged)."""
    y = call.value("y")
    call.state.setdefault("mpc.auth.instances", {})[("beaver", nonce)] = (
        weakref.ref(y),
        y._version,
    )


def _same(call: ProtocolCall, nonce: int) -> None:
    y = call.value("y")
    rec = call.state.setdefault("mpc.auth.instances", {}).pop(("beaver", nonce), None)
    if rec is None:
        raise call.refuse(f"no beaver instance {nonce} is waiting for its 'y' here")
    if rec[0]() is not y or rec[1] != y._version:
        raise call.refuse(
            f"parameter 'y' must be the share that instance {nonce}'s first step masked"
        )


def _mask_size(p: dict[str, Any]) -> int:
    na, nb = share_elems(p, "x"), share_elems(p, "y")
    c = p.get("c_shape")
    nc = numel(c, "c_shape") if isinstance(c, list) else 1
    return 4 * VM * (na + nb) + 2 * VM * nc + SLACK


@step(rule=_mask_rule, size=_mask_size, keeps=stream_records(3), makes_material=True)
def auth_beaver_mask(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    x: torch.Tensor,
    y: torch.Tensor,
    c_shape: list[int],
    corr: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Party i: its piece [e_i | f_i] = [x_i - a_i | y_i - b_i] (value shares, flat, to
    open) and their MAC shares, and its shares of a and c (kept for the combination)."""
    consume(ctx, [seed], nonce, TAG_TRIPLE_A, TAG_TRIPLE_B, TAG_TRIPLE_C)
    a_shape, b_shape = list(x.shape[2:]), list(y.shape[2:])
    na, nb, nc = math.prod(a_shape), math.prod(b_shape), math.prod(c_shape)
    a_mac = b_mac = c_word = c_mac = None
    if corr is not None:
        a_mac, b_mac, c_word, c_mac = unpack(corr, [2 * na, 2 * nb, nc, 2 * nc])
    a = party_value(seed, nonce, TAG_TRIPLE_A, a_shape, mac=a_mac)
    b = party_value(seed, nonce, TAG_TRIPLE_B, b_shape, mac=b_mac)
    c = party_value(seed, nonce, TAG_TRIPLE_C, c_shape, word=c_word, mac=c_mac)
    e = r128.sub(x, a)
    f = r128.sub(y, b)
    piece = torch.cat([e[:, 0].reshape(2, -1), f[:, 0].reshape(2, -1)], dim=1)
    mac = torch.cat([e[:, 1].reshape(2, -1), f[:, 1].reshape(2, -1)], dim=1)
    return [piece, mac, a, c]


def _combine_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    a = call.material("a", A, nonce, local=True, consume=True)
    c = call.material("c", C, nonce, local=True, consume=True)
    call.material("ef", OPENED + "beaver", nonce, local=True, consume=True)
    assert a is not None and c is not None
    key = c.extra[0] if c.extra else None
    if type(key) is not int:
        raise call.refuse("the triple's c names no key")
    share_of(call, "y", key)
    _same(call, nonce)
    return [kept_share(key)]


def _combine_size(p: dict[str, Any]) -> int:
    c = p.get("c")
    nc = c.numel() // 4 if isinstance(c, torch.Tensor) else 1
    na, nb = share_elems(p, "a"), share_elems(p, "y")
    return 40 * VM * nc + 4 * W128 * (na + nb) + 8 * WORD * (na + nb) + SLACK


@step(rule=_combine_rule, size=_combine_size, makes_material=True)
def auth_beaver_combine(
    ctx: Any,
    nonce: int,
    y: torch.Tensor,
    a: torch.Tensor,
    c: torch.Tensor,
    ef: torch.Tensor,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Party i's authenticated share of op(x, y): c + op(e, y) + op(a, f) (value and MAC),
    from the opened [e | f] (all 128 bits)."""
    na = a.numel() // 4
    if ef.dim() != 2 or ef.shape[0] != 2 or ef.shape[1] != na + y.numel() // 4:
        raise ValueError(f"an opened [e | f] of {list(ef.shape)} for {na} + {y.numel() // 4}")
    e = ef[:, :na].reshape(2, *a.shape[2:])
    f = ef[:, na:].reshape(2, *y.shape[2:])
    z = r128.add(c, bilinear_vm(op, params, e, y, True))
    return r128.add(z, bilinear_vm(op, params, f, a, False))
