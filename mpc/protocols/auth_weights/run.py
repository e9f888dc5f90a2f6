"""Products with a model's authenticated weights, the client's side (the steps and why the
reuse is safe: :mod:`mpc.protocols.auth_weights.steps`).

``mpc.share(model, ..., security="malicious")`` marks each shared parameter as a *fixed
weight*; a layout op on it (``t()``, ``transpose``, ``view``, ...) gives a fixed weight too,
keyed by the parameter and the ops applied. The first product of an authenticated
activation with a fixed weight makes an *instance* of it: the dealer's authenticated B,
and F = W - B opened in the same round as the product's own opening. Every later product
with it opens only e = x - A: per query the traffic scales with the activations, not with
the parameter count.
"""

from __future__ import annotations

import weakref
from typing import Any

from mpc.protocols.auth_opening.run import open_auth
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.auth_weights.steps import (
    auth_weight_mask,
    auth_wprod,
    auth_wprod_mask,
    dealer_auth_weight,
    dealer_auth_weight_triple,
    triple_words,
)
from mpc.protocols.parties import I64, Shares, at_parties, call
from mpc.protocols.step import name_of
from mpc.session import Session

INSTANCES = "_auth_weight_instances"


def mark_fixed(param: Any) -> None:
    """Mark a model's authenticated parameter as a fixed weight."""
    param.fixed = (weakref.ref(param), ())


def view_of(x: Any, out: Any, op: str, op_args: list[Any]) -> None:
    """The output of a layout op on a fixed weight is a fixed weight, keyed by the op and
    its public arguments."""
    fixed = getattr(x, "fixed", None)
    if fixed is not None:
        out.fixed = (fixed[0], (*fixed[1], (op, repr(op_args))))


class Instance:
    """The client's handles of one instance: its nonce, the weight's shares it masked, the
    opened F at each party, the dealer's B, and what it is valid for."""

    def __init__(self, weight: int, w: Shares, b: Any, base: Any, frac_bits: int) -> None:
        self.weight, self.w, self.b = weight, w, b
        self.f: Shares = []
        self.base_shares = list(base.shares)
        self.frac_bits = frac_bits

    def valid_for(self, base: Any, frac_bits: int) -> bool:
        return self.frac_bits == frac_bits and all(
            s is t for s, t in zip(self.base_shares, base.shares, strict=True)
        )


def fixed_product(
    session: Session,
    a: Any,
    b: Any,
    op: str,
    params: dict[str, Any],
    out_shape: tuple[int, ...],
) -> Shares | None:
    """[op(a, b)] where exactly one of the authenticated ``a`` and ``b`` is a fixed weight,
    with its instance (made now if needed: its F opens in the product's round); None where
    neither or both are (the caller runs an authenticated Beaver product)."""
    fa, fb = getattr(a, "fixed", None), getattr(b, "fixed", None)
    if (fa is None) == (fb is None):
        return None
    w, x, w_first = (a, b, True) if fa is not None else (b, a, False)
    base = w.fixed[0]()
    if base is None or w.pending or x.pending:
        return None
    instances: dict[Any, Instance] = base.__dict__.setdefault(INSTANCES, {})
    key = w.fixed[1]
    inst = instances.get(key)
    state = auth_state(session)
    dealer = session.require_dealer("a product with a shared weight")
    seed = session.party_seeds
    last = session.n - 1
    opening_f = None
    if inst is None or not inst.valid_for(base, w.frac_bits):
        weight = session.next_nonce()
        shape = [int(d) for d in w.shape]
        b_kept, b_corr = call(
            dealer,
            name_of(dealer_auth_weight),
            [session.dealer_seeds, state.alpha, weight, shape],
            [(tuple(shape), I64), ((2, *shape), I64)],
        )
        corr_last = b_corr.move(session.parties[last])
        piece, mac = at_parties(
            session,
            auth_weight_mask,
            lambda i: [seed[i], weight, w.shares[i], corr_last if i == last else None],
            [((2, *shape), I64), ((2, *shape), I64)],
        )
        inst = instances[key] = Instance(weight, list(w.shares), b_kept, base, w.frac_bits)
        opening_f = (piece, mac)
    nonce = session.next_nonce()
    x_shape = [int(d) for d in x.shape]
    c_shape = [int(d) for d in out_shape]
    (corr,) = call(
        dealer,
        name_of(dealer_auth_weight_triple),
        [session.dealer_seeds, state.alpha, nonce, inst.b, x_shape, w_first, op, params],
        [((triple_words(x_shape, c_shape),), I64)],
    )
    corr_last = corr.move(session.parties[last])
    piece_e, mac_e, a_kept, c_kept = at_parties(
        session,
        auth_wprod_mask,
        lambda i: [seed[i], nonce, x.shares[i], c_shape, corr_last if i == last else None],
        [
            ((2, *x_shape), I64),
            ((2, *x_shape), I64),
            ((2, 2, *x_shape), I64),
            ((2, 2, *c_shape), I64),
        ],
    )
    opened = open_auth(session, [(piece_e, mac_e)] + ([opening_f] if opening_f else []))
    if opening_f is not None:
        inst.f = opened[1]
    e = opened[0]
    (z,) = at_parties(
        session,
        auth_wprod,
        lambda i: [
            nonce,
            inst.weight,
            inst.w[i],
            inst.f[i],
            a_kept[i],
            c_kept[i],
            e[i],
            w_first,
            op,
            params,
        ],  # fmt: skip
        [((2, 2, *c_shape), I64)],
    )
    return z


__all__ = ["fixed_product", "mark_fixed", "view_of"]
