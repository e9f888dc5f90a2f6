"""What every comparison mode's run shares (the carry tree's,
:class:`mpc.protocols.comparison.run.CarryRun`, and FSS's,
:class:`mpc.protocols.fss.run.FssRun`): the first round (c = x + r with the products'
openings, a pending truncation's and the groups' masks), the products [v t] of the
selections on the daBit t, and the local last steps once d = msb(x) ^ t is open
(:mod:`mpc.protocols.comparison.selection`, :mod:`mpc.protocols.max_of_four.steps`).

A mode's constructor runs its rounds between :meth:`ComparisonRun.__init__` (the checks
and the nonces) and the open d; ``finish_bit``, ``finish_select``, ``finish_mask`` or
``finish_group`` is the local last step.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from mpc.protocols.comparison.selection import (
    MAX_SELECTED,
    cmp_select_finish,
    dabit_mask,
    dabit_product,
    party_derive,
)
from mpc.protocols.comparison.steps import cmp_mask
from mpc.protocols.max_of_four.steps import group_mask, group_select
from mpc.protocols.opening.run import Opened, Round
from mpc.protocols.parties import I64, Shares, at_parties, last_only, run_step
from mpc.protocols.riders.run import take
from mpc.protocols.streams import TAG_T_ARITH
from mpc.session import Session


class Late(Protocol):
    """A value whose masked opening travels in a comparison's first round and whose
    result, finished once that round opened, is selected too (its product [v t] opens in
    the next round): a pending truncation (:class:`~mpc.protocols.truncation.run.TruncRun`,
    :func:`mpc.protocols.compare.relu_truncating`) or a masked Fourier series
    (:class:`~mpc.protocols.fourier.run.SeriesRun`: exp, GELU, SiLU)."""

    def open_in(self, round: Round) -> Opened: ...

    def finish(self, c: Shares) -> Shares: ...


class ComparisonRun:
    """msb([x]) with optional products [v t] for selections (see
    :func:`mpc.protocols.compare.select_by_msb`), an optional truncation whose result is
    selected too (see :func:`mpc.protocols.compare.relu_truncating`) and optional groups
    of four (:func:`mpc.protocols.max_of_four.run.max_of_four`). Its subclasses' rounds
    set ``d`` (per party, the opened d = msb(x) ^ t), ``t`` (the daBit's shares) and
    ``vt`` (the products [v t])."""

    d: Shares
    t: Shares
    t_arith_last: Any  # the last party's share of t, dealt
    group_last: Any  # the last party's part of the groups' material, dealt

    def __init__(
        self,
        session: Session,
        x: Shares,
        values: list[Shares],
        trunc: Late | None = None,
        group: Shares | None = None,
        thresholds: list[int] | None = None,
    ) -> None:
        """``thresholds``: compare x - theta_k for these public ring values, [T, *x], with
        one opening of c = x + r an element (the T comparisons share r); no selections."""
        self.session = session
        self.shape = shape = list(x[0].shape)
        if thresholds:
            if values or trunc is not None or group is not None:
                raise ValueError("internal: a comparison with thresholds selects nothing")
            self.shape = [len(thresholds), *shape]
        self.group = group
        self.group_nonce: int | None = None
        self.group_e: Shares | None = None
        self.values = list(values)
        self.x = x
        for v in values:
            if list(v[0].shape) != shape:
                raise ValueError(f"select_by_msb: value shape {list(v[0].shape)} != {shape}")
        self.selected = _selected(values, trunc, group)  # products [v t]
        self.nonce = session.next_nonce()
        self.vt: list[Shares] = []

    def _selection_nonces(self) -> list[int]:
        """The nonces of the products [v t] (one each) and of the groups' selection."""
        session = self.session
        product_nonces = [session.next_nonce() for _ in range(self.selected)]
        if self.group is not None:
            self.group_nonce = session.next_nonce()
        return product_nonces

    def _round1(
        self,
        x: Shares,
        values: list[Shares],
        product_nonces: list[int],
        trunc: Late | None,
        group: Shares | None,
    ) -> tuple[Opened, list[DabitProduct], list[Opened], Opened | None]:
        """Round 1 of either mode: c = x + r, the products' e = v - a, the truncation's
        and the groups' masked values, opened together (``self.group_e`` is set)."""
        session, nonce, seed = self.session, self.nonce, self.session.party_seeds
        shape = list(x[0].shape)
        (masked,) = at_parties(session, cmp_mask, lambda i: [seed[i], nonce, x[i]], [(shape, I64)])
        products = [DabitProduct(session, pn, v) for pn, v in zip(product_nonces, values)]
        round1 = Round(session)
        c = round1.add(masked)
        product_openings = [round1.add(prod.e) for prod in products]
        trunc_opening = trunc.open_in(round1) if trunc is not None else None
        group_opening = None
        if group is not None and trunc is None:  # (truncated: opened in round 2, _late)
            group_opening = round1.add(self._group_mask(group))
        riders = take()  # (truncations riding in this round: mpc.protocols.riders)
        if riders is not None:
            riders.open_in(round1)
        round1.open()
        if riders is not None:
            riders.finish()
        self.group_e = group_opening.value if group_opening is not None else None
        return c, products, product_openings, trunc_opening

    def _products(
        self,
        products: list[DabitProduct],
        openings: list[Opened],
        c_products: list[Any],
        trunc: Late | None,
        trunc_opening: Opened | None,
        product_nonces: list[int],
    ) -> tuple[list[DabitProduct], Shares | None]:
        """The daBit's shares t, the products [v t] opened in round 1; and what opens in
        the next round (:meth:`_late`)."""
        self.t = self._t_shares() if self.selected or self.group is not None else []
        self.vt = [
            self._product(k, prod, o.value, c_last)
            for k, (prod, o, c_last) in enumerate(zip(products, openings, c_products))
        ]
        return self._late(trunc, trunc_opening, product_nonces)

    def _product(self, k: int, prod: DabitProduct, e: Shares, c_last: Any) -> Shares:
        """The ``k``-th selected value's [v t] once its e is open (a mode whose value is
        selected truncated keeps e instead: :class:`mpc.protocols.fss.run.FssRun`)."""
        return prod.finish(e, self.t, c_last)

    def _open_late(
        self, ride: Round, late: list[DabitProduct], late_group: Shares | None
    ) -> tuple[list[Opened], Opened | None]:
        """Add what :meth:`_late` left to ``ride``, the run's next round."""
        openings = [ride.add(prod.e) for prod in late]
        return openings, (ride.add(late_group) if late_group is not None else None)

    def _finish_late(
        self,
        late: list[DabitProduct],
        openings: list[Opened],
        group_opening: Opened | None,
        c_products: list[Any],
    ) -> None:
        """Once the round of :meth:`_open_late` opened: the late products (the last of
        ``c_products`` is theirs) and groups."""
        if group_opening is not None:
            self.group_e = group_opening.value
        done = len(self.vt)
        self.vt += [
            self._product(done + j, prod, o.value, c_products[-1])
            for j, (prod, o) in enumerate(zip(late, openings))
        ]

    def _group_mask(self, group: Shares) -> Shares:
        """The parties' groups masked for their selection (opened as e)."""
        seed, gn = self.session.party_seeds, self.group_nonce
        (masked,) = at_parties(
            self.session,
            group_mask,
            lambda i: [seed[i], gn, group[i]],
            [(list(group[0].shape), I64)],
        )
        return masked

    def _late(
        self, trunc: Late | None, opening: Opened | None, product_nonces: list[int]
    ) -> tuple[list[DabitProduct], Shares | None]:
        """After round 1, a truncation's result: selected too (its product [v t], opened in
        round 2), or the groups of four themselves (their masked values, opened in round 2,
        ``group_e``)."""
        if trunc is None or opening is None:
            return [], None
        truncated = trunc.finish(opening.value)
        if self.group is not None:
            self.group = truncated
            return [], self._group_mask(truncated)
        self.values.append(truncated)
        return [DabitProduct(self.session, product_nonces[-1], truncated)], None

    def _t_shares(self) -> Shares:
        """The parties' arithmetic shares of the daBit t (the last party's is dealt)."""
        session, nonce, shape = self.session, self.nonce, self.shape
        seed, last = session.party_seeds, session.n - 1
        return [
            run_step(p, party_derive, [seed[i], nonce, TAG_T_ARITH, shape], [(shape, I64)])[0]
            if i != last
            else self.t_arith_last
            for i, p in enumerate(session.parties)
        ]

    def finish_group(self, onehot: bool) -> tuple[Shares, Shares | None]:
        """The max of each group of four and, with ``onehot``, its one-hot argmax (first
        index on ties; shared integers), local (:func:`mpc.math.groups_of_four.select`)."""
        group, e = self.group, self.group_e
        assert group is not None and e is not None
        seed, gn, d, t = self.session.party_seeds, self.group_nonce, self.d, self.t
        material = last_only(self.session, self.group_last)
        g = list(group[0].shape)
        out: list[tuple[Any, torch.dtype]] = [([g[0]], I64)] + ([(g, I64)] if onehot else [])
        got = at_parties(
            self.session,
            group_select,
            lambda i: [seed[i], gn, i == 0, material(i), d[i], t[i], e[i], group[i], onehot],
            out,
        )
        return got[0], (got[1] if onehot else None)

    def finish_bit(self) -> Shares:
        """[msb(x)] (the mode's last local step)."""
        raise NotImplementedError

    def finish_mask(self) -> Shares:
        """[1 - msb(x)] from a selecting run's [t]: the selection of v = 1 (local)."""
        # v = 1 shared trivially: ones at party 0, zeros elsewhere (made where they live)
        one = [torch.ones_like(s) if i == 0 else torch.zeros_like(s) for i, s in enumerate(self.x)]
        (out,) = at_parties(
            self.session,
            cmp_select_finish,
            lambda i: [True, self.d[i], one[i], self.t[i]],
            [(self.shape, I64)],
        )
        return out

    def finish_select(self, complement: bool) -> list[Shares]:
        """Per value v: [v msb(x)] = d v + (1 - 2d) [v t] (complement: its complement)."""
        return [
            self._select(k, v, vt, complement)
            for k, (v, vt) in enumerate(zip(self.values, self.vt))
        ]

    def _select(self, k: int, v: Shares, vt: Shares, complement: bool) -> Shares:
        """The ``k``-th value's selection, local (:meth:`finish_select`)."""

        def args(i: int) -> list[Any]:
            return [complement, self.d[i], v[i], vt[i]]

        (selected,) = at_parties(self.session, cmp_select_finish, args, [(self.shape, I64)])
        return selected


class DabitProduct:
    """[v t] for the daBit's arithmetic [t], with the dealer's pair (a, c = a t) of
    ``nonce``: open e = v - a (one word an element, where a Beaver product of two values
    opens two), then [v t] = [c] + e [t]. The mask a is derived from the parties' seeds,
    so e can leave in the comparison's first round before any dealer material arrives."""

    def __init__(self, session: Session, nonce: int, v: Shares) -> None:
        self.session, self.nonce = session, nonce
        self.shape = [int(d) for d in v[0].shape]
        seed = session.party_seeds
        (self.e,) = at_parties(
            session, dabit_mask, lambda i: [seed[i], nonce, v[i]], [(self.shape, I64)]
        )

    def finish(self, e: Shares, t: Shares, c_last: Any) -> Shares:
        """[v t] from the opened e (per party) and the parties' shares of t."""
        seed, nonce = self.session.party_seeds, self.nonce
        c = last_only(self.session, c_last)
        (vt,) = at_parties(
            self.session,
            dabit_product,
            lambda i: [seed[i], nonce, c(i), t[i], e[i]],
            [(self.shape, I64)],
        )
        return vt


def _selected(values: list[Shares], trunc: Late | None, group: Shares | None) -> int:
    """The products [v t] of a run: the values, and a truncated value unless the
    truncation is of the groups of four (whose selection has its own material)."""
    selected = len(values) + (trunc is not None and group is None)
    if selected > MAX_SELECTED:
        raise ValueError(
            f"select_by_msb selects at most {MAX_SELECTED} values in one comparison, "
            f"got {len(values)}: split them over several calls"
        )
    return selected


def numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


__all__ = ["ComparisonRun", "DabitProduct", "numel"]
