"""Opening values among the parties, the client's side: a :class:`Round` of values opened
together (one latency), :func:`open_among` and :func:`exchange` (each party gets its
peers' pieces and opens the value in the step that uses it). The client never sees an
opened value: each party holds it, sealed for the instance's next step."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mpc import accounting, config
from mpc.protocols.opening.steps import open_bits, open_unpack, pack
from mpc.protocols.parties import I64, Out, Shares, at_parties, run_step
from mpc.session import Session

#: dtypes whose values one packed opening carries together, as bytes
MIXED = {torch.int64, torch.uint8}


class Round:
    """Values to open among the parties together, in one round: ``add`` each (it returns
    a handle), ``open`` once, then read each handle's ``.value`` (per party, a pointer to
    the opened value there)."""

    def __init__(self, session: Session, xor: bool = False, bits: bool = False) -> None:
        """``xor``: the values open by XOR; ``bits``: they are 0/1 values whose shares
        travel packed 64 to a word (each added with its unpacked ``shape``)."""
        self.session, self.xor, self.bits = session, xor, bits
        self._values: list[Shares] = []
        self._shapes: list[list[int]] = []
        self._handles: list[Opened] = []

    def add(self, shares: Shares, shape: list[int] | None = None) -> Opened:
        """Add a value to open; in a round of ``bits``, ``shares`` are the parties'
        packed words (:func:`mpc.math.bits.pack_bits`) of 0/1 values of ``shape``."""
        if self.bits != (shape is not None):
            raise ValueError("internal: a round of bits takes each value's shape, others none")
        handle = Opened()
        self._values.append(shares)
        self._shapes.append(shape or [])
        self._handles.append(handle)
        return handle

    def open(self, count: bool = True) -> None:
        """``count=False``: the values ride in a round already counted."""
        if self._values:
            opened = (
                open_bits_among(self.session, self._values, self._shapes, count)
                if self.bits
                else open_among(self.session, self._values, self.xor, count)
            )
            for h, v in zip(self._handles, opened):
                h.value = v
        elif count:
            accounting.count_round()
        self._values, self._shapes, self._handles = [], [], []


class Opened:
    """A value opened in a :class:`Round` (set when the round opens)."""

    value: Shares


def open_among(
    session: Session, values: list[Shares], xor: bool = False, count: bool = True
) -> list[Shares]:
    """Open each [v] among the parties in one round: party i sends v_i to every other
    party, then each party sums (``xor``: XORs) what it holds. Returns, per value, a
    pointer to the opened value at each party. The client never sees an opened value.
    ``count=False``: the values travel in a round already counted (same messages batch).
    Several values of one dtype travel packed (:func:`~mpc.protocols.opening.steps.pack`):
    one delivery per peer per round (per :data:`~mpc.config.PIECE_BYTES` of values), so a
    round costs one latency, not one per value."""
    if count:
        accounting.count_round()
    dtypes = {s.dtype for shares in values for s in shares}
    if len(values) > 1 and (len(dtypes) == 1 or dtypes <= MIXED):
        # one delivery per peer for the whole round (one latency, not one per value), in
        # packs of at most mpc.config.PIECE_BYTES (a network message is at most 256 MiB by default)
        out: list[Shares] = []
        for group in _packs(values):
            out += (
                _open_packed(session, group, xor)
                if len(group) > 1
                else [_open_one(session, group[0], xor)]
            )
        return out
    return [_open_one(session, shares, xor) for shares in values]


def open_bits_among(
    session: Session, values: list[Shares], shapes: list[list[int]], count: bool = True
) -> list[Shares]:
    """Open 0/1 values whose XOR shares the parties hold packed 64 to a word
    (:func:`mpc.math.bits.pack_bits`): one bit an element on the wire, not a word; each
    value is its own delivery (its shape is the one its masking step sealed). Returns,
    per value, a pointer at each party to the opened bits, unpacked to ``shapes``."""
    if count:
        accounting.count_round()
    out = []
    for shares, shape in zip(values, shapes):
        pieces = exchange(session, shares, count=False)
        metas: Out = [(tuple(shape), I64)]
        out += at_parties(session, open_bits, _args(pieces, shape), metas)
    return out


def _args(pieces: list[Shares], shape: list[int]) -> Callable[[int], list[Any]]:
    return lambda j: [pieces[j], shape]


def _packs(values: list[Shares]) -> list[list[Shares]]:
    """Consecutive groups of ``values`` of at most :data:`~mpc.config.PIECE_BYTES` each (a larger
    value alone)."""
    groups: list[list[Shares]] = []
    size = 0
    for shares in values:
        n = shares[0].numel() * shares[0].element_size()
        if groups and size + n <= config.PIECE_BYTES:
            groups[-1].append(shares)
            size += n
        else:
            groups.append([shares])
            size = n
    return groups


def _open_packed(session: Session, values: list[Shares], xor: bool) -> list[Shares]:
    """Each party packs its shares of ``values`` (one dtype, or int64 and uint8 values as
    bytes), the packed sums are opened (each party sums or XORs the pieces, each value in
    its dtype, and splits the sum in one step)."""
    parties = session.parties
    types = [shares[0].dtype for shares in values]
    shapes = [[int(d) for d in shares[0].shape] for shares in values]
    mixed = len(set(types)) > 1
    if mixed:
        dtype, total = torch.uint8, sum(math.prod(s) * t.itemsize for s, t in zip(shapes, types))
    else:
        dtype, total = types[0], sum(math.prod(s) for s in shapes)
    packed = [
        run_step(p, pack, [[shares[i] for shares in values]], out=[((total,), dtype)])[0]
        for i, p in enumerate(parties)
    ]
    pieces = exchange(session, packed, count=False)
    metas: Out = [(tuple(s), t) for s, t in zip(shapes, types)]
    names = [str(t).removeprefix("torch.") for t in types] if mixed else None

    def args(j: int) -> list[Any]:
        return [pieces[j], shapes, xor] + ([names] if mixed else [])

    return at_parties(session, open_unpack, args, metas)


def _open_one(session: Session, shares: Shares, xor: bool) -> Shares:
    """Each party opens the value from its share and its peers' (one step: the workers
    check that these are the pieces of one value to open, used once)."""
    pieces = exchange(session, shares, count=False)
    meta: Out = [(tuple(shares[0].shape), shares[0].dtype)]
    shape = [[int(d) for d in shares[0].shape]]
    (opened,) = at_parties(session, open_unpack, lambda j: [pieces[j], shape, xor], meta)
    return opened


def exchange(session: Session, shares: Shares, count: bool = True) -> list[Shares]:
    """One round in which each party sends its share of [v] to every other party, without
    the sums: per party j, [v_j, then v_i from each other party i], for a step that opens
    v itself (adds or XORs the pieces) as it uses it, one message per party fewer than
    :func:`open_among`. The client never sees a piece."""
    if count:
        accounting.count_round()
    pieces: list[Shares] = [[s] for s in shares]
    for i, s in enumerate(shares):
        for j, pj in enumerate(session.parties):
            if i != j:
                pieces[j].append(s.copy_to(pj, lend=True))  # only read at both ends
    return pieces


__all__ = ["Opened", "Round", "exchange", "open_among", "open_bits_among"]
