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
