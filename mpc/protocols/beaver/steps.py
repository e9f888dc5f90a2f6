"""The steps of a Beaver product (the protocol: :func:`mpc.protocols.beaver.run.beaver`):
the dealer's triple, each party's masking and its combination, and the local product of
a share by a public value.

Instance: one nonce. The dealer's c goes to the last party (the others derive theirs);
each party masks x and y with its derived a and b ([e | f], opened as one value) and
keeps a; once [e | f] is open it combines them with the very y it masked.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.ring import ring_bilinear
from mpc.protocols.rules import (
    OPENED,
    dealer_seeds,
    kept,
    nonce_of,
    party_seed,
    record,
    same,
)
from mpc.protocols.sizes import (
    WORD,
    bilinear,
    declared,
    numel,
    row_major,
    shape_of,
    stream_records,
    tensor_elems,
)
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import TAG_A, TAG_B, TAG_C, consume, derive, last_share, sum_derived
from pointers.worker.sealing import ProtocolCall, seal

# -- the dealer ----------------------------------------------------------------------------


def _triple_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.triple", nonce_of(call), deliveries=1)]


def _triple_size(p: dict[str, Any]) -> int:
    """a and b, c (in a's buffer for a product of one shape) and the others' derived
    shares of c, and the product's temporaries."""
    a_shape, b_shape, op = p.get("a_shape"), p.get("b_shape"), p.get("op")
    out, temp = bilinear(op, p.get("params"), a_shape, b_shape)
    ea, eb = numel(a_shape, "a_shape"), numel(b_shape, "b_shape")
    in_place = op == "mul" and a_shape == b_shape
    return declared(WORD * (ea + eb) + (1 if in_place else 2) * out + temp)


@step(rule=_triple_rule, size=_triple_size, keeps=stream_records(3), makes_material=True)
def dealer_triple(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    a_shape: list[int],
    b_shape: list[int],
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Beaver triple c = op(a, b): the last party's share of c (the others derive theirs)."""
    consume(ctx, seeds, nonce, TAG_A, TAG_B, TAG_C)
    a = sum_derived(seeds, nonce, TAG_A, a_shape)
    b = sum_derived(seeds, nonce, TAG_B, b_shape)
    c = a.mul_(b) if op == "mul" and a_shape == b_shape else ring_bilinear(op, params, a, b)
    return last_share(c, seeds, nonce, TAG_C)


# -- the parties ---------------------------------------------------------------------------


def _mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    record(call, ("beaver", nonce), call.share("y"))
    return [seal("beaver.ef", nonce), kept("beaver.a", nonce)]


def _mask_size(p: dict[str, Any]) -> int:
    """[e | f], a, and b (derived, then freed)."""
    return declared(2 * WORD * (tensor_elems(p, "x") + tensor_elems(p, "y")))


@step(
    rule=_mask_rule,
    size=_mask_size,
    keeps=stream_records(2),
    makes_material=True,
    opens={"beaver.ef": SUM},
)
def beaver_mask(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    x: torch.Tensor,
    y: torch.Tensor,
) -> list[torch.Tensor]:
    """Party i: the masked e_i = x_i - a_i and f_i = y_i - b_i packed flat in one tensor
    [e_i | f_i] (one value to open), and its triple share a_i."""
    consume(ctx, [seed], nonce, TAG_A, TAG_B)
    a = derive(seed, nonce, TAG_A, list(x.shape))
    b = derive(seed, nonce, TAG_B, list(y.shape))
    nx = a.numel()
    ef = torch.empty(nx + b.numel(), dtype=torch.int64)
    torch.sub(x.reshape(-1), a.reshape(-1), out=ef[:nx])
    torch.sub(y.reshape(-1), b.reshape(-1), out=ef[nx:])
    return [ef, a]


def _combine_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "c")
    call.material("c", "dealer.triple", nonce, local=False, optional=True, consume=True)
    call.material("a", "beaver.a", nonce, local=True, consume=True)
    call.material("ef", OPENED + "beaver.ef", nonce, local=True, consume=True)
    same(call, ("beaver", nonce), "y")
    return None


def _combine_size(p: dict[str, Any]) -> int:
    """The result (in e's buffer for a product of one shape), else the two products and
    their temporaries."""
    a, y, op = p.get("a"), p.get("y"), p.get("op")
    out, temp = bilinear(op, p.get("params"), shape_of(a), shape_of(y), row_major(y))
    in_place = op == "mul" and shape_of(a) == shape_of(y)
    return declared(out if in_place else 2 * out + temp)


@step(rule=_combine_rule, size=_combine_size, keeps=stream_records(1))
def beaver_combine(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    c: torch.Tensor | None,
    y: torch.Tensor,
    a: torch.Tensor,
    ef: torch.Tensor,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """Party i's share of op(x, y) = c + op(e, y) + op(a, f), summed over the parties:
    c + op(e, b + f) + op(a, f) = op(a + e, b + f). No party needs a special term.

    ``c`` is the dealer's correction at the last party, None elsewhere (then derived).
    ``ef`` is the opened [e | f] (e of a's shape, f of y's), this call's own temporary
    (opened here), like ``a`` (derived for this nonce): the elementwise case works in
    their buffers.
    """
    consume(ctx, [seed], nonce, TAG_C)
    nx = a.numel()
    if ef.dim() != 1 or ef.numel() != nx + y.numel():
        raise ValueError(f"an opened [e | f] of {ef.numel()} elements for {nx} + {y.numel()}")
    e, f = ef[:nx].view(a.shape), ef[nx:].view(y.shape)
    if op == "mul" and e.shape == y.shape == a.shape == f.shape:
        z = e.mul_(y).addcmul_(a, f)
    else:
        z = ring_bilinear(op, params, e, y)
        z += ring_bilinear(op, params, a, f)
    z += derive(seed, nonce, TAG_C, list(z.shape)) if c is None else c
    return z


# -- a product by a public value -------------------------------------------------------------


def _public_size(p: dict[str, Any]) -> int:
    """The product and its temporaries."""
    share, public = p.get("share"), p.get("public")
    first, second = (public, share) if p.get("public_first") is True else (share, public)
    out, temp = bilinear(
        p.get("op"), p.get("params"), shape_of(first), shape_of(second), row_major(second)
    )
    return declared(out + temp)


@step(size=_public_size)
def bilinear_public(
    ctx: Any,
    share: torch.Tensor,
    public: torch.Tensor,
    public_first: bool,
    op: str,
    params: dict[str, Any],
) -> torch.Tensor:
    """A share times an (encoded) public operand, in the ring: local to each party."""
    if public_first:
        return ring_bilinear(op, params, public, share)
    return ring_bilinear(op, params, share, public)
