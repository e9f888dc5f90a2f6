"""The parties' steps of an opening: pack a round's values (:func:`pack`) and open them from a party's piece and its peers' (:func:`open_unpack`).

Which values may be opened: those a step declared with ``opens`` (their kinds, each
opened by a sum or an XOR; :func:`mpc.protocols.step.step`), masked by this party for
the purpose, and each used once.

Where the pieces go: a party's piece (its share minus its share of a mask that the
dealer knows) is bound, by the step that masked it, to the session's computing parties
that the party's seed names (:func:`mpc.protocols.rules.bind_outputs`). Its worker
delivers it to those parties only, whatever peer the client names (never the dealer,
which would learn the value, nor a worker outside the session), and a delivered piece is
not sent on; a party opens a value only from its own piece and one from each other party
of the same session (:meth:`pointers.worker.sealing.ProtocolCall.pieces`).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.rules import OPENED, kept
from mpc.protocols.sizes import all_bytes, declared, nbytes, tensors
from mpc.protocols.step import XOR, opened_kinds, opens, step
from pointers.worker.sealing import ProtocolCall, seal

# -- rules --------------------------------------------------------------------------------


def _pack_rule(call: ProtocolCall) -> Any:
    """A party's shares of the values one round opens, packed: each must be a value this
    party masked to open (one kind of opening: sums or XORs), used up here, all of one
    session's parties, to whom the packed values alone may go (their ``to``)."""
    labels = call.materials("parts", opened_kinds(), "the values to open", local=True, consume=True)
    if len({opens(lb.kind) for lb in labels}) != 1:
        raise call.refuse("a packed opening is all sums or all XORs")
    group = labels[0].to
    if not group or any(lb.to != group for lb in labels):
        raise call.refuse("a packed opening packs values of one session's parties")
    parts = [
        [lb.kind, lb.nonce, lb.index, [int(d) for d in v.shape]]
        for lb, v in zip(labels, call.value("parts"))
    ]
    return [seal("packed", extra=tuple(parts), to=group)]


def _open_rule(call: ProtocolCall) -> Any:
    """Open one value (or a packed round of them) from this party's piece and each peer's,
    once; the opened values are sealed, for the instances' next steps."""
    labels = call.pieces("pieces")
    first = labels[0]
    shapes = call.value("shapes")
    if first.kind == "packed":
        parts = [list(p) for p in first.extra]
        if [p[3] for p in parts] != shapes:
            raise call.refuse("the shapes do not split the packed values")
    elif opens(first.kind) is not None:
        parts = [[first.kind, first.nonce, first.index, None]]
    else:
        raise call.refuse(f"a {first.kind} is not a value to open")
    xor = {opens(p[0]) for p in parts} == {XOR}
    if call.value("xor") is not xor:
        raise call.refuse("the opening's sum or XOR does not fit its values")
    return [kept(OPENED + p[0], p[1], p[2]) for p in parts]


# -- sizes --------------------------------------------------------------------------------


def _pack_size(p: dict[str, Any]) -> int:
    """The packed copy of the parts."""
    return declared(all_bytes(p))


def _open_size(p: dict[str, Any]) -> int:
    """The sum (or XOR) of the pieces, in one new tensor of a piece's size (the values
    are views of it)."""
    return declared(max((nbytes(t) for t in tensors(p.get("pieces"))), default=0))


# -- the steps ----------------------------------------------------------------------------


@step(rule=_pack_rule, size=_pack_size, makes_material=True)
def pack(ctx: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """A party's shares of the values one round opens, as one flat tensor: they reach
    each peer in one delivery instead of one per value (see :func:`split`)."""
    if not (isinstance(parts, list) and parts and all(isinstance(p, torch.Tensor) for p in parts)):
        raise TypeError("pack takes a non-empty list of tensors")
    if any(p.dtype != parts[0].dtype for p in parts):
        raise TypeError("pack takes tensors of one dtype")
    return torch.cat([p.reshape(-1) for p in parts])


def split(packed: torch.Tensor, shapes: list[list[int]]) -> list[torch.Tensor]:
    """The values :func:`pack` put in ``packed``, with their ``shapes`` (views: no copy)."""
    if not isinstance(packed, torch.Tensor) or packed.dim() != 1:
        raise TypeError("unpack takes the flat tensor pack made")
    if not (isinstance(shapes, list) and shapes):
        raise ValueError("unpack takes a non-empty list of shapes")
    sizes = []
    for shape in shapes:
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise ValueError(f"a shape is a list of sizes, got {shape!r}")
        n = 1
        for d in shape:
            n *= d
        sizes.append(n)
    if sum(sizes) != packed.numel():
        raise ValueError(f"shapes of {sum(sizes)} elements for a packed tensor of {packed.numel()}")
    return [part.view(shape) for part, shape in zip(packed.split(sizes), shapes)]


@step(rule=_open_rule, size=_open_size, makes_material=True)
def open_unpack(
    ctx: Any, pieces: list[torch.Tensor], shapes: list[list[int]], xor: bool
) -> list[torch.Tensor]:
    """Open a round's packed values (or one value) at this party: the sum (``xor``: the
    XOR) of its own packed share and the ones its peers sent it (``pieces``; not modified:
    in process they are the senders' own tensors), split into the values with their
    ``shapes`` (views of one new tensor; see :func:`pack` and :func:`split`)."""
    if type(xor) is not bool:
        raise TypeError("open_unpack's xor flag is a bool")
    if not (isinstance(pieces, list) and all(isinstance(t, torch.Tensor) for t in pieces)):
        raise ValueError("the pieces of an opening are tensors")
    total = open_pieces([t.reshape(-1) for t in pieces], xor)
    return split(total, shapes)


def open_pieces(pieces: list[torch.Tensor], xor: bool) -> torch.Tensor:
    """The sum (``xor``: the XOR) of a party's own share and the ones its peers sent it,
    in a new tensor (the pieces are not modified: in process they are the senders' own)."""
    if not (
        isinstance(pieces, list)
        and len(pieces) >= 2
        and all(isinstance(t, torch.Tensor) and t.dim() == 1 for t in pieces)
        and all(t.shape == pieces[0].shape and t.dtype == pieces[0].dtype for t in pieces)
    ):
        raise ValueError(
            "the pieces of an opening are two or more flat tensors of one shape and dtype"
        )
    if xor:
        total = torch.bitwise_xor(pieces[0], pieces[1])
        for piece in pieces[2:]:
            total ^= piece
    else:
        total = torch.add(pieces[0], pieces[1])
        for piece in pieces[2:]:
            total += piece
    return total
