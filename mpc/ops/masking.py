"""Public masks on shared values: a public selection, not an addition.

Hugging Face models mask attention scores with ``torch.finfo(float32).min`` (-3.4e38) or
``-inf``, added to the scores or filled in (``masked_fill``, ``where``). No fixed-point
encoding holds such a value (:func:`mpc.math.encoding.max_safe_value` is 2^46 at 16
bits). Where the mask is public, which positions are masked is public too, so the parties
*select* instead of adding: a masked position's shares are multiplied by 0 (exact, local)
and party 0 adds the public sentinel :data:`MASKED_VALUE`; every other position keeps its
shares (plus the mask's finite value there, if it was an addition). No round, no
truncation, no range warning, and a masked position no longer depends on the secret value
it replaced.

The result remembers its masked positions (a public bool tensor, keyed by its first share
as :mod:`mpc.ops.backward` keys ReLU's bits): :func:`mpc.ops.functions.softmax` multiplies
its exponentials by the complement, so masked positions weigh exactly 0, as
``e^(-3.4e38)`` does in float32. A row in which every position is masked comes out
uniform, as in float32 (``finfo.min - finfo.min = 0``). A view taken between the mask and
the softmax loses the record; the sentinel then weighs ``e^-16`` (1.1e-7) relative to the
row's largest score, with no dependence on the value it replaced.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

from mpc.errors import MPCError
from mpc.math.encoding import encode
from mpc.ops.common import check_public, encode_public, is_integral, rescale
from mpc.shared import SharedTensor

#: a public value at or below this (``finfo(float32).min``, ``finfo(bfloat16).min``,
#: ``-inf``) masks its position: no computation adds such a value for its magnitude
MASK_BELOW = -1e30
#: what a masked position holds: far enough below any score that softmax's exponential
#: clamps it (e^-16), small enough that products with it stay in range (2^14 < 2^15)
MASKED_VALUE = -(2.0**14)

# a result's first share -> the public bool tensors of its masked positions, and of those
# masked by -inf (a bool mask's False: sdpa and _safe_softmax give such a row zeros)
_MASKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def mask_of(p: Any) -> torch.Tensor | None:
    """The positions of a public value that are masks (at or below :data:`MASK_BELOW`),
    or None if there are none; a public ``+inf`` or NaN is refused (it has no meaning on a
    shared value and no encoding)."""
    if isinstance(p, SharedTensor):
        return None
    if isinstance(p, torch.Tensor):
        if not p.dtype.is_floating_point or p.numel() == 0:
            return None
        t = p.detach()
    elif isinstance(p, float):
        t = torch.tensor(p, dtype=torch.float64)
    else:
        return None
    if bool(torch.isnan(t).any()) or bool((t == float("inf")).any()):
        raise MPCError("a public NaN or +inf cannot meet a shared value")
    m = t <= MASK_BELOW
    return m if bool(m.any()) else None


def masked_positions(x: SharedTensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The public masked positions a shared tensor was given (broadcastable to it), and
    those of them masked by -inf."""
    return _MASKED.get(x.shares[0]) if isinstance(x, SharedTensor) else None


def select_public(keep: torch.Tensor, x: SharedTensor, fill: Any, add: Any = None) -> SharedTensor:
    """``where(keep, x + add, fill)`` for a public bool ``keep``, public ``fill`` and public
    ``add`` (default 0): local. Fill values at or below :data:`MASK_BELOW` become
    :data:`MASKED_VALUE`, and the result records them as masked. A pending truncation of
    ``x`` is applied first when there are masks (the record is kept by the result's
    first share, which a later truncation would replace; the softmax that reads it would
    truncate anyway)."""
    check_public(keep, "select")
    check_public(fill, "select")
    keep = keep.detach().to(torch.bool)
    fill_t = torch.as_tensor(fill.detach() if isinstance(fill, torch.Tensor) else fill)
    fill_t = fill_t.to(torch.float64)
    fill_mask = mask_of(fill_t)
    fill_inf = torch.isneginf(fill_t)
    if fill_mask is not None:
        fill_t = torch.where(fill_mask, torch.zeros((), dtype=torch.float64), fill_t)
    shape = tuple(torch.broadcast_shapes(tuple(x.shape), tuple(keep.shape), tuple(fill_t.shape)))
    if add is not None:
        check_public(add, "select")
        add_t = torch.as_tensor(add.detach() if isinstance(add, torch.Tensor) else add)
        shape = tuple(torch.broadcast_shapes(shape, tuple(add_t.shape)))
        public = torch.where(keep, add_t.to(torch.float64), fill_t)
    else:
        public = torch.where(keep, torch.zeros((), dtype=torch.float64), fill_t)
    masked = ~keep & fill_mask if fill_mask is not None else None
    if masked is not None or masked_positions(x) is not None:
        x.materialize()
    integral = masked is None and is_integral(public)
    f = x.frac_bits if x.frac_bits or integral else x.session.config.frac_bits
    pending = x.pending if f == x.frac_bits else 0
    enc = encode_public(public.expand(shape).contiguous(), f)
    if masked is not None:  # the sentinel is a known power of two: no range warning
        enc = enc + masked.to(torch.int64) * int(encode(MASKED_VALUE, f))
    k = keep.to(torch.int64)
    shares = [s * k for s in rescale(x, f)]
    shares[0] = shares[0] + enc
    shares = [s if tuple(s.shape) == shape else s.expand(shape).clone() for s in shares]
    dtype = x.dtype if x.dtype.is_floating_point or f == 0 else torch.float32
    out = SharedTensor(shares, x.session, f, dtype, pending=pending)
    inf = masked & fill_inf if masked is not None else None
    before = masked_positions(x)
    if before is not None:  # x's own masked positions stay masked where they are kept
        kept, kept_inf = keep & before[0], keep & before[1]
        masked = kept if masked is None else masked | kept
        inf = kept_inf if inf is None else inf | kept_inf
    if masked is not None and inf is not None and bool(masked.any()):
        _MASKED[out.shares[0]] = (masked, inf)
    return out


def add_mask(x: SharedTensor, p: torch.Tensor, mask: torch.Tensor, sign: int) -> SharedTensor:
    """``x + sign * p`` for a public float ``p`` whose ``mask`` positions are masks: the
    finite part is added, the masked positions selected (:func:`select_public`)."""
    if sign < 0:
        raise MPCError("subtracting a public mask (-finfo.min) has no fixed-point meaning")
    finite = torch.where(mask, torch.zeros((), dtype=p.dtype), p.detach())
    fill = torch.where(torch.isneginf(p.detach()), float("-inf"), torch.finfo(torch.float32).min)
    return select_public(~mask, x, fill, add=finite)


def keep_in_softmax(x: SharedTensor, dim: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """For a softmax of ``x`` over ``dim``: the 0/1 int64 factor of its exponentials (0 at
    masked positions, except in rows where everything is masked: uniform there, as
    float32 gives for finfo.min), and the 0/1 factor of its output that zeroes the rows
    masked entirely by -inf (as scaled_dot_product_attention and _safe_softmax do)."""
    record = masked_positions(x)
    if record is None:
        return None
    masked, inf = (t.expand(tuple(x.shape)) for t in record)
    all_masked = masked.all(dim, keepdim=True)
    all_inf = inf.all(dim, keepdim=True)
    return (~masked | all_masked).to(torch.int64), (~all_inf).to(torch.int64)
