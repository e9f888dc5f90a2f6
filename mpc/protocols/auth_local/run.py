"""The ops local to authenticated shares, the client's side (the steps:
:mod:`mpc.protocols.auth_local.steps`): one step at every party, no round."""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.auth_local.steps import (
    auth_bilinear_public,
    auth_linear,
    auth_scale,
    auth_sum,
    auth_view,
)
from mpc.protocols.auth_shares.state import auth_state
from mpc.protocols.parties import I64, Shares, at_parties
from mpc.session import Session


def _meta(shape: Any) -> tuple[int, ...]:
    return (2, 2, *shape)


def linear(
    session: Session,
    xs: list[Shares],
    coefs: list[int],
    const: torch.Tensor | None = None,
) -> Shares:
    """sum_k coefs[k] xs[k] + const (a public int64 tensor), broadcasting."""
    state = auth_state(session)
    seed = session.party_seeds
    shapes = [tuple(x[0].shape[2:]) for x in xs]
    if const is not None:
        shapes.append(tuple(const.shape))
    shape = torch.broadcast_shapes(*shapes)
    (z,) = at_parties(
        session,
        auth_linear,
        lambda i: [seed[i], state.keys[i], i == 0, [x[i] for x in xs], coefs, const],
        [(_meta(shape), I64)],
    )
    return z


def scale(session: Session, x: Shares, p: torch.Tensor) -> Shares:
    """x * p elementwise for a public int64 tensor p."""
    shape = torch.broadcast_shapes(tuple(x[0].shape[2:]), tuple(p.shape))
    (z,) = at_parties(session, auth_scale, lambda i: [x[i], p], [(_meta(shape), I64)])
    return z


def bilinear_public(
    session: Session,
    x: Shares,
    public: torch.Tensor,
    public_first: bool,
    op: str,
    params: dict[str, Any],
    out_shape: tuple[int, ...],
) -> Shares:
    """op(public, x) or op(x, public) for a public int64 operand."""
    (z,) = at_parties(
        session,
        auth_bilinear_public,
        lambda i: [x[i], public, public_first, op, params],
        [(_meta(out_shape), I64)],
    )
    return z


def sum_shares(
    session: Session, x: Shares, dims: list[int] | None, keepdim: bool, out_shape: tuple[int, ...]
) -> Shares:
    """The sum of x over ``dims`` (None: all)."""
    (z,) = at_parties(session, auth_sum, lambda i: [x[i], dims, keepdim], [(_meta(out_shape), I64)])
    return z


def view(
    session: Session,
    x: Shares | list[Shares],
    op: str,
    args: list[Any],
    out_shape: tuple[int, ...],
) -> Shares:
    """A layout op (:data:`mpc.protocols.auth_local.steps.VIEWS`) on x (or on a list of
    shares: cat, stack)."""
    if op in ("cat", "stack"):
        many: list[Shares] = x  # type: ignore[assignment]

        def of(i: int) -> list[Any]:
            return [[s[i] for s in many], op, args]
    else:
        one: Shares = x  # type: ignore[assignment]

        def of(i: int) -> list[Any]:
            return [one[i], op, args]

    (z,) = at_parties(session, auth_view, of, [(_meta(out_shape), I64)])
    return z
