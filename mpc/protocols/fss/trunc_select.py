"""Selections truncated in their selection, on the FSS comparison's daBit (the run:
:class:`mpc.protocols.fss.run.FssRun` with ``bits``; the default mode's alike, on the
carry tree's arithmetic last level: :mod:`mpc.protocols.comparison.arith_select`).

A selection on the daBit t opens e = v - a (:func:`~mpc.protocols.comparison.selection.
dabit_mask`, in the comparison's first round, or a late value's in its second) and then
d = msb(x) ^ t. The same e serves as the opening of a truncation with known MSB whose mask
is r = -a (:func:`mpc.math.carry_arith.trunc_masks`): for |v| < 2^62,

    w = v >> f = (e >> f) + U + msb(e) D      (or one unit more),

linear in the dealer's U and D, so that with its products t U and t D

    [t w] = (e >> f) [t] + [t U] + msb(e) [t D],

and the selection w msb(x) = d w + (1 - 2d) [t w] is local once d is open: the value comes
down by f bits with no round of its own. The dealer deals [U], [D], [t U], [t D] (4 words an
element, where the plain selection's pair takes 1) in its one delivery to the last party
(:func:`selection_parts`); the other party derives its shares.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.carry_arith import trunc_masks
from mpc.protocols.comparison.selection import (
    D_OPENED,
    T_KINDS,
    selected_by_d,
    selection_material,
)
from mpc.protocols.rules import OPENED, instances, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, stream_records, tensor_elems
from mpc.protocols.step import step
from mpc.protocols.streams import TAG_A, TAG_C, consume, derive, last_share, sum_derived
from pointers.worker.sealing import ProtocolCall

#: the last party's dealt [U], [D], [t U], [t D] of a value selected truncated
TRUNC_PRODUCT = "dealer.cmp.tprod"
#: the words an element of a value selected truncated
TRUNC_WORDS = 4


def selection_parts(
    ctx: Any,
    seeds: list[torch.Tensor],
    t: torch.Tensor,
    shape: list[int],
    product_nonces: list[int],
    bits: list[int],
) -> list[torch.Tensor]:
    """The last party's shares of the selections' material, flat, one part a product
    nonce: a value selected as it is (``bits`` 0) takes the pair's a t
    (:func:`~mpc.protocols.comparison.selection.selection_material`), a value selected
    truncated by f bits U, D, t U and t D for the mask a every party derives for its
    opening ([4, n])."""
    parts = []
    for product_nonce, f in zip(product_nonces, bits):
        if not f:
            parts += selection_material(ctx, seeds, t, shape, [product_nonce])
            continue
        consume(ctx, seeds, product_nonce, TAG_A, TAG_C)
        a = sum_derived(seeds, product_nonce, TAG_A, shape).reshape(-1)
        u, d = trunc_masks(a, f)
        flat_t = t.reshape(-1)
        words = torch.stack([u, d, u * flat_t, d * flat_t])
        parts.append(last_share(words, seeds, product_nonce, TAG_C).reshape(-1))
    return parts


# -- the parties ---------------------------------------------------------------------------


def _select_rule(call: ProtocolCall) -> Any:
    """Once d of the comparison is open: the value's opened e (of the same instance as the
    dealer's words, each consumed once), the daBit's t of the comparison whose d it is."""
    nonce = nonce_of(call)
    party_seed(call, "dealt")
    d = call.material("d", D_OPENED, local=True)
    t = call.material("t", T_KINDS, local=True)
    assert d is not None and t is not None
    if t.nonce != d.nonce:
        raise call.refuse("the daBit's shares belong to another comparison")
    dealt = call.material("dealt", TRUNC_PRODUCT, nonce, optional=True, consume=True)
    if dealt is not None and dealt.extra != (d.nonce, call.value("bits")):
        raise call.refuse("the dealer's words are for another comparison or truncation")
    call.material("e", OPENED + "dabit.e", nonce, local=True, consume=True)
    instances(call).pop(("dabit", nonce), None)  # (its value is selected as e here)
    return None


def _select_size(p: dict[str, Any]) -> int:
    """The derived (or dealt) words, the truncated value and its product with t, and the
    selection's terms: 11 words an element (9.4 measured at 2^17 elements)."""
    return declared(11 * WORD * tensor_elems(p, "e"))


@step(rule=_select_rule, size=_select_size, keeps=stream_records(1))
def fss_trunc_select(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    complement: bool,
    bits: int,
    dealt: torch.Tensor | None,
    d: torch.Tensor,
    t: torch.Tensor,
    e: torch.Tensor,
) -> torch.Tensor:
    """Party i's share of (v >> f) msb(x) (``complement``: of (v >> f) (1 - msb(x))) for
    the value v opened as e = v - a (module docstring), f = ``bits``: its words U, D, t U,
    t D (derived, or the last party's ``dealt``), the opened d, its share of t; party 0
    (``first``) adds e >> f."""
    if type(bits) is not int or not 1 <= bits <= 62:
        raise ValueError(f"a truncation of 1 to 62 bits, got {bits!r}")
    if e.shape != t.shape or e.shape != d.shape:
        raise ValueError(f"e, t and d of shapes {list(e.shape)}, {list(t.shape)}, {list(d.shape)}")
    n = e.numel()
    if dealt is not None and dealt.numel() != 4 * n:
        raise ValueError(f"the dealer's words are {dealt.numel()}, not 4 x {n}")
    consume(ctx, [seed], nonce, TAG_C)
    words = derive(seed, nonce, TAG_C, [4, n]) if dealt is None else dealt.view(4, n)
    u, dd, tu, td = (words[k].view(e.shape) for k in range(4))
    high = e >> bits
    wrap = e >> 63  # (all ones where msb(e) = 1)
    w = u + (dd & wrap)
    tw = tu + (td & wrap) + high * t
    if first:
        w += high
    return selected_by_d(complement, d, w, tw)
