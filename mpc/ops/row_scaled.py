"""A normalisation's output kept as ``S v + b`` (S one factor per row) until it is read,
so that the product with a weight that reads it takes the factor after the product:

    (S v + b) @ W = S (v @ W) + b @ W.

Layer norm's result is v = (x - mean) w over its rows, S = 1 / std, plus its bias
(RMSNorm's: v = x w, S = 1 / rms, no bias). After
its bins' comparison (:func:`mpc.protocols.inverse_product.row_factor`), the result
(:class:`RowScaled`) is not formed: its shares are deferred (:class:`mpc.shared.Deferred`).
A product ``result @ W`` with a shared weight (a linear layer's ``addmm``, a view of the
result first, as GPT-2's ``Conv1D`` and ``nn.Linear`` take it) then opens v @ W (and
b @ W) in the round of the factor's own products, and S (v @ W) rides in the truncation
round after it, together with S v, so the result is formed in the same rounds for any
other reader. The layer norm and the product took the comparison, three rounds and the
product's; here two. The next product that reads the formed result (Llama's k and v
projections after its q) truncates it once, one round, for every later product. Any
other read forms the result as the division would (two rounds; its truncation stays
pending until a reader needs it). The product's result keeps a pending truncation, as a
product's does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from mpc.ops.common import aten, encode_public, matmul_shape, result_dtype
from mpc.protocols.approx import Fx
from mpc.protocols.inverse_product import BeaverProduct, DigitRowFactor, ProductRun, RowFactor
from mpc.protocols.opening.run import Round
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.protocols.truncation.run import truncate_together
from mpc.protocols.weights.run import WeightRun, finish_runs, weight_runs
from mpc.shared import Deferred, SharedTensor

ROW_SCALED = "row_scaled"
Factor = RowFactor | DigitRowFactor
VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)
LEADING = (aten.slice.Tensor, aten.select.int)


class RowScaled:
    """S v + b per row of v (``factor``), b a shared row (``bias``) or None; ``shares``
    once formed (at scale ``bits + f``, ``bits`` pending)."""

    def __init__(
        self, factor: Factor, bias: SharedTensor | None, f: int, parent: RowScaled | None = None
    ) -> None:
        self.factor, self.bias, self.f, self.parent = factor, bias, f, parent
        self.bits = factor.s_bits
        self.shape = list(factor.v.shape)
        self.shares: list[Any] | None = None
        self.truncated: list[Any] | None = None  # the shares at scale f, once a product needs them
        self.used = False  # a value taken from this one (its last position) was formed

    @property
    def done(self) -> bool:
        return self.shares is not None or self.used

    def value(self) -> list[Any]:
        """The shares of S v + b, formed now if no product formed them (two rounds)."""
        if self.shares is None:
            self.form(self.factor, lambda v: [], False)
        assert self.shares is not None
        return self.shares

    def form(
        self, factor: Factor, make: Callable[[Fx], list[ProductRun]], product: bool
    ) -> tuple[Fx | None, list[ProductRun]]:
        """Round 1: the factor's products with the openings of the runs ``make`` gives
        for v (or the factor's comparison with them, :class:`~mpc.protocols.
        inverse_product.DigitRowFactor`); round 2: S, S v and, with ``product``, S times
        the first run's result, truncations and products in one round. Keeps S v + b
        (shaped as the value); returns S times the product, and the runs."""
        s, extra = factor.products(make)
        values, scales, pairs = [s, factor.v.lift(self.f + 1)], [self.bits, self.f], [(0, 1)]
        if product:
            values.append(extra[0].finish())
            scales.append(self.f)
            pairs.append((0, 2))
        _, prods = truncate_and_multiply(values, scales, [0.0] * len(values), pairs)
        sv = prods[0].shares
        if self.bias is not None:
            lift = 1 << self.bits
            sv = [t + b.reshape(-1) * lift for t, b in zip(sv, self.bias.shares)]
        self.shares = [t.reshape(self.shape) for t in sv]
        up = self.parent
        while up is not None:
            up.used, up = True, up.parent
        return (prods[1] if product else None), extra


class RowDeferred(Deferred):
    """A deferred :class:`RowScaled` result, or a view of it (``shape``); ``source`` is
    the tensor it derives from (the norm's input, the viewed tensor), never the tensor
    whose shares it defers (no reference cycle: an unread result is freed with its
    tensor, as a program's recording expects of what it does not keep)."""

    def __init__(self, state: RowScaled, source: SharedTensor, shape: list[int]) -> None:
        super().__init__(
            source.session,
            source,
            lambda: [t.reshape(shape) for t in state.value()],
            kind=ROW_SCALED,
        )
        self.state, self.shape = state, shape

    @property
    def done(self) -> bool:
        """Its rounds are run once the value is formed (a product formed it: what is
        left, a reshape at the parties, waits for a read), or once a value taken from it
        was (its other rows are formed only if they are read)."""
        return self.state.done


def at_scale(t: Any, f: int) -> bool:
    """Whether ``t`` is a shared value at scale ``f`` with no truncation pending (a bias
    the result adds, or a product's, as it is)."""
    return isinstance(t, SharedTensor) and not t.pending and t.frac_bits == f


def row_scaled(
    like: SharedTensor, factor: Factor, bias: SharedTensor | None, f: int
) -> SharedTensor:
    """The deferred result S v + b (see the module docstring), of ``like``'s dtype."""
    if factor.v_scale != f or (bias is not None and not at_scale(bias, f)):
        raise ValueError("internal: v and the bias are at the session's scale")
    state = RowScaled(factor, bias, f)
    dtype = like.dtype if like.dtype.is_floating_point else torch.float32
    out = SharedTensor(list(factor.v.shares), like.session, state.bits + f, dtype, state.bits)
    out.deferred = RowDeferred(state, like, state.shape)
    return out


def _row(x: Any) -> RowDeferred | None:
    """x's deferred result (or view of one) if its shares are not read yet."""
    d = x.deferred if isinstance(x, SharedTensor) else None
    return d if isinstance(d, RowDeferred) and d.source is not None else None


def _open(x: Any) -> RowDeferred | None:
    """x's deferred result if no product formed it yet."""
    d = _row(x)
    return d if d is not None and d.state.shares is None else None


def _settle(x: SharedTensor, d: RowDeferred) -> None:
    """x, a view of a result a product formed, at the session's scale: the result is
    truncated once (one round, at the first product that reads it so) and every later
    view reads those shares."""
    state = d.state
    if state.truncated is None:
        shares = state.value()
        with x.session.concurrently(math.prod(state.shape)):
            (state.truncated,) = truncate_together(x.session, [(shares, state.bits)])
    x.shares = [t.reshape(d.shape) for t in state.truncated]
    x.frac_bits, x.pending = state.f, 0


def view(x: SharedTensor, func: Any, args: tuple[Any, ...]) -> SharedTensor | None:
    """A view of a deferred result that keeps its last dimension (a linear layer's
    ``x.view(-1, n)``: the same value, viewed) or an index or slice of a leading one
    (GPT-2's head reads the last position: a value of its own) stays deferred; None for
    any other op or value."""
    d = _row(x)
    if d is None:
        return None
    if func in VIEWS:
        shape = list(torch.empty(tuple(x.shape), device="meta").reshape(args[1]).shape)
        if not shape or shape[-1] != x.shape[-1]:
            return None
        state = d.state
        if state.truncated is not None:  # (formed and truncated: a plain view of those)
            shares = [t.reshape(shape) for t in state.truncated]
            return SharedTensor(shares, x.session, state.f, x.dtype)
        placeholder = [t.reshape(shape) for t in state.factor.v.shares]
    elif func in LEADING and d.state.shares is None:
        dim = int(args[1]) % max(x.dim(), 1) if len(args) > 1 else 0
        if dim >= x.dim() - 1:
            return None
        factor = d.state.factor.reshaped(d.shape).mapped(lambda t: func(t, *args[1:]))
        state = RowScaled(factor, d.state.bias, d.state.f, d.state)
        shape, placeholder = state.shape, list(factor.v.shares)
    else:
        return None
    out = SharedTensor(placeholder, x.session, x.frac_bits, x.dtype, x.pending)
    out.deferred = RowDeferred(state, x, shape)
    return out


class _Weighted:
    """v @ W with a weight instance (its pieces' runs summed), as a ProductRun."""

    def __init__(self, runs: list[WeightRun], scale: int) -> None:
        self.runs, self.scale = runs, scale

    def open_in(self, round: Round) -> None:
        for r in self.runs:
            r.open_in(round)

    def finish(self) -> Fx:
        return Fx(self.runs[0].session, finish_runs(self.runs), self.scale)


def _product(x: SharedTensor, w: SharedTensor) -> ProductRun:
    """x @ w: with w's instance where it has one, else a Beaver product."""
    runs = weight_runs(x, w, "matmul", {})
    scale = x.frac_bits + w.frac_bits
    if runs is not None:
        return _Weighted(runs, scale)
    out_shape = matmul_shape(x.shape, w.shape)
    a = Fx(x.session, list(x.shares), x.frac_bits)
    return BeaverProduct(a, Fx(w.session, list(w.shares), w.frac_bits), "matmul", out_shape)


def fused_product(a: Any, w: Any, bias: Any = None) -> SharedTensor | None:
    """``a @ w + bias`` where ``a`` is a deferred :class:`RowScaled` result (or a view of
    it) and ``w`` a shared 2-D weight: S (v @ w) + b @ w + bias in the factor's rounds
    (the module docstring), or None (the caller forms ``a`` and multiplies)."""
    d = _row(a)
    if d is None:
        return None
    if d.state.shares is not None:  # (formed by another product: read at scale f)
        _settle(a, d)
        return None
    if not isinstance(w, SharedTensor) or w.pending or w.dim() != 2:
        return None
    state = d.state
    if int(w.shape[0]) != d.shape[-1] or w.frac_bits != state.f or not w.dtype.is_floating_point:
        return None
    if state.bits < state.f:  # (b @ w, at 2f, is lifted to the result's scale)
        return None
    if isinstance(bias, SharedTensor) and not at_scale(bias, state.f):
        return None
    factor = state.factor.reshaped(d.shape)
    f, session = state.f, a.session
    dtype = result_dtype(a, w)

    def make(v_fx: Fx) -> list[ProductRun]:
        v = SharedTensor(list(v_fx.shares), session, f, dtype)
        runs = [_product(v, w)]
        if state.bias is not None:
            b = state.bias
            row = SharedTensor([t.reshape(1, -1) for t in b.shares], session, b.frac_bits, dtype)
            runs.append(_product(row, w))
        return runs

    with session.concurrently(max(math.prod(d.shape), w.numel())):
        out, runs = state.form(factor, make, True)
    assert out is not None
    scale = state.bits + f
    shares = list(out.shares)
    if state.bias is not None:  # b @ w, at 2f, lifted to the result's scale
        bw = runs[1].finish()
        lift = 1 << (scale - bw.scale)
        shares = [t + u * lift for t, u in zip(shares, bw.shares)]
    if isinstance(bias, SharedTensor):
        shares = [t + u * (1 << state.bits) for t, u in zip(shares, bias.shares)]
    elif bias is not None:
        shares[0] = shares[0] + encode_public(torch.as_tensor(bias), scale)
    return SharedTensor(shares, session, scale, dtype, state.bits)
