"""Message encoding: msgpack for structure, tensors as out-of-band buffers.

Nothing here uses pickle. A message is a msgpack document (the *header*) plus a list of
tensor buffers. In the header a tensor is an extension value holding its buffer index,
dtype and shape; every other value must be a plain msgpack value or one of the few torch
types below. The decoder accepts only these types and rejects everything else with
:class:`~pointers.errors.DecodeError`.

Transports decide how buffers travel: the in-process transport hands the tensors over
(the receiver copies them, so sender and receiver never share memory); a network transport
sends their raw bytes after the header.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import msgpack
import torch

from .errors import DecodeError

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


def encode(obj: Any) -> tuple[bytes, list[torch.Tensor]]:
    """Encode ``obj`` into a msgpack header and a list of contiguous tensor buffers."""
    buffers: list[torch.Tensor] = []

    def default(o: Any) -> msgpack.ExtType:
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
            return msgpack.ExtType(_EXT_TUPLE, msgpack.packb(list(o), default=default))
        raise TypeError(f"cannot encode a value of type {type(o).__name__} in a message")

    try:
        header = msgpack.packb(obj, default=default, strict_types=True)
    except (TypeError, ValueError, OverflowError) as e:
        raise TypeError(f"message cannot be encoded: {e}") from e
    return header, buffers


def decode(header: bytes, buffers: list[Any], copy: bool = True) -> Any:
    """Decode a header produced by :func:`encode`.

    ``buffers`` holds tensors (in-process: they are copied unless ``copy`` is False, for a
    sender that gives them up) or bytes-like objects (network).
    Raises :class:`DecodeError` on anything malformed.
    """

    def ext_hook(code: int, data: bytes) -> Any:
        if code == _EXT_TENSOR:
            meta = msgpack.unpackb(data)
            if not (isinstance(meta, list) and len(meta) == 3):
                raise DecodeError("malformed tensor header")
            index, name, shape = meta
            if not isinstance(index, int) or not 0 <= index < len(buffers):
                raise DecodeError(f"tensor buffer index {index!r} out of range")
            if not isinstance(shape, list) or not all(isinstance(s, int) and s >= 0 for s in shape):
                raise DecodeError(f"malformed tensor shape {shape!r}")
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
            inner = msgpack.unpackb(data, ext_hook=ext_hook, strict_map_key=True)
            if not isinstance(inner, list):
                raise DecodeError("malformed tuple")
            return tuple(inner)
        raise DecodeError(f"unknown extension type {code}")

    try:
        return msgpack.unpackb(header, ext_hook=ext_hook, strict_map_key=True)
    except DecodeError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise DecodeError(f"malformed message: {type(e).__name__}: {e}") from e


def _tensor_from_buffer(
    buf: Any, dtype: torch.dtype, shape: list[int], copy: bool = True
) -> torch.Tensor:
    numel = 1
    for s in shape:
        numel *= s
    if isinstance(buf, torch.Tensor):
        if buf.dtype != dtype or buf.numel() != numel:
            raise DecodeError("tensor buffer does not match its header")
        if not copy and list(buf.shape) == shape:
            return buf
        return buf.view(shape).clone()
    raw = bytes(buf) if not isinstance(buf, bytes | bytearray | memoryview) else buf
    itemsize = torch.empty((), dtype=dtype).element_size()
    if len(raw) != numel * itemsize:
        raise DecodeError(f"tensor buffer holds {len(raw)} bytes, header says {numel * itemsize}")
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).view(shape)


def nbytes(header: bytes, buffers: list[Any]) -> int:
    """Bytes the message would carry on a wire: header plus raw buffers."""
    total = len(header)
    for b in buffers:
        total += b.numel() * b.element_size() if isinstance(b, torch.Tensor) else len(b)
    return total
