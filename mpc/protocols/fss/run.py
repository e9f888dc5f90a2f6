"""The comparison by function secret sharing, the client's side: the session option
``comparison="fss"`` (2 parties; the steps and their algebra: :mod:`mpc.protocols.fss.steps`,
the DCF: :mod:`mpc.math.dcf`).

Offline, one dealer call deals both parties' DCF keys: the correction words, one object
delivered to each party, and the last party's shares of the mask's top bit, of the daBit
and of the selections' products, a second delivery to it.
Online:

- msb / lt / gt: round 1 opens c = x + r; each party evaluates its key at c (local) and
  holds its share of msb(x). 1 round.
- selections (ReLU, max, max-pool, |x|, the comparisons of the non-linear functions):
  round 1 opens c together with the e = v - a of the products [v t] (and a pending
  truncation's opening, and the groups' masks for a max of four); the local evaluation
  gives [msb(x) ^ t]; round 2 opens d = msb(x) ^ t (and a truncated value's product
  opening); then the selection is local, the same steps as the carry tree's last one
  (:class:`mpc.protocols.comparison.base.ComparisonRun`). 2 rounds.
"""

from __future__ import annotations

from typing import Any

from mpc.math import groups_of_four
from mpc.math.bits import words_for
from mpc.protocols.comparison.arith_select import check_bits
from mpc.protocols.comparison.base import ComparisonRun, DabitProduct, Late, numel
from mpc.protocols.comparison.steps import cmp_mask
from mpc.protocols.fss import relu as fss_relu
from mpc.protocols.fss import steps as material
from mpc.protocols.fss.relu import dealer_fss_relu, fss_relu_eval
from mpc.protocols.fss.steps import dealer_fss, fss_eval, fss_unpack
from mpc.protocols.fss.trunc_select import TRUNC_WORDS, fss_trunc_select
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, count_dealt, last_only, run_step
from mpc.session import Session


class FssRun(ComparisonRun):
    """msb([x]) by FSS, with the same optional selections as the carry tree (whose local
    last steps it shares, :class:`~mpc.protocols.comparison.base.ComparisonRun`); the
    constructor runs the online rounds."""

    def __init__(
        self,
        session: Session,
        x: Shares,
        values: list[Shares],
        trunc: Late | None = None,
        group: Shares | None = None,
        thresholds: list[int] | None = None,
        bits: list[int] | None = None,
    ) -> None:
        """``thresholds``: one key an element of x, evaluated at its T points. ``bits``:
        each selected value's truncation in its selection (the values', then the late
        one's; 0: none; :mod:`mpc.protocols.fss.trunc_select`)."""
        if session.n != 2:  # (a session refuses comparison="fss" for more parties)
            raise ValueError("the FSS comparison is for 2 parties")
        super().__init__(session, x, values, trunc=trunc, group=group, thresholds=thresholds)
        shape, nonce, selected = self.shape, self.nonce, self.selected
        self.bits = check_bits(bits, selected)
        if any(self.bits) and group is not None:
            raise ValueError("internal: groups of four are not selected truncated")
        # a value selected truncated: its opened e and the dealer's words, by its index
        self.truncated: dict[int, tuple[Shares, Any]] = {}
        self.select = select = selected > 0 or group is not None
        self.product_nonces = product_nonces = self._selection_nonces()
        fss_bits = session.config.fss_bits
        seed = session.party_seeds
        n = numel(shape[1:] if thresholds else shape)  # (keys: with thresholds, a value's)

        # offline: the correction words, one object delivered to each party (in process
        # both read the dealer's buffer), and the last party's part of its key
        w = material.words(n, fss_bits)
        shapes: list[list[int]] = [[n]]
        if select:
            shapes.append(shape)
            shapes += [[TRUNC_WORDS * numel(shape)] if f else shape for f in self.bits]
            if group is not None:
                shapes.append([groups_of_four.terms(shape[1]) * shape[0]])
        dealer = session.require_dealer("comparison of secret values")
        delivered = [([w], I64), ([sum(numel(s) for s in shapes)], I64)]
        cw, key1 = run_step(
            dealer,
            dealer_fss,
            [session.dealer_seeds, nonce, shape, product_nonces, self.group_nonce, select, fss_bits]
            + [len(thresholds or [])]
            + ([self.bits] if any(self.bits) else []),
            out=delivered,
        )
        first_party, last_party = session.parties
        cws = [cw.copy_to(party, lend=True) for party in session.parties]  # (read only)
        key1 = key1.move(last_party)
        count_dealt([delivered[0], *delivered])  # (the correction words go to both parties)

        # round 1: c = x + r, the products' e, the truncation's and the groups' openings
        c, products, product_openings, trunc_opening = self._round1(
            x, values, product_nonces, trunc, group
        )

        # the last party's key, split; then the local evaluation at both parties
        dealt = run_step(
            last_party,
            fss_unpack,
            [seed[1], nonce, key1, shapes],
            out=[(sh, I64) for sh in shapes],
        )
        us = [None, dealt[0]]
        (out,) = at_parties(
            session,
            fss_eval,
            lambda i: (
                [seed[i], nonce, i == 0, cws[i], us[i], c.value[i], fss_bits, select]
                + ([thresholds] if thresholds else [])
            ),
            [([words_for(numel(shape))], I64) if select else (shape, I64)],
        )
        if not select:
            self.bit = out
            return
        rest = dealt[1:]
        self.t_arith_last = rest[0]
        c_products = rest[1 : 1 + selected]
        self.group_last = rest[1 + selected] if group is not None else None
        late, late_group = self._products(
            products, product_openings, c_products, trunc, trunc_opening, product_nonces
        )

        # round 2: d = msb(x) ^ t (the low bits of the parties' shares, packed: one bit
        # an element), with the late products (and a truncated group's masked values)
        d_round, round2 = Round(session, bits=True), Round(session)
        opened_d = d_round.add(out, shape)
        late_openings, group_opening = self._open_late(round2, late, late_group)
        round2.open()
        d_round.open(count=False)  # (in the same round)
        self.d = opened_d.value
        self._finish_late(late, late_openings, group_opening, c_products)

    def _product(self, k: int, prod: DabitProduct, e: Shares, c_last: Any) -> Shares:
        if not self.bits[k]:
            return super()._product(k, prod, e, c_last)
        self.truncated[k] = (e, c_last)
        return e  # (not [v t]: finish_select selects the value from e)

    def _select(self, k: int, v: Shares, vt: Shares, complement: bool) -> Shares:
        """A value selected truncated: (v >> f) msb(x) (complement: (v >> f) (1 - msb(x)))
        from its opened e (:func:`~mpc.protocols.fss.trunc_select.fss_trunc_select`)."""
        if k not in self.truncated:
            return super()._select(k, v, vt, complement)
        e, c_last = self.truncated[k]
        dealt = last_only(self.session, c_last)
        seed, nonce, f = self.session.party_seeds, self.product_nonces[k], self.bits[k]

        def args(i: int) -> list[Any]:
            return [seed[i], nonce, i == 0, complement, f, dealt(i), self.d[i], self.t[i], e[i]]

        (selected,) = at_parties(self.session, fss_trunc_select, args, [(self.shape, I64)])
        return selected

    def finish_bit(self) -> Shares:
        """[msb(x)]: the evaluation's result (a run without selections)."""
        if self.select:
            raise ValueError("a selecting comparison's bit is its selection of 1")
        return self.bit


def relu_truncating(session: Session, z: Shares, bits: int) -> Shares | None:
    """[relu(z >> bits)] for a product z not yet truncated, |z| < 2^62, in one round: the
    opening of c = z + r, then each party's local step (:mod:`mpc.protocols.fss.relu`).
    None where it does not apply (a narrower comparison domain than 64 bits: the
    two-round run then takes it)."""
    if session.n != 2 or session.config.fss_bits != 64 or not 1 <= bits <= 61:
        return None
    nonce = session.next_nonce()
    shape = list(z[0].shape)
    n = numel(shape)
    seed = session.party_seeds
    dealer = session.require_dealer("comparison of secret values")
    delivered = [([fss_relu.key_words(n)], I64), ([fss_relu.CONSTS * n], I64)]
    cw, consts = run_step(
        dealer, dealer_fss_relu, [session.dealer_seeds, nonce, shape, bits], delivered
    )
    cws = [cw.copy_to(party, lend=True) for party in session.parties]
    dealt = [None, consts.move(session.parties[1])]
    count_dealt([delivered[0], *delivered])  # (the correction words go to both parties)
    (masked,) = at_parties(session, cmp_mask, lambda i: [seed[i], nonce, z[i]], [(shape, I64)])
    round1 = Round(session)
    c = round1.add(masked)
    round1.open()
    (out,) = at_parties(
        session,
        fss_relu_eval,
        lambda i: [seed[i], nonce, i == 0, cws[i], dealt[i], c.value[i], bits],
        [(shape, I64)],
    )
    return out


__all__ = ["FssRun", "relu_truncating"]
