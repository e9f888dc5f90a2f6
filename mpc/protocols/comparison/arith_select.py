"""Selections on the comparison's arithmetic last level (the math:
:func:`mpc.math.carry_arith.selected_shares`): [v msb(x)] in the comparison's third round,
with no daBit and no d.

Each selected value v opens e = v - b in the comparison's first round (or, for a pending
truncation's result, its second) with the mask b of its product nonce, as a selection on
the daBit does (:func:`mpc.protocols.comparison.selection.dabit_mask`). The dealer deals,
per value, additive shares of b h and of b (1 - 2h) a_S for the last level's monomials
(:func:`select_material`). The last level keeps, per party, its share of u = h ^ carry
with msb(c) and the opened bits (:data:`ARITH_SEL`, made by
:func:`mpc.protocols.comparison.arith.carry_arith_sel`); each value's
:func:`arith_select` is local, and so is ReLU's mask (:func:`arith_mask`).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import carry_arith as arith_math
from mpc.protocols.comparison.selection import select_once
from mpc.protocols.rules import OPENED, nonce_of, party_seed, same
from mpc.protocols.sizes import WORD, declared, stream_records, tensor_elems
from mpc.protocols.step import step
from mpc.protocols.streams import TAG_A, TAG_C, consume, derive, last_share, sum_derived
from pointers.worker.sealing import ProtocolCall

#: a party's u, msb(c) and opened bits of a selecting comparison ([3, n], kept)
ARITH_SEL = "cmp.arith.sel"
#: the dealer's b h and b (1 - 2h) a_S of a value (the last party's, kept)
ARITH_PROD = "dealer.cmp.arith.prod"
#: the words an element of a value's products
PRODUCT_WORDS = 1 + len(arith_math.MONOMIALS)
#: ... of a value selected truncated: U's and D's (mpc.math.carry_arith.trunc_masks)
TRUNC_PRODUCT_WORDS = 2 * (2 + len(arith_math.MONOMIALS))


def product_words(bits: int) -> int:
    """The words an element of a value's products, selected truncated by ``bits`` (0:
    as it is)."""
    return TRUNC_PRODUCT_WORDS if bits else PRODUCT_WORDS


def check_bits(bits: Any, count: int) -> list[int]:
    """A comparison's truncations of its selected values: None (none) or a list of
    ``count`` ints, 0 (as it is) or 1 to 62 bits each."""
    if bits is None:
        return [0] * count
    if not (
        isinstance(bits, list)
        and len(bits) == count
        and all(type(b) is int and 0 <= b <= 62 for b in bits)
    ):
        raise ValueError(f"product_bits: {count} truncations of 0 to 62 bits, got {bits!r}")
    return bits


def select_material(
    ctx: Any,
    seeds: list[torch.Tensor],
    h: torch.Tensor,
    words: torch.Tensor,
    shape: list[int],
    product_nonces: list[int],
    bits: list[int],
) -> list[torch.Tensor]:
    """The last party's shares of each value's products (flat), b the mask every party
    derives for the value's opening (``(product nonce, TAG_A)``), ``words`` the dealer's
    (1 - 2h) a_S in the clear; a value selected truncated (``bits`` > 0) takes U's and
    D's products instead (:func:`mpc.math.carry_arith.dealt_trunc_products`)."""
    parts = []
    for product_nonce, f in zip(product_nonces, bits):
        consume(ctx, seeds, product_nonce, TAG_A, TAG_C)
        b = sum_derived(seeds, product_nonce, TAG_A, shape)
        if f:
            products = arith_math.dealt_trunc_products(b, h, words, f)
        else:
            products = arith_math.dealt_products(b, h, words)
        parts.append(last_share(products, seeds, product_nonce, TAG_C).reshape(-1))
    return parts


def _sel(call: ProtocolCall) -> int:
    """The selecting comparison's kept last level (its nonce)."""
    sel = call.material("sel", ARITH_SEL, local=True)
    assert sel is not None
    return sel.nonce


def _arith_select_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "products")
    comparison = _sel(call)
    dealt = call.material("products", ARITH_PROD, nonce, local=True, optional=True, consume=True)
    if dealt is not None and dealt.extra != (comparison, call.value("bits") or 0):
        raise call.refuse("the dealer's products belong to another comparison or truncation")
    call.material("e", OPENED + "dabit.e", nonce, local=True, consume=True)
    same(call, ("dabit", nonce), "v")
    return None


def _arith_select_size(p: dict[str, Any]) -> int:
    """The derived products (dealt at the last party), the coefficients (a byte each),
    the result and its temporaries: 25.6 words an element measured at 2^15 elements."""
    bits = p.get("bits")
    product = product_words(bits if type(bits) is int else 0)
    words = product + 4 if p.get("products") is None else 8
    return declared((words + (6 if bits else 0)) * WORD * tensor_elems(p, "v"))


@step(rule=_arith_select_rule, size=_arith_select_size, keeps=stream_records(1))
def arith_select(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    products: torch.Tensor | None,
    e: torch.Tensor,
    v: torch.Tensor,
    sel: torch.Tensor,
    complement: bool,
    bits: int = 0,
) -> torch.Tensor:
    """This party's share of v msb(x) (``complement``: of v (1 - msb(x))), v's shape, from
    the opened e = v - b, its share of v, its kept last level ``sel`` and its shares of
    the dealer's ``products`` (dealt at the last party, None elsewhere: derived).
    ``bits`` > 0: of (v >> bits) msb(x) (and its complement), from U's and D's products
    (:func:`mpc.math.carry_arith.selected_truncated_shares`): the truncation the selected
    value would take after the comparison, with no round of its own (|v| < 2^62)."""
    n = v.numel()
    if e.shape != v.shape or list(sel.shape) != [3, n]:
        raise ValueError(f"a selection of {list(v.shape)} with e {list(e.shape)}, sel {sel.shape}")
    if type(bits) is not int or not 0 <= bits <= 62:
        raise ValueError(f"a selection truncates by 0 to 62 bits, got {bits!r}")
    words = product_words(bits)
    consume(ctx, [seed], nonce, TAG_C)
    if products is None:
        products = derive(seed, nonce, TAG_C, [words, n])
    if products.numel() != words * n:
        raise ValueError(f"{products.numel()} words of products for {n} elements")
    if bits:
        out, tv = arith_math.selected_truncated_shares(
            first, sel[2], sel[0], sel[1], e.reshape(-1), products.view(words, n), bits
        )
        return (tv - out if complement else out).view(v.shape)
    out = arith_math.selected_shares(
        first, sel[2], sel[0], sel[1], v, e.reshape(-1), products.view(words, n)
    )
    if complement:
        out = v.reshape(-1) - out
    return out.view(v.shape)


def _arith_mask_rule(call: ProtocolCall) -> Any:
    select_once(call, _sel(call), "mask was selected")
    return None


def _arith_mask_size(p: dict[str, Any]) -> int:
    return declared(3 * WORD * tensor_elems(p, "sel"))


@step(rule=_arith_mask_rule, size=_arith_mask_size)
def arith_mask(ctx: Any, first: bool, sel: torch.Tensor, shape: list[int]) -> torch.Tensor:
    """This party's share of 1 - msb(x) in ``shape`` from its kept last level: ReLU's
    mask."""
    if sel.dim() != 2 or sel.shape[0] != 3:
        raise ValueError(f"a kept last level is [3, n], got {list(sel.shape)}")
    out = -arith_math.flip(first, sel[0], sel[1])
    if first:
        out += 1
    return out.view(shape)


__all__ = [
    "ARITH_PROD",
    "ARITH_SEL",
    "PRODUCT_WORDS",
    "TRUNC_PRODUCT_WORDS",
    "check_bits",
    "product_words",
    "arith_mask",
    "arith_select",
    "select_material",
]
