"""The selections that ride on a comparison's daBit, in either mode (the carry tree's,
:mod:`mpc.protocols.comparison.run`, or FSS's, :mod:`mpc.protocols.fss.run`).

A comparison deals a random bit t shared both ways (a daBit) and opens d = msb(x) ^ t;
then msb(x) = d + (1 - 2d) t, and a selection v * msb(x) = d v + (1 - 2d) [v t] needs
only the product [v t]: the dealer's pair (a, c = a t) turns it into one opening of
e = v - a (:func:`dabit_mask`, :func:`dabit_product`), which rides on the comparison's
first round. Here: those steps, the last local step (:func:`cmp_select_finish`), the
parties' derived shares of t (:func:`party_derive`), and the dealer's part
(:func:`selection_material`, called by each mode's dealer step).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import groups_of_four
from mpc.protocols.rules import OPENED, is_last, kept, nonce_of, party_seed, record, same
from mpc.protocols.sizes import (
    WORD,
    declared,
    derived,
    elementwise,
    numel,
    shape_of,
    stream_records,
    tensor_elems,
)
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
    TAG_T_ARITH,
    consume,
    derive,
    last_share,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

# the most values one comparison selects (:func:`mpc.protocols.compare.select_by_msb`)
MAX_SELECTED = 16

# the opened d of either mode (the carry tree's XOR-opened one, FSS's sum-opened one)
D_OPENED = (OPENED + "cmp.d", OPENED + "fss.d")
# the parties' arithmetic shares of the daBit t (derived, or the last party's dealt)
T_KINDS = ("cmp.t", "dealer.cmp.tarith")


def select_once(call: ProtocolCall, comparison: int, what: str) -> None:
    """A comparison's daBits serve one selection of a whole value (ReLU's mask, the max
    of groups of four), once."""
    done: set[int] = call.state.setdefault("mpc.t_selected", set())
    if comparison in done:
        raise call.refuse(f"comparison {comparison}'s {what} before")
    done.add(comparison)


# -- the dealer ----------------------------------------------------------------------------


def selected_count(p: dict[str, Any]) -> int:
    """The products a dealer's call deals (its ``product_nonces``), for its size."""
    nonces = p.get("product_nonces")
    return min(len(nonces), MAX_SELECTED) if isinstance(nonces, list) else 0


def check_selection(shape: list[int], product_nonces: Any, group_nonce: Any) -> None:
    """A comparison's selections: at most :data:`MAX_SELECTED` products (an int nonce
    each), and a group nonce only for the six pairs of groups of four ([G, 6]), or the six
    pairs and the four values of a max after a ReLU ([G, 10])."""
    if group_nonce is not None and (
        type(group_nonce) is not int
        or len(shape) != 2
        or shape[-1] not in (groups_of_four.PLAIN, groups_of_four.RELU)
    ):
        raise ValueError(
            "a comparison of groups of four takes an int nonce and a [G, 6] or [G, 10] shape"
        )
    if not (
        isinstance(product_nonces, list)
        and len(product_nonces) <= MAX_SELECTED
        and all(type(v) is int for v in product_nonces)
    ):
        raise ValueError(
            f"a comparison selects at most {MAX_SELECTED} values, one nonce each, "
            f"got {product_nonces!r}"
        )


def selection_material(
    ctx: Any,
    seeds: list[torch.Tensor],
    t: torch.Tensor,
    shape: list[int],
    product_nonces: list[int],
) -> list[torch.Tensor]:
    """The last party's shares of what a comparison's selections ride on, given the daBits
    ``t``: per product nonce c = a t (a derived by every party), flat (for groups of four,
    :func:`mpc.protocols.max_of_four.steps.group_material` follows)."""
    parts = []
    for product_nonce in product_nonces:
        consume(ctx, seeds, product_nonce, TAG_A, TAG_C)
        c = sum_derived(seeds, product_nonce, TAG_A, shape).mul_(t)
        parts.append(last_share(c, seeds, product_nonce, TAG_C).reshape(-1))
    return parts


# -- the parties ---------------------------------------------------------------------------


def _party_derive_rule(call: ProtocolCall) -> Any:
    """Only the daBit's arithmetic share t, for the products of a selection."""
    nonce = nonce_of(call)
    seed = party_seed(call)
    if is_last(seed):
        raise call.refuse("the last party's daBit share is the dealer's, not derived")
    if call.value("tag") != TAG_T_ARITH:
        raise call.refuse("a party derives only the daBit's arithmetic share here")
    return [kept("cmp.t", nonce)]


@step(
    rule=_party_derive_rule,
    size=derived,
    keeps=stream_records(1),
    makes_material=True,
    name="mpc.derive",
)
def party_derive(ctx: Any, seed: torch.Tensor, nonce: int, tag: int, shape: list[int]) -> Any:
    """The party's share of the dealer's material ``(nonce, tag)`` (e.g. a daBit's [t])."""
    consume(ctx, [seed], nonce, tag)
    return derive(seed, nonce, tag, shape)


def _dabit_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    record(call, ("dabit", nonce), call.share("v"))
    return [seal("dabit.e", nonce)]


@step(
    rule=_dabit_mask_rule,
    size=elementwise(2, "v"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"dabit.e": SUM},
)
def dabit_mask(ctx: Any, seed: torch.Tensor, nonce: int, v: torch.Tensor) -> torch.Tensor:
    """e_i = v_i - a_i: the party's share of v masked for a product with the daBit's t
    (see :func:`dabit_product`)."""
    return minus_mask(ctx, seed, nonce, v)


def minus_mask(ctx: Any, seed: torch.Tensor, nonce: int, v: torch.Tensor) -> torch.Tensor:
    """v_i - a_i for the mask a of ``nonce`` (each party derives its share from its seed)."""
    consume(ctx, [seed], nonce, TAG_A)
    return v - derive(seed, nonce, TAG_A, list(v.shape))


def _dabit_product_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "c")
    t = call.material("t", T_KINDS, local=True)
    assert t is not None
    c = call.material("c", "dealer.cmp.prod", nonce, optional=True, consume=True)
    if c is not None and c.extra != (t.nonce,):
        raise call.refuse("the dealer's product correction belongs to another comparison")
    call.material("e", OPENED + "dabit.e", nonce, local=True, consume=True)
    return [kept("cmp.vt", nonce, extra=(t.nonce,))]


def _dabit_product_size(p: dict[str, Any]) -> int:
    return declared(2 * WORD * max(tensor_elems(p, "t"), tensor_elems(p, "e")))


@step(
    rule=_dabit_product_rule, size=_dabit_product_size, keeps=stream_records(1), makes_material=True
)
def dabit_product(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    c: torch.Tensor | None,
    t: torch.Tensor,
    e: torch.Tensor,
) -> torch.Tensor:
    """Party i's share of v t = c + e t, from the opened e = v - a: the dealer's c = a t
    (its correction ``c`` at the last party, None elsewhere: derived), summed over the
    parties a t + (v - a) t. t is the dealer's own random bit, so unlike a Beaver
    product of two values only e is opened (one word an element, not two), and nothing
    of the dealer's is needed before that opening."""
    consume(ctx, [seed], nonce, TAG_C)
    if e.shape != t.shape:
        raise ValueError(f"an opened e of shape {list(e.shape)} for a t of {list(t.shape)}")
    z = torch.mul(e, t)
    z += derive(seed, nonce, TAG_C, list(z.shape)) if c is None else c
    return z


def _cmp_select_finish_rule(call: ProtocolCall) -> Any:
    d = call.material("d", D_OPENED, local=True)
    assert d is not None
    vt = call.args.get("vt")
    label = vt.label if vt is not None else None
    if label is not None and label.kind == "cmp.vt":
        call.material("vt", "cmp.vt", local=True, consume=True)
        if label.extra != (d.nonce,):
            raise call.refuse("parameter 'vt' belongs to another comparison")
        same(call, ("dabit", label.nonce), "v")
        return None
    # the selection of 1 (ReLU's mask): [t] itself, once per comparison
    call.material("vt", T_KINDS, d.nonce, local=True)
    select_once(call, d.nonce, "mask was selected")
    call.share("v")
    return None


def _cmp_select_finish_size(p: dict[str, Any]) -> int:
    shapes = [shape_of(p.get(x)) for x in ("d", "v", "vt")]
    try:
        n = numel(list(torch.broadcast_shapes(*shapes)))
    except RuntimeError as e:
        raise ValueError(f"the shares of a selection do not broadcast: {e}") from None
    return declared(4 * WORD * n)


@step(rule=_cmp_select_finish_rule, size=_cmp_select_finish_size)
def cmp_select_finish(
    ctx: Any,
    complement: bool,
    d: torch.Tensor,
    v: torch.Tensor,
    vt: torch.Tensor,
) -> torch.Tensor:
    """Share of v * msb(x) = d v + (1 - 2d) [v t] (complement: (1 - d) v - (1 - 2d) [v t]).

    Every party holds d (public) and its shares of v and v t; d v is linear in v."""
    return selected_by_d(complement, d, v, vt)


def selected_by_d(
    complement: bool, d: torch.Tensor, v: torch.Tensor, vt: torch.Tensor
) -> torch.Tensor:
    """A party's share of v msb(x) = d v + (1 - 2d) [v t] (complement: (1 - d) v -
    (1 - 2d) [v t]) from the opened d = msb(x) ^ t and its shares of v and v t."""
    coef = 1 - 2 * d
    if complement:
        return (1 - d) * v - coef * vt
    return d * v + coef * vt
