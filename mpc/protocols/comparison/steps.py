"""The steps of the comparison's carry tree (the protocol:
:class:`mpc.protocols.comparison.run.CarryRun`; the math: :mod:`mpc.math.carry_tree`):
the dealer's material, each party's mask of x, its carry-tree levels and its bit.

Instance: one nonce for the comparison (c, the generate/propagate words, d), one for
each carry-tree level's ANDs and one for each product a selection rides on, all bound
by the dealer to the comparison. A level's step takes the operands the previous level
masked (the level's nonce links back to its comparison).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.math import carry_arith, carry_tree
from mpc.math.bits import pack_bits
from mpc.math.prg import PRG
from mpc.protocols.comparison.arith import (
    ARITH_DEALER_WORDS,
    ARITH_EF,
    ARITH_H,
    ARITH_TOP,
    ARITH_WORDS,
    arith_material,
    carry_links,
)
from mpc.protocols.comparison.arith_select import (
    ARITH_PROD,
    PRODUCT_WORDS,
    TRUNC_PRODUCT_WORDS,
    check_bits,
    product_words,
)
from mpc.protocols.comparison.selection import (
    MAX_SELECTED,
    check_selection,
    selected_count,
    selection_material,
)
from mpc.protocols.comparison.thresholds import check_thresholds, threshold_values
from mpc.protocols.max_of_four.steps import group_material, group_terms, group_words
from mpc.protocols.opening.steps import open_pieces, split
from mpc.protocols.rules import OPENED, dealer_seeds, int_of, kept, nonce_of, party_seed
from mpc.protocols.sizes import (
    WORD,
    declared,
    elementwise,
    fixed,
    numel,
    records,
    stream_records,
    tensor_elems,
)
from mpc.protocols.step import BITS, SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_B,
    TAG_C,
    TAG_PAIRS,
    TAG_R,
    TAG_RBITS,
    TAG_T_ARITH,
    TAG_T_BIN,
    consume,
    derive,
    last_share,
    last_xor_share,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

LEVELS = carry_tree.LEVELS
# -- the dealer ----------------------------------------------------------------------------


def _dealer_compare_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    levels, products, shape, group, thresholds, arith = (
        call.value(k)
        for k in ("level_nonces", "product_nonces", "shape", "group_nonce", "thresholds", "arith")
    )
    count = len(products) if isinstance(products, list) else 0
    bits = check_bits(call.value("product_bits"), count)
    if any(bits) and arith is not True:
        raise call.refuse("only the arithmetic last level selects truncated values")
    extra = (levels, products, shape, group, thresholds or 0, arith is True, bits)
    return [seal("dealer.compare", nonce_of(call), deliveries=1, extra=extra)]


def _dealer_compare_size(p: dict[str, Any]) -> int:
    """The carry tree's material and its temporaries (27 words an element at the peak,
    measured at 2^20 elements), two words per selected value and the groups' material."""
    words = 27 + 2 * selected_count(p) + group_words(p)
    if p.get("arith") is True:  # (per selected value: its products and a derived copy)
        bits = p.get("product_bits")
        truncated = sum(1 for b in bits[:MAX_SELECTED] if b) if isinstance(bits, list) else 0
        words += ARITH_DEALER_WORDS + 2 * PRODUCT_WORDS * selected_count(p)
        words += 2 * (TRUNC_PRODUCT_WORDS - PRODUCT_WORDS + 4) * truncated
    return declared(words * WORD * numel(p.get("shape")))


def _dealer_compare_keeps(p: dict[str, Any]) -> int:
    levels = p.get("level_nonces")
    n_levels = min(len(levels), 16) if isinstance(levels, list) else 0
    return records(p.get("seeds"), 5 + 3 * n_levels + 2 * selected_count(p))


@step(
    rule=_dealer_compare_rule,
    size=_dealer_compare_size,
    keeps=_dealer_compare_keeps,
    makes_material=True,
)
def dealer_compare(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    shape: list[int],
    level_nonces: list[int],
    product_nonces: list[int],
    group_nonce: int | None = None,
    thresholds: int = 0,
    arith: bool = False,
    product_bits: list[int] | None = None,
) -> torch.Tensor:
    """Comparison material, the last party's part as one flat tensor (one delivery): its
    binary share of r (arithmetic, derived by all), its arithmetic and binary shares of a
    random bit t (a "daBit"), its XOR share of the products of ~r's bits within each group
    of four that make the radix-4 carry tree's level 0 local (packed, over the padded
    element count; :mod:`mpc.math.carry_tree`), then per other level (``level_nonces``: one
    each, levels 1 and 2) its share of the products of the level's masks (the masks a are
    derived by every party), then per ``product_nonces`` entry its share of c = a t, a
    derived by every party: the pair (a, c) turns a product [v t] into one opening of
    e = v - a (see :func:`~mpc.protocols.comparison.selection.dabit_product`). With ``group_nonce`` the
    comparison is the six pairs of groups of four (``shape`` [G, 6]) and last come its
    shares of the daBits' products and of their products with the groups' masks
    (:mod:`mpc.math.groups_of_four`; see :func:`~mpc.protocols.max_of_four.steps.group_select`).

    ``thresholds`` T > 0: ``shape`` is [T, *x] and the T comparisons of each element of x
    (with T public thresholds, :func:`cmp_init`) share its mask r, derived for x's shape:
    one opening of c = x + r an element, not T. Each comparison keeps its own daBit and
    its own AND masks, so what each opens beyond c is uniform as before.

    ``arith``: a comparison without groups of four ends with the last level's arithmetic
    output (:mod:`mpc.protocols.comparison.arith`): no daBit; in its place the last
    party's additive share of h = msb(~r), in place of the last level's mask products its
    shares of (1 - 2h) a_S, and per ``product_nonces`` entry its shares of a selected
    value's products (:func:`~mpc.protocols.comparison.arith.arith_material`); with
    ``product_bits``, a value's truncation by that many bits (0: none) in its selection
    (:func:`~mpc.protocols.comparison.arith_select.arith_select`), arith only."""
    check_selection(shape, product_nonces, group_nonce)
    bits = check_bits(product_bits, len(product_nonces))
    if any(bits) and not arith:
        raise ValueError("only the arithmetic last level selects truncated values")
    check_thresholds(shape, thresholds, bool(product_nonces) or group_nonce is not None)
    if type(arith) is not bool or (arith and group_nonce is not None):
        raise ValueError("an arithmetic comparison output (arith) selects no groups of four")
    if not (
        isinstance(level_nonces, list)
        and len(level_nonces) == carry_tree.LEVELS - 1
        and all(type(v) is int for v in level_nonces)
    ):
        raise ValueError(
            f"a comparison takes {carry_tree.LEVELS - 1} level nonces, got {level_nonces!r}"
        )
    consume(ctx, seeds, nonce, TAG_R, TAG_RBITS, TAG_T_ARITH, TAG_T_BIN, TAG_PAIRS)
    # with thresholds one r an element of x, the same for its T comparisons (its bits too)
    r = sum_derived(seeds, nonce, TAG_R, shape[1:] if thresholds else shape)
    r_bits = last_xor_share(r.clone(), seeds, nonce, TAG_RBITS)
    # arith: h = msb(~r), one an element of x (its thresholds share it)
    h = ((r >> 63) & 1) ^ 1 if arith else None
    if thresholds:
        r = r.unsqueeze(0).expand(shape)
    parts = [r_bits.reshape(-1)]
    t = torch.zeros(0, dtype=torch.int64)
    if h is not None:
        parts.append(last_share(h.clone(), seeds, level_nonces[-1], TAG_B).reshape(-1))
    else:
        t = PRG(os.urandom(16)).int64(tuple(shape)) & 1
        t_arith = last_share(t.clone(), seeds, nonce, TAG_T_ARITH)
        t_bin = last_xor_share(t.clone(), seeds, nonce, TAG_T_BIN, mask=1)
        parts += [t_arith.reshape(-1), t_bin.reshape(-1)]
    y = ~r.reshape(-1)
    words = carry_tree.padded(y.numel())
    y = torch.cat([y, y.new_zeros(words - y.numel())])
    # bit planes: every bit is used
    mono = last_xor_share(torch.stack(carry_tree.bit_monomials(y)), seeds, nonce, TAG_PAIRS)
    parts.append(mono.reshape(-1))
    count = len(carry_tree.VARS)
    for level, level_nonce in enumerate(level_nonces, start=1):
        consume(ctx, seeds, level_nonce, TAG_A, TAG_C)
        if h is not None and level == carry_tree.LEVELS - 1:
            consume(ctx, seeds, level_nonce, TAG_B)
            h_all = h.unsqueeze(0).expand(shape) if thresholds else h
            parts += arith_material(
                ctx, seeds, level_nonce, h_all, words, shape, product_nonces, bits
            )
            continue
        w = carry_tree.words(words, level)
        packed = derive(seeds[0], level_nonce, TAG_A, [carry_tree.packed_words(count), w])
        for s in seeds[1:]:  # every party's masks (the last party's too: it derives its own)
            packed ^= derive(s, level_nonce, TAG_A, list(packed.shape))
        products = carry_tree.mask_monomials(carry_tree.unpack(packed, count, level))
        parts.append(_last_share(seeds, level_nonce, TAG_C, products, level))
    if h is None:  # (arith: the products came with the last level's words)
        parts += selection_material(ctx, seeds, t, shape, product_nonces)
    if group_nonce is not None:
        parts += group_material(ctx, seeds, t, shape, group_nonce)
    return torch.cat(parts)


def _last_share(
    seeds: list[torch.Tensor], nonce: int, tag: int, values: list[torch.Tensor], level: int
) -> torch.Tensor:
    """The last party's XOR share of aligned ``values``, packed flat: the others derive
    theirs as packed random words (:func:`mpc.math.carry_tree.unpack` aligns them)."""
    out = carry_tree.pack(values, level)  # (packing is linear: the others' shares are packed)
    for s in seeds[:-1]:
        share = derive(s, nonce, tag, list(out.shape))
        out ^= carry_tree.pack(carry_tree.unpack(share, len(values), level), level)
    return out.reshape(-1)


# -- the parties ---------------------------------------------------------------------------


def _unpack_rule(call: ProtocolCall) -> Any:
    """The last party splits the dealer's comparison material (one delivery)."""
    label = call.material("packed", "dealer.compare", local=False, consume=True)
    assert label is not None
    levels, products, shape, group, thresholds, arith, bits = label.extra
    n = 1
    for d in shape:
        n *= d
    words = carry_tree.padded(n)
    tree = [[len(carry_tree.BIT_MONOMIALS) * words // 4]] + [
        [carry_tree.packed_words(len(carry_tree.MONOMIALS)) * carry_tree.words(words, level)]
        for level in range(1, carry_tree.LEVELS)
    ]
    x_shape = shape[1:] if thresholds else shape
    if arith:  # h an element of x, and the last level's words
        tree[-1] = [len(carry_arith.MONOMIALS) * n]
    want = [x_shape] + ([x_shape] if arith else [shape] * 2) + tree
    want += [[product_words(b) * n] if arith else shape for b in bits]
    if group is not None:
        want += [[group_terms(call, shape)]]
    if call.value("shapes") != want:
        raise call.refuse("the shapes do not split the dealer's comparison material")
    nonce = label.nonce
    # (the r bits say how many thresholds share r: cmp_init compares that many)
    seals = [kept("dealer.cmp.rbits", nonce, extra=(thresholds,))]
    if arith:
        seals.append(kept(ARITH_H, levels[-1], extra=(thresholds,)))
    else:
        seals += [kept(k, nonce) for k in ("dealer.cmp.tarith", "dealer.cmp.tbin")]
    seals.append(kept("dealer.cmp.monomials", nonce))
    seals += [kept("dealer.cmp.and", ln, k + 1) for k, ln in enumerate(levels[:-1])]
    seals.append(kept(ARITH_WORDS if arith else "dealer.cmp.and", levels[-1], len(levels)))
    product_kind = ARITH_PROD if arith else "dealer.cmp.prod"
    seals += [
        kept(product_kind, pn, extra=(nonce, b) if arith else (nonce,))
        for pn, b in zip(products, bits)
    ]
    if group is not None:  # the selection's products (see group_select)
        seals.append(kept("dealer.cmp.group", group, extra=(nonce,)))
    return seals


@step(rule=_unpack_rule, size=fixed, makes_material=True)
def unpack(ctx: Any, packed: torch.Tensor, shapes: list[list[int]]) -> list[torch.Tensor]:
    """The last party splits the dealer's comparison material (views: no copy)."""
    return split(packed, shapes)


def _cmp_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    return [seal("cmp.c", nonce)]


@step(
    rule=_cmp_mask_rule,
    size=elementwise(2, "x"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"cmp.c": SUM},
)
def cmp_mask(ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor) -> torch.Tensor:
    """c_i = x_i + r_i: the party's share of x masked by the dealer's r."""
    consume(ctx, [seed], nonce, TAG_R)
    return x + derive(seed, nonce, TAG_R, list(x.shape))


def _seal_level(
    call: ProtocolCall, comparison: int, level_nonce: Any, level: int, arith: bool = False
) -> list[Any]:
    if type(level_nonce) is not int:
        raise call.refuse("a carry-tree level's nonce is an int")
    carry_links(call)[level_nonce] = comparison
    if arith:  # (the arithmetic last level: its operands, no masks kept)
        return [seal(ARITH_EF, level_nonce, level)]
    return [seal("carry.ef", level_nonce, level), kept("carry.a", level_nonce, level)]


def _init_size(p: dict[str, Any]) -> int:
    """The words of c - r, level 0's bit planes and products, level 1's operands and their
    masks: 15 words an element compared (13.5 at the last party, whose r bits are dealt),
    measured at 2^20 elements (14.2 and under at party 0; 15.2 declared: a run of 2^15
    measured 0.8% over 15 once); with thresholds, each element of c is compared once a
    threshold."""
    words = 15.2 if p.get("r_bits") is None else 13.5
    thresholds = p.get("thresholds")
    count = len(thresholds) if isinstance(thresholds, list) and thresholds else 1
    return declared(words * WORD * tensor_elems(p, "c") * count)


def _level_size(p: dict[str, Any]) -> int:
    """A level's operands, masks and mask products unpacked to bit planes, the
    combination, the next level's operands: 75 words a word of g (69 at the last party,
    whose products are dealt), measured at 2^20 elements."""
    words = 75 if p.get("c") is None else 69
    return declared(words * WORD * tensor_elems(p, "g"))


def _cmp_init_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "r_bits", "monomials")
    rb = call.material("r_bits", "dealer.cmp.rbits", nonce, optional=True, consume=True)
    mo = call.material("monomials", "dealer.cmp.monomials", nonce, optional=True, consume=True)
    if (rb is None) != (mo is None):
        raise call.refuse("the dealer's r bits and bit products go together")
    if rb is not None:  # (the last party: its r bits say how many thresholds share r)
        thresholds = call.value("thresholds")
        if (rb.extra[0] if rb.extra else 0) != (len(thresholds) if thresholds else 0):
            raise call.refuse("the thresholds are not the ones the dealer's r is shared by")
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    arith = call.value("arith")
    if type(arith) is not bool:
        raise call.refuse("parameter 'arith' is a bool")
    if arith:  # (msb(c), public, for the arithmetic last level of as many thresholds)
        thresholds = call.value("thresholds")
        top = kept(ARITH_TOP, nonce, extra=(len(thresholds) if thresholds else 0,))
    else:
        top = kept("cmp.top", nonce)
    out = [kept("cmp.g", nonce, 1), kept("cmp.p", nonce, 1), top]
    return out + _seal_level(call, nonce, call.value("next_nonce"), 1)


@step(rule=_cmp_init_rule, size=_init_size, keeps=stream_records(4), makes_material=True)
def cmp_init(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    r_bits: torch.Tensor | None,
    monomials: torch.Tensor | None,
    c: torch.Tensor,
    next_nonce: int,
    thresholds: list[int] | None = None,
    arith: bool = False,
) -> list[torch.Tensor]:
    """XOR shares of the generate/propagate words of c + ~r + 1 (that is c - r) with the
    carry-in folded into bit 0 and bit 63 set to propagate, after the radix-4 carry tree's
    level 0, which is local here given the dealer's products of ~r's bits within each
    group of four (``monomials``: the last party's, as bit planes; derived elsewhere; see
    :mod:`mpc.math.carry_tree`); the party's XOR share of msb(c) ^ msb(~r); and level 1's
    operands masked for its multi-input ANDs with the masks of ``next_nonce``
    (:func:`_mask_level`).

    ``thresholds`` (public ring values theta_k): c = x + r opened once an element, and
    compared as c - theta_k, [T, *x]: the T comparisons x - theta_k share r
    (:func:`dealer_compare`). ``arith``: the top bit returned is msb(c) itself, public
    (the arithmetic last level, :mod:`mpc.protocols.comparison.arith`, adds h's share)."""
    theta = threshold_values(thresholds) if thresholds else None  # (before any stream is used)
    if r_bits is not None and r_bits.shape != c.shape:
        raise ValueError(f"the dealer's r bits are {list(r_bits.shape)}, c {list(c.shape)}")
    consume(ctx, [seed], nonce, TAG_RBITS, TAG_PAIRS)
    y = derive(seed, nonce, TAG_RBITS, list(c.shape)) if r_bits is None else r_bits
    if theta is not None:  # the T comparisons of an element: c - theta_k, the same r bits
        c = c.unsqueeze(0) - theta.view([-1] + [1] * c.dim())
        y = y.unsqueeze(0).expand(c.shape)
    if first:
        y = ~y
    if arith:
        top = (c >> 63) & 1
    else:
        top = (y >> 63) & 1
        if first:
            top ^= (c >> 63) & 1
    n = c.numel()
    words = carry_tree.padded(n)
    want = [len(carry_tree.BIT_MONOMIALS), words // 4]
    if monomials is None:
        monomials = derive(seed, nonce, TAG_PAIRS, want)
    if monomials.numel() != want[0] * want[1]:
        raise ValueError(f"bit products of {monomials.numel()} words for {n} elements")
    cw, yw = c.reshape(-1), y.reshape(-1)
    if words > n:
        cw = torch.cat([cw, cw.new_zeros(words - n)])
        yw = torch.cat([yw, yw.new_zeros(words - n)])
    g, p = carry_tree.level0(cw, yw, list(monomials.view(want).unbind(0)), first)
    return [g, p, top, *_mask_level(ctx, seed, next_nonce, g, p, 1)]


def _mask_level(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    g: torch.Tensor,
    p: torch.Tensor,
    level: int,
    arith: bool = False,
) -> list[torch.Tensor]:
    """A carry-tree level's operands (:data:`mpc.math.carry_tree.VARS`) masked with the random
    bits a of ``nonce``: e = x ^ a packed flat (opened as one value), and a packed.
    ``arith`` (the last level with an arithmetic output): G3 masked too
    (:data:`mpc.math.carry_arith.VARS`, in the same words), and e alone."""
    if type(level) is not int or not 1 <= level < carry_tree.LEVELS:
        raise ValueError(f"a carry-tree level is 1 to {carry_tree.LEVELS - 1}, got {level!r}")
    consume(ctx, [seed], nonce, TAG_A)
    names = carry_arith.VARS if arith else carry_tree.VARS
    a = derive(seed, nonce, TAG_A, [carry_tree.packed_words(len(names)), g.shape[0]])
    masks = carry_tree.unpack(a, len(names), level)
    ops = carry_tree.operands(g, p, level, names)
    e = carry_tree.pack([x ^ m for x, m in zip(ops, masks)], level)
    return [e.reshape(-1)] if arith else [e.reshape(-1), a.reshape(-1)]


def _carry_step_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "c")
    level = int_of(call, "level")
    comparison = carry_links(call).pop(nonce, None)
    if comparison is None:
        raise call.refuse(f"no carry-tree level waits for nonce {nonce} here")
    call.material("c", "dealer.cmp.and", nonce, optional=True, consume=True)
    c = call.args.get("c")
    if c is not None and c.label is not None and c.label.index != level:
        raise call.refuse("the dealer's AND correction is for another level")
    lb = call.material("a", "carry.a", nonce, local=True, consume=True)
    assert lb is not None
    if lb.index != level:
        raise call.refuse("parameter 'a' belongs to another level")
    pieces = call.pieces("ef_pieces")
    if (pieces[0].kind, pieces[0].nonce, pieces[0].index) != ("carry.ef", nonce, level):
        raise call.refuse("parameter 'ef_pieces' takes this level's masked operands")
    for name in ("g", "p"):
        lb = call.material(name, f"cmp.{name}", comparison, local=True, consume=True)
        assert lb is not None
        if lb.index != level:
            raise call.refuse(f"parameter {name!r} belongs to another level")
    arith = call.value("arith")
    if type(arith) is not bool or (arith and level != LEVELS - 2):
        raise call.refuse("parameter 'arith' is a bool, true only before the last level")
    if arith:  # (the next level is the arithmetic last level: its operands alone)
        return _seal_level(call, comparison, call.value("next_nonce"), level + 1, arith=True)
    if level == LEVELS - 1:
        return [kept("cmp.g", comparison, LEVELS)]
    out = [kept("cmp.g", comparison, level + 1), kept("cmp.p", comparison, level + 1)]
    return out + _seal_level(call, comparison, call.value("next_nonce"), level + 1)


@step(rule=_carry_step_rule, size=_level_size, keeps=stream_records(3), makes_material=True)
def carry_step(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    c: torch.Tensor | None,
    a: torch.Tensor,
    ef_pieces: list[torch.Tensor],
    g: torch.Tensor,
    p: torch.Tensor,
    level: int,
    next_nonce: int | None,
    arith: bool = False,
) -> list[torch.Tensor]:
    """Finish one carry-tree level's multi-input ANDs from the masked operands e, opened
    here as the XOR of ``ef_pieces`` (this party's share and the ones the others sent it: no
    separate opening step), with this party's masks ``a`` and its shares of the masks'
    products (``c``: the dealer's, packed, at the last party; derived elsewhere): the next
    (G, P) (:func:`mpc.math.carry_tree.combine`); and, but after the last level, the next
    level's masked operands (:func:`_mask_level` with ``next_nonce``); ``arith`` (before
    the last level): those operands alone, for the arithmetic last level
    (:func:`mpc.protocols.comparison.arith.carry_arith`)."""
    ef = open_pieces(ef_pieces, xor=True)
    if type(level) is not int or not 1 <= level < carry_tree.LEVELS:
        raise ValueError(f"a carry-tree level is 1 to {carry_tree.LEVELS - 1}, got {level!r}")
    last = level == carry_tree.LEVELS - 1
    if (next_nonce is None) != last:
        raise ValueError("a next nonce is given for every carry-tree level but the last")
    w = g.shape[0]
    count, n_mono = len(carry_tree.VARS), len(carry_tree.MONOMIALS)
    shape_e = [carry_tree.packed_words(count), w]
    if ef.numel() != shape_e[0] * w or a.numel() != shape_e[0] * w:
        raise ValueError("the opened operands and the masks must be two packed words per word")
    consume(ctx, [seed], nonce, TAG_C)
    shape_m = [carry_tree.packed_words(n_mono), w]
    if c is None:
        c = derive(seed, nonce, TAG_C, shape_m)
    if c.numel() != shape_m[0] * w:
        raise ValueError(f"mask products of {c.numel()} words for {w} words")
    g_new, p_new = carry_tree.combine(
        g,
        carry_tree.unpack(a.view(shape_e), count, level),
        carry_tree.unpack(ef.view(shape_e), count, level),
        carry_tree.unpack(c.view(shape_m), n_mono, level),
        level,
        first,
    )
    if last or next_nonce is None:
        return [g_new]
    if arith:
        return _mask_level(ctx, seed, next_nonce, g_new, p_new, level + 1, arith=True)
    return [g_new, p_new, *_mask_level(ctx, seed, next_nonce, g_new, p_new, level + 1)]


def _cmp_bit_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "t_bin")
    call.material("t_bin", "dealer.cmp.tbin", nonce, optional=True, consume=True)
    g = call.material("g", "cmp.g", nonce, local=True, consume=True)
    if g is not None and g.index != LEVELS:
        raise call.refuse("parameter 'g' is not the carry tree's last level")
    call.material("top", "cmp.top", nonce, local=True, consume=True)
    top = call.value("top")
    shape = tuple(int(d) for d in top.shape) if isinstance(top, torch.Tensor) else ()
    return [seal("cmp.d", nonce, extra=shape)]  # (its opening unpacks it to this shape)


def _cmp_bit_mask_size(p: dict[str, Any]) -> int:
    """The carries unpacked, the daBit's bits and the result (4 words an element; 3.8
    measured with their packing, 1/64 of a word), one more for the packing's shifted
    copy, and the last level's g."""
    return declared(WORD * (5 * tensor_elems(p, "top") + tensor_elems(p, "g")))


@step(
    rule=_cmp_bit_mask_rule,
    size=_cmp_bit_mask_size,
    keeps=stream_records(1),
    makes_material=True,
    opens={"cmp.d": BITS},
)
def cmp_bit_mask(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    t_bin: torch.Tensor | None,
    g: torch.Tensor,
    top: torch.Tensor,
) -> torch.Tensor:
    """The party's XOR share of msb(x) = top ^ carry_63, masked by the daBit t: d_i,
    packed 64 bits to a word (:func:`mpc.math.bits.pack_bits`: one bit an element on the
    wire; the opening, :func:`mpc.protocols.opening.steps.open_bits`, unpacks it)."""
    consume(ctx, [seed], nonce, TAG_T_BIN)
    carry = carry_tree.unpack_carries(g, top.numel()).view(top.shape)
    t = derive(seed, nonce, TAG_T_BIN, list(top.shape)) & 1 if t_bin is None else t_bin
    return pack_bits(carry.bitwise_xor_(top).bitwise_xor_(t))


def _cmp_bit_finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "t_arith")
    call.material("t_arith", "dealer.cmp.tarith", nonce, optional=True)
    call.material("d", OPENED + "cmp.d", nonce, local=True)
    return None


@step(rule=_cmp_bit_finish_rule, size=elementwise(3, "d"), keeps=stream_records(1))
def cmp_bit_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    t_arith: torch.Tensor | None,
    d: torch.Tensor,
) -> torch.Tensor:
    """Arithmetic share of msb(x) = d + (1 - 2d) t from the opened d = msb(x) ^ t."""
    consume(ctx, [seed], nonce, TAG_T_ARITH)
    t = derive(seed, nonce, TAG_T_ARITH, list(d.shape)) if t_arith is None else t_arith
    out = (1 - 2 * d) * t
    if first:
        out += d
    return out
