"""Message encoding: msgpack for structure, tensors as out-of-band buffers.

Nothing here uses pickle. A message is a msgpack document (the *header*) plus a list of
tensor buffers. In the header a tensor is an extension value holding its buffer index,
dtype and shape; every other value must be a plain msgpack value or one of the few torch
types below. The decoder accepts only these types and rejects everything else with
:class:`~pointers.errors.DecodeError`.

Transports decide how buffers travel: the in-process transport hands the tensors over,
and the receiver copies them, except where the sender vouches that neither side will
change them (``decode(..., copy=False)``: a donated move, or an opening's shares lent with
``SendToPeer.lend``), when both keep one tensor; a network transport sends their raw bytes
after the header.

Limits (what a hostile peer cannot get past, checked before anything is built): a header
holds at most :data:`MAX_HEADER_BYTES` bytes; values nest at most :data:`MAX_DEPTH` levels,
where every array, map and extension value counts one level (so a tuple counts two: its
extension and the array inside; a tensor three), and at most :data:`MAX_EXT_DEPTH`
extension values sit inside one another (each is decoded by a nested ``unpackb``, which
takes about 40 KB of C stack: this bound, not Python's recursion limit, is what keeps the
stack safe); every declared array, map, string, binary or extension length must fit in the
bytes that follow it; a header decodes into at most :func:`max_objects` allocated objects
(one per two bytes), so decoding takes at most a few tens of times the header's size in
memory (Python objects are that much larger than their msgpack form). A message carries
at most :data:`MAX_BUFFERS` tensor buffers, each used once, and a tensor's declared dtype
and shape must match its buffer's size exactly before anything is allocated. :func:`encode`
refuses what :func:`decode` would refuse. :func:`unpack_document` applies the same
structural limits, without the header's size cap, to stand-alone documents from untrusted
bytes (serialised plans and protocols, which carry their tensors).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from pointers.errors import DecodeError

# Extension type codes.
_EXT_TENSOR = 1
_EXT_DTYPE = 2
_EXT_DEVICE = 3
_EXT_REF = 4
_EXT_LAYOUT = 5
_EXT_MEMFMT = 6
_EXT_TUPLE = 7
_EXT_SLOT = 8
_EXT_SLOTREF = 9
_REF = struct.Struct("<q")

# Limits of a header (see the module's docstring).
# The largest legitimate headers are stored plans and programs (tens of KB); the deepest
# nest about 25 levels (a plan's node argument may hold lists 16 deep); :func:`encode`
# puts an extension inside an extension only for a tensor in a tuple (2 levels: a tuple
# inside a tuple travels as a list).
MAX_HEADER_BYTES = 8 << 20
MAX_DEPTH = 64  # arrays, maps and extension values around a value
MAX_EXT_DEPTH = 16  # tuples / tensors inside one another: 16 x ~40 KB of C stack at most
MAX_BUFFERS = 1 << 12  # tensor buffers of one message
MAX_TENSOR_DIMS = 64
_MAX_NUMEL = 1 << 62
# A short header with few bytes that could start a container needs no exact scan: it
# cannot nest deeper than that count, nor hold more values than bytes, and its containers'
# declared sizes cannot add up to much (msgpack bounds each by the header's length).
_FAST_MAX_BYTES = 2048


def max_objects(header_bytes: int) -> int:
    """The most allocated objects (containers, strings, numbers outside the small-int
    cache, extension values) a header of ``header_bytes`` bytes may decode into. Ordinary
    messages need fewer than one per four bytes; the densest legitimate ones (tensor
    metadata: ``[[3], [1], "float32"]`` is four objects in 13 bytes) about one per three."""
    return header_bytes // 2 + 1024


_DTYPES: dict[str, torch.dtype] = {
    str(d).removeprefix("torch."): d
    for d in (
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint8,
        torch.bool,
        torch.complex64,
        torch.complex128,
    )
}
_DTYPE_NAMES = {d: n for n, d in _DTYPES.items()}
_LAYOUTS = {"strided": torch.strided}
_MEMFMTS = {
    "contiguous_format": torch.contiguous_format,
    "preserve_format": torch.preserve_format,
    "channels_last": torch.channels_last,
}
_MEMFMT_NAMES = {v: k for k, v in _MEMFMTS.items()}


@dataclass(frozen=True, slots=True)
class Ref:
    """A reference to an object held by the worker that receives the message."""

    obj_id: int


@dataclass(frozen=True, slots=True)
class Slot:
    """In a stored program: an int bound at each run (an object id or a nonce)."""

    index: int


@dataclass(frozen=True, slots=True)
class SlotRef:
    """In a stored program: a reference to the object whose id is bound to a slot."""

    index: int


def ref_id(o: Any) -> int | None:
    """The object id of a reference in either form (``Ref`` or its wire ``ExtType``)."""
    if isinstance(o, Ref):
        return o.obj_id
    if isinstance(o, msgpack.ExtType) and o.code == _EXT_REF and len(o.data) == _REF.size:
        return int(_REF.unpack(o.data)[0])
    return None


def ref_ext(obj_id: int) -> msgpack.ExtType:
    """The wire form of :class:`Ref` built directly (skips the encoder's fallback hook)."""
    return msgpack.ExtType(_EXT_REF, _REF.pack(obj_id))


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"dtype {dtype} cannot be sent to a worker") from None


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name]
    except KeyError:
        raise DecodeError(f"unknown dtype {name!r}") from None


# -- header limits -------------------------------------------------------------------------
# bytes that may start an array, a map or an extension value
_CONTAINER_BYTES = bytes(
    [*range(0x80, 0xA0), 0xC7, 0xC8, 0xC9, *range(0xD4, 0xD9), *range(0xDC, 0xE0)]
)
_FIXED, _VAR, _ARRAY, _MAP, _EXT, _BAD = range(6)


def _byte_table() -> list[tuple[int, int, int]]:
    """For each first byte of a msgpack value: (kind, size, allocates). ``size``: payload
    bytes (fixed), bytes of the length field (negative for arrays/maps/extensions, which
    may also carry their count or data size in the byte itself), or the count."""
    t: list[tuple[int, int, int]] = [(_BAD, 0, 0)] * 256
    for b in range(0x00, 0x80):
        t[b] = (_FIXED, 0, 0)  # positive fixint (cached small ints)
    for b in range(0x80, 0x90):
        t[b] = (_MAP, b & 0x0F, 1)
    for b in range(0x90, 0xA0):
        t[b] = (_ARRAY, b & 0x0F, 1)
    for b in range(0xA0, 0xC0):
        t[b] = (_FIXED, b & 0x1F, 1)  # fixstr
    for b in range(0xE0, 0x100):
        t[b] = (_FIXED, 0, 1)  # negative fixint
    t[0xC0] = t[0xC2] = t[0xC3] = (_FIXED, 0, 0)  # nil, false, true
    for b, k in ((0xC4, 1), (0xC5, 2), (0xC6, 4), (0xD9, 1), (0xDA, 2), (0xDB, 4)):
        t[b] = (_VAR, k, 1)  # bin / str
    for b, k in ((0xC7, 1), (0xC8, 2), (0xC9, 4)):
        t[b] = (_EXT, -k, 1)
    for b, n in ((0xD4, 1), (0xD5, 2), (0xD6, 4), (0xD7, 8), (0xD8, 16)):
        t[b] = (_EXT, n, 1)  # fixext
    for b, n, alloc in (
        (0xCA, 4, 1), (0xCB, 8, 1),  # float
        (0xCC, 1, 0), (0xCD, 2, 1), (0xCE, 4, 1), (0xCF, 8, 1),  # uint (uint8: cached)
        (0xD0, 1, 1), (0xD1, 2, 1), (0xD2, 4, 1), (0xD3, 8, 1),  # int
    ):  # fmt: skip
        t[b] = (_FIXED, n, alloc)
    t[0xDC], t[0xDD] = (_ARRAY, -2, 1), (_ARRAY, -4, 1)
    t[0xDE], t[0xDF] = (_MAP, -2, 1), (_MAP, -4, 1)
    return t


_TABLE = _byte_table()
_KINDS = [k for k, _, _ in _TABLE]
_SIZES = [n for _, n, _ in _TABLE]
_ALLOCS = [a for _, _, a in _TABLE]
_STEPS = [1 + n if k == _FIXED else 0 for k, n, _ in _TABLE]  # whole size of a fixed value


def _scan(
    data: bytes,
    pos: int,
    end: int,
    depth: int,
    ext_depth: int,
    budget: int,
    what: str = "a message header",
) -> tuple[int, int]:
    """Walk the msgpack value at ``data[pos:end]`` without building anything, checking the
    limits; return where it ends and how many objects the budget has left. ``what`` names
    the value in errors."""
    steps, kinds, sizes, allocs = _STEPS, _KINDS, _SIZES, _ALLOCS
    stack: list[int] = []  # values still to read in each enclosing container
    left = 1  # values still to read at this level
    while True:
        while not left:
            if not stack:
                if budget < 0:
                    raise DecodeError(f"{what} decodes into too many objects")
                return pos, budget
            left = stack.pop()
        if pos >= end:
            raise DecodeError(f"{what} ends in the middle of a value")
        b = data[pos]
        step = steps[b]
        if step:  # a run of fixed-size values (numbers, short strings, nil, booleans)
            while True:
                budget -= allocs[b]
                pos += step
                left -= 1
                if not left or pos >= end:
                    break
                b = data[pos]
                step = steps[b]
                if not step:
                    break
            if pos > end:
                raise DecodeError(f"{what} ends in the middle of a value")
            continue
        left -= 1
        kind = kinds[b]
        size = sizes[b]
        budget -= allocs[b]
        pos += 1
        if kind == _ARRAY or kind == _MAP:
            if size < 0:
                n = int.from_bytes(data[pos : pos - size], "big")
                pos -= size
            else:
                n = size
            if depth + len(stack) >= MAX_DEPTH:
                raise DecodeError(f"{what} nests deeper than {MAX_DEPTH} levels")
            if budget < 0:
                raise DecodeError(f"{what} decodes into too many objects")
            if kind == _MAP:
                n *= 2
            if n > end - pos:  # every value takes at least one byte
                raise DecodeError(f"{what} declares {n} values in {end - pos} bytes")
            if n:
                stack.append(left)
                left = n
        elif kind == _VAR:
            n = int.from_bytes(data[pos : pos + size], "big")
            pos += size
            if n > end - pos:
                if pos > end:
                    raise DecodeError(f"{what} ends in the middle of a value")
                raise DecodeError(
                    f"{what} declares a string or binary of {n} bytes in {end - pos} bytes"
                )
            pos += n
        elif kind == _EXT:
            if size < 0:
                n = int.from_bytes(data[pos : pos - size], "big")
                pos -= size
            else:
                n = size
            if pos >= end:
                raise DecodeError(f"{what} ends in the middle of a value")
            code = data[pos]
            pos += 1
            if pos + n > end:
                raise DecodeError(f"{what} ends in the middle of an extension value")
            level = depth + len(stack) + 1
            if level > MAX_DEPTH:
                raise DecodeError(f"{what} nests deeper than {MAX_DEPTH} levels")
            if code == _EXT_TUPLE or code == _EXT_TENSOR:  # decoded by a nested unpackb
                if ext_depth >= MAX_EXT_DEPTH:
                    raise DecodeError(f"{what} nests tuples deeper than {MAX_EXT_DEPTH} levels")
                inner, budget = _scan(data, pos, pos + n, level, ext_depth + 1, budget, what)
                if inner != pos + n:
                    raise DecodeError("an extension value holds more than one value")
            pos += n
        else:
            raise DecodeError(f"{what} holds the invalid byte 0x{b:02x}")
        if pos > end:
            raise DecodeError(f"{what} ends in the middle of a value")


def check_header(header: Any) -> bytes:
    """``header`` as bytes, once it is known to keep the limits (size, nesting, declared
    lengths, objects); raises :class:`DecodeError` otherwise. A short header with few
    nested values costs a translate (about 0.2 us); the others an exact scan in Python
    (about 0.1 us per value, without building anything)."""
    data = header if type(header) is bytes else bytes(header)
    n = len(data)
    if n > MAX_HEADER_BYTES:
        raise DecodeError(
            f"a message header of {n} bytes exceeds the limit of {MAX_HEADER_BYTES} bytes"
        )
    if n > MAX_DEPTH:
        possible = n - len(data.translate(None, _CONTAINER_BYTES))
        if possible > MAX_DEPTH or n > _FAST_MAX_BYTES:
            end, _ = _scan(data, 0, n, 0, 0, max_objects(n))
            if end != n:
                raise DecodeError(f"{n - end} unexpected bytes after a message header's value")
    return data


# msgpack's max_*_len limits: ``unpackb`` sets them from ``len(packed)`` by itself (no
# string, binary, array or extension length past the bytes present, no map of more than
# half as many entries; MAX_HEADER_BYTES caps ``len(packed)``). Passing them costs about a
# microsecond a call, so the decoders below rely on that; tests/test_wire_limits.py checks
# that it stays so.


def unpack_limited(
    data: Any,
    ext_hook: Any = msgpack.ExtType,
    *,
    max_str_len: int = MAX_HEADER_BYTES,
    max_bin_len: int = MAX_HEADER_BYTES,
    max_array_len: int = MAX_HEADER_BYTES,
    max_map_len: int = MAX_HEADER_BYTES,
) -> Any:
    """``msgpack.unpackb`` of a header within the limits (see :func:`check_header`), with
    msgpack's ``max_*_len`` (from the header's length) lowered to the caps given. Raises
    :class:`DecodeError` on a header past the limits, msgpack's own errors on a malformed
    one."""
    raw = check_header(data)
    n = len(raw)
    return msgpack.unpackb(
        raw,
        raw=False,
        strict_map_key=True,
        ext_hook=ext_hook,
        max_str_len=min(n, max_str_len),
        max_bin_len=min(n, max_bin_len),
        max_array_len=min(n, max_array_len),
        max_map_len=min(n // 2, max_map_len),
        max_ext_len=n,
    )


def unpack_document(
    data: Any,
    ext_hook: Any = msgpack.ExtType,
    *,
    max_bytes: int | None = None,
    what: str = "the document",
) -> Any:
    """``msgpack.unpackb`` of a stand-alone msgpack document from untrusted bytes (a
    serialised plan or protocol), within a header's structural limits but not its size
    cap: values nest at most :data:`MAX_DEPTH` levels (and :data:`MAX_EXT_DEPTH`
    extension values), every declared array, map, string, binary or extension length
    fits in the bytes that follow it, the document decodes into at most
    :func:`max_objects` objects, and msgpack's ``max_*_len`` are set from the document's
    length. Documents may exceed :data:`MAX_HEADER_BYTES` (a plan carries its tensors);
    ``max_bytes``, if given, caps their size. ``what`` names the document in errors.

    Raises :class:`DecodeError` on anything past the limits or malformed (never msgpack's
    own errors), before building anything on a limit's account."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise DecodeError(f"{what} must be bytes, not {type(data).__name__}")
    raw = data if type(data) is bytes else bytes(data)
    n = len(raw)
    if max_bytes is not None and n > max_bytes:
        raise DecodeError(f"{what} of {n} bytes exceeds the limit of {max_bytes} bytes")
    # (always the exact scan, unlike check_header: documents are few, and so every limit
    # gets the same error whatever the document's length)
    end, _ = _scan(raw, 0, n, 0, 0, max_objects(n), what)
    if end != n:
        raise DecodeError(f"{n - end} unexpected bytes after the value of {what}")
    try:
        return msgpack.unpackb(
            raw,
            raw=False,
            strict_map_key=True,
            ext_hook=ext_hook,
            max_str_len=n,
            max_bin_len=n,
            max_array_len=n,
            max_map_len=n // 2,
            max_ext_len=n,
        )
    except DecodeError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise DecodeError(f"{what} is malformed msgpack: {type(e).__name__}: {e}") from None


def encode(obj: Any) -> tuple[bytes, list[torch.Tensor]]:
    """Encode ``obj`` into a msgpack header and a list of contiguous tensor buffers.

    Raises ``TypeError`` for a value that cannot travel, or for a message that a worker
    would refuse (past the limits in this module's docstring)."""
    buffers: list[torch.Tensor] = []
    nested = 0  # extension values being packed inside one another

    def default(o: Any) -> msgpack.ExtType:
        nonlocal nested
        if isinstance(o, torch.Tensor):
            if type(o) is not torch.Tensor and not isinstance(o, torch.nn.Parameter):
                raise TypeError(f"cannot encode a {type(o).__name__} as a plain tensor")
            t = o.detach()
            if t.device.type != "cpu":
                t = t.cpu()
            if not t.is_contiguous():
                t = t.contiguous()
            buffers.append(t)
            meta = [len(buffers) - 1, dtype_name(t.dtype), list(t.shape)]
            return msgpack.ExtType(_EXT_TENSOR, msgpack.packb(meta))
        if isinstance(o, Ref):
            return msgpack.ExtType(_EXT_REF, _REF.pack(o.obj_id))
        if isinstance(o, Slot):
            return msgpack.ExtType(_EXT_SLOT, _REF.pack(o.index))
        if isinstance(o, SlotRef):
            return msgpack.ExtType(_EXT_SLOTREF, _REF.pack(o.index))
        if isinstance(o, torch.dtype):
            return msgpack.ExtType(_EXT_DTYPE, dtype_name(o).encode())
        if isinstance(o, torch.device):
            return msgpack.ExtType(_EXT_DEVICE, str(o).encode())
        if isinstance(o, torch.layout):
            if o is not torch.strided:
                raise TypeError(f"layout {o} cannot be sent to a worker")
            return msgpack.ExtType(_EXT_LAYOUT, b"strided")
        if isinstance(o, torch.memory_format):
            return msgpack.ExtType(_EXT_MEMFMT, _MEMFMT_NAMES[o].encode())
        if isinstance(o, tuple):
            if nested >= MAX_EXT_DEPTH:
                raise ValueError(f"tuples nest deeper than the {MAX_EXT_DEPTH} levels allowed")
            nested += 1
            try:
                return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(list(o), default=default))
            finally:
                nested -= 1
        if isinstance(o, int) and not isinstance(o, bool):  # an int subclass (a RunValue)
            return int(o)  # type: ignore[return-value]
        raise TypeError(f"cannot encode a value of type {type(o).__name__} in a message")

    try:
        header = msgpack.packb(obj, default=default, strict_types=True)
        if len(buffers) > MAX_BUFFERS:
            raise ValueError(f"{len(buffers)} tensors, more than the {MAX_BUFFERS} allowed")
        check_header(header)  # what a worker would refuse is refused here
    except (TypeError, ValueError, OverflowError, DecodeError) as e:
        raise TypeError(f"message cannot be encoded: {e}") from e
    return header, buffers


def decode(header: bytes, buffers: list[Any], copy: bool = True) -> Any:
    """Decode a header produced by :func:`encode`.

    ``buffers`` holds tensors (in-process: they are copied unless ``copy`` is False, for a
    sender that gives them up) or bytes-like objects (network).
    Raises :class:`DecodeError` on anything malformed or past the limits (before it
    allocates anything on their account).
    """
    if buffers and len(buffers) > MAX_BUFFERS:
        raise DecodeError(f"a message carries {len(buffers)} buffers, at most {MAX_BUFFERS}")
    # (a short bytes header keeps every limit: its check is inlined here, the hot path)
    data = header if type(header) is bytes and len(header) <= MAX_DEPTH else check_header(header)
    used: set[int] = set()  # buffer indices taken: each buffer makes one tensor
    nested = 0  # nested unpackb calls under way (each takes C stack)

    def ext_hook(code: int, data: bytes) -> Any:
        nonlocal nested
        if code == _EXT_TENSOR:
            if nested >= MAX_EXT_DEPTH:
                raise DecodeError(f"a message nests tuples deeper than {MAX_EXT_DEPTH} levels")
            meta = msgpack.unpackb(data)  # (max_*_len: msgpack's own, from len(data))
            if not (isinstance(meta, list) and len(meta) == 3):
                raise DecodeError("malformed tensor header")
            index, name, shape = meta
            if type(index) is not int or not 0 <= index < len(buffers):
                raise DecodeError(f"tensor buffer index {index!r} out of range")
            if index in used:
                raise DecodeError(f"tensor buffer {index} is used twice")
            used.add(index)
            if not (
                type(shape) is list
                and len(shape) <= MAX_TENSOR_DIMS
                and all(type(s) is int and s >= 0 for s in shape)
            ):
                raise DecodeError(f"malformed tensor shape {shape!r}")
            if type(name) is not str:
                raise DecodeError("malformed tensor header")
            return _tensor_from_buffer(buffers[index], dtype_from_name(name), shape, copy)
        if code == _EXT_REF:
            if len(data) != _REF.size:
                raise DecodeError("malformed object reference")
            return Ref(_REF.unpack(data)[0])
        if code in (_EXT_SLOT, _EXT_SLOTREF):
            if len(data) != _REF.size:
                raise DecodeError("malformed program slot")
            index = _REF.unpack(data)[0]
            return Slot(index) if code == _EXT_SLOT else SlotRef(index)
        if code == _EXT_DTYPE:
            return dtype_from_name(data.decode())
        if code == _EXT_DEVICE:
            name = data.decode()
            if name not in ("cpu", "meta") and not name.startswith("cuda"):
                raise DecodeError(f"unknown device {name!r}")
            return torch.device(name)
        if code == _EXT_LAYOUT:
            if data != b"strided":
                raise DecodeError(f"unknown layout {data!r}")
            return torch.strided
        if code == _EXT_MEMFMT:
            try:
                return _MEMFMTS[data.decode()]
            except KeyError:
                raise DecodeError(f"unknown memory format {data!r}") from None
        if code == _EXT_TUPLE:
            if nested >= MAX_EXT_DEPTH:
                raise DecodeError(f"a message nests tuples deeper than {MAX_EXT_DEPTH} levels")
            nested += 1
            try:
                # (max_*_len: msgpack's own, from len(data))
                inner = msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=True)
            finally:
                nested -= 1
            if not isinstance(inner, list):
                raise DecodeError("malformed tuple")
            return tuple(inner)
        raise DecodeError(f"unknown extension type {code}")

    try:
        # (max_*_len: msgpack's own, from len(data))
        return msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=True)
    except DecodeError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise DecodeError(f"malformed message: {type(e).__name__}: {e}") from e


def _tensor_from_buffer(
    buf: Any, dtype: torch.dtype, shape: list[int], copy: bool = True
) -> torch.Tensor:
    numel = 1
    extent = 1  # the product of the non-zero sizes (strides must fit in an int64)
    for s in shape:
        numel *= s
        extent *= s or 1
    if extent >= _MAX_NUMEL:
        raise DecodeError(f"tensor shape {shape} is too large")
    if isinstance(buf, torch.Tensor):
        if buf.dtype != dtype or buf.numel() != numel:
            raise DecodeError("tensor buffer does not match its header")
        if not copy and list(buf.shape) == shape:
            return buf
        return buf.view(shape).clone()
    raw = buf if isinstance(buf, bytes | bytearray | memoryview) else memoryview(buf)
    size = numel * dtype.itemsize
    got = raw.nbytes if isinstance(raw, memoryview) else len(raw)
    if got != size:  # checked before anything is allocated
        raise DecodeError(f"tensor buffer holds {got} bytes, header says {size}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    t = torch.frombuffer(bytearray(raw), dtype=dtype).view(shape)
    if dtype is torch.bool:  # only 0 and 1 are booleans: other bytes would be undefined
        t = t.view(torch.uint8).ne_(0).view(torch.bool)
    return t


def nbytes(header: bytes, buffers: list[Any]) -> int:
    """Bytes the message would carry on a wire: header plus raw buffers."""
    total = len(header)
    for b in buffers:
        total += b.numel() * b.element_size() if isinstance(b, torch.Tensor) else len(b)
    return total
