"""The comparison by function secret sharing: the session option ``comparison="fss"``
(2 parties; the steps and their algebra: :mod:`mpc.material.fss`, the DCF:
:mod:`mpc.math.dcf`).

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
  opening); then the selection is local, the same steps as the default protocol's last
  one (:class:`mpc.protocols.compare._MsbRun`). 2 rounds.
"""

from __future__ import annotations

from typing import Any

from mpc.material import fss as material
from mpc.material import fss_relu
from mpc.material.fss import dealer_fss, fss_eval, fss_unpack
from mpc.material.fss_relu import dealer_fss_relu, fss_relu_eval
from mpc.material.party import cmp_mask
from mpc.math import group4
from mpc.protocols.arith import TruncRun
from mpc.protocols.compare import (
    _MsbRun,
    _numel,
    _selected,
    register_mode,
    register_relu_truncating,
)
from mpc.protocols.opening.run import Round
from mpc.protocols.parties import I64, Shares, at_parties, run_step
from mpc.session import Session


class FssRun(_MsbRun):
    """msb([x]) by FSS, with the same optional selections as :class:`_MsbRun` (whose
    local last steps it shares); the constructor runs the online rounds."""

    def __init__(
        self,
        session: Session,
        x: Shares,
        values: list[Shares],
        trunc: TruncRun | None = None,
        group: Shares | None = None,
    ) -> None:
        if session.n != 2:  # (a session refuses comparison="fss" for more parties)
            raise ValueError("the FSS comparison is for 2 parties")
        self.session = session
        self.shape = shape = list(x[0].shape)
        self.group, self.group_nonce = group, None
        self.values = list(values)
        self.x = x
        for v in values:
            if list(v[0].shape) != shape:
                raise ValueError(f"select_by_msb: value shape {list(v[0].shape)} != {shape}")
        selected = _selected(values, trunc, group)
        self.select = select = selected > 0 or group is not None
        self.nonce = nonce = session.next_nonce()
        product_nonces = [session.next_nonce() for _ in range(selected)]
        if group is not None:
            self.group_nonce = session.next_nonce()
        bits = session.config.fss_bits
        seed = session.party_seeds
        n = _numel(shape)

        # offline: the correction words, one object delivered to each party (in process
        # both read the dealer's buffer), and the last party's part of its key
        w = material.words(n, bits)
        shapes: list[list[int]] = [[n]]
        if select:
            shapes += [shape] * (1 + selected)
            if group is not None:
                shapes.append([group4.terms(shape[1]) * shape[0]])
        dealer = session.require_dealer("comparison of secret values")
        cw, key1 = run_step(
            dealer,
            dealer_fss,
            [session.dealer_seeds, nonce, shape, product_nonces, self.group_nonce, select, bits],
            out=[([w], I64), ([sum(_numel(s) for s in shapes)], I64)],
        )
        first_party, last_party = session.parties
        cws = [cw.copy_to(party, lend=True) for party in session.parties]  # (read only)
        key1 = key1.move(last_party)

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
            lambda i: [seed[i], nonce, i == 0, cws[i], us[i], c.value[i], bits],
            [(shape, I64)],
        )
        if not select:
            self.bit = out
            return
        rest = dealt[1:]
        self.t_arith_last = rest[0]
        c_products = rest[1 : 1 + selected]
        self.group_last = rest[1 + selected] if group is not None else None
        t = self._t_shares()
        self.t = t
        self.vt = [
            prod.finish(o.value, t, c_last)
            for prod, o, c_last in zip(products, product_openings, c_products)
        ]
        late, late_group = self._late(trunc, trunc_opening, product_nonces)

        # round 2: d = msb(x) ^ t (a sum of the parties' shares), with the late products
        # (and a truncated group's masked values)
        round2 = Round(session)
        opened_d = round2.add(out)
        late_openings = [round2.add(prod.e) for prod in late]
        group_opening = round2.add(late_group) if late_group is not None else None
        round2.open()
        self.d = opened_d.value
        if group_opening is not None:
            self.group_e = group_opening.value
        self.vt += [prod.finish(o.value, t, c_products[-1]) for prod, o in zip(late, late_openings)]

    def finish_bit(self) -> Shares:
        """[msb(x)]: the evaluation's result (a run without selections)."""
        if self.select:
            raise ValueError("a selecting comparison's bit is its selection of 1")
        return self.bit


def relu_truncating(session: Session, z: Shares, bits: int) -> Shares | None:
    """[relu(z >> bits)] for a product z not yet truncated, |z| < 2^62, in one round: the
    opening of c = z + r, then each party's local step (:mod:`mpc.material.fss_relu`).
    None where it does not apply (a narrower comparison domain than 64 bits: the
    two-round run then takes it)."""
    if session.n != 2 or session.config.fss_bits != 64 or not 1 <= bits <= 61:
        return None
    nonce = session.next_nonce()
    shape = list(z[0].shape)
    n = _numel(shape)
    seed = session.party_seeds
    dealer = session.require_dealer("comparison of secret values")
    cw, consts = run_step(
        dealer,
        dealer_fss_relu,
        [session.dealer_seeds, nonce, shape, bits],
        out=[([fss_relu.key_words(n)], I64), ([fss_relu.CONSTS * n], I64)],
    )
    cws = [cw.copy_to(party, lend=True) for party in session.parties]
    dealt = [None, consts.move(session.parties[1])]
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


def run(
    session: Session,
    x: Shares,
    values: list[Shares],
    trunc: TruncRun | None = None,
    group: Shares | None = None,
) -> Any:
    """An :class:`FssRun` (for :mod:`mpc.protocols.compare`)."""
    return FssRun(session, x, values, trunc=trunc, group=group)


register_mode("fss", run)
register_relu_truncating("fss", relu_truncating)

__all__ = ["FssRun", "relu_truncating", "run"]
