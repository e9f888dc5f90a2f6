"""The steps of the max of groups of four (the protocol:
:func:`mpc.protocols.max_of_four.run.max_of_four`; the math:
:mod:`mpc.math.groups_of_four`): each party masks its groups (e = a - alpha, opened with
the comparison's first round or, after a pending truncation, its second), and selects
the max from the opened d and e and the daBits' products; the dealer deals those
products with the comparison's material (:func:`group_material`, called by each mode's
dealer step).

Instance: the group nonce, bound by the dealer to its comparison.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import groups_of_four
from mpc.protocols.comparison.selection import D_OPENED, T_KINDS, minus_mask, select_once
from mpc.protocols.rules import OPENED, nonce_of, party_seed, record, same
from mpc.protocols.sizes import WORD, declared, elementwise, elems, stream_records
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import TAG_A, TAG_C, TAG_U, consume, derive, last_share, sum_derived
from pointers.worker.sealing import ProtocolCall, seal


def group_terms(call: ProtocolCall, shape: Any) -> int:
    """The dealer's selection words of groups of four of ``shape`` ([G, 6] or [G, 10])."""
    if not (
        isinstance(shape, list)
        and len(shape) == 2
        and shape[1] in (groups_of_four.PLAIN, groups_of_four.RELU)
    ):
        raise call.refuse("groups of four are compared as [G, 6] or [G, 10]")
    return groups_of_four.terms(shape[1]) * int(shape[0])


# -- the dealer ----------------------------------------------------------------------------


def group_words(p: dict[str, Any]) -> float:
    """Words an element (of its ``shape``, [G, 6] or [G, 10]) that a dealer's call holds
    for groups of four (its ``group_nonce``) at its peak, for its size: 1.2 times the
    words of the daBits' products (44 a group of [G, 6], 104 of [G, 10]), as measured."""
    shape = p.get("shape")
    if p.get("group_nonce") is None or not isinstance(shape, list) or len(shape) != 2:
        return 0
    k = shape[1] if shape[1] in (groups_of_four.PLAIN, groups_of_four.RELU) else 6
    return 1.2 * groups_of_four.terms(k) / k


def group_material(
    ctx: Any, seeds: list[torch.Tensor], t: torch.Tensor, shape: list[int], group_nonce: int
) -> list[torch.Tensor]:
    """The last party's shares of the daBits' products and of their products with the
    groups' masks (flat), given the comparison's daBits ``t`` ([G, 6] or [G, 10])."""
    consume(ctx, seeds, group_nonce, TAG_A, TAG_C, TAG_U)
    groups = shape[0]
    alpha = sum_derived(seeds, group_nonce, TAG_A, [groups, 4])
    tt, at = groups_of_four.dealer_monomials(t.view(groups, shape[1]), alpha)
    tt, at = last_share(tt, seeds, group_nonce, TAG_C), last_share(at, seeds, group_nonce, TAG_U)
    return [tt.reshape(-1), at.reshape(-1)]


# -- the parties ---------------------------------------------------------------------------


def _group_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    record(call, ("group", nonce), call.share("a"))
    return [seal("group.e", nonce)]


@step(
    rule=_group_mask_rule,
    size=elementwise(2, "a"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"group.e": SUM},
)
def group_mask(ctx: Any, seed: torch.Tensor, nonce: int, a: torch.Tensor) -> torch.Tensor:
    """e_i = a_i - alpha_i: the party's share of the groups of four (``a``: [G, 4]) masked
    for their selection (see :func:`group_select`)."""
    if a.dim() != 2 or a.shape[1] != 4:
        raise ValueError(f"the values of groups of four are [G, 4], got {list(a.shape)}")
    return minus_mask(ctx, seed, nonce, a)


def _group_select_rule(call: ProtocolCall) -> Any:
    """The selection of groups of four: the comparison's opened d and its daBits t (used
    for this selection once), the opened e of the groups' instance, and the very values
    its mask step masked."""
    nonce = nonce_of(call)
    party_seed(call, "material")
    d = call.material("d", D_OPENED, local=True)
    assert d is not None
    mat = call.args.get("material")
    if mat is not None and mat.entries is not None:
        raise call.refuse("parameter 'material' takes the dealer's selection material")
    if mat is not None and mat.entry is not None:
        label = call.material("material", "dealer.cmp.group", nonce, consume=True)
        assert label is not None
        if label.extra != (d.nonce,):
            raise call.refuse("the dealer's selection material belongs to another comparison")
    call.material("t", T_KINDS, d.nonce, local=True)
    select_once(call, d.nonce, "daBits were used for a selection")
    call.material("e", OPENED + "group.e", nonce, local=True, consume=True)
    same(call, ("group", nonce), "a")
    return None


def _group_select_size(p: dict[str, Any]) -> int:
    """The max of groups of four: the daBits' products ([G, 44] derived or viewed; [G, 104]
    after a ReLU, d [G, 10]), the expansion's coefficients and terms (a few [G] words per
    product): 61 words a group of [G, 6], 133 of [G, 10], measured at 2^18 groups."""
    groups = elems(p.get("a")) // 4 + 1
    per = 61 if elems(p.get("d")) <= 6 * groups else 133
    return declared(per * WORD * groups)


@step(rule=_group_select_rule, size=_group_select_size, keeps=stream_records(2))
def group_select(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    material: torch.Tensor | None,
    d: torch.Tensor,
    t: torch.Tensor,
    e: torch.Tensor,
    a: torch.Tensor,
    onehot: bool,
) -> list[torch.Tensor]:
    """The party's share of the max of each group of four (first index on ties) and, with
    ``onehot``, of its one-hot argmax, from the comparison of the six pairs (the opened d
    and its daBits' shares t, [G, 6]; [G, 10]: the pairs and the four values, the max of
    0 and the four, :data:`mpc.math.groups_of_four.RELU`), the opened e = a - alpha ([G, 4]) and the products of
    the daBits (and of the masks with them): the dealer's ``material`` at the last party,
    derived elsewhere (:func:`mpc.math.groups_of_four.select`). Local."""
    groups = a.shape[0] if a.dim() == 2 else -1
    bits = d.shape[-1] if d.dim() == 2 else -1  # 6, or 10 for the max after a ReLU
    if not (
        a.dim() == 2
        and a.shape[1] == 4
        and list(e.shape) == [groups, 4]
        and list(d.shape) == list(t.shape) == [groups, bits]
        and bits in (groups_of_four.PLAIN, groups_of_four.RELU)
        and type(onehot) is bool
    ):
        raise ValueError(
            "a selection of groups of four takes [G, 4] values and [G, 6] or [G, 10] bits"
        )
    consume(ctx, [seed], nonce, TAG_C, TAG_U)
    _, t_monomials, at_monomials = groups_of_four.layout(bits)
    n_t, n_at = len(t_monomials), len(at_monomials)
    if material is None:
        tt = derive(seed, nonce, TAG_C, [groups, n_t])
        at = derive(seed, nonce, TAG_U, [groups, n_at])
    elif material.numel() == groups * (n_t + n_at):
        tt = material[: groups * n_t].view(groups, n_t)
        at = material[groups * n_t :].view(groups, n_at)
    else:
        raise ValueError(f"the dealer's selection material has {material.numel()} words")
    out, w = groups_of_four.select(d, t, tt, at, e, a, first, onehot)
    return [out] if w is None else [out, w]
