"""The comparison's last carry-tree level with an arithmetic output (the math:
:mod:`mpc.math.carry_arith`): a comparison that selects nothing (msb, public thresholds)
ends in its third round, with no daBit round after it.

The level before the last masks the last level's operands and G3 with random bits of the
last level's nonce (:func:`mpc.protocols.comparison.steps.carry_step` with ``arith``); the
parties open them (one XOR round) and :func:`carry_arith` computes each party's additive
share of msb(x) from the opened bits, its share of h = msb(~r) and its shares of the
dealer's (1 - 2h) a_S (:func:`arith_material`: the last party's are dealt, the others
derive theirs from the last level's nonce).

Instance: the last level's nonce, linked to its comparison by the level before it (the
``mpc.carry_links`` state, :func:`carry_links`); the comparison's msb(c), kept by
:func:`~mpc.protocols.comparison.steps.cmp_init` with the count of thresholds that share
its r.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import carry_arith as arith_math
from mpc.math import carry_tree
from mpc.protocols.comparison.arith_select import ARITH_SEL, select_material
from mpc.protocols.opening.steps import open_pieces
from mpc.protocols.rules import kept, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, stream_records, tensor_elems
from mpc.protocols.step import step
from mpc.protocols.streams import TAG_A, TAG_B, TAG_C, consume, derive, last_share
from pointers.worker.sealing import ProtocolCall

#: the last level's masked operands (opened), msb(c) kept by cmp_init, the dealt h and words
ARITH_EF = "carry.arith.ef"
ARITH_TOP = "cmp.arith.top"
ARITH_H = "dealer.cmp.h"
ARITH_WORDS = "dealer.cmp.arith"
#: the dealer's words an element for the arithmetic last level beyond the XOR tree's (its
#: shares of the monomials, their copy in the delivery, the masks: 70.6 words an element
#: in all measured at 2^15 elements, 27 + 36 declared)
ARITH_DEALER_WORDS = len(arith_math.MONOMIALS) + len(arith_math.VARS) + 6


def carry_links(call: ProtocolCall) -> dict[int, int]:
    """A worker's carry-tree levels waiting for their step: level nonce -> comparison."""
    out: dict[int, int] = call.state.setdefault("mpc.carry_links", {})
    return out


def arith_material(
    ctx: Any,
    seeds: list[torch.Tensor],
    level_nonce: int,
    h: torch.Tensor,
    n_pad: int,
    shape: list[int],
    product_nonces: list[int],
    bits: list[int],
) -> list[torch.Tensor]:
    """The dealer's last-level material (flat): the last party's shares of (1 - 2h) a_S
    for :data:`mpc.math.carry_arith.MONOMIALS`, a_S the products of the full masks of the
    last level's operands (every party's, derived here) and h per compared element; then
    each selected value's products (:func:`~mpc.protocols.comparison.arith_select.
    select_material`; ``bits``: each one's truncation, 0: none)."""
    level = carry_tree.LEVELS - 1
    count = len(arith_math.VARS)
    packed_shape = [carry_tree.packed_words(count), carry_tree.words(n_pad, level)]
    packed = derive(seeds[0], level_nonce, TAG_A, packed_shape)
    for s in seeds[1:]:
        packed ^= derive(s, level_nonce, TAG_A, packed_shape)
    masks = arith_math.opened_index(carry_tree.unpack(packed, count, level), h.numel())
    words = arith_math.dealt(masks, h)
    del masks
    products = select_material(ctx, seeds, h, words, shape, product_nonces, bits)
    return [last_share(words, seeds, level_nonce, TAG_C).reshape(-1), *products]


def _last_level_rule(call: ProtocolCall, thresholds: Any) -> int:
    """The checks of either step of the arithmetic last level; its comparison's nonce."""
    nonce = nonce_of(call)
    party_seed(call, "h", "words")
    comparison = carry_links(call).pop(nonce, None)
    if comparison is None:
        raise call.refuse(f"no carry-tree level waits for nonce {nonce} here")
    if type(thresholds) is not int:
        raise call.refuse("parameter 'thresholds' is an int")
    h = call.material("h", ARITH_H, nonce, local=True, optional=True, consume=True)
    words = call.material("words", ARITH_WORDS, nonce, local=True, optional=True, consume=True)
    if (h is None) != (words is None):
        raise call.refuse("the dealer's h and words go together")
    if h is not None and h.extra != (thresholds,):
        raise call.refuse("the thresholds are not the ones the dealer's h is shared by")
    pieces = call.pieces("ef_pieces")
    if (pieces[0].kind, pieces[0].nonce) != (ARITH_EF, nonce):
        raise call.refuse("parameter 'ef_pieces' takes this level's masked operands")
    top = call.material("top", ARITH_TOP, comparison, local=True, consume=True)
    assert top is not None
    if top.extra != (thresholds,):
        raise call.refuse("parameter 'top' is of a comparison of another count of thresholds")
    return comparison


def _carry_arith_rule(call: ProtocolCall) -> Any:
    _last_level_rule(call, call.value("thresholds"))
    return None  # (additive shares of the bit, the comparison's result)


def _carry_arith_size(p: dict[str, Any]) -> int:
    """The derived words (one a monomial: dealt at the last party), the opened operands'
    index, the coefficients gathered (a byte each) and the result: 36.8 words an element
    measured at 2^15 elements (14.5 at the last party)."""
    words = len(arith_math.MONOMIALS) + 12 if p.get("words") is None else 14
    return declared(words * WORD * tensor_elems(p, "top"))


def _last_level(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    h: torch.Tensor | None,
    words: torch.Tensor | None,
    ef_pieces: list[torch.Tensor],
    top: torch.Tensor,
    thresholds: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The opened bits of the last level's operands (one int64 an element:
    :func:`mpc.math.carry_arith.opened_index`) and this party's share of u = h ^ carry
    (flat)."""
    ef = open_pieces(ef_pieces, xor=True)
    level = carry_tree.LEVELS - 1
    shape = list(top.shape)
    n = top.numel()
    count, n_mono = len(arith_math.VARS), len(arith_math.MONOMIALS)
    shape_e = [carry_tree.packed_words(count), carry_tree.words(carry_tree.padded(n), level)]
    if ef.numel() != shape_e[0] * shape_e[1]:
        raise ValueError(f"{ef.numel()} opened words for {n} elements")
    if type(thresholds) is not int or thresholds < 0 or (thresholds and shape[:1] != [thresholds]):
        raise ValueError(f"thresholds {thresholds!r} do not lead the shape {shape}")
    h_shape = shape[1:] if thresholds else shape
    consume(ctx, [seed], nonce, TAG_B, TAG_C)
    if h is None:
        h = derive(seed, nonce, TAG_B, h_shape)
    if words is None:
        words = derive(seed, nonce, TAG_C, [n_mono, n])
    if list(h.shape) != h_shape or words.numel() != n_mono * n:
        raise ValueError(f"the dealer's h {list(h.shape)} and words do not fit {shape}")
    if thresholds:
        h = h.unsqueeze(0).expand(shape)
    index = arith_math.opened_index(carry_tree.unpack(ef.view(shape_e), count, level), n)
    return index, arith_math.u_shares(first, index, h, words.view(n_mono, n))


@step(rule=_carry_arith_rule, size=_carry_arith_size, keeps=stream_records(2))
def carry_arith(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    h: torch.Tensor | None,
    words: torch.Tensor | None,
    ef_pieces: list[torch.Tensor],
    top: torch.Tensor,
    thresholds: int,
) -> torch.Tensor:
    """This party's additive share of msb(x), top's shape, from the last level's operands
    opened here (the XOR of ``ef_pieces``), msb(c) (``top``, public), its share of h (an
    element of x: ``thresholds`` T > 0 compare each element T times, [T, *x]) and of the
    dealer's words (``h`` and ``words``: dealt at the last party, None elsewhere)."""
    _, u = _last_level(ctx, seed, nonce, first, h, words, ef_pieces, top, thresholds)
    return arith_math.flip(first, u, top.reshape(-1)).view(top.shape)


def _carry_arith_sel_rule(call: ProtocolCall) -> Any:
    return [kept(ARITH_SEL, _last_level_rule(call, 0))]


@step(
    rule=_carry_arith_sel_rule,
    size=_carry_arith_size,
    keeps=stream_records(2),
    makes_material=True,
)
def carry_arith_sel(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    h: torch.Tensor | None,
    words: torch.Tensor | None,
    ef_pieces: list[torch.Tensor],
    top: torch.Tensor,
) -> torch.Tensor:
    """The last level of a comparison that selects values: this party's share of u,
    msb(c) and the opened bits, [3, n], kept for the selections
    (:mod:`mpc.protocols.comparison.arith_select`)."""
    e, u = _last_level(ctx, seed, nonce, first, h, words, ef_pieces, top, 0)
    return torch.stack([u, top.reshape(-1), e])


__all__ = [
    "ARITH_DEALER_WORDS",
    "ARITH_EF",
    "ARITH_H",
    "ARITH_TOP",
    "ARITH_WORDS",
    "arith_material",
    "carry_arith",
    "carry_arith_sel",
    "carry_links",
]
