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

from mpc.protocols.rules import (
    OPENED,
    SEED,
    dealer_seeds,
    int_of,
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
    return [seal("wprod.e", nonce), seal("wprod.a", nonce)]


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
