"""Products with a model's fixed weights: the weight keeps its Beaver mask across queries.

``mpc.share(model, ...)`` marks each shared parameter as a *fixed weight*; a layout op on
it (``t()``, ``transpose``, ``view``, a slice, ...) gives a fixed weight too, keyed by the
parameter and the ops applied. The first product of a shared activation x with a fixed
weight W makes a *weight instance* of W (:mod:`mpc.protocols.weights.steps`): F = W - B is
opened once, in the same round as the product's own opening. Every later product with the
same weight opens only e = x - A (a fresh A), and the dealer deals C = op(A, B): per query
the traffic scales with the activations, not the parameter count.

An instance lasts while its parameter does and is not written: an in-place update of
the parameter (an optimizer step) ends it, and the next product makes a new one with a
fresh B (the workers refuse a product with a modified weight in any case). While a plan
is recorded, products use ordinary Beaver triples (a plan's nonces are bound at each
run, an instance's F lives across runs), except inside :func:`held_instances`: a held
plan (:mod:`mpc.held`) records a first program that makes the instances of its stand-in
weights and a later one that uses them, and binds the later one's references to them
to what the first one's approved run kept (:mod:`pointers.worker.holding`).
"""

from __future__ import annotations

import contextlib
import contextvars
import weakref
from collections.abc import Iterator
from typing import Any

import torch

from mpc import config
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only, run_step
from mpc.protocols.truncation.steps import trunc_mask
from mpc.protocols.weights.steps import (
    dealer_trunc_weight,
    dealer_weight,
    dealer_weight_triple,
    trunc_material_words,
    trunc_weight_product,
    weight_mask,
    weight_product,
    weight_product_mask,
)
from mpc.session import Session, recording
from mpc.shared import SharedTensor

_HELD_RECORDING: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "mpc_held_instances", default=False
)


@contextlib.contextmanager
def held_instances() -> Iterator[None]:
    """Inside: products with fixed weights use instances while a plan is recorded (a held
    plan's recordings, see :mod:`mpc.held`)."""
    token = _HELD_RECORDING.set(True)
    try:
        yield
    finally:
        _HELD_RECORDING.reset(token)


def instances_of(param: SharedTensor) -> list[WeightInstance]:
    """The instances made of a fixed weight ``param`` (and its layout views)."""
    return list(param.__dict__.get("_weight_instances", {}).values())


def drop_instances(param: SharedTensor) -> None:
    """Forget the instances of ``param`` (their objects are deleted with their pointers)."""
    param.__dict__.pop("_weight_instances", None)


class WeightInstance:
    """The client's handles of one instance: the weight's shares it was made from, the
    opened F at each party, the dealer's B, and the parameter's state it is valid for."""

    __slots__ = ("weight", "w", "f", "b", "base_shares", "epoch", "frac_bits")

    def __init__(self, weight: int, w: SharedTensor, b: Any, base: SharedTensor) -> None:
        self.weight = weight
        self.w: Shares = list(w.shares)
        self.f: Shares = []
        self.b = b
        self.base_shares = list(base.shares)
        self.epoch = base.weight_epoch
        self.frac_bits = w.frac_bits

    def valid_for(self, w: SharedTensor, base: SharedTensor) -> bool:
        return (
            self.epoch == base.weight_epoch
            and self.frac_bits == w.frac_bits
            and len(self.base_shares) == len(base.shares)
            and all(s is t for s, t in zip(self.base_shares, base.shares))
        )


def mark_fixed(param: SharedTensor) -> None:
    """Mark a model's shared parameter as a fixed weight (:func:`mpc.share` of a model)."""
    param.fixed = (weakref.ref(param), ())


def _hashable(v: Any) -> Any:
    if v is None or type(v) in (int, float, bool, str):
        return v
    if isinstance(v, torch.dtype | torch.device | torch.memory_format):
        return str(v)
    if isinstance(v, list | tuple):
        return tuple(_hashable(u) for u in v)
    raise TypeError


def view_of(x: SharedTensor, outs: list[SharedTensor], func: Any, args: Any, kwargs: Any) -> None:
    """The outputs of a layout op on a fixed weight are fixed weights (keyed by the op and
    its public arguments; an op with a tensor argument ends the chain)."""
    if x.fixed is None:
        return
    try:
        key = (str(func), _hashable(args), _hashable(tuple(sorted(kwargs.items()))))
    except TypeError:
        return
    base, chain = x.fixed
    for k, out in enumerate(outs):
        out.fixed = (base, (*chain, (key, k)))


def written(x: SharedTensor) -> None:
    """``x`` was updated in place: a fixed weight it belongs to needs a new instance."""
    if x.fixed is not None:
        base = x.fixed[0]()
        if base is not None:
            base.weight_epoch += 1


def fixed_product(
    a: SharedTensor, b: SharedTensor, op: str, params: dict[str, Any], out_shape: tuple[int, ...]
) -> Shares | None:
    """[op(a, b)] where exactly one of ``a`` and ``b`` is a fixed weight, with its
    instance (made now if needed); None where neither or both are, or while a plan is
    recorded (then the caller runs an ordinary Beaver product).

    A matmul weight of more than :data:`~mpc.config.PIECE_BYTES` (GPT-2's token
    embedding: 309 MB) is split along the contraction dimension into pieces of at most
    that size, each an instance of its own (a network message is at most 256 MiB by
    default, and F travels whole): the partial products, opened in one round, are added."""
    runs = weight_runs(a, b, op, params)
    if runs is None:
        return None
    one = Round(runs[0].session)
    for run in runs:
        run.open_in(one)
    one.open()
    total = finish_runs(runs)
    if tuple(total[0].shape) != tuple(out_shape):
        raise AssertionError(f"internal: {tuple(total[0].shape)} != {out_shape}")
    return total


#: the most words of the dealer's D_k B_kj a truncated operand's product takes
#: (rows x K x N: a decoding step's attention output projection, 1 x 768 x 768, 590k)
TRUNC_WEIGHT_UP_TO = 1 << 20


def trunc_fixed_product(x: SharedTensor, w: SharedTensor) -> Shares | None:
    """[(x >> pending) @ W] for an operand x still to be truncated and a fixed 2-D weight
    W second, in one round (its truncation's opening; W's F rides in it where the
    instance is new): :func:`mpc.protocols.weights.steps.trunc_weight_product`. None where it does not
    apply (another layout, a large product, while a plan is recorded, or another mode):
    the caller truncates x, then multiplies."""
    session = x.session
    config_ = session.config
    if (
        not x.pending
        or w.pending
        or w.fixed is None
        or w.fixed[0]() is None
        or x.fixed is not None
        or w.dim() != 2
        or x.dim() < 1
        or int(x.shape[-1]) != int(w.shape[0])
        or (recording() and not _HELD_RECORDING.get())
        or config_.security != "semi-honest"
        or w.numel() * 8 > config.PIECE_BYTES
        or x.numel() * int(w.shape[1]) > TRUNC_WEIGHT_UP_TO
    ):
        return None
    inst, opening_f = _instance(session, w)
    bits = int(x.pending)
    nonce = session.next_nonce()
    seed = session.party_seeds
    x_shape = [int(d) for d in x.shape]
    rows = x.numel() // int(w.shape[0])
    out_shape = (*x_shape[:-1], int(w.shape[1]))
    words = trunc_material_words(x_shape, [int(d) for d in w.shape], bits)
    (material,) = deal(
        session,
        "a product with a shared weight",
        dealer_trunc_weight,
        [nonce, inst.b, x_shape, bits],
        out=[([words], I64)],
    )
    (masked,) = at_parties(
        session, trunc_mask, lambda i: [seed[i], nonce, x.shares[i]], [(x_shape, I64)]
    )
    one = Round(session)
    c = one.add(masked)
    f = one.add(opening_f) if opening_f is not None else None
    one.open()
    if f is not None:
        inst.f = f.value
    dealt = last_only(session, material)
    with session.concurrently(rows * int(w.shape[0]) * int(w.shape[1])):
        (z,) = at_parties(
            session,
            trunc_weight_product,
            lambda i: [
                seed[i],
                nonce,
                inst.weight,
                dealt(i),
                inst.w[i],
                inst.f[i],
                c.value[i],
                bits,
            ],
            [(out_shape, I64)],
        )
    return z


def weight_runs(
    a: SharedTensor, b: SharedTensor, op: str, params: dict[str, Any]
) -> list[WeightRun] | None:
    """The runs of op(a, b) where exactly one of ``a`` and ``b`` is a fixed weight (one
    per piece of a large weight, :func:`fixed_product`), their openings not yet joined to
    a round; None where :func:`fixed_product` takes no instance."""
    if (a.fixed is None) == (b.fixed is None) or (recording() and not _HELD_RECORDING.get()):
        return None
    w, x, w_first = (a, b, True) if a.fixed is not None else (b, a, False)
    if w.pending or x.pending or w.fixed is None or w.fixed[0]() is None:
        return None
    pieces = _pieces(w, x, op, w_first)
    return [_run(x.session, wp, xp, w_first, op, params) for wp, xp in pieces]


def finish_runs(runs: list[WeightRun]) -> Shares:
    """The sum of the runs' products (the pieces of one product, :func:`weight_runs`), once
    their openings opened."""
    out = [run.finish() for run in runs]
    total = out[0]
    for z in out[1:]:
        total = [t + u for t, u in zip(total, z)]
    return total


def _pieces(
    w: SharedTensor, x: SharedTensor, op: str, w_first: bool
) -> list[tuple[SharedTensor, SharedTensor]]:
    """(weight piece, operand piece) pairs whose products add up to op(x, w)."""
    size = w.numel() * 8
    if op != "matmul" or w.dim() != 2 or size <= config.PIECE_BYTES or x.dim() < 2:
        return [(w, x)]
    wdim, xdim = (1, x.dim() - 2) if w_first else (0, x.dim() - 1)
    k = int(w.shape[wdim])
    per = max(k * config.PIECE_BYTES // size, 1)
    aten = torch.ops.aten
    return [
        (aten.slice.Tensor(w, wdim, k0, k0 + per), aten.slice.Tensor(x, xdim, k0, k0 + per))
        for k0 in range(0, k, per)
    ]


def _run(
    session: Session,
    w: SharedTensor,
    x: SharedTensor,
    w_first: bool,
    op: str,
    params: dict[str, Any],
) -> WeightRun:
    inst, opening_f = _instance(session, w)
    mw, mx = torch.empty(w.shape, device="meta"), torch.empty(x.shape, device="meta")
    if op == "matmul":
        out = torch.matmul(mw, mx) if w_first else torch.matmul(mx, mw)
    elif op == "mul":
        out = mw * mx
    else:
        out = torch.nn.functional.conv2d(
            mw if w_first else mx,
            mx if w_first else mw,
            None,
            params["stride"],
            params["padding"],
            params["dilation"],
            params["groups"],
        )
    return WeightRun(session, inst, opening_f, x.shares, w_first, op, params, tuple(out.shape))


def _instance(session: Session, w: SharedTensor) -> tuple[WeightInstance, Shares | None]:
    """The instance of the fixed weight ``w`` (its layout's), made now where it has none
    or its weight was written: then with the parties' F shares to open, else None."""
    assert w.fixed is not None
    base = w.fixed[0]()
    assert base is not None
    instances: dict[Any, WeightInstance] = base.__dict__.setdefault("_weight_instances", {})
    key = w.fixed[1]
    inst = instances.get(key)
    if inst is not None and inst.valid_for(w, base):
        return inst, None
    inst, opening_f = _make(session, w, base)
    instances[key] = inst
    return inst, opening_f


def _make(session: Session, w: SharedTensor, base: SharedTensor) -> tuple[WeightInstance, Shares]:
    """A new instance of ``w``: the dealer's B, and each party's f_i = W_i - B_i to open."""
    dealer = session.require_dealer("a product with a shared weight")
    if not w.is_contiguous():
        # a transposed view (nn.Linear's W.t()): the instance keeps a contiguous copy, as
        # torch's int64 matmul is up to 10x slower on the view (GPT-2's LM head: 1.2 s)
        w = torch.ops.aten.clone.default(w, memory_format=torch.contiguous_format)
    weight = session.next_nonce()
    shape = [int(d) for d in w.shape]
    seed = session.party_seeds
    (b,) = run_step(dealer, dealer_weight, [session.dealer_seeds, weight, shape], [(shape, I64)])
    (f,) = at_parties(
        session, weight_mask, lambda i: [seed[i], weight, w.shares[i]], [(shape, I64)]
    )
    return WeightInstance(weight, w, b, base), f


class WeightRun:
    """One product with an instance, in phases so that several open in one round: the
    dealer's C and each party's e = x - A (and, for a new instance, its F), then the
    combination op(e, W) + op(A, F) + C."""

    def __init__(
        self,
        session: Session,
        inst: WeightInstance,
        opening_f: Shares | None,
        x: Shares,
        w_first: bool,
        op: str,
        params: dict[str, Any],
        out_shape: tuple[int, ...],
    ) -> None:
        self.session, self.inst, self.opening_f = session, inst, opening_f
        self.w_first, self.op, self.params, self.out_shape = w_first, op, params, out_shape
        self.nonce = nonce = session.next_nonce()
        seed = session.party_seeds
        x_shape = [int(d) for d in x[0].shape]
        (self.c_last,) = deal(
            session,
            "a product with a shared weight",
            dealer_weight_triple,
            [nonce, inst.b, x_shape, w_first, op, params],
            out=[(out_shape, I64)],
        )
        self.e, self.a = at_parties(
            session,
            weight_product_mask,
            lambda i: [seed[i], nonce, x[i]],
            [(tuple(x_shape), I64), (tuple(x_shape), I64)],
        )

    def open_in(self, round: Round) -> None:
        self.opened_e = round.add(self.e)
        self.opened_f = round.add(self.opening_f) if self.opening_f is not None else None

    def finish(self) -> Shares:
        inst, seed, nonce = self.inst, self.session.party_seeds, self.nonce
        if self.opened_f is not None:
            inst.f = self.opened_f.value
        c = last_only(self.session, self.c_last)
        e = self.opened_e.value
        (z,) = at_parties(
            self.session,
            weight_product,
            lambda i: [
                seed[i],
                nonce,
                inst.weight,
                c(i),
                inst.w[i],
                inst.f[i],
                self.a[i],
                e[i],
                self.w_first,
                self.op,
                self.params,
            ],
            [(self.out_shape, I64)],
        )
        return z
