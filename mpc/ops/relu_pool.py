"""A ReLU followed by a 2x2 max-pool in one comparison run (issue 25).

In inference a ReLU does not run when it is called: its result is a SharedTensor whose
shares are deferred (:class:`mpc.shared.Deferred`). Any read of them (a view, ``get()``,
any other op, an in-place write anywhere in the session) runs the ReLU exactly as it
ran before, in the same rounds. A 2x2 max-pool (stride 2, no padding) of a deferred ReLU
instead takes the ReLU's input and computes

    max(relu(a_0), .., relu(a_3)) = max(0, a_0, .., a_3)

of each window in one comparison run (:func:`mpc.protocols.max_of_four.run.max_of_four` with
``relu``: the six pairwise differences and the four values, 4 rounds, 2 with
``comparison="fss"``), where the ReLU's run and then the max's took two (8 rounds; FSS:
the one-round ReLU of a product and the max's 2). A truncation pending on the ReLU's
input (a product) is absorbed as the ReLU absorbs it: the comparisons read the product,
the truncation opens in the run's first round. A ReLU whose result is never read costs
nothing.
"""

from __future__ import annotations

from typing import Any, cast

import pointers as pt
from mpc.protocols.compare import relu_truncating, select_by_msb
from mpc.protocols.max_of_four.run import max_of_four
from mpc.shared import Deferred, SharedTensor


def _relu_now(x: SharedTensor) -> list[Any]:
    """The ReLU's shares (at scale ``x.frac_bits - x.pending``): one comparison run (with
    the in-process workers side by side for large operands, as when the ReLU was called,
    whichever op reads it)."""
    with x.session.concurrently(x.numel()):
        if x.pending:  # fuse the pending truncation into the comparison's rounds
            return relu_truncating(x.session, x.shares, x.pending)
        (out,) = select_by_msb(x.session, x.shares, [x.shares], complement=True)
        return out


def deferred_relu(x: SharedTensor) -> SharedTensor:
    """relu(x) whose comparison runs when its shares are first read (see the module
    docstring); the ReLU of a deferred ReLU is a copy of it (no second run)."""
    x.session.require_dealer("comparison of secret values")  # (an error now, not at a read)
    d = x.deferred
    if d is not None and d.source is not None and d.kind == RELU:
        src, first = d.source, d

        def copy() -> list[Any]:  # (the first ReLU's shares, even once x is released)
            return [s.clone() for s in first.value()]

        out = SharedTensor(src.shares, x.session, x.frac_bits, x.dtype)
        out.deferred = _relu_cell(x.session, src, copy)
        return out
    # the input as it is now (its shares, scale and pending truncation): a later
    # materialize() of x rebinds x's shares and leaves these
    src = SharedTensor(x.shares, x.session, x.frac_bits, x.dtype, x.pending)
    src.keep_alive = x.keep_alive
    out = SharedTensor(x.shares, x.session, x.frac_bits - x.pending, x.dtype)
    out.deferred = _relu_cell(x.session, src, lambda: _relu_now(src))
    return out


RELU = "relu"


def _relu_cell(session: Any, src: SharedTensor, compute: Any) -> Deferred:
    return Deferred(session, src, compute, kind=RELU)


def relu_source(x: Any) -> SharedTensor | None:
    """The input of ``x``'s ReLU if x is a ReLU not computed yet, else None."""
    d = x.deferred if isinstance(x, SharedTensor) else None
    if d is None or d.source is None or d.kind != RELU:
        return None
    return d.source


def pool_of_relu(
    x: Any, kernel: list[int], stride: list[int], padding: list[int]
) -> SharedTensor | None:
    """max_pool2d(relu(a), 2) of a deferred ReLU ``x`` = relu(a), in one comparison run;
    None where that does not apply (then the ReLU runs and the max-pool as before)."""
    src = relu_source(x)
    if (
        src is None
        or list(kernel) != [2, 2]
        or list(stride) != [2, 2]
        or any(padding)
        or src.dim() != 4
        or src.shape[2] < 2
        or src.shape[3] < 2
    ):
        return None
    n, c, h, w = src.shape
    ho, wo = h // 2, w // 2
    # each party's windows as rows of four: [N C Ho Wo, 4] (views and one copy)
    groups = [
        cast(
            pt.PointerTensor,
            s[:, :, : 2 * ho, : 2 * wo]
            .reshape(n, c, ho, 2, wo, 2)
            .permute(0, 1, 2, 4, 3, 5)
            .reshape(-1, 4),
        )
        for s in src.shares
    ]
    session = src.session
    with session.concurrently(src.numel()):
        best, _ = max_of_four(session, groups, relu=True, pending=src.pending)
    out = [b.view(n, c, ho, wo) for b in best]
    return SharedTensor(out, session, src.frac_bits - src.pending, src.dtype)


__all__ = ["deferred_relu", "pool_of_relu", "relu_source"]
