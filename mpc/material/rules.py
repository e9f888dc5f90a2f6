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

from typing import Any

from mpc.protocols.rules import (
    OPENED,
    SEED,
    dealer_seeds,
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


# -- truncation and series ---------------------------------------------------------------


def fourier_finish(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "trig")
    call.material("trig", "dealer.fourier", nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return None


# -- comparison --------------------------------------------------------------------------


# -- the comparison by function secret sharing (mpc.material.fss) -----------------------
