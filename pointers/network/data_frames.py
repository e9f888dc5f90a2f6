"""The data plane's frame format (:mod:`pointers.network.dataplane`): a frame is

    b"PTD1" | u32 big-endian H | msgpack header (H bytes) | body (the tensor's raw bytes)

and its header is checked here (:func:`decode_frame_header`: sizes, types, the dtype, the
shape against the byte length, the message limit) before anything is allocated on its
account."""

from __future__ import annotations

import struct
from typing import Any

import msgpack
import torch

from pointers.errors import DecodeError, LimitExceeded
from pointers.network.framing import FrameError
from pointers.wire import serde

MAGIC = b"PTD1"
PREFIX = struct.Struct(">4sI")
MAX_FRAME_HEADER = 64 << 10  # bytes of a frame header (a sealed label included)


class DataFrame:
    """A checked frame header."""

    __slots__ = ("client", "dtype", "msg", "nbytes", "obj_id", "session", "shape", "source")

    def __init__(
        self,
        client: str,
        source: str,
        session: str,
        obj_id: int,
        dtype: torch.dtype,
        shape: list[int],
        nbytes: int,
        msg: bytes,
    ) -> None:
        self.client, self.source, self.session, self.obj_id = client, source, session, obj_id
        self.dtype, self.shape, self.nbytes, self.msg = dtype, shape, nbytes, msg

    @property
    def info(self) -> dict[str, Any]:
        """The fields a gRPC delivery's envelope carries (for the same checks)."""
        return {"client": self.client, "from": self.source, "session": self.session}


def encode_frame_header(
    info: dict[str, Any], obj_id: int, msg_header: bytes, tensor: torch.Tensor
) -> bytes:
    """The prefix and header of a frame carrying ``tensor`` (its body follows)."""
    head = msgpack.packb(
        {
            "client": info["client"],
            "from": info["from"],
            "session": info.get("session", ""),
            "id": obj_id,
            "dtype": serde.dtype_name(tensor.dtype),
            "shape": list(tensor.shape),
            "nbytes": tensor.numel() * tensor.element_size(),
            "msg": bytes(msg_header),
        },
        use_bin_type=True,
    )
    return PREFIX.pack(MAGIC, len(head)) + head


def decode_frame_header(data: bytes | memoryview, max_body: int) -> DataFrame:
    """Check a frame header (without its prefix); :class:`FrameError` when malformed or
    past a limit. Nothing is allocated on the frame's account before this returns."""
    if len(data) > MAX_FRAME_HEADER:
        raise FrameError(f"a frame header of {len(data)} bytes exceeds {MAX_FRAME_HEADER}")
    try:
        head = serde.unpack_limited(
            data,
            ext_hook=_no_ext,
            max_array_len=serde.MAX_TENSOR_DIMS,
            max_map_len=16,
            max_str_len=1024,
            max_bin_len=MAX_FRAME_HEADER,
        )
    except FrameError:
        raise
    except Exception as e:  # msgpack raises many types on malformed input
        raise FrameError(f"malformed frame header: {type(e).__name__}: {e}") from e
    if not isinstance(head, dict):
        raise FrameError("a frame header is a map")
    client, source, session = head.get("client"), head.get("from"), head.get("session", "")
    obj_id, name, shape = head.get("id"), head.get("dtype"), head.get("shape")
    nbytes, msg = head.get("nbytes"), head.get("msg")
    if not (isinstance(client, str) and isinstance(source, str) and isinstance(session, str)):
        raise FrameError("a frame names its client, source and session")
    if type(obj_id) is not int or type(nbytes) is not int or nbytes < 0:
        raise FrameError("a frame's object id and byte length are integers")
    if not isinstance(msg, bytes) or not isinstance(name, str):
        raise FrameError("a frame carries its message header and dtype")
    if not (
        type(shape) is list
        and len(shape) <= serde.MAX_TENSOR_DIMS
        and all(type(s) is int and 0 <= s < (1 << 62) for s in shape)
    ):
        raise FrameError(f"malformed tensor shape {shape!r}")
    try:
        dtype = serde.dtype_from_name(name)
        serde.check_header(msg)
    except DecodeError as e:
        raise FrameError(str(e)) from None
    numel = 1
    for s in shape:
        numel *= s
    if numel * dtype.itemsize != nbytes:
        raise FrameError(f"a frame of shape {shape} and dtype {name} cannot hold {nbytes} bytes")
    if nbytes > max_body:
        raise LimitExceeded(
            f"a delivery of {nbytes} bytes exceeds the message limit of {max_body} bytes"
        )
    return DataFrame(client, source, session, obj_id, dtype, shape, nbytes, msg)


def _no_ext(code: int, data: bytes) -> Any:
    raise FrameError(f"a frame header may not hold extension type {code}")
