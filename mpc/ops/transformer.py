"""The ops transformer models add: lookups with public indices, public masks, baddbmm.

- ``embedding``, ``gather``, ``index_select`` with a public index on a shared table are
  local: every party looks up the same rows of its own share (a Hugging Face model's
  token, position and token-type embeddings with public ids).
- A shared index (private token ids) on a public or shared table is a one-hot product:
  ``embedding`` with shared ids compares them with every row number (one comparison run
  of ``ids x vocab`` elements, :func:`mpc.ops.nonlinear.eq`), then multiplies the one-hot
  rows by the table (one Beaver matmul, or local with a public table). Its cost grows with
  the vocabulary (docs/transformers.md); ids shared as one-hot rows by their owner
  (:func:`mpc.hf.share_token_ids`) skip the comparison.
- ``masked_fill`` with a public mask is a public selection (:mod:`mpc.ops.masking`):
  local, and a fill of finfo.min / -inf is recorded as masked for the softmax.
- ``baddbmm`` is ``beta input + alpha bmm(b1, b2)`` (one Beaver bmm).
"""

from __future__ import annotations

from typing import Any, cast

import torch

import pointers as pt
from mpc.errors import UnsupportedOpError
from mpc.ops.bilinear import bilinear_op
from mpc.ops.common import aten, check_public
from mpc.ops.local import add_shared, mul_public
from mpc.ops.masking import select_public
from mpc.ops.nonlinear import eq
from mpc.registry import register
from mpc.shared import SharedTensor


def _per_share(out: list[torch.Tensor]) -> list[pt.PointerTensor]:
    # (an op on a pointer gives a pointer; torch's stubs say Tensor)
    return cast(list[pt.PointerTensor], out)


def _public_index(func: Any, index: Any) -> torch.Tensor:
    if isinstance(index, SharedTensor):
        raise UnsupportedOpError(str(func), "the index must be public here")
    check_public(index, str(func))
    if not isinstance(index, torch.Tensor) or index.dtype not in (torch.int64, torch.int32):
        raise UnsupportedOpError(str(func), "the index must be an integer tensor")
    return index


def _one_hot(ids: SharedTensor, n: int) -> SharedTensor:
    """[ids == j] for j < n, as shared 0/1 integers of shape ids.shape + (n,): one
    comparison run over ids.numel() * n elements."""
    if ids.frac_bits:
        raise UnsupportedOpError("embedding", "shared token ids must be integers")
    rows = torch.arange(n, dtype=torch.int64)
    wide = ids.unsqueeze(-1).expand(*ids.shape, n)
    return eq(aten.eq.Tensor, (wide, rows), {})


@register(aten.embedding.default)
def embedding(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """weight[ids]. Public ids: the lookup on every share (local). Shared ids: their
    one-hot encoding (one comparison run over ids x vocab) times the table (one Beaver
    matmul with a shared table, local with a public one). ``padding_idx`` only matters
    for the gradient and is ignored, as in torch's forward."""
    weight, ids = args[0], args[1]
    if isinstance(ids, SharedTensor):
        onehot = _one_hot(ids, weight.shape[0])
        return bilinear_op(onehot, weight, "matmul", {})
    ids = _public_index(func, ids)
    return weight.with_shares(_per_share([torch.embedding(s, ids) for s in weight.shares]))


@register(aten.gather.default)
def gather(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch.gather(x, dim, index) with a public index: local on every share."""
    x, dim, index = args[0], args[1], args[2]
    if not isinstance(x, SharedTensor):
        raise UnsupportedOpError(str(func), "the index must be public")
    index = _public_index(func, index)
    sparse = kwargs.get("sparse_grad", False)
    return x.with_shares(
        _per_share([torch.gather(s, dim, index, sparse_grad=sparse) for s in x.shares])
    )


@register(aten.index_select.default)
def index_select(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """torch.index_select(x, dim, index) with a public index: local on every share."""
    x, dim, index = args[0], args[1], args[2]
    if not isinstance(x, SharedTensor):
        raise UnsupportedOpError(str(func), "the index must be public")
    index = _public_index(func, index)
    return x.with_shares(_per_share([torch.index_select(s, dim, index) for s in x.shares]))


@register(aten.masked_fill.Scalar, aten.masked_fill.Tensor, lazy=True)
def masked_fill(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """x.masked_fill(mask, value) with a public mask and a public value: a public
    selection (local; finfo.min / -inf are recorded as masked, :mod:`mpc.ops.masking`).
    A shared value: value + (x - value) [not mask], local too."""
    x, mask, value = args[0], args[1], args[2]
    if isinstance(mask, SharedTensor) or not isinstance(x, SharedTensor):
        raise UnsupportedOpError(str(func), "the mask must be public and x shared")
    check_public(mask, str(func))
    keep = ~mask.to(torch.bool)
    if isinstance(value, SharedTensor):
        x.materialize()
        value.materialize()
        d = add_shared(x, value, -1)
        return add_shared(mul_public(d, keep), value, 1)
    if isinstance(value, torch.Tensor):
        value = value.detach()
    return select_public(keep, x, value)
