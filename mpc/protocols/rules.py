"""What the rules of every protocol step check (a step's own rule is declared with it,
:func:`mpc.protocols.step.step`).

Before a step runs, its worker calls the step's rule with the labels of the arguments
(:class:`pointers.worker.sealing.ProtocolCall`). A rule checks that each piece of material
is the output of the previous step of the same protocol instance (its nonce), of the right
kind, made at this worker or delivered by a peer as the protocol says, and that each share
operand is an ordinary object (never material: a step that a client could feed a sealed
object of its choosing is an oracle). It names what the step consumes (used once) and the
label of each output (None: the instance's final result, an ordinary share).

Instances: a Beaver product, a truncation, a series and a comparison each run under one
nonce (a comparison's carry-tree levels and products under nonces the dealer bound to it).
Where a later step takes the share that an earlier step masked (the y of a Beaver
product, the v of a selection), the earlier step records the tensor and its version
(:func:`record`), and the later step must be given that same, unmodified tensor
(:func:`same`).
"""

from __future__ import annotations

import weakref
from dataclasses import replace
from typing import Any

from pointers.worker.sealing import Label, ProtocolCall, seal

SEED = "seed"  # the kind of a party's seed (mpc.protocols.seeds)
OPENED = "open:"  # the prefix of an opened value's kind (mpc.protocols.opening)


def kept(kind: str, nonce: int = 0, index: int = 0, extra: tuple[Any, ...] = ()) -> list[Any]:
    """The label of material that stays at the party that made it: its share of a mask,
    the dealer's material once it is split, a value opened here. It is never delivered:
    a client that handed one party another party's share of a mask (or the dealer a value
    opened with the dealer's mask) would show it the masked value."""
    return seal(kind, nonce, index, deliveries=0, extra=extra)


def instances(call: ProtocolCall) -> dict[tuple[str, int], Any]:
    """The shares that instances' first steps masked at this worker (see :func:`record`)."""
    out: dict[tuple[str, int], Any] = call.state.setdefault("mpc.instances", {})
    return out


def record(call: ProtocolCall, key: tuple[str, int], share: Any) -> None:
    """Remember the share an instance's first step masked (see the module docstring)."""
    instances(call)[key] = (weakref.ref(share), share._version)


def same(call: ProtocolCall, key: tuple[str, int], name: str) -> None:
    """The share parameter ``name`` must be the one the instance's first step masked."""
    share = call.share(name)
    rec = instances(call).pop(key, None)
    if rec is None:
        raise call.refuse(f"no {key[0]} instance {key[1]} is waiting for its {name!r} here")
    if rec[0]() is not share or rec[1] != share._version:
        raise call.refuse(
            f"parameter {name!r} must be the share that instance {key[1]}'s first step "
            "masked, unmodified"
        )


def nonce_of(call: ProtocolCall) -> int:
    """The step's ``nonce`` parameter (its protocol instance)."""
    nonce = call.value("nonce")
    if type(nonce) is not int:
        raise call.refuse("a protocol step takes an int nonce")
    return nonce


def int_of(call: ProtocolCall, name: str) -> int:
    """The step's int parameter ``name``."""
    v = call.value(name)
    if type(v) is not int:
        raise call.refuse(f"parameter {name!r} is an int")
    return v


def party_seed(call: ProtocolCall, *last_only: str) -> Label:
    """A party's step runs on the seed the dealer delivered to it. The seed tells the
    party's place (its index among the session's parties), so the client cannot make two
    parties, or none, the first (``first``), nor leave out or add the dealer's corrections
    (``last_only``: given at the last party, None elsewhere). It names the session's
    parties too (:func:`bind_outputs`): this worker must be the one at the seed's place,
    and the dealer that delivered it none of them."""
    seed = call.material("seed", SEED, local=False)
    assert seed is not None
    group = seed_group(seed)
    parties = len(group)
    if not 0 <= seed.index < parties:
        raise call.refuse("a seed names the session's parties (a seed dealt unbound is refused)")
    if group[seed.index] != call.worker_id:
        raise call.refuse(
            f"the seed is party {seed.index}'s of {list(group)}, that is "
            f"{group[seed.index]!r}, not this worker's"
        )
    if seed.origin in group:
        raise call.refuse(f"the seed's dealer {seed.origin!r} is one of its parties")
    if "first" in call.args and call.value("first") is not (seed.index == 0):
        raise call.refuse(f"'first' must be {seed.index == 0} at party {seed.index}")
    last = seed.index == parties - 1
    for name in last_only:
        a = call.args.get(name)
        given = a is not None and not (a.entry is None and a.entries is None and a.value is None)
        if given != last:
            where = "the last party takes" if last else "only the last party takes"
            raise call.refuse(f"{where} the dealer's {name!r}")
    return seed


def dealer_seeds(call: ProtocolCall) -> None:
    """A dealer's step runs on the seeds it made, each party's in its place, all of one
    session's parties (:func:`bind_outputs`)."""
    seeds = call.materials("seeds", SEED, "the dealer's seeds", local=True)
    n = len(seeds)
    group = seed_group(seeds[0])
    for k, seed in enumerate(seeds):
        if seed.index != k or seed.extra[:1] != (n,):
            raise call.refuse(f"the seeds must be the {n} parties' seeds, in their order")
        if seed_group(seed) != group or call.worker_id in group:
            raise call.refuse("the seeds must be the seeds of one session's parties")


def seed_group(seed: Label) -> tuple[str, ...]:
    """The session's parties a seed names (its extra: their count, then their worker
    ids; :func:`mpc.protocols.seeds.steps.new_seed`), or ``()``."""
    e = seed.extra
    if not (e and type(e[0]) is int and len(e) == 1 + e[0] >= 3):
        return ()
    group = e[1:]
    if not all(type(w) is str for w in group) or len(set(group)) != len(group):
        return ()
    return tuple(group)


def is_last(seed: Label) -> bool:
    """Whether a seed (checked by :func:`party_seed`) is the last party's."""
    return seed.index == len(seed_group(seed)) - 1


def group_of(call: ProtocolCall) -> tuple[tuple[str, ...], bool]:
    """The session's parties that a step runs for, from its seed's label (a party's
    step) or its seeds' (a dealer's, then True), checked by :func:`party_seed` and
    :func:`dealer_seeds`; ``()`` for a step under no seed."""
    one = call.args.get("seed")
    if one is not None and one.label is not None and one.label.kind == SEED:
        return seed_group(one.label), False
    many = call.args.get("seeds")
    if many is not None and many.entries:
        first = Label.of(many.entries[0].sealed) if many.entries[0] is not None else None
        if first is not None and first.kind == SEED:
            return seed_group(first), True
    return (), False


def bind_outputs(call: ProtocolCall, seals: Any) -> Any:
    """The seals a step's rule returned, each output that may leave this worker bound to
    the session's computing parties (its label's ``to``; :mod:`pointers.worker.sealing`),
    so that its worker delivers it to them only, whatever the client names:

    - a party's output (a piece of an opening, masked by this party's share of a mask
      the dealer knows): to the session's parties, never the dealer nor another worker;
    - a dealer's output: with one delivery, to the last party (the party that takes the
      dealer's corrections, :func:`party_seed`), with more, to the parties.

    A rule may bind an output itself (the seeds, a packed round). An output that may leave
    and is bound to nobody is refused: protocol material travels within its session."""
    if not seals:
        return seals
    group: tuple[str, ...] | None = None
    dealer = False
    one = isinstance(seals, list) and type(seals[0]) is str
    out = []
    for sealed in [seals] if one else seals:
        label = Label.of(sealed) if sealed else None
        if label is not None and label.deliveries != 0 and not label.to:
            if group is None:
                group, dealer = group_of(call)
            if not group:
                raise call.refuse(
                    f"a {label.kind} would leave this worker bound to no session's parties"
                )
            to = (group[-1],) if dealer and label.deliveries == 1 else group
            sealed = replace(label, to=to).wire()
        out.append(sealed)
    return out[0] if one else out


def make_instance(
    call: ProtocolCall, records: dict[int, Any], weight: int, w: Any, *extra: Any
) -> None:
    """Record weight instance ``weight`` as made of the tensor ``w`` here (bound to that
    tensor, unmodified, and ``extra``): once per weight nonce; records whose tensor is gone
    are dropped."""
    for k in [k for k, rec in records.items() if rec[0]() is None]:
        del records[k]  # (instances whose weight is gone)
    if weight in records:
        raise call.refuse(f"weight instance {weight} was made before")
    records[weight] = (weakref.ref(w), w._version, *extra)


def instance_of(
    call: ProtocolCall, records: dict[int, Any], weight: int, w: Any
) -> tuple[Any, ...]:
    """The record of weight instance ``weight``, which must have been made of the tensor
    ``w`` here, unmodified since."""
    rec = records.get(weight)
    if rec is None or rec[0]() is not w or rec[1] != w._version:
        raise call.refuse(
            f"parameter 'w' must be the share that weight instance {weight} masked, unmodified"
        )
    return tuple(rec)
