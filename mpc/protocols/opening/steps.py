"""The parties' steps of an opening: pack a round's values (:func:`pack`) and open them from a party's piece and its peers' (:func:`open_unpack`; :func:`open_bits` for 0/1 values that travel packed 64 to a word).

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

from mpc.math.bits import unpack_bits
from mpc.protocols.rules import OPENED, kept
from mpc.protocols.sizes import WORD, all_bytes, declared, nbytes, tensors
from mpc.protocols.step import BITS, XOR, opened_kinds, opens, step
from pointers.worker.sealing import ProtocolCall, seal

# -- rules --------------------------------------------------------------------------------


def _pack_rule(call: ProtocolCall) -> Any:
    """A party's shares of the values one round opens, packed: each must be a value this
    party masked to open (one kind of opening: sums or XORs), used up here, all of one
    session's parties, to whom the packed values alone may go (their ``to``)."""
    labels = call.materials("parts", opened_kinds(), "the values to open", local=True, consume=True)
    hows = {opens(lb.kind) for lb in labels}
    if BITS in hows:
        raise call.refuse("bits packed 64 to a word open one value at a time (open_bits)")
    if len(hows) != 1:
        raise call.refuse("a packed opening is all sums or all XORs")
    group = labels[0].to
    if not group or any(lb.to != group for lb in labels):
        raise call.refuse("a packed opening packs values of one session's parties")
    values = call.value("parts")
    mixed = len({v.dtype for v in values}) > 1  # (then each part's dtype: packed as bytes)
    parts = [
        [lb.kind, lb.nonce, lb.index, [int(d) for d in v.shape]]
        + ([dtype_name(v.dtype)] if mixed else [])
        for lb, v in zip(labels, values)
    ]
    return [seal("packed", extra=tuple(parts), to=group)]


#: the dtypes a round opens packed as bytes with others of other dtypes (by name)
PACKED_DTYPES = {str(t).removeprefix("torch."): t for t in (torch.int64, torch.uint8)}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _parts(call: ProtocolCall) -> list[list[Any]]:
    """The values one opening's pieces hold: [kind, nonce, index, shape of the piece (a
    packed round's part) or None (a single value)]."""
    first = call.pieces("pieces")[0]
    if first.kind == "packed":
        return [list(p) for p in first.extra]
    if opens(first.kind) is not None:
        return [[first.kind, first.nonce, first.index, None]]
    raise call.refuse(f"a {first.kind} is not a value to open")


def _open_rule(call: ProtocolCall) -> Any:
    """Open one value (or a packed round of them) from this party's piece and each peer's,
    once; the opened values are sealed, for the instances' next steps."""
    parts = _parts(call)
    if parts[0][3] is not None and [p[3] for p in parts] != call.value("shapes"):
        raise call.refuse("the shapes do not split the packed values")
    dtypes = call.value("dtypes")
    packed_as = [p[4] for p in parts] if all(len(p) == 5 for p in parts) else None
    if dtypes != packed_as:
        raise call.refuse("the dtypes do not split the packed bytes")
    hows = {opens(p[0]) for p in parts}
    if BITS in hows:
        raise call.refuse("bits packed 64 to a word open with open_bits")
    if call.value("xor") is not (hows == {XOR}):
        raise call.refuse("the opening's sum or XOR does not fit its values")
    return [kept(OPENED + p[0], p[1], p[2]) for p in parts]


def _open_bits_rule(call: ProtocolCall) -> Any:
    """Open one value of 0/1 elements packed 64 to a word, as :func:`_open_rule` opens
    others, to the shape the step that masked it sealed (``extra``): an opening cannot
    reshape the bits (a [n, 1] d broadcast against [n] values would mix the elements)."""
    first = call.pieces("pieces")[0]
    if opens(first.kind) != BITS:
        raise call.refuse("open_bits opens one value declared as bits (not packed with others)")
    if call.value("shape") != list(first.extra):
        raise call.refuse(f"the bits are of shape {list(first.extra)}, not {call.value('shape')}")
    return [kept(OPENED + first.kind, first.nonce, first.index)]


def _count(shape: Any) -> int:
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"a shape is a list of sizes, got {shape!r}")
    n = 1
    for d in shape:
        n *= d
    return n


# -- sizes --------------------------------------------------------------------------------


def _pack_size(p: dict[str, Any]) -> int:
    """The packed copy of the parts."""
    return declared(all_bytes(p))


def _open_size(p: dict[str, Any]) -> int:
    """The sum (or XOR) of the pieces, in one new tensor of a piece's size (the values
    are views of it)."""
    return declared(max((nbytes(t) for t in tensors(p.get("pieces"))), default=0))


def _open_bits_size(p: dict[str, Any]) -> int:
    """The XOR of the pieces, and the unpacked bits (with their shifted copy: two words
    an element)."""
    shape = p.get("shape")
    bits = _count(shape) if isinstance(shape, list) else 0
    pieces = max((nbytes(t) for t in tensors(p.get("pieces"))), default=0)
    return declared(pieces + 2 * WORD * bits)


# -- the steps ----------------------------------------------------------------------------


@step(rule=_pack_rule, size=_pack_size, makes_material=True)
def pack(ctx: Any, parts: list[torch.Tensor]) -> torch.Tensor:
    """A party's shares of the values one round opens, as one flat tensor: they reach
    each peer in one delivery instead of one per value (see :func:`split`)."""
    if not (isinstance(parts, list) and parts and all(isinstance(p, torch.Tensor) for p in parts)):
        raise TypeError("pack takes a non-empty list of tensors")
    if any(p.dtype != parts[0].dtype for p in parts):  # (mixed: as bytes, in one delivery)
        if any(dtype_name(p.dtype) not in PACKED_DTYPES for p in parts):
            raise TypeError(f"pack takes tensors of one dtype, or of {sorted(PACKED_DTYPES)}")
        return torch.cat([p.reshape(-1).contiguous().view(torch.uint8) for p in parts])
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
    ctx: Any,
    pieces: list[torch.Tensor],
    shapes: list[list[int]],
    xor: bool,
    dtypes: list[str] | None = None,
) -> list[torch.Tensor]:
    """Open a round's packed values (or one value) at this party: the sum (``xor``: the
    XOR) of its own packed share and the ones its peers sent it (``pieces``; not modified:
    in process they are the senders' own tensors), split into the values with their
    ``shapes`` (views of one new tensor; see :func:`pack` and :func:`split`). ``dtypes``:
    values of several dtypes packed as bytes, each opened in its own (a sum modulo its
    width)."""
    if type(xor) is not bool:
        raise TypeError("open_unpack's xor flag is a bool")
    if not (isinstance(pieces, list) and all(isinstance(t, torch.Tensor) for t in pieces)):
        raise ValueError("the pieces of an opening are tensors")
    if dtypes is None:
        total = open_pieces([t.reshape(-1) for t in pieces], xor)
        return split(total, shapes)
    if not (
        isinstance(dtypes, list)
        and len(dtypes) == len(shapes)
        and all(d in PACKED_DTYPES for d in dtypes)
        and all(t.dtype == torch.uint8 for t in pieces)
    ):
        raise ValueError(f"packed bytes open as {sorted(PACKED_DTYPES)}, one dtype a shape")
    types = [PACKED_DTYPES[d] for d in dtypes]
    sizes = [_count(sh) * t.itemsize for sh, t in zip(shapes, types)]
    flat = [t.reshape(-1) for t in pieces]
    if any(t.numel() != sum(sizes) for t in flat):
        raise ValueError(f"packed pieces of {sum(sizes)} bytes for these shapes and dtypes")
    out = []
    for k, (shape, dtype) in enumerate(zip(shapes, types)):
        start = sum(sizes[:k])
        part = [t[start : start + sizes[k]].view(dtype) for t in flat]
        out.append(open_pieces(part, xor).view(shape))
    return out


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


@step(rule=_open_bits_rule, size=_open_bits_size, makes_material=True)
def open_bits(ctx: Any, pieces: list[torch.Tensor], shape: list[int]) -> torch.Tensor:
    """Open a value of 0/1 elements whose shares travel packed 64 to a word
    (:mod:`mpc.math.bits`): the XOR of this party's packed share and its peers'
    (``pieces``, not modified), unpacked to ``shape``."""
    if not (isinstance(pieces, list) and all(isinstance(t, torch.Tensor) for t in pieces)):
        raise ValueError("the pieces of an opening are tensors")
    return unpack_bits(open_pieces([t.reshape(-1) for t in pieces], xor=True), list(shape))
