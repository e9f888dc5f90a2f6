"""Bit manipulation on packed int64 words for the comparison's carry tree (no I/O).

The carry into bit 63 of c + ~r + 1 is the generate bit of the group [0, 63] (bit 63 set
to "propagate"). A binary tree combines adjacent groups, (G, P)_hi o (G, P)_lo =
(G_hi ^ P_hi & G_lo, P_hi & P_lo): each level halves the groups per element, leaving
half the bit positions free, which the results of a second word fill (interleaving).
Every level therefore ANDs half as many words as the one before (about 4 words per
element over all six levels, against 11 for a Kogge-Stone network on full words), and
the XOR shares stay local under shifts, masks and interleaving.
"""

from __future__ import annotations

from functools import lru_cache

import torch

LEVELS = 6  # 64 groups -> 1
PAD = 32  # element count multiple that keeps every packing step even


def _low_mask(level: int) -> int:
    """Bit positions whose bit ``level`` is 0 (the "lo" member of each pair)."""
    m = 0
    for pos in range(64):
        if not (pos >> level) & 1:
            m |= 1 << pos
    return m - (1 << 64) if m >= 1 << 63 else m


MASKS = tuple(_low_mask(level) for level in range(LEVELS))


def padded(n: int) -> int:
    return -(-max(n, 1) // PAD) * PAD


_LOW63 = (1 << 63) - 1
_TOP = -(1 << 63)


def and_shapes(words: int) -> list[list[int]]:
    """The AND operands' shapes of the carry tree's levels 1..5 for ``words`` padded
    words at level 0 (the first level is local): two stacked halves
    ([2, words / 2^level]), one at the last level."""
    out = []
    for level in range(1, LEVELS):
        w = words >> level
        out.append([w] if level == LEVELS - 1 else [2, w])
    return out


def pair_products(r_not: torch.Tensor) -> torch.Tensor:
    """The dealer's q for the local first level: at each even bit position l, the product
    y_(l+1) y_l of the complemented mask's bits y = ~r, with bit 63 read as 0 (it is the
    public "propagate" there), one word per element."""
    y = r_not & _LOW63
    return (y >> 1) & y & MASKS[0]


def pack_pairs(q: torch.Tensor) -> torch.Tensor:
    """(2m,) words with only even bits used -> (m,): word i ^ word i+m << 1 (linear over
    XOR); :func:`unpack_pairs` inverts it. Halves what the dealer ships."""
    m = q.shape[0] // 2
    return (q[:m] & MASKS[0]) ^ ((q[m:] & MASKS[0]) << 1)


def unpack_pairs(packed: torch.Tensor) -> torch.Tensor:
    return torch.cat([packed & MASKS[0], (packed >> 1) & MASKS[0]])


def local_first_level(
    c: torch.Tensor, y: torch.Tensor, q: torch.Tensor, first: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Level 0 of the carry tree without an AND round: (G, P) after it, as
    :func:`level_update` gives them, from the public c, this party's XOR share y of ~r
    (party 0's already complemented) and its share q of the pairs' products (all flat,
    padded words).

    With c public every AND of level 0 is linear in the shares once q = y_h y_l is known:
    for a pair (h, l) = (2j+1, 2j), p = c ^ y and g_l = alpha_l ^ beta_l y_l (alpha = 0,
    beta = c_l, but at bit 0, where the carry-in 1 is folded in: g_0 = c_0 | y_0, so
    alpha_0 = c_0, beta_0 = 1 ^ c_0), and bit 63 is public (c_63 read as 1, y_63 as 0):
      p_h p_l = c_h c_l ^ c_h y_l ^ c_l y_h ^ q
      p_h g_l = c_h alpha_l ^ c_h beta_l y_l ^ alpha_l y_h ^ beta_l q
    (the c-only terms at party 0). Cf. the preprocessed products of mask bits that make
    ABY2.0's multi-input AND gates local (Patra et al., USENIX Security 2021)."""
    m0 = MASKS[0]
    cp = c | _TOP
    yp = y & _LOW63
    g = c & yp
    p = (cp ^ yp) if first else yp
    g ^= p & 1  # the carry-in, at bit 0
    ch, cl = (cp >> 1) & m0, cp & m0
    yh, yl = (yp >> 1) & m0, yp & m0
    alpha = c & 1
    beta = (c ^ 1) & m0
    z1 = (ch & yl) ^ (cl & yh) ^ q
    z0 = (ch & beta & yl) ^ (alpha & yh) ^ (beta & q)
    if first:
        z1 ^= ch & cl
        z0 ^= ch & alpha
    g_new, p_new = level_update(g, torch.stack([z0, z1]), 0)
    assert p_new is not None
    return g_new, p_new


def level_operands(
    g: torch.Tensor, p: torch.Tensor, level: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """AND operands of tree level ``level``: P_hi & G_lo (and P_hi & P_lo), at lo bits.

    At level L a word interleaves 2^L elements (element e at positions = e mod 2^L), so
    the two groups of a pair sit 2^L bits apart."""
    shift, mask = 1 << level, MASKS[level]
    x = (p >> shift) & mask
    if level == LEVELS - 1:
        return x, g & mask
    return torch.stack([x, x]), torch.stack([g & mask, p & mask])


def level_update(
    g: torch.Tensor, z: torch.Tensor, level: int
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New (G, P) from the level's AND results z: G = G_hi ^ (P_hi & G_lo), P = z[1];
    then two words are interleaved into one (but after the last level)."""
    shift, mask = 1 << level, MASKS[level]
    last = level == LEVELS - 1
    # Mask after combining: a share of z has random bits everywhere (only the XOR of
    # the shares is zero off the mask), and masking is linear over XOR.
    g_new = ((g >> shift) ^ (z if last else z[0])) & mask
    if last:
        return g_new, None
    return _interleave(g_new, shift), _interleave(z[1] & mask, shift)


def _interleave(x: torch.Tensor, shift: int) -> torch.Tensor:
    """(2m,) -> (m,): word i ^ word i+m << shift (the second fills the free positions;
    XOR rather than OR so that it is linear on shares)."""
    m = x.shape[0] // 2
    return x[:m] ^ (x[m:] << shift)


@lru_cache(maxsize=64)
def element_order(n_pad: int) -> torch.Tensor:
    """After the last level, bit s of word w holds the carry of element order[w, s]."""
    slots = torch.arange(n_pad, dtype=torch.int64).view(n_pad, 1)
    for _ in range(LEVELS - 1):  # interleaving steps: word i gets slots of i and i + half
        half = slots.shape[0] // 2
        slots = torch.cat([slots[:half], slots[half:]], dim=1)
    return slots


def unpack_carries(g: torch.Tensor, n: int) -> torch.Tensor:
    """The per-element carry bits (0/1 int64, shape (n,)) from the final words."""
    n_pad = g.shape[0] * PAD
    order = element_order(n_pad)
    bits = (g.view(-1, 1) >> torch.arange(PAD, dtype=torch.int64)) & 1
    out = torch.empty(n_pad, dtype=torch.int64)
    out[order.reshape(-1)] = bits.reshape(-1)
    return out[:n]
