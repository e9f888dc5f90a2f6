"""The comparison's carry tree in radix 4, on packed int64 words (no I/O).

msb(x) for x = c - r needs the carry into bit 63 of c + ~r + 1, the generate bit G of the
group [0, 63] (bit 63 set to "propagate", the carry-in 1 folded into bit 0). With c public
and y = ~r XOR-shared, every bit's generate and propagate are affine in one secret bit:
g_i = alpha_i ^ beta_i y_i, p_i = c_i ^ y_i. Groups combine four at a time:

    G = G3 ^ P3 G2 ^ P3 P2 G1 ^ P3 P2 P1 G0,    P = P3 P2 P1 P0.

A product of affine factors in distinct secret bits expands into monomials of those bits
with public coefficients (:func:`expand`), so given XOR shares of the monomials a radix-4
combination is *local*:

* level 0 (64 bits -> 16 groups): the dealer deals the monomials of y's bits within each
  group of four (11 of them: every subset of two or more bits), so the level needs no round;
* levels 1 and 2 (16 -> 4 -> 1): each is one round of a multi-input AND: the parties open
  their operands masked with random bits a (e = x ^ a), and x = e ^ a is affine in a with the
  public e, so the products expand into monomials of the masks, which the dealer deals (22
  of them per combination). Cf. the preprocessed mask products of ABY2.0's multi-input AND
  gates (Patra et al., USENIX Security 2021).

So the carry costs two rounds after c is opened (six with radix 2). Between levels four
words are interleaved into one (their used bit positions are disjoint), so level 1 works on
a quarter of the words and level 2 on a sixteenth.

Layout. Level 0 works on one word per element, groups at bit positions 4k. Level L >= 1
works on ``words(n, L)`` words whose used positions are ``MASKS[L]`` and whose groups sit
``SPACING[L]`` bits apart (4, then 16); after level 2 bit ``s`` of word ``w`` holds the carry
of element :func:`element_of`.
"""

from __future__ import annotations

from functools import lru_cache
from itertools import combinations

import torch

LEVELS = 3  # level 0 (local), then two rounds
PAD = 32  # element count multiple (a multiple of 16 keeps the interleaving even)
ONES = -1

_LOW63 = (1 << 63) - 1
_TOP = -(1 << 63)


def _mask(keep: int, period: int) -> int:
    m = 0
    for pos in range(64):
        if pos % period < keep:
            m |= 1 << pos
    return m - (1 << 64) if m >= 1 << 63 else m


# level 0: group bases at multiples of 4; level 1: offsets 0-3 of each 16-bit block (four
# interleaved slots); level 2: bits 0-15 (sixteen slots)
MASKS = (_mask(1, 4), _mask(4, 16), _mask(16, 64))
SPACING = (1, 4, 16)  # bits between the four groups a level combines

# the combination's variables (levels 1 and 2): G3 enters linearly, the others in products
VARS = ("G0", "G1", "G2", "P0", "P1", "P2", "P3")
PRODUCTS = (("P3", "G2"), ("P3", "P2", "G1"), ("P3", "P2", "P1", "G0"))
P_PRODUCT = ("P3", "P2", "P1", "P0")


def _subsets(factors: tuple[str, ...]) -> list[frozenset[str]]:
    return [frozenset(t) for k in range(2, len(factors) + 1) for t in combinations(factors, k)]


def _monomials() -> tuple[frozenset[str], ...]:
    seen: list[frozenset[str]] = []
    for prod in (*PRODUCTS, P_PRODUCT):
        for t in _subsets(prod):
            if t not in seen:
                seen.append(t)
    return tuple(seen)


MONOMIALS = _monomials()  # the 22 mask products a level's combination needs
BIT_MONOMIALS = tuple(_subsets(("y0", "y1", "y2", "y3")))  # level 0: 11 products of y bits


def padded(n: int) -> int:
    return -(-max(n, 1) // PAD) * PAD


def words(n_pad: int, level: int) -> int:
    """Words per level-``level`` operand for ``n_pad`` padded elements."""
    return n_pad >> (2 * level)


def packed_words(count: int) -> int:
    """Words that hold ``count`` aligned values packed four to a word."""
    return -(-count // 4)


def pack(aligned: list[torch.Tensor], level: int) -> torch.Tensor:
    """Values aligned on ``MASKS[level]`` packed four to a word (the free offsets of the
    positions each uses), stacked: shape [packed_words(len), words]. Linear over XOR."""
    shift = 1 if level == 0 else SPACING[level]
    out = []
    for k in range(0, len(aligned), 4):
        w = aligned[k]
        for j, v in enumerate(aligned[k + 1 : k + 4], start=1):
            w = w ^ (v << (j * shift))
        out.append(w)
    return torch.stack(out)


def unpack(packed: torch.Tensor, count: int, level: int) -> list[torch.Tensor]:
    """The ``count`` aligned values :func:`pack` packed (any words: e.g. random ones)."""
    shift = 1 if level == 0 else SPACING[level]
    shifts = torch.arange(0, 4 * shift, shift, dtype=packed.dtype, device=packed.device)
    shifts = shifts.view(1, 4, *([1] * (packed.dim() - 1)))
    out = (packed.unsqueeze(1) >> shifts).bitwise_and_(MASKS[level])  # four offsets at once
    return list(out.flatten(0, 1)[:count].unbind(0))


# -- polynomials in secret bits with public word coefficients ----------------------------

Poly = dict[frozenset[str], "torch.Tensor | int"]


Factor = tuple["torch.Tensor | int", "torch.Tensor | int | None", str]


def expand(factors: list[Factor], poly: Poly | None = None) -> Poly:
    """The product of affine factors k ^ m v (public words k and m, m None for all ones, v a
    secret bit named by the string), each in its own variable, as monomial -> coefficient
    (times ``poly``, a product of other variables, if given)."""
    if poly is None:
        poly = {frozenset(): ONES}
    for k, m, v in factors:
        out: Poly = {}
        for t, coef in poly.items():
            if not (isinstance(k, int) and k == 0):  # (a zero term vanishes)
                out[t] = coef & k  # (t and t | {v} are distinct keys: no merging needed)
            out[t | {v}] = coef if m is None else coef & m
        poly = out
    return poly


def _chain(first: Factor, props: list[Factor], gens: list[Factor]) -> tuple[Poly, Poly]:
    """G = g_top ^ p_top g_(top-1) ^ p_top p_(top-1) g_(top-2) ^ ..., sharing the prefixes
    of the propagates' product: ``first`` is g_top, ``props`` the propagates from the top
    down, ``gens`` the generates below g_top; and that product of the propagates."""
    big_g = expand([first])
    prefix: Poly | None = None
    for p, g in zip(props, gens):
        prefix = expand([p], prefix)
        big_g = add(big_g, expand([g], prefix))
    assert prefix is not None
    return big_g, prefix


def _xor_into(poly: Poly, t: frozenset[str], value: torch.Tensor | int) -> None:
    old = poly.get(t)
    poly[t] = value if old is None else old ^ value


def add(*polys: Poly) -> Poly:
    out: Poly = {}
    for p in polys:
        for t, coef in p.items():
            _xor_into(out, t, coef)
    return out


def evaluate(poly: Poly, shares: dict[frozenset[str], torch.Tensor], first: bool) -> torch.Tensor:
    """This party's XOR share of the polynomial from its shares of the monomials (the
    constant term at the first party)."""
    out: torch.Tensor | None = None  # (a fresh tensor of this call's, updated in place)
    for t, coef in poly.items():
        if not t:
            if not first or not isinstance(coef, torch.Tensor):
                continue  # (a constant coefficient is never produced: c is a word)
            out = coef.clone() if out is None else out.bitwise_xor_(coef)
        else:
            term = shares[t] & coef
            out = term if out is None else out.bitwise_xor_(term)
    assert out is not None
    return out


# -- level 0: local, from the public c and the dealer's monomials of y's bits --------------


def planes(x: torch.Tensor) -> list[torch.Tensor]:
    """Bit planes of one word per padded element, interleaved as level 1 takes its input:
    plane j holds, at bit 4k + s of word i, bit 4k + j of element i + s (n_pad / 4). Level
    0 then works on a quarter of the words, and its outputs need no interleaving."""
    q = x.view(4, -1)
    out = []
    for j in range(4):
        w = (q[0] >> j) & MASKS[0]
        for s in range(1, 4):
            w ^= ((q[s] >> j) & MASKS[0]) << s
        out.append(w)
    return out


def level0_polys(c: torch.Tensor) -> tuple[Poly, Poly]:
    """G and P of every group of four bits as polynomials in y's bit planes, with public
    coefficients (planes of c): g_j = alpha_j ^ beta_j y_j (alpha = beta = 0 but at bit 0,
    where the carry-in 1 is folded in: g_0 = c_0 | y_0 = c_0 ^ ~c_0 y_0; at bit 63 g = 0) and
    p_j = c_j ^ y_j (bit 63: c read as 1, y as 0)."""
    cpl = planes(c)
    top = -(1 << 60)  # bits 60-63 of a plane: bit 63 of the four elements (plane 3)
    slot0 = 0xF  # bits 0-3: bit 0 of the four elements (plane 0)
    alpha: list[torch.Tensor | int] = [cpl[0] & slot0, 0, 0, 0]  # c & 1 (0: the term vanishes)
    beta = [cpl[0] ^ slot0, cpl[1], cpl[2], cpl[3] & ~top]  # (c ^ 1) & LOW63
    cp = [cpl[0], cpl[1], cpl[2], cpl[3] | top]  # c | TOP
    g: list[Factor] = [(alpha[j], beta[j], f"y{j}") for j in range(4)]
    p: list[Factor] = [(cp[j], None, f"y{j}") for j in range(4)]
    big_g, p321 = _chain(g[3], [p[3], p[2], p[1]], [g[2], g[1], g[0]])
    return big_g, expand([p[0]], p321)


def level0(
    c: torch.Tensor, y: torch.Tensor, monomials: list[torch.Tensor], first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's XOR shares of (G, P) after level 0, laid out for level 1, from the
    public c, its share y of ~r (bit 63 ignored; both one word per padded element) and its
    shares of :data:`BIT_MONOMIALS` (bit planes, as :func:`bit_monomials` lays them out)."""
    shares = {frozenset({f"y{j}"}): v for j, v in enumerate(planes(y & _LOW63))}
    shares.update(zip(BIT_MONOMIALS, monomials))
    big_g, big_p = level0_polys(c)
    return evaluate(big_g, shares, first), evaluate(big_p, shares, first)


def products(
    values: dict[str, torch.Tensor], monomials: tuple[frozenset[str], ...]
) -> list[torch.Tensor]:
    """The AND of the named words of each monomial (the dealer's, in the clear)."""
    out = []
    for t in monomials:
        it = iter(sorted(t))
        m = values[next(it)]
        for v in it:
            m = m & values[v]
        out.append(m)
    return out


def bit_monomials(y: torch.Tensor) -> list[torch.Tensor]:
    """The dealer's :data:`BIT_MONOMIALS` of y = ~r (bit 63 read as 0), as bit planes."""
    return products({f"y{j}": v for j, v in enumerate(planes(y & _LOW63))}, BIT_MONOMIALS)


# -- levels 1 and 2: a round of multi-input ANDs each ---------------------------------------


def operands(
    g: torch.Tensor, p: torch.Tensor, level: int, names: tuple[str, ...] = VARS
) -> list[torch.Tensor]:
    """The combination's variables (``names``: :data:`VARS` by default) aligned on its
    output positions."""
    shift, mask = SPACING[level], MASKS[level]
    out = []
    for name in names:
        src = g if name[0] == "G" else p
        out.append((src >> (int(name[1]) * shift)) & mask)
    return out


def combine(
    g: torch.Tensor,
    masks: list[torch.Tensor],
    opened: list[torch.Tensor],
    monomials: list[torch.Tensor],
    level: int,
    first: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """This party's shares of the combined (G, P) of ``level`` from its share of G (for the
    linear G3), its shares of the masks a of :data:`VARS`, the opened e = x ^ a, and its
    shares of the masks' :data:`MONOMIALS`; interleaved for the next level (not after the
    last)."""
    e = dict(zip(VARS, opened))
    shares = {frozenset({v}): a for v, a in zip(VARS, masks)}
    shares.update(zip(MONOMIALS, monomials))

    def f(v: str) -> Factor:
        return (e[v], None, v)

    # G = G3 ^ P3 G2 ^ P3 P2 G1 ^ P3 P2 P1 G0 (G3 linear), P = P3 P2 P1 P0
    g3: Factor = (0, None, "G3")  # (linear: added below from this party's share)
    g_poly, p321 = _chain(g3, [f("P3"), f("P2"), f("P1")], [f("G2"), f("G1"), f("G0")])
    g_poly.pop(frozenset({"G3"}))
    big_g = evaluate(g_poly, shares, first)
    big_g ^= (g >> (3 * SPACING[level])) & MASKS[level]  # G3
    big_p = evaluate(expand([f("P0")], p321), shares, first)
    if level == LEVELS - 1:
        return big_g, big_p
    return interleave(big_g, level), interleave(big_p, level)


def mask_monomials(masks: list[torch.Tensor]) -> list[torch.Tensor]:
    """The dealer's :data:`MONOMIALS` of the full masks (aligned)."""
    return products(dict(zip(VARS, masks)), MONOMIALS)


def interleave(x: torch.Tensor, level: int) -> torch.Tensor:
    """(4m,) -> (m,): the four quarters in one word, quarter q shifted by q times the
    level's free offset (XOR, so linear on shares)."""
    m = x.shape[0] // 4
    shift = 1 if level == 0 else SPACING[level]
    out = x[:m].clone()
    for q in range(1, 4):
        out ^= x[q * m : (q + 1) * m] << (q * shift)
    return out


@lru_cache(maxsize=64)
def element_of(n_pad: int) -> torch.Tensor:
    """After level 2, bit s (0-15) of word w holds the carry of element element_of[w, s]."""
    w = n_pad // 16
    word = torch.arange(w, dtype=torch.int64).view(w, 1)
    s = torch.arange(16, dtype=torch.int64).view(1, 16)
    # bit 4q + r: level-1 word w + q (n_pad / 16), slot r of it: element + r (n_pad / 4)
    return word + (s // 4) * w + (s % 4) * (n_pad // 4)


def unpack_carries(g: torch.Tensor, n: int) -> torch.Tensor:
    """The per-element carry bits (0/1 int64, shape (n,)) from the final words."""
    n_pad = g.shape[0] * 16
    bits = (g.view(-1, 1) >> torch.arange(16, dtype=torch.int64)) & 1
    out = torch.empty(n_pad, dtype=torch.int64)
    out[element_of(n_pad).reshape(-1)] = bits.reshape(-1)
    return out[:n]
