"""The wire form of a network call: an envelope of frames (msgpack header + raw buffers).

A frame is one message as :mod:`pointers.wire.serde` encodes it: a msgpack header plus the raw
bytes of its tensor buffers. An envelope carries any number of frames and a small map of
call metadata::

    b"PTW1" | u32 big-endian L | msgpack [info, [[tag, header_len, [buf_len, ...]], ...]] (L bytes)
    | header 0 | buffers of frame 0 | header 1 | buffers of frame 1 | ...

``info`` is a map of plain msgpack values (str keys); ``tag`` is an int whose meaning the
call defines (request flags, or the index of the request a reply answers). Decoding checks
every length against the bytes actually present, holds the metadata to the limits of a
message header (:func:`pointers.wire.serde.check_header`: size, nesting, declared lengths,
objects) and accepts no extension types, so a malformed envelope ends in
:class:`FrameError`, never in a large allocation or a crash.
Buffers come back as zero-copy ``memoryview`` slices of the envelope.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import msgpack
import torch

from pointers.errors import DecodeError
from pointers.wire import serde
from pointers.wire.messages import ErrorReply, encode_message

MAGIC = b"PTW1"
_PREFIX = struct.Struct(">4sI")
MAX_FRAMES = 1 << 16  # frames in one envelope
MAX_BUFFERS = serde.MAX_BUFFERS  # buffers in one frame
MAX_META = 1 << 24  # bytes of the metadata map

Frame = tuple[int, Any, list[Any]]  # (tag, header, buffers); header and buffers bytes-like
_ERROR_PREFIX = encode_message(ErrorReply("", ""))[0][:7]  # fixarray(3) + fixstr "error"


class FrameError(DecodeError):
    """An envelope is malformed: wrong magic, lengths that do not add up, bad metadata."""


def is_error_header(header: bytes | memoryview) -> bool:
    """Whether a frame's header is an :class:`~pointers.wire.messages.ErrorReply` (a reply
    that reports a failure), read from its first bytes without decoding it."""
    return bytes(header[:7]) == _ERROR_PREFIX


def buffer_bytes(buf: Any) -> bytes | bytearray | memoryview:
    """The raw bytes of a tensor buffer (zero-copy for a contiguous CPU tensor)."""
    if isinstance(buf, bytes | bytearray | memoryview):
        return buf
    if isinstance(buf, torch.Tensor):
        t = buf.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous().reshape(-1)
        if t.numel() == 0:
            return b""
        if t.stride(0) != 1:  # "contiguous" with one element but any stride
            t = t.clone(memory_format=torch.contiguous_format)
        array: Any = t.view(torch.uint8).numpy()
        return memoryview(array).cast("B")
    raise TypeError(f"a frame buffer must be bytes or a tensor, got {type(buf).__name__}")


def encode_envelope(info: dict[str, Any], frames: Sequence[Frame]) -> bytes:
    """Pack ``frames`` (tag, header, buffers) and ``info`` into one envelope."""
    index: list[list[Any]] = []
    parts: list[Any] = []
    for tag, header, buffers in frames:
        raw = [buffer_bytes(b) for b in buffers]
        index.append([tag, memoryview(header).nbytes, [memoryview(r).nbytes for r in raw]])
        parts.append(header)
        parts.extend(raw)
    meta = msgpack.packb([info, index], use_bin_type=True)
    return b"".join([_PREFIX.pack(MAGIC, len(meta)), meta, *parts])


def decode_envelope(data: bytes | memoryview) -> tuple[dict[str, Any], list[Frame]]:
    """Unpack an envelope; raises :class:`FrameError` on anything malformed."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise FrameError(f"an envelope must be bytes, got {type(data).__name__}")
    view = memoryview(data).cast("B") if not isinstance(data, memoryview) else data.cast("B")
    total = len(view)
    if total < _PREFIX.size:
        raise FrameError(f"an envelope needs at least {_PREFIX.size} bytes, got {total}")
    magic, meta_len = _PREFIX.unpack_from(view, 0)
    if magic != MAGIC:
        raise FrameError(f"not a pointers envelope (magic {bytes(magic)!r})")
    if meta_len > MAX_META or _PREFIX.size + meta_len > total:
        raise FrameError(f"metadata length {meta_len} exceeds the {total} bytes received")
    start = _PREFIX.size + meta_len
    try:  # within the limits of a message header (nesting, sizes: see pointers.wire.serde)
        meta = serde.unpack_limited(
            view[_PREFIX.size : start],
            ext_hook=_no_ext,
            max_array_len=MAX_FRAMES,
            max_map_len=1024,
            max_str_len=1 << 20,
            max_bin_len=1 << 20,
        )
    except FrameError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise FrameError(f"malformed envelope metadata: {type(e).__name__}: {e}") from e
    if not (isinstance(meta, list) and len(meta) == 2):
        raise FrameError("envelope metadata must be [info, frames]")
    info, index = meta
    if not isinstance(info, dict) or not isinstance(index, list):
        raise FrameError("envelope metadata must be [map, list]")
    if len(index) > MAX_FRAMES:
        raise FrameError(f"an envelope holds at most {MAX_FRAMES} frames, got {len(index)}")
    frames: list[Frame] = []
    pos = start
    for entry in index:
        if not (isinstance(entry, list) and len(entry) == 3):
            raise FrameError("a frame entry must be [tag, header_len, buffer_lens]")
        tag, header_len, buf_lens = entry
        if type(tag) is not int or type(header_len) is not int or header_len < 0:
            raise FrameError("a frame's tag and header length must be integers")
        if header_len > serde.MAX_HEADER_BYTES:
            raise FrameError(
                f"a frame header of {header_len} bytes exceeds the limit of "
                f"{serde.MAX_HEADER_BYTES} bytes"
            )
        if not isinstance(buf_lens, list) or len(buf_lens) > MAX_BUFFERS:
            raise FrameError(f"a frame holds a list of at most {MAX_BUFFERS} buffer lengths")
        end = pos + header_len
        if end > total:
            raise FrameError("a frame header runs past the end of the envelope")
        header = view[pos:end]
        pos = end
        buffers: list[Any] = []
        for n in buf_lens:
            if type(n) is not int or n < 0:
                raise FrameError("buffer lengths must be non-negative integers")
            end = pos + n
            if end > total:
                raise FrameError("a frame buffer runs past the end of the envelope")
            buffers.append(view[pos:end])
            pos = end
        frames.append((tag, header, buffers))
    if pos != total:
        raise FrameError(f"{total - pos} unexpected bytes after the last frame")
    return info, frames


def _no_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"envelope metadata may not hold extension type {code}")


def info_field(info: dict[str, Any], name: str, kind: type | tuple[type, ...], default: Any) -> Any:
    """``info[name]`` checked against ``kind`` (``default`` when absent)."""
    value = info.get(name, default)
    if value is not default and not isinstance(value, kind):
        raise FrameError(f"envelope field {name!r} has type {type(value).__name__}")
    return value
