"""The allow-list of operations a worker may run, and op names on the wire.

An op travels as its qualified aten name (``"aten::add.Tensor"``). A worker resolves it only
in the ``aten`` namespace and refuses the few aten ops that touch files or raw memory.
"""

from __future__ import annotations

import torch

from .errors import NotAllowedError

_DENIED = frozenset(
    {
        "from_file",
        "_local_scalar_dense",
        "set_",
        "_make_per_tensor_quantized_tensor",
        "_make_per_channel_quantized_tensor",
        "record_stream",
        "_unsafe_view_copy",
    }
)

_resolved: dict[str, torch._ops.OpOverload] = {}


def op_name(op: torch._ops.OpOverload) -> str:
    """The wire name of an op overload: ``aten::name.overload``."""
    return f"{op._schema.name}.{op._overloadname}"


def resolve_op(name: str) -> torch._ops.OpOverload:
    """Resolve a wire name to an aten op overload, enforcing the allow-list."""
    op = _resolved.get(name)
    if op is not None:
        return op
    ns, sep, rest = name.partition("::")
    base, dot, overload = rest.partition(".")
    if ns != "aten" or not sep or not dot or not base or not overload:
        raise NotAllowedError(f"op {name!r} is not an allowed aten op")
    if base in _DENIED or base.startswith("_foreach_copy") or "cuda" in base:
        raise NotAllowedError(f"op {name!r} is refused by the worker's allow-list")
    try:
        packet = getattr(torch.ops.aten, base)
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError):
        raise NotAllowedError(f"unknown op {name!r}") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise NotAllowedError(f"unknown op {name!r}")
    _resolved[name] = op
    return op
