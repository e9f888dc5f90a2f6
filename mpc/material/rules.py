"""The rules of the protocol steps: which sealed objects each step takes and makes.

Every step that :mod:`mpc.material` registers with a worker is a *protocol step*
(:func:`pointers.worker.sealing.protocol_function`): before it runs, the worker calls its
rule here with the labels of the arguments. A rule checks that each piece of material is
the output of the previous step of the same protocol instance (its nonce), of the right
kind, made at this worker or delivered by a peer as the protocol says, and that each
share operand is an ordinary object (never material: a step that a client could feed a
sealed object of its choosing is an oracle). It names what the step consumes (used once)
and the label of each output (None: the instance's final result, an ordinary share).

Instances: a Beaver product, a truncation, a series and a comparison each run under one
nonce (a comparison's carry-tree levels and products under nonces the dealer bound to it).
Where a later step takes the share that an earlier step masked (the y of a Beaver
product, the v of a selection), the earlier step records the tensor and its version, and
the later step must be given that same, unmodified tensor.
"""

from __future__ import annotations

import weakref
from typing import Any

from mpc.math import carry4, group4
from mpc.protocols.rules import (
    OPENED,
    SEED,
    dealer_seeds,
    int_of,
    kept,
    nonce_of,
    party_seed,
    record,
    same,
)
from pointers.worker.sealing import ProtocolCall, seal

LEVELS = carry4.LEVELS


# -- seeds and the dealer ----------------------------------------------------------------


def new_seed(call: ProtocolCall) -> Any:
    """Party ``index``'s seed of a group of ``parties``: it leaves the dealer once, to its
    party, and tells that party its place."""
    index, parties = call.value("index"), call.value("parties")
    if type(parties) is not int or not 2 <= parties <= 5:
        raise call.refuse("a seed is for a group of 2 to 5 parties")
    if type(index) is not int or not 0 <= index < parties:
        raise call.refuse(f"a seed is for party 0 to {parties - 1}")
    return [seal(SEED, 0, index, deliveries=1, extra=(parties,))]


def dealer_trunc(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.trunc", nonce_of(call), int_of(call, "bits"), deliveries=1)]


def dealer_fourier(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.fourier", nonce_of(call), deliveries=1)]


def dealer_compare(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    levels, products, shape, group = (
        call.value(k) for k in ("level_nonces", "product_nonces", "shape", "group_nonce")
    )
    extra = (levels, products, shape, group)
    return [seal("dealer.compare", nonce_of(call), deliveries=1, extra=extra)]


# -- weight instances (mpc.material.weights) ---------------------------------------------


def _weights(call: ProtocolCall) -> dict[int, Any]:
    out: dict[int, Any] = call.state.setdefault("mpc.weight_instances", {})
    return out


def dealer_weight(call: ProtocolCall) -> Any:
    """The instance's mask B stays at the dealer (it is never sent)."""
    dealer_seeds(call)
    return [seal("dealer.weight", int_of(call, "weight"), deliveries=0)]


def dealer_weight_triple(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    b = call.material("b", "dealer.weight", local=True)
    assert b is not None
    w_first = call.value("w_first")
    if type(w_first) is not bool:
        raise call.refuse("parameter 'w_first' is a bool")
    return [seal("dealer.wtriple", nonce_of(call), deliveries=1, extra=(b.nonce, w_first))]


def weight_mask(call: ProtocolCall) -> Any:
    """Make instance ``weight`` of the share ``w``: once per weight nonce, bound to ``w``
    (its F is combined with that tensor only, unmodified)."""
    weight = int_of(call, "weight")
    party_seed(call)
    w = call.share("w")
    records = _weights(call)
    for k in [k for k, (ref, _) in records.items() if ref() is None]:
        del records[k]  # (instances whose weight is gone)
    if weight in records:
        raise call.refuse(f"weight instance {weight} was made before")
    records[weight] = (weakref.ref(w), w._version)
    return [seal("weight.f", weight)]


def weight_product_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    return [seal("wprod.e", nonce), kept("wprod.a", nonce)]


def weight_product(call: ProtocolCall) -> Any:
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
    rec = _weights(call).get(weight)
    if rec is None or rec[0]() is not w or rec[1] != w._version:
        raise call.refuse(
            f"parameter 'w' must be the share that weight instance {weight} masked, unmodified"
        )
    return None


# -- truncation and series ---------------------------------------------------------------


def trunc_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("z")
    return [seal("trunc.c", nonce)]


def trunc_finish(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corrections")
    corr = call.material(
        "corrections", "dealer.trunc", nonce, local=False, optional=True, consume=True
    )
    if corr is not None and corr.index != call.value("bits"):
        raise call.refuse(f"the dealer's correction is for {corr.index} bits")
    call.material("c", OPENED + "trunc.c", nonce, local=True, consume=True)
    return None


def fourier_finish(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "trig")
    call.material("trig", "dealer.fourier", nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return None


# -- comparison --------------------------------------------------------------------------


def cmp_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    return [seal("cmp.c", nonce)]


def unpack(call: ProtocolCall) -> Any:
    """The last party splits the dealer's comparison material (one delivery)."""
    label = call.material("packed", "dealer.compare", local=False, consume=True)
    assert label is not None
    levels, products, shape, group = label.extra
    n = 1
    for d in shape:
        n *= d
    words = carry4.padded(n)
    tree = [[len(carry4.BIT_MONOMIALS) * words // 4]] + [
        [carry4.packed_words(len(carry4.MONOMIALS)) * carry4.words(words, level)]
        for level in range(1, carry4.LEVELS)
    ]
    want = [shape] * 3 + tree + [shape] * len(products)
    if group is not None:
        want += [[_group_terms(call, shape)]]
    if call.value("shapes") != want:
        raise call.refuse("the shapes do not split the dealer's comparison material")
    nonce = label.nonce
    seals = [kept(k, nonce) for k in ("dealer.cmp.rbits", "dealer.cmp.tarith", "dealer.cmp.tbin")]
    seals.append(kept("dealer.cmp.monomials", nonce))
    seals += [kept("dealer.cmp.and", ln, k + 1) for k, ln in enumerate(levels)]
    seals += [kept("dealer.cmp.prod", pn, extra=(nonce,)) for pn in products]
    if group is not None:  # the selection's products (see group_select)
        seals.append(kept("dealer.cmp.group", group, extra=(nonce,)))
    return seals


def _group_terms(call: ProtocolCall, shape: Any) -> int:
    """The dealer's selection words of groups of four of ``shape`` ([G, 6] or [G, 10])."""
    if not (
        isinstance(shape, list) and len(shape) == 2 and shape[1] in (group4.PLAIN, group4.RELU)
    ):
        raise call.refuse("groups of four are compared as [G, 6] or [G, 10]")
    return group4.terms(shape[1]) * int(shape[0])


def _links(call: ProtocolCall) -> dict[int, int]:
    out: dict[int, int] = call.state.setdefault("mpc.carry_links", {})
    return out


def _masked_level(call: ProtocolCall, comparison: int, level_nonce: Any, level: int) -> list[Any]:
    if type(level_nonce) is not int:
        raise call.refuse("a carry-tree level's nonce is an int")
    _links(call)[level_nonce] = comparison
    return [seal("carry.ef", level_nonce, level), kept("carry.a", level_nonce, level)]


def cmp_init(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "r_bits", "monomials")
    rb = call.material("r_bits", "dealer.cmp.rbits", nonce, optional=True, consume=True)
    mo = call.material("monomials", "dealer.cmp.monomials", nonce, optional=True, consume=True)
    if (rb is None) != (mo is None):
        raise call.refuse("the dealer's r bits and bit products go together")
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    out = [kept("cmp.g", nonce, 1), kept("cmp.p", nonce, 1), kept("cmp.top", nonce)]
    return out + _masked_level(call, nonce, call.value("next_nonce"), 1)


def carry_step(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "c")
    level = int_of(call, "level")
    comparison = _links(call).pop(nonce, None)
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
    if level == LEVELS - 1:
        return [kept("cmp.g", comparison, LEVELS)]
    out = [kept("cmp.g", comparison, level + 1), kept("cmp.p", comparison, level + 1)]
    return out + _masked_level(call, comparison, call.value("next_nonce"), level + 1)


def cmp_bit_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "t_bin")
    call.material("t_bin", "dealer.cmp.tbin", nonce, optional=True, consume=True)
    g = call.material("g", "cmp.g", nonce, local=True, consume=True)
    if g is not None and g.index != LEVELS:
        raise call.refuse("parameter 'g' is not the carry tree's last level")
    call.material("top", "cmp.top", nonce, local=True, consume=True)
    return [seal("cmp.d", nonce)]


def cmp_bit_finish(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "t_arith")
    call.material("t_arith", "dealer.cmp.tarith", nonce, optional=True)
    call.material("d", OPENED + "cmp.d", nonce, local=True)
    return None


def party_derive(call: ProtocolCall) -> Any:
    """Only the daBit's arithmetic share t, for the products of a selection."""
    from mpc.protocols.streams import TAG_T_ARITH

    nonce = nonce_of(call)
    seed = party_seed(call)
    if seed.extra == (seed.index + 1,):
        raise call.refuse("the last party's daBit share is the dealer's, not derived")
    if call.value("tag") != TAG_T_ARITH:
        raise call.refuse("a party derives only the daBit's arithmetic share here")
    return [kept("cmp.t", nonce)]


def dabit_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    record(call, ("dabit", nonce), call.share("v"))
    return [seal("dabit.e", nonce)]


def dabit_product(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "c")
    t = call.material("t", ("cmp.t", "dealer.cmp.tarith"), local=True)
    assert t is not None
    c = call.material("c", "dealer.cmp.prod", nonce, optional=True, consume=True)
    if c is not None and c.extra != (t.nonce,):
        raise call.refuse("the dealer's product correction belongs to another comparison")
    call.material("e", OPENED + "dabit.e", nonce, local=True, consume=True)
    return [kept("cmp.vt", nonce, extra=(t.nonce,))]


def cmp_select_finish(call: ProtocolCall) -> Any:
    d = call.material("d", D_OPENED, local=True)
    assert d is not None
    vt = call.args.get("vt")
    label = vt.label if vt is not None else None
    if label is not None and label.kind == "cmp.vt":
        call.material("vt", "cmp.vt", local=True, consume=True)
        if label.extra != (d.nonce,):
            raise call.refuse("parameter 'vt' belongs to another comparison")
        same(call, ("dabit", label.nonce), "v")
        return None
    # the selection of 1 (ReLU's mask): [t] itself, once per comparison
    call.material("vt", ("cmp.t", "dealer.cmp.tarith"), d.nonce, local=True)
    done: set[int] = call.state.setdefault("mpc.t_selected", set())
    if d.nonce in done:
        raise call.refuse(f"comparison {d.nonce}'s mask was selected before")
    done.add(d.nonce)
    call.share("v")
    return None


def group_mask(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    record(call, ("group", nonce), call.share("a"))
    return [seal("group.e", nonce)]


def group_select(call: ProtocolCall) -> Any:
    """The selection of groups of four: the comparison's opened d and its daBits t (used
    for this selection once), the opened e of the groups' instance, and the very values
    its mask step masked."""
    nonce = nonce_of(call)
    party_seed(call, "material")
    d = call.material("d", D_OPENED, local=True)
    assert d is not None
    mat = call.args.get("material")
    if mat is not None and mat.entries is not None:
        raise call.refuse("parameter 'material' takes the dealer's selection material")
    if mat is not None and mat.entry is not None:
        label = call.material("material", "dealer.cmp.group", nonce, consume=True)
        assert label is not None
        if label.extra != (d.nonce,):
            raise call.refuse("the dealer's selection material belongs to another comparison")
    call.material("t", ("cmp.t", "dealer.cmp.tarith"), d.nonce, local=True)
    done: set[int] = call.state.setdefault("mpc.t_selected", set())
    if d.nonce in done:
        raise call.refuse(f"comparison {d.nonce}'s daBits were used for a selection before")
    done.add(d.nonce)
    call.material("e", OPENED + "group.e", nonce, local=True, consume=True)
    same(call, ("group", nonce), "a")
    return None


# -- the comparison by function secret sharing (mpc.material.fss) -----------------------

D_OPENED = (OPENED + "cmp.d", OPENED + "fss.d")


def dealer_fss(call: ProtocolCall) -> Any:
    """The correction words, common to both keys (one object, a delivery to each of the
    2 parties), and the last party's part (index 1: the party's place)."""
    dealer_seeds(call)
    if len(call.materials("seeds", SEED, "the dealer's seeds")) != 2:
        raise call.refuse("the FSS comparison is for 2 parties")
    select = call.value("select")
    if type(select) is not bool:
        raise call.refuse("parameter 'select' is a bool")
    keys = ("select", "bits", "shape", "product_nonces", "group_nonce")
    extra = tuple(call.value(k) for k in keys)
    nonce = nonce_of(call)
    return [
        seal("dealer.fss.cw", nonce, deliveries=2, extra=extra[:2]),
        seal("dealer.fss", nonce, 1, deliveries=1, extra=extra),
    ]


def fss_unpack(call: ProtocolCall) -> Any:
    """The last party splits its own part of the key (the index the dealer gave it) once."""
    nonce = nonce_of(call)
    seed = party_seed(call)
    label = call.material("packed", "dealer.fss", nonce, local=False, consume=True)
    assert label is not None
    if label.index != seed.index or seed.index != 1:
        raise call.refuse(f"party {seed.index} takes the key of party {label.index}")
    select, bits, shape, products, group = label.extra
    n = 1
    for d in shape:
        n *= d
    want = [[n]]
    if select:
        want += [shape] * (1 + len(products))
        if group is not None:
            want += [[_group_terms(call, shape)]]
    if call.value("shapes") != want:
        raise call.refuse("the shapes do not split the dealer's FSS key")
    seals = [kept("fss.u", nonce, seed.index, extra=(select, bits))]
    if select:
        seals.append(kept("dealer.cmp.tarith", nonce))
        seals += [kept("dealer.cmp.prod", pn, extra=(nonce,)) for pn in products]
        if group is not None:
            seals.append(kept("dealer.cmp.group", group, extra=(nonce,)))
    return seals


def fss_eval(call: ProtocolCall) -> Any:
    """A party evaluates the key once, at the opened c of the same instance: the
    correction words delivered to it (each party its own copy, consumed), and at the last
    party its share of u that it split from its own part. With a selection the result is
    d's share (opened next), else the comparison's result."""
    nonce = nonce_of(call)
    seed = party_seed(call, "u")
    key = call.material("key", "dealer.fss.cw", nonce, local=False, consume=True)
    assert key is not None
    u = call.material("u", "fss.u", nonce, local=True, optional=True, consume=True)
    if u is not None and u.index != seed.index:
        raise call.refuse(f"party {seed.index} takes its own key, not party {u.index}'s")
    select, bits = key.extra[0], key.extra[1]
    if call.value("bits") != bits:
        raise call.refuse(f"the key reads {bits} bits")
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return [seal("fss.d", nonce)] if select else None
