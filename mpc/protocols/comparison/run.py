"""The comparison's carry tree, the client's side: the most significant bit of a shared
ring element, for any number of parties (the steps: :mod:`mpc.protocols.comparison.steps`).

msb([x]) with a dealer (4 rounds; 3 for the bit alone):
1. Dealer: r uniform, shared additively [r] and bitwise <r> (XOR shares of the 64-bit
   word), and a random bit t shared both ways (a daBit).
2. Open c = x + r (round 1). Then x = c - r = c + ~r + 1 over 64 bits, so
   msb(x) = msb(c) ^ msb(~r) ^ carry_63, where carry_63 is the carry into bit 63.
3. Generate g = c & ~r and propagate p = c ^ ~r are affine in the XOR-shared bits of ~r
   (c is public); a radix-4 tree of (G, P) group combinations gives the carry into bit 63
   in 3 levels (:mod:`mpc.math.carry_tree`). Level 0 is local: the dealer also deals the
   products of ~r's bits within each group of four. Levels 1 and 2 are one round each of
   multi-input ANDs (rounds 2-3): the parties open their operands masked with random bits,
   and the dealer deals the products of the masks the combination needs.
4. Convert the XOR-shared bit to an arithmetic one with the daBit: open d = msb(x) ^ t
   (round 4; its XOR shares travel packed, one bit an element), [msb(x)] = d + (1 - 2d)[t].
   A comparison that selects nothing skips it: its last level (round 3) gives additive
   shares of msb(x) directly (:mod:`mpc.protocols.comparison.arith`), from the dealer's
   additive shares of the last level's mask products.
Correct whenever x is in the signed range (-2^63, 2^63): x < y is msb(x - y).
Cf. CrypTen's A2B + carry-lookahead comparison. daBits: Rotaru and Wood, INDOCRYPT 2019;
opening a masked value and subtracting the mask's bits: Escudero et al., CRYPTO 2020 (edaBits).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import carry_tree, groups_of_four
from mpc.math.bits import words_for
from mpc.math.carry_arith import MONOMIALS as ARITH_MONOMIALS
from mpc.protocols.comparison.arith import carry_arith, carry_arith_sel
from mpc.protocols.comparison.arith_select import (
    arith_mask,
    arith_select,
    check_bits,
    product_words,
)
from mpc.protocols.comparison.base import ComparisonRun, Late, numel
from mpc.protocols.comparison.steps import (
    carry_step,
    cmp_bit_finish,
    cmp_bit_mask,
    cmp_init,
    dealer_compare,
    unpack,
)
from mpc.protocols.opening.run import Round, exchange
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only, run_step
from mpc.session import Session


class CarryRun(ComparisonRun):
    """msb([x]) as in the module docstring, with the selections of
    :class:`~mpc.protocols.comparison.base.ComparisonRun`. The constructor runs the
    rounds; ``finish_bit`` or ``finish_select`` is the local last step."""

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
        """``bits``: each selected value's truncation in its selection (the values', then
        the late one's; 0: none), on the arithmetic last level only."""
        super().__init__(session, x, values, trunc=trunc, group=group, thresholds=thresholds)
        shape, nonce, seed = self.shape, self.nonce, session.party_seeds
        self.bits = check_bits(bits, self.selected)

        # offline, in one dealer call and one delivery: r shared both ways (the last
        # party's <r>), the daBit t both ways, the pair products of the local first level,
        # the binary triples of the five AND levels (one nonce each) and the pairs
        # (a, a t) of the products [v t] (one nonce each), split at the last party by one
        # unpack once round 1 has left: nothing of the dealer's is needed before it
        words = carry_tree.padded(numel(shape))
        level_nonces = [session.next_nonce() for _ in range(carry_tree.LEVELS - 1)]
        product_nonces = self._selection_nonces()
        # but for groups of four, up to the session's size: the last level's output is
        # arithmetic (3 rounds, no daBit)
        self.arith = arith = three_rounds(session, numel(shape), group is not None)
        if any(self.bits) and not arith:
            raise ValueError("internal: a truncated selection ends on the arithmetic level")
        self.product_nonces = product_nonces
        # (with thresholds, r's bits are one word an element of x: shared by its T)
        x_shape = shape[1:] if thresholds else shape
        shapes = [x_shape] + ([x_shape] if arith else [shape] * 2)
        shapes += _packed_shapes(words, numel(shape) if arith else 0)
        shapes += [[product_words(b) * numel(shape)] if arith else shape for b in self.bits]
        if group is not None:  # the max of groups of four (mpc.math.groups_of_four)
            shapes.append([groups_of_four.terms(shape[1]) * shape[0]])
        self.n_thresholds = n_thresholds = len(thresholds or [])
        (corr,) = deal(
            session,
            "comparison of secret values",
            dealer_compare,
            [nonce, shape, level_nonces, product_nonces, self.group_nonce, n_thresholds, arith]
            + ([self.bits] if any(self.bits) else []),
            out=[([sum(numel(sh) for sh in shapes)], I64)],
        )

        # round 1: open c = x + r, with e = v - a of the products [v t] and the
        # truncation's mask (all derived from the parties' seeds)
        c, products, product_openings, trunc_opening = self._round1(
            x, values, product_nonces, trunc, group
        )

        last_party = session.parties[-1]
        dealt = run_step(last_party, unpack, [corr, shapes], out=[(sh, I64) for sh in shapes])
        if arith:  # (h, a word an element of x, where the daBit's two shares were)
            r_bits_last, h_last, mono_last, *rest = dealt
        else:
            r_bits_last, self.t_arith_last, t_bin_last, mono_last, *rest = dealt
        self.group_last = rest.pop() if group is not None else None
        and_last, c_products = rest[: carry_tree.LEVELS - 1], rest[carry_tree.LEVELS - 1 :]
        if arith:  # (the values' openings; their products are the last level's)
            self.ev = [o.value for o in product_openings]
            self.products_last = c_products
            late, late_group = self._late(trunc, trunc_opening, product_nonces)
        else:
            late, late_group = self._products(
                products, product_openings, c_products, trunc, trunc_opening, product_nonces
            )

        # generate / propagate words of c - r after the radix-4 tree's local level 0,
        # masked for level 1; then rounds 2-3: levels 1 and 2, each step finishing one
        # level's multi-input ANDs and masking the next's (one call per party and level)
        r_bits, mono = last_only(session, r_bits_last), last_only(session, mono_last)
        words //= 4
        g, p, top, ef, a = at_parties(
            session,
            cmp_init,
            lambda i: (
                [seed[i], nonce, i == 0, r_bits(i), mono(i), c.value[i], level_nonces[0]]
                + [thresholds or None, arith]
            ),
            [([words], I64), ([words], I64), (shape, I64)] + _masked(words),
        )
        for k, level in enumerate(range(1, carry_tree.LEVELS)):
            last_level = level == carry_tree.LEVELS - 1
            ride = Round(session)  # the late products open with the first AND level
            late_openings, group_opening = (
                self._open_late(ride, late, late_group) if level == 1 else ([], None)
            )
            ef_pieces = exchange(session, ef)  # opened (XORed) by the step itself
            ride.open(count=False)  # (the same round's arithmetic openings)
            if arith:
                self.ev += [o.value for o in late_openings]
            else:
                self._finish_late(late, late_openings, group_opening, c_products)
            if arith and last_level:  # the bit's additive shares: no round 4
                self._last_level(level_nonces[k], h_last, and_last[k], ef_pieces, top)
                return
            corr_c = last_only(session, and_last[k])
            next_nonce = None if last_level else level_nonces[k + 1]
            if not last_level:
                words //= 4
            out = [([words], I64)] if last_level else [([words], I64)] * 2
            to_arith = arith and level == carry_tree.LEVELS - 2
            if to_arith:  # (the last level's operands alone)
                out = _masked(words)[:1]
            elif not last_level:
                out += _masked(words)

            step_args = [
                [seed[i], level_nonces[k], i == 0, corr_c(i), a[i], ef_pieces[i]]
                + [g[i], p[i], level, next_nonce, to_arith]
                for i in range(session.n)
            ]
            outs = at_parties(session, carry_step, step_args.__getitem__, out)
            if last_level:
                (g,) = outs
            elif to_arith:
                (ef,) = outs
            else:
                g, p, ef, a = outs

        # round 4: open d = msb(x) ^ t
        t_bin = last_only(session, t_bin_last)
        (d,) = at_parties(
            session,
            cmp_bit_mask,
            lambda i: [seed[i], nonce, t_bin(i), g[i], top[i]],
            [([words_for(numel(shape))], I64)],
        )
        last_round = Round(session, bits=True)  # one bit an element, packed
        opened_d = last_round.add(d, shape)
        last_round.open()
        self.d = opened_d.value

    def _last_level(
        self, level_nonce: int, h_last: Any, words_last: Any, ef_pieces: Any, top: Shares
    ) -> None:
        """The arithmetic last level: the bit's shares (``bit``), or for selections each
        party's kept u, msb(c) and opened bits (``sel``)."""
        session, seed = self.session, self.session.party_seeds
        h, w = last_only(session, h_last), last_only(session, words_last)
        args = [
            [seed[i], level_nonce, i == 0, h(i), w(i), ef_pieces[i], top[i]]
            for i in range(session.n)
        ]
        if not self.selected:
            out = [(self.shape, I64)]
            t = self.n_thresholds
            (self.bit,) = at_parties(session, carry_arith, lambda i: [*args[i], t], out)
            return
        out = [([3, numel(self.shape)], I64)]
        (self.sel,) = at_parties(session, carry_arith_sel, args.__getitem__, out)

    def finish_select(self, complement: bool) -> list[Shares]:
        """Per value v: [v msb(x)] (complement: its complement): from d and [v t], or
        on the arithmetic last level (:func:`~mpc.protocols.comparison.arith_select.
        arith_select`)."""
        if not self.arith:
            return super().finish_select(complement)
        session, seed = self.session, self.session.party_seeds
        out = []
        for v, ev, pn, prod, bits in zip(
            self.values, self.ev, self.product_nonces, self.products_last, self.bits
        ):
            p = last_only(session, prod)
            args = [
                [seed[i], pn, i == 0, p(i), ev[i], v[i], self.sel[i], complement]
                + ([bits] if bits else [])
                for i in range(session.n)
            ]
            (got,) = at_parties(session, arith_select, args.__getitem__, [(self.shape, I64)])
            out.append(got)
        return out

    def finish_mask(self) -> Shares:
        """[1 - msb(x)] (ReLU's mask)."""
        if not self.arith:
            return super().finish_mask()
        (out,) = at_parties(
            self.session,
            arith_mask,
            lambda i: [i == 0, self.sel[i], self.shape],
            [(self.shape, I64)],
        )
        return out

    def finish_bit(self) -> Shares:
        """[msb(x)] = d + (1 - 2d) [t]; on the arithmetic last level, its output."""
        if self.arith:
            if self.selected:
                raise ValueError("internal: a selecting comparison's bit is its mask's complement")
            return self.bit
        seed, nonce, d = self.session.party_seeds, self.nonce, self.d
        t_arith = last_only(self.session, self.t_arith_last)
        (out,) = at_parties(
            self.session,
            cmp_bit_finish,
            lambda i: [seed[i], nonce, i == 0, t_arith(i), d[i]],
            [(self.shape, I64)],
        )
        return out


def three_rounds(session: Session, elements: int, grouped: bool) -> bool:
    """Whether a comparison run of ``elements`` (of groups of four: never) ends on the
    arithmetic last level (the session's ``three_round_up_to``)."""
    limit = session.config.three_round_up_to
    return not grouped and limit is not None and elements <= limit


def _masked(words: int) -> list[tuple[Any, torch.dtype]]:
    """Output metadata of a masking step: the masked operands e packed flat (opened as one
    value), then the masks a, packed likewise."""
    packed = carry_tree.packed_words(len(carry_tree.VARS)) * words
    return [([packed], I64), ([packed], I64)]


def _packed_shapes(words: int, arith: int) -> list[list[int]]:
    """The dealer's carry-tree material at the last party: level 0's bit products, then
    each other level's mask products (packed words, flat); ``arith`` compared elements:
    the last level's words (:mod:`mpc.protocols.comparison.arith`)."""
    out = [[len(carry_tree.BIT_MONOMIALS) * words // 4]]
    for level in range(1, carry_tree.LEVELS):
        out.append(
            [carry_tree.packed_words(len(carry_tree.MONOMIALS)) * carry_tree.words(words, level)]
        )
    if arith:
        out[-1] = [len(ARITH_MONOMIALS) * arith]
    return out


__all__ = ["CarryRun", "three_rounds"]
