"""Documents on disk in the wire's encoding: a magic line, then a msgpack header and the
raw bytes of its tensors (:mod:`pointers.wire.serde`, never pickle). What an owner hands
its served worker at start (``serve --data FILE``) is written this way."""

from __future__ import annotations

import struct
from typing import Any

import torch

from pointers.wire import serde

__all__ = ["read_document", "write_document"]


def write_document(path: Any, magic: bytes, doc: Any) -> None:
    """Write ``doc`` (what :func:`serde.encode` takes) to ``path`` after ``magic``."""
    header, buffers = serde.encode(doc)
    with open(path, "wb") as f:
        f.write(magic)
        f.write(struct.pack("<QQ", len(header), len(buffers)))
        f.write(header)
        for b in buffers:
            raw = b.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            f.write(struct.pack("<Q", len(raw)))
            f.write(raw)


def read_document(path: Any, magic: bytes, what: str) -> Any:
    """The document :func:`write_document` wrote to ``path`` with ``magic``; a
    ``ValueError`` naming ``what`` (e.g. "an owner's data file") if it is not one."""
    with open(path, "rb") as f:
        data = f.read()
    where = f"{what} {str(path)!r}"
    if not data.startswith(magic):
        raise ValueError(f"{where}: not {what}")
    at = len(magic)
    try:
        n_header, n_buffers = struct.unpack_from("<QQ", data, at)
        at += 16
        if n_header > serde.MAX_HEADER_BYTES or n_buffers > serde.MAX_BUFFERS:
            raise ValueError("too large")
        header = data[at : at + n_header]
        at += n_header
        buffers = []
        for _ in range(n_buffers):
            (n,) = struct.unpack_from("<Q", data, at)
            at += 8
            if at + n > len(data):
                raise ValueError("truncated")
            buffers.append(memoryview(data)[at : at + n])
            at += n
        doc = serde.decode(header, buffers)
    except Exception as e:
        raise ValueError(f"{where} is malformed: {type(e).__name__}: {e}") from None
    if at != len(data):
        raise ValueError(f"{where} is malformed: {len(data) - at} bytes after its end")
    return doc
