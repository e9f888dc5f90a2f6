"""Non-linear ops built on the comparison protocol (:mod:`mpc.protocols.compare`).

x < y is msb(x - y); ReLU is x * (1 - msb(x)); max/argmax reduce by groups of four (one
comparison run of the six pairwise comparisons per level: ceil(log4 k) levels, the last two
or three entries pairwise), argmax with each index packed into the low bits of its value,
or, for few rows of many entries (an LM head's), by levels of ranked groups whose entries
carry their index (:func:`mpc.ops.max_tree.indexed_max`); max-pooling is that tree over
each window.
"""

from __future__ import annotations

from typing import Any, cast

import torch

import pointers as pt
from mpc.errors import UnsupportedOpError
from mpc.ops import max_tree
from mpc.ops.backward import keep_pool_argmax, relu_keeping_mask
from mpc.ops.common import aten, check_public
from mpc.ops.local import add_shared, neg_shared
from mpc.ops.relu_pool import deferred_relu, pool_of_relu
from mpc.protocols import ranks
from mpc.protocols.compare import msb, relu_with_mask, select_by_msb
from mpc.protocols.low_bits.run import low_bits
from mpc.protocols.low_bits.steps import MAX_LOW_BITS
from mpc.registry import register
from mpc.shared import SharedTensor, public_to_shares


def difference(a: Any, b: Any) -> SharedTensor:
    """a - b as a SharedTensor (one operand may be public)."""
    if isinstance(a, SharedTensor):
        return add_shared(a, b, -1)
    return add_shared(neg_shared(b), a, 1)


def _bit(x: SharedTensor, shares: list[pt.PointerTensor]) -> SharedTensor:
    return SharedTensor(shares, x.session, 0, torch.bool)


def less_than(a: Any, b: Any) -> SharedTensor:
    d = difference(a, b)
    return _bit(d, msb(d.session, d.shares))


def _one_minus(bit: SharedTensor) -> SharedTensor:
    shares = [-s for s in bit.shares]
    shares[0] = shares[0] + 1
    return bit.with_shares(shares)


@register(aten.lt.Tensor, aten.lt.Scalar)
def lt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return less_than(args[0], args[1])


@register(aten.gt.Tensor, aten.gt.Scalar)
def gt(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return less_than(args[1], args[0])


@register(aten.ge.Tensor, aten.ge.Scalar)
def ge(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _one_minus(less_than(args[0], args[1]))


@register(aten.le.Tensor, aten.le.Scalar)
def le(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return _one_minus(less_than(args[1], args[0]))


def lt_gt(a: Any, b: Any) -> tuple[SharedTensor, SharedTensor]:
    """[a < b] and [a > b] together: one comparison run on the stacked differences."""
    d = difference(a, b)
    # (stacks of pointers are pointers; torch's stubs say Tensor)
    stacked = cast(list[pt.PointerTensor], [torch.stack([s, -s]) for s in d.shares])
    bits = msb(d.session, stacked)
    return _bit(d, [s[0] for s in bits]), _bit(d, [s[1] for s in bits])


@register(aten.eq.Tensor, aten.eq.Scalar)
def eq(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lo, hi = lt_gt(args[0], args[1])
    shares = [-(x + y) for x, y in zip(lo.shares, hi.shares)]
    shares[0] = shares[0] + 1
    return lo.with_shares(shares)


@register(aten.ne.Tensor, aten.ne.Scalar)
def ne(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    lo, hi = lt_gt(args[0], args[1])
    return lo.with_shares([x + y for x, y in zip(lo.shares, hi.shares)])


@register(aten.relu.default, lazy=True)
def relu(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    if x.requires_grad and torch.is_grad_enabled():  # keep the bit for the backward
        return relu_keeping_mask(x)
    # its comparison (a pending truncation fused) runs when its shares are first read,
    # unless a 2x2 max-pool takes it into its own (mpc.ops.relu_pool)
    return deferred_relu(x)


# -- max / argmax over the last dim by a tree of pairs and groups of four ---------------


def _tree_max(
    x: SharedTensor, with_index: bool, values: bool = True
) -> tuple[SharedTensor, SharedTensor | None]:
    """Max (and argmax, :func:`_max_with_index`) over the last dim of x; indices are shared
    integers. Without ``values`` (an argmax alone) the max returned may be None.

    Few rows of few entries take one comparison run and one round (:mod:`mpc.protocols.
    ranks`), where that saves rounds; otherwise the levels of :mod:`mpc.ops.max_tree`."""
    if not with_index:
        return max_tree.values_max(x), None
    k = x.shape[-1]
    rows = x.numel() // max(k, 1)
    # (on a tie, ranks: the packed tree compares the packed values beside x, or takes the
    # low bits' round)
    if ranks.worth_it(x.session, rows, k, _indexed_rounds(x, values) + 1):
        x.materialize()
        v, i = ranks.max_by_ranks(x.session, x.shares, True)
        assert i is not None
        return x.with_shares(v), SharedTensor(i, x.session, 0, torch.int64)
    return _max_with_index(x, values)


# the argmax alone takes its index from the packed max's low bits (one round more, half the
# compared elements) from this many elements a call, or where it skips a truncation's round
LOW_BITS_FROM = 1 << 15
# an argmax alone reads a value still to be truncated at its full scale f where the packing
# p = x 2^m + (k - 1 - j) leaves |x| < 2^(62 - m - f) >= 2^14 (f + m <= 48: a product of
# two 16-bit fixed-point values over a vocabulary of up to 65,536)
FULL_SCALE_PACKING = 48


def _max_with_index(x: SharedTensor, values: bool = True) -> tuple[Any, SharedTensor]:
    """Max and argmax over the last dim (k entries), first index on ties as torch, in the
    rounds of the values-only max (:func:`_tree_max`: groups of four).

    Entry j is packed with its reversed index, p_j = x_j 2^m + (k - 1 - j) (ring elements,
    k - 1 < 2^m): the p_j are distinct, p_i > p_j iff x_i > x_j or x_i = x_j and i < j, so
    the max of the p's is x_max 2^m + (k - 1 - argmax) with torch's tie rule. With the max
    (``values``), the max of the x's and of the p's run as one stacked tensor (the same
    comparison runs, twice the elements); then k - 1 - argmax = p_max - x_max 2^m, exactly
    (local). For the argmax alone, only the p's are compared and k - 1 - argmax is p_max
    mod 2^m, exactly, in one more round (:func:`mpc.protocols.low_bits.run.low_bits`:
    half the compared elements; the max is None), from :data:`LOW_BITS_FROM` elements a
    call (below, a round weighs more than the bytes saved). The packing needs |x| < 2^(62 - m) in
    ring units (2^(46 - m) at 16 fractional bits). The argmax alone of a value still to be
    truncated (an LM head's logits) packs it at its full scale where that leaves
    |x| < 2^14 (:data:`FULL_SCALE_PACKING`): the truncation's round and opening are never
    paid."""
    k = x.shape[-1]
    m = max(k - 1, 1).bit_length()
    low, full_scale = _low_bits(x, values)
    pairwise = _pairwise(x, values)  # (x as it comes: pending or not)
    sizes = None if pairwise else _indexed_sizes(x)
    if sizes is not None:
        if x.pending and x.frac_bits <= FULL_SCALE_COMPARED:
            # compared at its full scale (differences of at most 2^62): the truncation's
            # round is never paid; the max keeps it pending
            read = SharedTensor(list(x.shares), x.session, x.frac_bits, x.dtype)
        else:
            x.materialize()
            read = x
        top, index = max_tree.indexed_max(read, sizes)
        vmax = x.with_shares(list(top.shares)) if values else None
        return vmax, SharedTensor(index, x.session, 0, torch.int64)
    if full_scale:
        x = SharedTensor(list(x.shares), x.session, x.frac_bits, x.dtype)  # (not pending)
    else:
        x.materialize()
    if pairwise:
        return _pairwise_with_index(x)
    rev = (k - 1 - torch.arange(k, dtype=torch.int64)).expand(x.shape).contiguous()
    packed = [s * (1 << m) + r for s, r in zip(x.shares, public_to_shares(rev, x))]
    if low:
        top, _ = _tree_max(x.with_shares(packed), False)
        idx = [-s for s in low_bits(x.session, top.shares, m)]
        idx[0] = idx[0] + (k - 1)
        return None, SharedTensor(idx, x.session, 0, torch.int64)
    # (a stack of shared tensors is shared; torch's stubs say Tensor)
    both = cast(SharedTensor, torch.stack([x, x.with_shares(packed)]))
    top, _ = _tree_max(both, False)
    vmax, pmax = top[0], top[1]
    idx = [-(p - v * (1 << m)) for p, v in zip(pmax.shares, vmax.shares)]
    idx[0] = idx[0] + (k - 1)
    return vmax, SharedTensor(idx, x.session, 0, torch.int64)


# a pending value compared at its full scale f by the indexed levels, up to this f: its
# pairs' differences need |x| < 2^(62 - f) (2^18 at 44 bits; a layer norm's factor times
# a head's product: 40 to 42 bits), where the pending value itself needs |x| < 2^(63 - f)
FULL_SCALE_COMPARED = 44


def _indexed_sizes(x: SharedTensor) -> tuple[int, ...] | None:
    """The ranked groups' sizes where :func:`_max_with_index` carries each entry's index
    through them (:func:`mpc.ops.max_tree.indexed_max`): in the default comparison mode,
    where they take fewer rounds than the packed tree (its truncation's round, where x
    is pending and not packed at its full scale, included); None elsewhere."""
    if x.session.config.comparison == "fss":
        return None
    k = x.shape[-1]
    rows = x.numel() // max(k, 1)
    sizes = max_tree.indexed_sizes(x.session, rows, k)
    if sizes is None:
        return None
    packed = _packed_rounds(x, False) + (1 if x.pending and not _low_bits(x, False)[1] else 0)
    return sizes if max_tree.ranked_rounds(x.session, rows, k, sizes) < packed else None


def _low_bits(x: SharedTensor, values: bool) -> tuple[bool, bool]:
    """(whether :func:`_max_with_index` takes the index from the packed max's low bits,
    whether it packs x at its full scale, its truncation never paid)."""
    m = max(x.shape[-1] - 1, 1).bit_length()
    low = not values and _packable(x) and m <= MAX_LOW_BITS
    if low and x.pending and x.frac_bits + m <= FULL_SCALE_PACKING:
        return True, True
    return low and x.numel() >= LOW_BITS_FROM, False


def _packable(x: SharedTensor) -> bool:
    # (with FSS, a domain narrower than the ring, fss_bits < 64, leaves no room for it)
    return x.session.config.comparison != "fss" or x.session.config.fss_bits >= 64


def _packed_rounds(x: SharedTensor, values: bool) -> int:
    """The rounds of the packed tree of :func:`_max_with_index` (its max of the packed
    values, with the values' own stacked or the low bits' round after it)."""
    k = x.shape[-1]
    low, _ = _low_bits(x, values)
    rows = x.numel() // max(k, 1) * (1 if low else 2)
    return max_tree.values_max_rounds(x.session, rows, k) + (1 if low else 0)


def _pairwise(x: SharedTensor, values: bool) -> bool:
    """Whether :func:`_max_with_index` takes the pairwise tree: with FSS, where the
    packing takes no fewer rounds (the pairwise tree carries the index, 2 rounds a level,
    k - 1 comparisons; the packing takes fewer rounds where its tree finishes by ranks, an
    LM head's argmax over 50,257: 13 rounds where the pairwise tree took 32, for about
    1.5 k comparisons more, 3 KB of keys each at the dealer)."""
    if x.session.config.comparison != "fss":
        return False
    pairwise = 2 * max(x.shape[-1] - 1, 1).bit_length()
    return not _packable(x) or pairwise <= _packed_rounds(x, values)


def _indexed_rounds(x: SharedTensor, values: bool) -> int:
    """The rounds :func:`_max_with_index` takes for x."""
    if _pairwise(x, values):
        return 2 * max(x.shape[-1] - 1, 1).bit_length()
    sizes = _indexed_sizes(x)
    if sizes is not None:
        k = x.shape[-1]
        return max_tree.ranked_rounds(x.session, x.numel() // max(k, 1), k, sizes)
    return _packed_rounds(x, values)


def _pairwise_with_index(x: SharedTensor) -> tuple[SharedTensor, SharedTensor]:
    """Max and argmax by a pairwise tree, the index selected with the value on each
    comparison's daBit (ceil(log2 k) levels): for FSS comparisons (see
    :func:`_max_with_index`).
    Each level pairs neighbours (a = entry 2i, b = entry 2i + 1: every entry stands for a
    block of consecutive indices, in order), so ties keep a's, the first, index."""
    k = x.shape[-1]
    ar = torch.arange(k, dtype=torch.int64).expand(x.shape).contiguous()
    idx = SharedTensor(public_to_shares(ar, x), x.session, 0, torch.int64)
    vals = x
    while k > 1:
        h = k // 2
        a, b = vals[..., 0 : 2 * h : 2], vals[..., 1 : 2 * h : 2]
        ia, ib = idx[..., 0 : 2 * h : 2], idx[..., 1 : 2 * h : 2]
        d = difference(b, a)  # msb(a - b) = [a < b]: b wins only when strictly greater
        sel = select_by_msb(x.session, neg_shared(d).shares, [d.shares, difference(ib, ia).shares])
        new_vals, new_idx = (
            add_shared(a, vals.with_shares(sel[0]), 1),
            add_shared(ia, idx.with_shares(sel[1]), 1),
        )
        if k % 2:
            new_vals = cast(SharedTensor, torch.cat([new_vals, vals[..., 2 * h :]], dim=-1))
            new_idx = cast(SharedTensor, torch.cat([new_idx, idx[..., 2 * h :]], dim=-1))
        vals, idx, k = new_vals, new_idx, h + (k % 2)
    return vals, idx


def _tree_max_onehot(x: SharedTensor) -> tuple[SharedTensor, SharedTensor]:
    """Max over the last dim (k entries) and its argmax as a one-hot vector (shared 0/1
    integers, shape x.shape + [k]), for max-pooling's backward.

    Each level pairs neighbours, a = entry 2i and b = entry 2i + 1 (each entry stands for
    a block of consecutive window positions, in order): max(a, b) = b + relu(a - b),
    and the bit [a >= b] from the same comparison
    (:func:`mpc.protocols.compare.relu_with_mask`) selects the one-hot vectors,
    oh_b + [a >= b] (oh_a - oh_b): local on the first level (the vectors are public unit
    vectors), one Beaver product of integers (1 round, no truncation) on the others.
    4 rounds per level plus 1 from the second level on: 9 for a 2x2 window. Ties go to
    the earlier block, so to the first position of the window as in torch (an all-equal
    window, e.g. zeros after a ReLU, and partial ties too: first halves against second
    halves sent a tie of entries 1 and 2 to 2).
    """
    k = x.shape[-1]
    vals = x
    onehot: Any = torch.eye(k, dtype=torch.int64).expand(*x.shape, k)  # public at first
    while vals.shape[-1] > 1:
        n = vals.shape[-1]
        h = n // 2
        a, b = vals[..., 0 : 2 * h : 2], vals[..., 1 : 2 * h : 2]
        d = difference(a, b)
        r, bit_shares = relu_with_mask(x.session, d.shares, d.pending)
        relu = d.with_shares(r, frac_bits=d.frac_bits - d.pending)
        bit = SharedTensor(bit_shares, x.session, 0, torch.int64).unsqueeze(-1)  # [a >= b]
        oa, ob = onehot[..., 0 : 2 * h : 2, :], onehot[..., 1 : 2 * h : 2, :]
        if isinstance(onehot, SharedTensor):
            chosen = add_shared(ob, bit * difference(oa, ob), 1)
        else:
            chosen = add_shared(bit * (oa - ob).contiguous(), ob.contiguous(), 1)
        new_vals = add_shared(b, relu, 1)
        if n % 2:
            rest = onehot[..., 2 * h :, :]
            rest = rest if isinstance(rest, SharedTensor) else rest.contiguous()
            new_vals = cast(SharedTensor, torch.cat([new_vals, vals[..., 2 * h :]], dim=-1))
            chosen = _cat_shared(chosen, rest)
        vals, onehot = new_vals, chosen
    return vals, onehot.squeeze(-2)


def _cat_shared(a: SharedTensor, b: Any) -> SharedTensor:
    """[a, b] along dim -2, b shared or public (a public part is shared trivially)."""
    if not isinstance(b, SharedTensor):
        b = SharedTensor(public_to_shares(b, a), a.session, 0, torch.int64)
    return cast(SharedTensor, torch.cat([a, b], dim=-2))


def _move_dim_last(x: SharedTensor, dim: int) -> SharedTensor:
    return x.movedim(dim, -1) if dim not in (-1, x.dim() - 1) else x


def max_reduce(
    x: SharedTensor, dim: int | None, keepdim: bool, with_index: bool, values: bool = True
) -> Any:
    """(max, argmax) over ``dim`` (all elements if None); the argmax None without
    ``with_index``, the max possibly None without ``values``."""

    def shaped(t: Any, to: Any) -> Any:
        return to(t) if t is not None else None

    if dim is None:
        flat = x.reshape(-1)
        v, i = _tree_max(flat, with_index, values)
        out_shape = [1] * x.dim() if keepdim else []
        return shaped(v, lambda t: t.reshape(out_shape)), shaped(i, lambda t: t.reshape(out_shape))
    d = dim % max(x.dim(), 1)
    moved = _move_dim_last(x, d)
    v, i = _tree_max(moved, with_index, values)
    v, i = shaped(v, lambda t: t.squeeze(-1)), shaped(i, lambda t: t.squeeze(-1))
    if keepdim:
        v, i = shaped(v, lambda t: t.unsqueeze(d)), shaped(i, lambda t: t.unsqueeze(d))
    return v, i


def _negated(x: SharedTensor) -> SharedTensor:
    return neg_shared(x)


@register(aten.max.dim, aten.min.dim)
def max_dim(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, dim = args[0], args[1]
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    src = x if func is aten.max.dim else _negated(x)
    v, i = max_reduce(src, dim, keepdim, True)
    if func is aten.min.dim:
        v = _negated(v)
    return v, i


@register(aten.max.default, aten.min.default, aten.amax.default, aten.amin.default)
def max_all(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    is_min = func in (aten.min.default, aten.amin.default)
    src = _negated(x) if is_min else x
    if func in (aten.amax.default, aten.amin.default):
        dims = args[1] if len(args) > 1 else kwargs.get("dim", [])
        keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
        if len(dims) > 1:
            raise UnsupportedOpError(str(func), "reduce over one dim at a time")
        v, _ = max_reduce(src, dims[0] if dims else None, keepdim, False)
    else:
        v, _ = max_reduce(src, None, False, False)
    return _negated(v) if is_min else v


@register(aten.argmax.default, aten.argmin.default, lazy=True)
def argmax(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    keepdim = args[2] if len(args) > 2 else kwargs.get("keepdim", False)
    src = x if func is aten.argmax.default else _negated(x)
    _, i = max_reduce(src, dim, keepdim, True, values=False)
    return i


# -- pooling ------------------------------------------------------------------------------


def _windows(x: SharedTensor, kernel: list[int], stride: list[int]) -> SharedTensor:
    """(N, C, H, W) -> (N, C, Ho, Wo, kh * kw) of windows (a view on every share)."""
    w = x.unfold(2, kernel[0], stride[0]).unfold(3, kernel[1], stride[1])
    return w.reshape(*w.shape[:4], kernel[0] * kernel[1])


def _pool_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[int], ...]:
    def pair(v: Any, default: Any) -> list[int]:
        v = default if v is None or (isinstance(v, list | tuple) and len(v) == 0) else v
        v = list(v) if isinstance(v, list | tuple) else [v]
        return v * 2 if len(v) == 1 else v

    kernel = pair(args[1], None)
    stride = pair(args[2] if len(args) > 2 else kwargs.get("stride"), kernel)
    padding = pair(args[3] if len(args) > 3 else kwargs.get("padding", 0), [0])
    return kernel, stride, padding


@register(aten.max_pool2d_with_indices.default)
def max_pool2d(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    kernel, stride, padding = _pool_args(args, kwargs)
    dilation = args[4] if len(args) > 4 else kwargs.get("dilation", 1)
    ceil_mode = args[5] if len(args) > 5 else kwargs.get("ceil_mode", False)
    if dilation not in (1, [1, 1], (1, 1)) or ceil_mode:
        raise UnsupportedOpError(str(func), "dilation and ceil_mode are not supported")
    if x.dim() != 4:
        raise UnsupportedOpError(str(func), "expects (N, C, H, W) input")
    fused = pool_of_relu(x, kernel, stride, padding)  # of a ReLU not run yet: one run
    if fused is not None:
        return fused, torch.empty(tuple(fused.shape), dtype=torch.int64, device="meta")
    if any(padding):
        big = -float(2 ** (40 - x.frac_bits)) if x.frac_bits else -float(2**40)
        x = aten.constant_pad_nd.default(x, [padding[1], padding[1], padding[0], padding[0]], big)
    if args[0].requires_grad and torch.is_grad_enabled() and not any(padding):
        # training: keep the one-hot argmax of every window for the backward
        wins = _windows(x, kernel, stride)
        v, onehot = _tree_max_onehot(wins)
        return v.squeeze(-1), keep_pool_argmax(onehot, x, kernel, stride)
    v, _ = _tree_max(_windows(x, kernel, stride), False)
    v = v.squeeze(-1)
    # Indices would cost an argmax; nn.MaxPool2d ignores them. Return a meta tensor so
    # any use fails loudly rather than silently.
    return v, torch.empty(tuple(v.shape), dtype=torch.int64, device="meta")


@register(aten.avg_pool2d.default)
def avg_pool2d(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x = args[0]
    kernel, stride, padding = _pool_args(args, kwargs)
    ceil_mode = args[4] if len(args) > 4 else kwargs.get("ceil_mode", False)
    include_pad = args[5] if len(args) > 5 else kwargs.get("count_include_pad", True)
    divisor = args[6] if len(args) > 6 else kwargs.get("divisor_override")
    if ceil_mode or (any(padding) and not include_pad):
        raise UnsupportedOpError(str(func), "ceil_mode / count_include_pad=False")
    if any(padding):
        x = aten.constant_pad_nd.default(x, [padding[1], padding[1], padding[0], padding[0]])
    total = _windows(x, kernel, stride).sum(dim=-1)
    return total / float(divisor or kernel[0] * kernel[1])


@register(aten._adaptive_avg_pool2d.default)
def adaptive_avg_pool2d(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, out = args[0], list(args[1])
    h, w = x.shape[-2], x.shape[-1]
    if h % out[0] or w % out[1]:
        raise UnsupportedOpError(str(func), f"input {h}x{w} is not a multiple of {out}")
    k = [h // out[0], w // out[1]]
    return avg_pool2d(aten.avg_pool2d.default, (x, k, k), {})


@register(aten.native_batch_norm.default, aten._native_batch_norm_legit_no_training.default)
def batch_norm(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    x, weight, bias, mean, var = args[:5]
    if func is aten.native_batch_norm.default:
        training, eps = args[5], args[7]
        if training:
            raise UnsupportedOpError(str(func), "batch norm in training mode; call model.eval()")
    else:
        eps = args[6]
    for name, t in (("running_mean", mean), ("running_var", var)):
        if isinstance(t, SharedTensor) or t is None:
            raise UnsupportedOpError(
                str(func), f"{name} must be public (mpc.share(model) folds it into the weights)"
            )
        check_public(t, "batch_norm")
    shape = [1, -1] + [1] * (x.dim() - 2)
    inv = torch.rsqrt(var.to(torch.float64) + eps)
    y = add_shared(x, (mean.to(torch.float64)).view(shape), -1)
    if torch.allclose(inv, torch.ones_like(inv)):
        scaled = y
    else:
        scaled = y * inv.view(shape)
    if weight is not None:
        scaled = scaled * (
            weight.view(shape) if isinstance(weight, SharedTensor) else weight.view(shape)
        )
    if bias is not None:
        scaled = scaled + (bias.view(shape) if isinstance(bias, SharedTensor) else bias.view(shape))
    empty = torch.empty(0, device="meta")
    return scaled, empty, empty
