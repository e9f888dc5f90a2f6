"""Comparison: the most significant bit of a shared ring element, for any number of parties.

msb([x]) with a dealer (4 rounds):
1. Dealer: r uniform, shared additively [r] and bitwise <r> (XOR shares of the 64-bit
   word), and a random bit t shared both ways (a daBit).
2. Open c = x + r (round 1). Then x = c - r = c + ~r + 1 over 64 bits, so
   msb(x) = msb(c) ^ msb(~r) ^ carry_63, where carry_63 is the carry into bit 63.
3. Generate g = c & ~r and propagate p = c ^ ~r are affine in the XOR-shared bits of ~r
   (c is public); a radix-4 tree of (G, P) group combinations gives the carry into bit 63
   in 3 levels (:mod:`mpc.math.carry4`). Level 0 is local: the dealer also deals the
   products of ~r's bits within each group of four. Levels 1 and 2 are one round each of
   multi-input ANDs (rounds 2-3): the parties open their operands masked with random bits,
   and the dealer deals the products of the masks the combination needs.
4. Convert the XOR-shared bit to an arithmetic one with the daBit: open d = msb(x) ^ t
   (round 4), [msb(x)] = d + (1 - 2d)[t].
Correct whenever x is in the signed range (-2^63, 2^63): x < y is msb(x - y).
Cf. CrypTen's A2B + carry-lookahead comparison. daBits: Rotaru and Wood, INDOCRYPT 2019;
opening a masked value and subtracting the mask's bits: Escudero et al., CRYPTO 2020 (edaBits).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from mpc.errors import MPCError
from mpc.material.dealer import MAX_SELECTED, dealer_compare
from mpc.material.party import (
    carry_step,
    cmp_bit_finish,
    cmp_bit_mask,
    cmp_init,
    cmp_mask,
    cmp_select_finish,
    dabit_mask,
    dabit_product,
    group_mask,
    group_select,
    party_derive,
    unpack,
)
from mpc.math import carry4, group4
from mpc.protocols.arith import TruncRun
from mpc.protocols.opening.run import Opened, Round, exchange
from mpc.protocols.parties import I64, Shares, at_parties, deal, last_only, run_step
from mpc.protocols.streams import TAG_T_ARITH
from mpc.session import Session


def msb(session: Session, x: Shares) -> Shares:
    """[msb(x)] as arithmetic shares of 0/1 (1 where x is negative). 4 rounds (1 with the
    session option ``comparison="fss"``: :mod:`mpc.protocols.fss`)."""
    run = _run(session, x, [])
    return run.finish_bit()


def select_by_msb(
    session: Session, x: Shares, values: list[Shares], complement: bool = False
) -> list[Shares]:
    """[v * msb(x)] for each v (``complement``: [v * (1 - msb(x))]), in 4 rounds (2 with
    ``comparison="fss"``).

    The products ride on the daBit: with d = msb(x) ^ t opened in the last round,
    msb(x) = d + (1 - 2d) t, so v * msb(x) = d v + (1 - 2d) [v t]; the Beaver product
    [v t] is opened in round 1, together with c. ReLU is x * (1 - msb(x)), the max of a
    and b is b + (a - b) msb(b - a): both cost exactly one comparison's rounds.
    """
    run = _run(session, x, values)
    return run.finish_select(complement)


def relu_truncating(session: Session, z: Shares, bits: int) -> Shares:
    """[relu(z >> bits)] in 4 rounds, for a product z not yet truncated.

    The comparison runs on z itself (same sign as z >> bits, up to the one-unit rounding
    of the truncation); the truncation's opening shares the comparison's first round and
    the product (z >> bits) * t opens with the first carry-tree level. This saves the
    round a separate truncation would cost before every ReLU of a linear layer.
    """
    fused = _RELU_TRUNCATING.get(session.config.comparison)
    out = fused(session, z, bits) if fused is not None else None
    if out is not None:  # (a mode's own protocol: FSS, one round)
        return out  # type: ignore[no-any-return]
    run = _run(session, z, [], trunc=TruncRun(session, z, bits))
    return run.finish_select(complement=True)[0]


# column c: +1 at PAIRS[c][0], -1 at PAIRS[c][1]: groups [G, 4] @ this = the six differences
_PAIR_DIFFERENCES = torch.tensor(
    [[(k == i) - (k == j) for i, j in group4.PAIRS] for k in range(4)], dtype=torch.int64
)
# after a ReLU: the six differences, then the four values (msb(a_i) = [a_i < 0])
_PAIRS_AND_VALUES = torch.cat([_PAIR_DIFFERENCES, torch.eye(4, dtype=torch.int64)], dim=1)


def max_of_four(
    session: Session, groups: Shares, onehot: bool = False, relu: bool = False, pending: int = 0
) -> Any:
    """[max] of each group of four values (``groups``: [G, 4] shares), and with
    ``onehot`` its one-hot argmax ([G, 4] shared 0/1 integers, first index on ties), in one
    comparison's 4 rounds: the six pairwise comparisons at once, the selection riding on
    their daBits (:mod:`mpc.math.group4`). A pairwise tree takes two comparisons' rounds.

    ``relu``: the max of 0 and the four, max(relu(a_0), .., relu(a_3)), in the same run
    (the four values' own comparisons join the six: :data:`mpc.math.group4.RELU`), where a
    ReLU and then the max took two runs. ``pending``: of the groups truncated by that many
    bits (a product not yet truncated, as :func:`relu_truncating`: the comparisons run on
    the product, the truncation opens in round 1 and the truncated values' masked opening
    rides on round 2)."""
    if onehot and relu:
        raise ValueError("max_of_four: the one-hot argmax is of the values, not of a ReLU's")
    # x_c = a_i - a_j (msb(x_c) = [a_i < a_j]) for all six pairs: one product by a public
    # matrix of 1, -1 and 0 at each party (exact in the ring), not 18 ops and a stack
    matrix = _PAIRS_AND_VALUES if relu else _PAIR_DIFFERENCES
    x = [g @ matrix for g in groups]
    trunc = TruncRun(session, groups, pending) if pending else None
    run = _run(session, x, [], trunc=trunc, group=groups)  # type: ignore[arg-type]
    return run.finish_group(onehot)


def relu_with_mask(session: Session, x: Shares, pending: int = 0) -> tuple[Shares, Shares]:
    """[relu(x)] (``pending``: of x >> pending, as :func:`relu_truncating`) and the
    arithmetic bit [x >= 0] that ReLU's backward multiplies the gradient by, from one
    comparison: the bit is d + (1 - 2d) [t] complemented, local once d is open."""
    trunc = TruncRun(session, x, pending) if pending else None
    run = _run(session, x, [] if pending else [x], trunc=trunc)
    (out,) = run.finish_select(complement=True)
    return out, run.finish_mask()


def _run(
    session: Session,
    x: Shares,
    values: list[Shares],
    trunc: TruncRun | None = None,
    group: Shares | None = None,
) -> _MsbRun:
    """The comparison run of the session's mode: the default protocol below, or a mode
    that registered its run with :func:`register_mode` (``comparison="fss"``: function
    secret sharing, :mod:`mpc.protocols.fss`, 1 round for the bit, 2 with selections,
    whose local last steps are this one's; it builds on this module, so it registers
    itself rather than being imported here)."""
    mode = session.config.comparison
    if mode == "default":
        return _MsbRun(session, x, values, trunc=trunc, group=group)
    factory = _MODES.get(mode)
    if factory is None:
        raise MPCError(f"no comparison protocol {mode!r} is loaded (import mpc first)")
    return factory(session, x, values, trunc=trunc, group=group)  # type: ignore[no-any-return]


# comparison modes other than the default: name -> the run's factory (see _run)
_MODES: dict[str, Callable[..., Any]] = {}


# a mode's own relu_truncating (None where it does not apply: the comparison run then)
_RELU_TRUNCATING: dict[str, Callable[..., Any]] = {}


def register_relu_truncating(name: str, fn: Callable[..., Any]) -> None:
    """Make ``fn(session, z, bits)`` (Shares or None) the ReLU of a pending truncation of
    sessions whose config says ``comparison=name``."""
    _RELU_TRUNCATING[name] = fn


def register_mode(name: str, factory: Callable[..., Any]) -> None:
    """Make ``factory(session, x, values, trunc=, group=)`` the comparison run of
    sessions whose config says ``comparison=name``."""
    _MODES[name] = factory


class _MsbRun:
    """msb([x]) as in the module docstring, with optional products [v t] for selections
    (see :func:`select_by_msb`) and an optional truncation whose result is selected too
    (see :func:`relu_truncating`). The constructor runs rounds 1-7; ``finish_bit`` or
    ``finish_select`` is the local last step."""

    def __init__(
        self,
        session: Session,
        x: Shares,
        values: list[Shares],
        trunc: TruncRun | None = None,
        group: Shares | None = None,
    ) -> None:
        self.session = session
        self.shape = shape = list(x[0].shape)
        self.group, self.group_nonce = group, None
        self.group_e: Shares | None = None
        self.values = list(values)
        for v in values:
            if list(v[0].shape) != shape:
                raise ValueError(f"select_by_msb: value shape {list(v[0].shape)} != {shape}")
        selected = _selected(values, trunc, group)  # products [v t]
        self.nonce = nonce = session.next_nonce()
        seed = session.party_seeds

        # offline, in one dealer call and one delivery: r shared both ways (the last
        # party's <r>), the daBit t both ways, the pair products of the local first level,
        # the binary triples of the five AND levels (one nonce each) and the pairs
        # (a, a t) of the products [v t] (one nonce each), split at the last party by one
        # unpack once round 1 has left: nothing of the dealer's is needed before it
        n = _numel(shape)
        words = carry4.padded(n)
        level_nonces = [session.next_nonce() for _ in range(carry4.LEVELS - 1)]
        product_nonces = [session.next_nonce() for _ in range(selected)]
        packed = _packed_shapes(words)
        shapes = [shape] * 3 + packed + [shape] * selected
        if group is not None:  # the max of groups of four (mpc.math.group4)
            self.group_nonce = session.next_nonce()
            shapes.append([group4.terms(shape[1]) * shape[0]])
        (corr,) = deal(
            session,
            "comparison of secret values",
            dealer_compare,
            [nonce, shape, level_nonces, product_nonces, self.group_nonce],
            out=[([_total(shapes)], I64)],
        )
        self.x = x

        # round 1: open c = x + r, with e = v - a of the products [v t] and the
        # truncation's mask (all derived from the parties' seeds)
        c, products, product_openings, trunc_opening = self._round1(
            x, values, product_nonces, trunc, group
        )

        last_party = session.parties[-1]
        dealt = run_step(last_party, unpack, [corr, shapes], out=[(sh, I64) for sh in shapes])
        r_bits_last, self.t_arith_last, t_bin_last, mono_last, *rest = dealt
        self.group_last = rest.pop() if group is not None else None
        and_last, c_products = rest[: carry4.LEVELS - 1], rest[carry4.LEVELS - 1 :]
        t = self._t_shares() if selected or group is not None else []
        self.t = t
        self.vt = [
            prod.finish(o.value, t, c_last)
            for prod, o, c_last in zip(products, product_openings, c_products)
        ]
        late, late_group = self._late(trunc, trunc_opening, product_nonces)

        # generate / propagate words of c - r after the radix-4 tree's local level 0,
        # masked for level 1; then rounds 2-3: levels 1 and 2, each step finishing one
        # level's multi-input ANDs and masking the next's (one call per party and level)
        r_bits, mono = last_only(session, r_bits_last), last_only(session, mono_last)
        words //= 4
        g, p, top, ef, a = at_parties(
            session,
            cmp_init,
            lambda i: [seed[i], nonce, i == 0, r_bits(i), mono(i), c.value[i], level_nonces[0]],
            [([words], I64), ([words], I64), (shape, I64)] + _masked(words),
        )
        for k, level in enumerate(range(1, carry4.LEVELS)):
            last_level = level == carry4.LEVELS - 1
            ride = Round(session)  # the late products open with the first AND level
            late_openings = [ride.add(prod.e) for prod in late] if level == 1 else []
            group_opening = ride.add(late_group) if level == 1 and late_group is not None else None
            ef_pieces = exchange(session, ef)  # opened (XORed) by the step itself
            ride.open(count=False)  # (the same round's arithmetic openings)
            if group_opening is not None:
                self.group_e = group_opening.value
            self.vt += [
                prod.finish(o.value, t, c_products[-1]) for prod, o in zip(late, late_openings)
            ]
            corr_c = last_only(session, and_last[k])
            next_nonce = None if last_level else level_nonces[k + 1]
            if not last_level:
                words //= 4
            out = [([words], I64)] if last_level else [([words], I64)] * 2
            out += [] if last_level else _masked(words)

            step_args = [
                [seed[i], level_nonces[k], i == 0, corr_c(i), a[i], ef_pieces[i]]
                + [g[i], p[i], level, next_nonce]
                for i in range(session.n)
            ]
            outs = at_parties(session, carry_step, step_args.__getitem__, out)
            if last_level:
                (g,) = outs
            else:
                g, p, ef, a = outs

        # round 4: open d = msb(x) ^ t
        t_bin = last_only(session, t_bin_last)
        (d,) = at_parties(
            session,
            cmp_bit_mask,
            lambda i: [seed[i], nonce, t_bin(i), g[i], top[i]],
            [(shape, I64)],
        )
        last_round = Round(session, xor=True)
        opened_d = last_round.add(d)
        last_round.open()
        self.d = opened_d.value

    def _round1(
        self,
        x: Shares,
        values: list[Shares],
        product_nonces: list[int],
        trunc: TruncRun | None,
        group: Shares | None,
    ) -> tuple[Opened, list[_TProduct], list[Opened], Opened | None]:
        """Round 1 of either mode: c = x + r, the products' e = v - a, the truncation's
        and the groups' masked values, opened together (``self.group_e`` is set)."""
        session, nonce, seed = self.session, self.nonce, self.session.party_seeds
        shape = list(x[0].shape)
        (masked,) = at_parties(session, cmp_mask, lambda i: [seed[i], nonce, x[i]], [(shape, I64)])
        products = [_TProduct(session, pn, v) for pn, v in zip(product_nonces, values)]
        round1 = Round(session)
        c = round1.add(masked)
        product_openings = [round1.add(prod.e) for prod in products]
        trunc_opening = trunc.open_in(round1) if trunc is not None else None
        group_opening = None
        if group is not None and trunc is None:  # (truncated: opened in round 2, _late)
            group_opening = round1.add(self._group_mask(group))
        round1.open()
        self.group_e = group_opening.value if group_opening is not None else None
        return c, products, product_openings, trunc_opening

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
        self, trunc: TruncRun | None, opening: Opened | None, product_nonces: list[int]
    ) -> tuple[list[_TProduct], Shares | None]:
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
        return [_TProduct(self.session, product_nonces[-1], truncated)], None

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
        index on ties; shared integers), local (:func:`mpc.math.group4.select`)."""
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
        """[msb(x)] = d + (1 - 2d) [t]."""
        seed, nonce, d = self.session.party_seeds, self.nonce, self.d
        t_arith = last_only(self.session, self.t_arith_last)
        (out,) = at_parties(
            self.session,
            cmp_bit_finish,
            lambda i: [seed[i], nonce, i == 0, t_arith(i), d[i]],
            [(self.shape, I64)],
        )
        return out

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
        out = []
        for v, vt in zip(self.values, self.vt):

            def args(i: int, v: Shares = v, vt: Shares = vt) -> list[Any]:
                return [complement, self.d[i], v[i], vt[i]]

            (selected,) = at_parties(self.session, cmp_select_finish, args, [(self.shape, I64)])
            out.append(selected)
        return out


class _TProduct:
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


def _selected(values: list[Shares], trunc: TruncRun | None, group: Shares | None) -> int:
    """The products [v t] of a run: the values, and a truncated value unless the
    truncation is of the groups of four (whose selection has its own material)."""
    selected = len(values) + (trunc is not None and group is None)
    if selected > MAX_SELECTED:
        raise ValueError(
            f"select_by_msb selects at most {MAX_SELECTED} values in one comparison, "
            f"got {len(values)}: split them over several calls"
        )
    return selected


def _masked(words: int) -> list[tuple[Any, torch.dtype]]:
    """Output metadata of a masking step: the masked operands e packed flat (opened as one
    value), then the masks a, packed likewise."""
    packed = carry4.packed_words(len(carry4.VARS)) * words
    return [([packed], I64), ([packed], I64)]


def _packed_shapes(words: int) -> list[list[int]]:
    """The dealer's carry-tree material at the last party: level 0's bit products, then
    each other level's mask products (packed words, flat)."""
    out = [[len(carry4.BIT_MONOMIALS) * words // 4]]
    for level in range(1, carry4.LEVELS):
        out.append([carry4.packed_words(len(carry4.MONOMIALS)) * carry4.words(words, level)])
    return out


def _total(shapes: list[list[int]]) -> int:
    return sum(_numel(sh) for sh in shapes)


def _numel(shape: list[int]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n
