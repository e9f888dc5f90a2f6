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

from mpc.protocols.max_of_four.steps import group_terms
from mpc.protocols.rules import (
    OPENED,
    SEED,
    dealer_seeds,
    int_of,
    kept,
    nonce_of,
    party_seed,
)
from pointers.worker.sealing import ProtocolCall, seal

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


def dealer_fourier(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.fourier", nonce_of(call), deliveries=1)]


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


def fourier_finish(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "trig")
    call.material("trig", "dealer.fourier", nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return None


# -- comparison --------------------------------------------------------------------------


# -- the comparison by function secret sharing (mpc.material.fss) -----------------------


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
            want += [[group_terms(call, shape)]]
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
