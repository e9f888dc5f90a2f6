"""The carry tree's last level with an arithmetic output (no I/O): the comparison's bit as
additive shares once the last level's operands are open, with no daBit round after it.

The last level of :mod:`mpc.math.carry_tree` combines four groups of 16 bits,
G = G3 ^ P3 G2 ^ P3 P2 G1 ^ P3 P2 P1 G0. In groups 1 to 3 (no carry-in; bit 63 set to
propagate, never to generate) a group's G and P exclude each other: P = 1 means that
every bit propagates, so that none generates. So at most one of the four terms is 1, and
their XOR is their integer sum. Every operand is opened masked, x = e ^ a with e public and
a a random bit (G3 too, where the XOR tree adds it locally), and over the integers
x = e + (1 - 2e) a: each term expands into monomials a_S of the masks whose coefficients
(per element, small integers) the parties compute from the e (:func:`coefficients`).

msb(x) = msb(c) ^ h ^ carry with h = msb(~r), a bit of the dealer's r. Over the integers
h ^ carry = h + (1 - 2h) carry, so with additive shares of h and of (1 - 2h) a_S for each
monomial S (:data:`MONOMIALS`, dealt: :func:`dealt`), the parties' additive shares of
msb(x) are local (:func:`msb_shares`). Cf. the preprocessed mask products of ABY2.0's
multi-input AND gates (Patra et al., USENIX Security 2021), here with arithmetic shares of
the products as the dealer's output, the way an edaBit's bits are dealt both ways.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import torch

from mpc.math import carry_tree

#: the last level's operands, masked and opened: the XOR tree's and G3 (its eighth slot)
VARS = (*carry_tree.VARS, "G3")
#: the carry's four terms, each a product of operands
TERMS = (("G3",), ("P3", "G2"), ("P3", "P2", "G1"), ("P3", "P2", "P1", "G0"))


def _monomials() -> tuple[frozenset[str], ...]:
    seen: list[frozenset[str]] = []
    for term in TERMS:
        for k in range(1, len(term) + 1):
            for t in combinations(term, k):
                if frozenset(t) not in seen:
                    seen.append(frozenset(t))
    return tuple(seen)


#: the monomials of the masks whose arithmetic shares (times 1 - 2h) the dealer deals
MONOMIALS = _monomials()
_EMPTY: frozenset[str] = frozenset()


def opened_index(aligned: list[torch.Tensor], n: int) -> torch.Tensor:
    """The last level's words of :data:`VARS` (aligned as :func:`carry_tree.unpack` gives
    them) as one int64 an element, 0 to 255 (bit j: ``VARS[j]``), the first ``n``
    elements."""
    words = torch.stack(aligned)  # [8, w], the elements at bits 0-15 of each word
    bits = (words.unsqueeze(-1) >> torch.arange(16, dtype=torch.int64)) & 1  # [8, w, 16]
    shifts = torch.arange(len(VARS), dtype=torch.int64).view(-1, 1, 1)
    packed = (bits << shifts).sum(0)  # [w, 16]
    n_pad = words.shape[1] * 16
    out = torch.empty(n_pad, dtype=torch.int64)
    out[carry_tree.element_of(n_pad).reshape(-1)] = packed.reshape(-1)
    return out[:n]


def coefficients(e: dict[str, torch.Tensor]) -> dict[frozenset[str], torch.Tensor]:
    """The carry as a polynomial in the masks' monomials with integer coefficients, per
    element, from the opened bits ``e`` of :data:`VARS` (0/1 tensors; the coefficients are
    -4 to 4): the empty monomial's is the constant term. (Evaluated once, on the 256
    values of the eight bits: :func:`coefficient_table`.)"""
    total: dict[frozenset[str], torch.Tensor] = {}
    for term in TERMS:
        poly: dict[frozenset[str], torch.Tensor | int] = {_EMPTY: 1}
        for v in term:
            ev = e[v]
            sv = 1 - 2 * ev
            out: dict[frozenset[str], torch.Tensor | int] = {}
            for t, coef in poly.items():
                out[t] = coef * ev
                out[t | {v}] = coef * sv
            poly = out
        for t, coef in poly.items():
            assert isinstance(coef, torch.Tensor)
            old = total.get(t)
            total[t] = coef if old is None else old + coef
    return total


def _all_bits() -> dict[str, torch.Tensor]:
    idx = torch.arange(1 << len(VARS), dtype=torch.int64)
    return {v: (idx >> j) & 1 for j, v in enumerate(VARS)}


@lru_cache(maxsize=1)
def coefficient_table() -> torch.Tensor:
    """The carry's coefficients for each value of the eight opened bits (an
    :func:`opened_index`): [256, 1 + len(MONOMIALS)] int8, the constant term first."""
    coefs = coefficients(_all_bits())
    table = torch.stack([coefs[_EMPTY]] + [coefs[t] for t in MONOMIALS], dim=1)
    return table.to(torch.int8).contiguous()  # (-4 to 4)


@lru_cache(maxsize=1)
def monomial_table() -> torch.Tensor:
    """The monomials a_S (0/1) for each value of the eight mask bits:
    [256, len(MONOMIALS)] int8."""
    bits = _all_bits()
    out = []
    for t in MONOMIALS:
        m = torch.ones(1 << len(VARS), dtype=torch.int64)
        for v in t:
            m = m * bits[v]
        out.append(m)
    return torch.stack(out, dim=1).to(torch.int8).contiguous()


def _terms(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The constant term (n, int64) and the monomials' coefficients ([len(MONOMIALS), n],
    int8) of the elements' opened bits."""
    coefs = coefficient_table()[index]  # [n, 23], a byte each
    return coefs[:, 0].to(torch.int64), coefs[:, 1:].t()


def _combine(out: torch.Tensor, coefs: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """out + sum_S coef_S words_S, one monomial at a time (no [len(MONOMIALS), n]
    temporary)."""
    for k in range(coefs.shape[0]):
        out.addcmul_(coefs[k], words[k])
    return out


def u_shares(
    first: bool, index: torch.Tensor, h: torch.Tensor, words: torch.Tensor
) -> torch.Tensor:
    """This party's additive share of u = h ^ carry = h + (1 - 2h) carry (flat), from the
    opened bits (:func:`opened_index`), its share ``h`` of h and its shares ``words`` of
    (1 - 2h) a_S ([len(MONOMIALS), n], :data:`MONOMIALS` order); the constant terms at the
    first party."""
    const, coefs = _terms(index)
    u = h.reshape(-1) * (1 - 2 * const)  # h + const (1 - 2h): const at the first party
    if first:
        u += const
    return _combine(u, coefs, words)


def msb_shares(
    first: bool, index: torch.Tensor, h: torch.Tensor, words: torch.Tensor, top: torch.Tensor
) -> torch.Tensor:
    """This party's additive share of msb(x) = top ^ u (:func:`u_shares`), ``top`` msb(c)
    (public, per element)."""
    return flip(first, u_shares(first, index, h, words), top.reshape(-1))


def flip(first: bool, u: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
    """Shares of top ^ u = top + (1 - 2 top) u for a public bit ``top``."""
    out = (1 - 2 * top) * u
    if first:
        out += top
    return out


def selected_shares(
    first: bool,
    index: torch.Tensor,
    u: torch.Tensor,
    top: torch.Tensor,
    v: torch.Tensor,
    ev: torch.Tensor,
    products: torch.Tensor,
) -> torch.Tensor:
    """This party's share of v msb(x) (flat), v = ev + b opened as ``ev`` with the mask b
    the dealer knows: v u = ev u + b u and b u = (1 - 2 const) b h + const b +
    sum_S coef_S b (1 - 2h) a_S, with its shares ``products`` of b h, then of
    b (1 - 2h) a_S ([1 + len(MONOMIALS), n], :func:`dealt_products`), of u and of v."""
    const, coefs = _terms(index)
    v = v.reshape(-1)
    b = v - ev if first else v  # (e = v - b)
    vu = _combine(ev * u, coefs, products[1:])
    vu += (1 - 2 * const) * products[0]
    vu += const * b
    out = top * v  # v (top ^ u) = top v + (1 - 2 top) v u
    out += (1 - 2 * top) * vu
    return out


def trunc_masks(b: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, D) of a truncation by ``bits`` whose opened value is e = v - b (the mask
    r = -b of :func:`mpc.protocols.truncation.steps.dealer_trunc`): with r' = r - 2^62,
    U = -(r' >> f) - 2^(62-f) and D = 2^(64-f) (1 - msb(r')), so that for |v| < 2^62
    v >> f = (e >> f) + U + msb(e) D, or one unit more."""
    r = b.neg().sub_(1 << 62)
    d = (r >> 63).add_(1).bitwise_left_shift_(64 - bits)
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    return u, d


def selected_truncated_shares(
    first: bool,
    index: torch.Tensor,
    u: torch.Tensor,
    top: torch.Tensor,
    ev: torch.Tensor,
    products: torch.Tensor,
    bits: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's shares (flat) of (v >> f) msb(x) and of v >> f (f = ``bits``, each
    one unit more at most), v = ev + b opened as ``ev``: v >> f = (ev >> f) + U + msb(ev) D
    (:func:`trunc_masks`), and with W u for W = U, D from the dealer's products as
    :func:`selected_shares` takes b u, (v >> f) u = (ev >> f) u + U u + msb(ev) D u;
    ``products`` [2 (2 + len(MONOMIALS)), n]: U, U h, U (1 - 2h) a_S, then D's
    (:func:`dealt_trunc_products`)."""
    const, coefs = _terms(index)
    half = 2 + len(MONOMIALS)
    high = ev.reshape(-1) >> bits
    wrap = ev.reshape(-1) >> 63  # (all ones where msb(ev) = 1)

    def times_u(w: torch.Tensor) -> torch.Tensor:  # W u from W, W h, W (1 - 2h) a_S
        out = _combine((1 - 2 * const) * w[1], coefs, w[2:])
        return out.add_(const * w[0])

    ups, downs = products[:half], products[half:]
    tv = ups[0] + (downs[0] & wrap)
    tu = times_u(ups) + (times_u(downs) & wrap)
    tu += high * u
    if first:
        tv += high
    out = top * tv
    out += (1 - 2 * top) * tu
    return out, tv


def dealt_trunc_products(
    b: torch.Tensor, h: torch.Tensor, words: torch.Tensor, bits: int
) -> torch.Tensor:
    """The dealer's U, U h, U (1 - 2h) a_S and D's alike for a value's mask ``b`` and a
    truncation by ``bits`` (:func:`trunc_masks`): [2 (2 + len(MONOMIALS)), n]."""
    u, d = trunc_masks(b.reshape(-1), bits)
    half = 2 + words.shape[0]
    out = torch.empty((2 * half, u.numel()), dtype=torch.int64)
    for k, w in enumerate((u, d)):
        out[k * half] = w
        out[k * half + 1 : (k + 1) * half] = dealt_products(w, h, words)
    return out


def dealt(mask_index: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The dealer's (1 - 2h) a_S for each of :data:`MONOMIALS` from the full masks of
    :data:`VARS` (an :func:`opened_index` of them) and h (0/1 per element):
    [len(MONOMIALS), n]."""
    monomials = monomial_table()[mask_index].t()  # [22, n], a byte each
    return monomials * (1 - 2 * h.reshape(-1))


def dealt_products(b: torch.Tensor, h: torch.Tensor, words: torch.Tensor) -> torch.Tensor:
    """The dealer's b h and b (1 - 2h) a_S (``words``, :func:`dealt`) for a value's mask
    ``b``: [1 + len(MONOMIALS), n]."""
    b = b.reshape(-1)
    out = torch.empty((1 + words.shape[0], b.numel()), dtype=torch.int64)
    torch.mul(b, h.reshape(-1), out=out[0])
    torch.mul(words, b, out=out[1:])
    return out


__all__ = [
    "MONOMIALS",
    "TERMS",
    "VARS",
    "coefficient_table",
    "coefficients",
    "dealt",
    "dealt_products",
    "dealt_trunc_products",
    "flip",
    "monomial_table",
    "msb_shares",
    "opened_index",
    "selected_shares",
    "selected_truncated_shares",
    "trunc_masks",
    "u_shares",
]
