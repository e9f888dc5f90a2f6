"""Bit manipulation on packed int64 words for the comparison's carry tree (no I/O).

The carry into bit 63 of c + ~r + 1 is the generate bit of the group [0, 63] (bit 63 set
to "propagate"). A binary tree combines adjacent groups, (G, P)_hi o (G, P)_lo =
(G_hi ^ P_hi & G_lo, P_hi & P_lo): each level halves the groups per element, so after
combining, the even bit positions are compacted into the low 32 bits and two words are
packed into one. Every level therefore ANDs half as many words as the one before (about
4 words per element over all six levels, against 11 for a Kogge-Stone network on full
words), and the XOR shares stay local under shifts, masks and packing.
"""

from __future__ import annotations

from functools import lru_cache

import torch

EVEN = 0x5555555555555555
LEVELS = 6  # 64 groups -> 1
PAD = 32  # element count multiple that keeps every packing step even

_COMPACT = (
    (1, 0x3333333333333333),
    (2, 0x0F0F0F0F0F0F0F0F),
    (4, 0x00FF00FF00FF00FF),
    (8, 0x0000FFFF0000FFFF),
    (16, 0x00000000FFFFFFFF),
)


def padded(n: int) -> int:
    return -(-max(n, 1) // PAD) * PAD


def compact_even(x: torch.Tensor) -> torch.Tensor:
    """Gather the 32 even bits of each word into its low 32 bits (in place on x)."""
    x &= EVEN
    for shift, mask in _COMPACT:
        x |= x >> shift
        x &= mask
    return x


def pack_pairs(x: torch.Tensor) -> torch.Tensor:
    """Words with 32 meaningful low bits, (2m,) -> (m,): word i | word i+m << 32."""
    m = x.shape[0] // 2
    return x[:m] | (x[m:] << 32)


def level_operands(g: torch.Tensor, p: torch.Tensor, last: bool) -> tuple[torch.Tensor, ...]:
    """AND operands of one tree level: P_odd & G_even (and P_odd & P_even), at even bits."""
    x = (p >> 1) & EVEN
    if last:
        return x, g & EVEN
    return torch.stack([x, x]), torch.stack([g & EVEN, p & EVEN])


def level_update(
    g: torch.Tensor, z: torch.Tensor, last: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """New (G, P) from a level's AND results z: G = G_odd ^ (P_odd & G_even), P = z[1];
    compacted and (but for the last level) packed."""
    g_new = ((g >> 1) & EVEN) ^ (z if last else z[0])
    g_new = compact_even(g_new)
    if last:
        return g_new, None
    return pack_pairs(g_new), pack_pairs(compact_even(z[1]))


@lru_cache(maxsize=64)
def element_order(n_pad: int) -> torch.Tensor:
    """After the last level, bit s of word w holds the carry of element order[w, s]."""
    slots = torch.arange(n_pad, dtype=torch.int64).view(n_pad, 1)
    for _ in range(LEVELS - 1):  # packing steps: word i gets slots of i and i + half
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
