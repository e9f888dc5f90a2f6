"""In-place arithmetic on shared tensors: ``x += y``, ``x *= 0.5``, ``x.relu_()``, ...

The out-of-place op runs (with its protocol), its result is brought to ``x``'s scale and
written into ``x``'s shares at the parties (``copy_``), so views of ``x`` see the update
as they would for a plain tensor. The result must keep ``x``'s shape, and its dtype must
be castable to ``x``'s (as for torch's in-place ops).

One case is refused: a view taken from a product whose truncation was still pending
(``v = (a * b)[0]``) no longer shares memory with it once either is truncated, so an
in-place update of either would not reach the other; materialize the product first.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.errors import MPCError, UnsupportedOpError
from mpc.ops.common import aten
from mpc.protocols.weights.run import written
from mpc.registry import OPS, register
from mpc.shared import SharedTensor

OUT_OF_PLACE = {
    aten.add_.Tensor: aten.add.Tensor,
    aten.add_.Scalar: aten.add.Scalar,
    aten.sub_.Tensor: aten.sub.Tensor,
    aten.sub_.Scalar: aten.sub.Scalar,
    aten.mul_.Tensor: aten.mul.Tensor,
    aten.mul_.Scalar: aten.mul.Scalar,
    aten.div_.Tensor: aten.div.Tensor,
    aten.div_.Scalar: aten.div.Scalar,
    aten.neg_.default: aten.neg.default,
    aten.relu_.default: aten.relu.default,
}


@register(*OUT_OF_PLACE)
def inplace(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if not isinstance(x, SharedTensor):
        raise UnsupportedOpError(
            str(func),
            "a public tensor cannot hold a secret result in place; use the out-of-place op",
        )
    if x.views_of_pending:
        raise MPCError(
            f"{func}: this shared tensor shares memory with a view taken while a product "
            "was not yet truncated; an in-place update would not reach that view. Call "
            ".materialize() on the product before taking views, or use the out-of-place op"
        )
    base = OUT_OF_PLACE[func]
    out = OPS[base](base, args, kwargs).materialize()
    if tuple(out.shape) != tuple(x.shape):
        raise RuntimeError(
            f"{func}: output with shape {list(x.shape)} doesn't match the broadcast shape "
            f"{list(out.shape)}"
        )
    if not torch.can_cast(out.dtype, x.dtype):
        raise RuntimeError(
            f"{func}: result type {out.dtype} can't be cast to the desired output type {x.dtype}"
        )
    if out.frac_bits != x.frac_bits:  # e.g. an integer tensor times an integer: same scale
        raise MPCError(f"internal: {func} changed the scale ({x.frac_bits} -> {out.frac_bits})")
    written(x)
    for s, o in zip(x.shares, out.shares):
        s.copy_(o)
    return x
