"""A DCF whose payload is two elements of Z/2^128: the authenticated mode's comparison
(a bit's value and its MAC, :mod:`mpc.protocols.auth_fss`).

The tree, its seeds, control bits and their corrections are those of :mod:`mpc.math.dcf`
(Boyle et al., Eurocrypt 2021, Fig. 1, over any abelian group); only the group differs:
here (Z/2^128)^2, each element two 64-bit words (low, high) with carries, where
:mod:`mpc.math.dcf` has words of Z/2^64. For every public x in [0, 2^bits):

    evaluate(0, k_0, x) + evaluate(1, k_1, x) = beta * [x < alpha]   (mod 2^128, each),

and a key alone is pseudorandom. A node's value is the two elements H_K(s | 2 + side)
and H_K2(s | 2 + side) (two words each, :data:`mpc.math.dcf.FIXED_KEY` and
:data:`~mpc.math.dcf.FIXED_KEY2`); a leaf's, H_K(s | 2) and H_K2(s | 2) of the leaf
seed. The key of an element: per level the seed correction (two words, the control-bit
corrections in its low bits) and the two elements' value corrections (four words), then
the four words of the final correction: 6 bits + 4 words.

Layout of values and payloads: ``[4, n]`` int64, the words (low, high) of the first
element, then of the second.
"""

from __future__ import annotations

import numpy as np
import torch

from mpc.math.dcf import FIXED_KEY2, MMO, as_u64, check_bits, seed_level

__all__ = ["evaluate", "gen", "key_words"]

CHUNK = 4096
_U64 = np.dtype("<u8")
_Z = np.uint64(0)
_ONE = np.uint64(1)
_ALL = np.uint64((1 << 64) - 1)
_CLEAR = np.uint64(~3 & ((1 << 64) - 1))  # (a seed's two low bits: the control bits)


def _bit(x: np.ndarray, shift: int) -> np.ndarray:
    return (x >> np.uint64(shift)) & _ONE


def key_words(bits: int) -> int:
    """int64 words of one element's correction words (common to both parties)."""
    check_bits(bits)
    return 6 * bits + 4


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for ``[4, ...]`` word arrays (two elements of Z/2^128)."""
    out = a + b
    for k in (0, 2):
        out[k + 1] += (out[k] < a[k]).astype(_U64)
    return out


def _neg(a: np.ndarray) -> np.ndarray:
    out = np.negative(a)
    for k in (0, 2):
        out[k + 1] -= (a[k] != _Z).astype(_U64)
    return out


def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _add(a, _neg(b))


def _blocks(mmo: MMO, mmo2: MMO, s_lo: np.ndarray, s_hi: np.ndarray, tweak: int) -> np.ndarray:
    """The value of seeds (s_lo | tweak, s_hi) as ``[4, ...]`` words: H_K, then H_K2."""
    u = np.stack([s_lo | np.uint64(tweak), s_hi], axis=-1)
    h, h2 = mmo(np.ascontiguousarray(u)), mmo2(np.ascontiguousarray(u))
    return np.stack([h[..., 0], h[..., 1], h2[..., 0], h2[..., 1]])


def gen(
    alpha: torch.Tensor, beta: torch.Tensor, bits: int, roots: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The correction words (``[key_words(bits), n]`` int64) of the keys for
    beta * [x < alpha]: ``alpha`` n values in [0, 2^bits), ``beta`` ``[4, n]`` (two
    elements of Z/2^128 per x), ``roots`` the parties' root seeds (``[n, 2]`` each)."""
    check_bits(bits)
    n = alpha.numel()
    a = as_u64(alpha.reshape(-1), "alpha")
    if bits < 64 and np.any(a >> np.uint64(bits)):
        raise ValueError(f"alpha must lie in [0, 2^{bits})")
    b = as_u64(beta, "beta", (4, n))
    r0, r1 = (as_u64(r, "root", (n, 2)) for r in roots)
    cw = np.empty((key_words(bits), n), dtype=_U64)
    mmo, mmo2 = MMO(), MMO(FIXED_KEY2)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        _gen_chunk(mmo, mmo2, a[lo:hi], b[:, lo:hi], bits, r0[lo:hi], r1[lo:hi], cw[:, lo:hi])
    return torch.from_numpy(cw.view(np.int64))


def _gen_chunk(
    mmo: MMO,
    mmo2: MMO,
    alpha: np.ndarray,
    beta: np.ndarray,
    bits: int,
    r0: np.ndarray,
    r1: np.ndarray,
    cw: np.ndarray,
) -> None:
    m = alpha.shape[0]
    s = np.stack([r0, r1])  # [party, m, word]
    s[:, :, 0] &= _CLEAR
    t = np.zeros((2, m), dtype=_U64)
    t[1] = 1
    acc = np.zeros((4, m), dtype=_U64)  # the path's values so far, party 1 minus party 0
    tweak = np.arange(4, dtype=_U64)
    u = np.empty((2, m, 4, 2), dtype=_U64)
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)
        am = np.negative(a)
        u[:, :, :, 0] = s[:, :, None, 0] | tweak
        u[:, :, :, 1] = s[:, :, None, 1]
        h = mmo(u)  # [party, m, tweak, word]: the children (tweaks 0, 1), values (2, 3)
        h2 = mmo2(np.ascontiguousarray(u[:, :, 2:4]))
        s_cw, s_next, t_next = seed_level(h, a, t)  # (the tree of mpc.math.dcf)
        row = 6 * level
        cw[row], cw[row + 1] = s_cw[:, 0], s_cw[:, 1]
        # the values: [4 words, party, m, side]
        v = np.stack([h[:, :, 2:4, 0], h[:, :, 2:4, 1], h2[..., 0], h2[..., 1]])
        goes_right = a.astype(bool)[None, :]  # (alpha goes right: the path keeps that child)
        keep = [np.where(goes_right, v[:, p, :, 1], v[:, p, :, 0]) for p in (0, 1)]
        lose = [np.where(goes_right, v[:, p, :, 0], v[:, p, :, 1]) for p in (0, 1)]
        w = _add(_sub(_sub(lose[1], lose[0]), acc), beta & am)
        acc = _add(acc, _add(_sub(keep[0], keep[1]), w))
        cw[row + 2 : row + 6] = np.where(t[1].astype(bool), _neg(w), w)
        s, t = s_next, t_next
    leaf = [_blocks(mmo, mmo2, s[p, :, 0], s[p, :, 1], 2) for p in (0, 1)]
    last = _sub(_sub(leaf[1], leaf[0]), acc)
    cw[6 * bits :] = np.where(t[1].astype(bool), _neg(last), last)


def evaluate(
    party: int, root: torch.Tensor, cw: torch.Tensor, x: torch.Tensor, bits: int
) -> torch.Tensor:
    """Party ``party``'s additive shares (``[4, n]`` int64) of beta * [x < alpha] from
    its root seeds (``[n, 2]``), the correction words and the public inputs ``x`` (n
    values; their low ``bits`` bits are read)."""
    check_bits(bits)
    if party not in (0, 1):
        raise ValueError(f"a DCF has parties 0 and 1, got {party!r}")
    n = x.numel()
    xs = as_u64(x.reshape(-1), "x")
    s0 = as_u64(root, "root", (n, 2))
    cws = as_u64(cw, "cw", (key_words(bits), n))
    out = np.empty((4, n), dtype=_U64)
    mmo, mmo2 = MMO(), MMO(FIXED_KEY2)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        acc = _eval_chunk(mmo, mmo2, party, s0[lo:hi], cws[:, lo:hi], xs[lo:hi], bits)
        out[:, lo:hi] = _neg(acc) if party else acc
    return torch.from_numpy(out.view(np.int64))


def _eval_chunk(
    mmo: MMO, mmo2: MMO, party: int, root: np.ndarray, cw: np.ndarray, x: np.ndarray, bits: int
) -> np.ndarray:
    m = x.shape[0]
    s_lo = root[:, 0] & _CLEAR
    s_hi = root[:, 1].copy()
    mask = np.full(m, _ALL if party else 0, dtype=_U64)
    acc = np.zeros((4, m), dtype=_U64)
    for level in range(bits):
        side = (x >> np.uint64(bits - 1 - level)) & _ONE
        acc = _add(acc, _blocks(mmo, mmo2, s_lo | side, s_hi, 2))  # (tweak 2 + side)
        row = 6 * level
        acc = _add(acc, cw[row + 2 : row + 6] & mask)
        child = mmo(np.ascontiguousarray(np.stack([s_lo | side, s_hi], axis=-1)))
        s_lo = child[:, 0] ^ (cw[row] & mask)
        s_hi = child[:, 1] ^ (cw[row + 1] & mask)
        mask = np.negative((s_lo >> side) & _ONE)
        s_lo &= _CLEAR
    acc = _add(acc, _blocks(mmo, mmo2, s_lo, s_hi, 2))
    return _add(acc, cw[6 * bits :] & mask)
