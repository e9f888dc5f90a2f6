"""A DCF whose payload is two or four elements of Z/2^128: the authenticated mode's
comparison (a bit's value and its MAC) and its selection (also the mask's product with the
bit, and that product's MAC), :mod:`mpc.protocols.auth_fss`.

The tree, its seeds, control bits and their corrections are those of :mod:`mpc.math.dcf`
(Boyle et al., Eurocrypt 2021, Fig. 1, over any abelian group); only the group differs:
here (Z/2^128)^q, q = 2 or 4, each element two 64-bit words (low, high) with carries,
where :mod:`mpc.math.dcf` has words of Z/2^64. For every public x in [0, 2^bits):

    evaluate(0, k_0, x) + evaluate(1, k_1, x) = beta * [x < alpha]   (mod 2^128, each),

and a key alone is pseudorandom. A node's value is the q elements H_K(s | 2 + side),
H_K2(s | 2 + side) and, for q = 4, H_K3(s | 2 + side) and H_K4(s | 2 + side) (two words
each, under the fixed public keys :data:`mpc.math.dcf.FIXED_KEY`,
:data:`~mpc.math.dcf.FIXED_KEY2`, :data:`FIXED_KEY3` and :data:`FIXED_KEY4`); a leaf's,
the same blocks of the leaf seed with tweak 2. The key of an element: per level the seed
correction (two words, the control-bit corrections in its low bits) and the elements'
value corrections (2q words), then the 2q words of the final correction: (2 + 2q) bits +
2q words.

Layout of values and payloads: ``[2q, n]`` int64, the words (low, high) of the first
element, then of the second, and so on.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from mpc.math.dcf import FIXED_KEY, FIXED_KEY2, MMO, as_u64, check_bits, seed_level

__all__ = ["ELEMENTS", "FIXED_KEY3", "FIXED_KEY4", "evaluate", "gen", "key_words"]

# (the labels are fixed: they define the keys)
FIXED_KEY3 = hashlib.sha256(b"mpc.math.dcf128 third fixed-key AES").digest()[:16]
FIXED_KEY4 = hashlib.sha256(b"mpc.math.dcf128 fourth fixed-key AES").digest()[:16]
_KEYS = (FIXED_KEY, FIXED_KEY2, FIXED_KEY3, FIXED_KEY4)
ELEMENTS = (2, 4)  # the payload's elements of Z/2^128

CHUNK = 4096
_U64 = np.dtype("<u8")
_Z = np.uint64(0)
_ONE = np.uint64(1)
_ALL = np.uint64((1 << 64) - 1)
_CLEAR = np.uint64(~3 & ((1 << 64) - 1))  # (a seed's two low bits: the control bits)


def _bit(x: np.ndarray, shift: int) -> np.ndarray:
    return (x >> np.uint64(shift)) & _ONE


def _check_elements(elements: int) -> None:
    if elements not in ELEMENTS:
        raise ValueError(f"a payload has 2 or 4 elements of Z/2^128, got {elements!r}")


def key_words(bits: int, elements: int = 2) -> int:
    """int64 words of one element's correction words (common to both parties), for a
    payload of ``elements`` elements of Z/2^128."""
    check_bits(bits)
    _check_elements(elements)
    return (2 + 2 * elements) * bits + 2 * elements


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a + b for ``[2q, ...]`` word arrays (q elements of Z/2^128)."""
    out = a + b
    for k in range(0, out.shape[0], 2):
        out[k + 1] += (out[k] < a[k]).astype(_U64)
    return out


def _neg(a: np.ndarray) -> np.ndarray:
    out = np.negative(a)
    for k in range(0, out.shape[0], 2):
        out[k + 1] -= (a[k] != _Z).astype(_U64)
    return out


def _sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a - b for ``[2q, ...]`` word arrays."""
    out = a - b
    for k in range(0, out.shape[0], 2):
        out[k + 1] -= (a[k] < b[k]).astype(_U64)
    return out


def _mmos(elements: int) -> list[MMO]:
    return [MMO(k) for k in _KEYS[:elements]]


def _blocks(mmos: list[MMO], s_lo: np.ndarray, s_hi: np.ndarray, tweak: int) -> np.ndarray:
    """The value of seeds (s_lo | tweak, s_hi) as ``[2q, ...]`` words: H_K, H_K2, ..."""
    u = np.ascontiguousarray(np.stack([s_lo | np.uint64(tweak), s_hi], axis=-1))
    words = []
    for mmo in mmos:
        h = mmo(u)
        words += [h[..., 0], h[..., 1]]
    return np.stack(words)


def gen(
    alpha: torch.Tensor, beta: torch.Tensor, bits: int, roots: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The correction words (``[key_words(bits, q), n]`` int64) of the keys for
    beta * [x < alpha]: ``alpha`` n values in [0, 2^bits), ``beta`` ``[2q, n]`` (q = 2 or 4
    elements of Z/2^128 per x), ``roots`` the parties' root seeds (``[n, 2]`` each)."""
    check_bits(bits)
    n = alpha.numel()
    if beta.dim() != 2 or beta.shape[1] != n or beta.shape[0] % 2:
        raise ValueError(f"beta must have shape [2q, {n}], got {list(beta.shape)}")
    q = beta.shape[0] // 2
    _check_elements(q)
    a = as_u64(alpha.reshape(-1), "alpha")
    if bits < 64 and np.any(a >> np.uint64(bits)):
        raise ValueError(f"alpha must lie in [0, 2^{bits})")
    b = as_u64(beta, "beta", (2 * q, n))
    r0, r1 = (as_u64(r, "root", (n, 2)) for r in roots)
    cw = np.empty((key_words(bits, q), n), dtype=_U64)
    mmos = _mmos(q)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        _gen_chunk(mmos, a[lo:hi], b[:, lo:hi], bits, r0[lo:hi], r1[lo:hi], cw[:, lo:hi])
    return torch.from_numpy(cw.view(np.int64))


def _gen_chunk(
    mmos: list[MMO],
    alpha: np.ndarray,
    beta: np.ndarray,
    bits: int,
    r0: np.ndarray,
    r1: np.ndarray,
    cw: np.ndarray,
) -> None:
    m = alpha.shape[0]
    w = beta.shape[0]  # 2q words
    row = 2 + w
    s = np.stack([r0, r1])  # [party, m, word]
    s[:, :, 0] &= _CLEAR
    t = np.zeros((2, m), dtype=_U64)
    t[1] = 1
    acc = np.zeros((w, m), dtype=_U64)  # the path's values so far, party 1 minus party 0
    tweak = np.arange(4, dtype=_U64)
    u = np.empty((2, m, 4, 2), dtype=_U64)
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)
        am = np.negative(a)
        u[:, :, :, 0] = s[:, :, None, 0] | tweak
        u[:, :, :, 1] = s[:, :, None, 1]
        h = mmos[0](u)  # [party, m, tweak, word]: the children (tweaks 0, 1), values (2, 3)
        sides = np.ascontiguousarray(u[:, :, 2:4])
        blocks = [h[:, :, 2:4]] + [mmo(sides) for mmo in mmos[1:]]
        s_cw, s_next, t_next = seed_level(h, a, t)  # (the tree of mpc.math.dcf)
        cw[row * level], cw[row * level + 1] = s_cw[:, 0], s_cw[:, 1]
        # the values: [2q words, party, m, side]; their differences party 1 - party 0
        v = np.stack(blocks).transpose(0, 4, 1, 2, 3).reshape(w, 2, m, 2)
        delta = _sub(v[:, 1], v[:, 0])  # [2q, m, side]
        goes_right = a.astype(bool)  # (alpha goes right: the path keeps that child)
        lose = np.where(goes_right, delta[:, :, 0], delta[:, :, 1])
        keep = np.where(goes_right, delta[:, :, 1], delta[:, :, 0])
        # the correction: lose_1 - lose_0 - acc + beta [alpha goes right]; the path's
        # values after it (acc + keep_0 - keep_1 + corr): acc cancels
        base = _add(lose, beta & am)
        corr = _sub(base, acc)
        acc = _sub(base, keep)
        cw[row * level + 2 : row * (level + 1)] = np.where(t[1].astype(bool), _neg(corr), corr)
        s, t = s_next, t_next
    leaf = [_blocks(mmos, s[p, :, 0], s[p, :, 1], 2) for p in (0, 1)]
    last = _sub(_sub(leaf[1], leaf[0]), acc)
    cw[row * bits :] = np.where(t[1].astype(bool), _neg(last), last)


def evaluate(
    party: int, root: torch.Tensor, cw: torch.Tensor, x: torch.Tensor, bits: int
) -> torch.Tensor:
    """Party ``party``'s additive shares (``[2q, n]`` int64) of beta * [x < alpha] from
    its root seeds (``[n, 2]``), the correction words (``[key_words(bits, q), n]``: q
    follows from their rows) and the public inputs ``x`` (n values; their low ``bits``
    bits are read)."""
    check_bits(bits)
    if party not in (0, 1):
        raise ValueError(f"a DCF has parties 0 and 1, got {party!r}")
    n = x.numel()
    q = next((e for e in ELEMENTS if cw.dim() == 2 and cw.shape[0] == key_words(bits, e)), 0)
    if not q:
        raise ValueError(f"correction words of {[key_words(bits, e) for e in ELEMENTS]} rows")
    xs = as_u64(x.reshape(-1), "x")
    s0 = as_u64(root, "root", (n, 2))
    cws = as_u64(cw, "cw", (key_words(bits, q), n))
    out = np.empty((2 * q, n), dtype=_U64)
    mmos = _mmos(q)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        acc = _eval_chunk(mmos, party, s0[lo:hi], cws[:, lo:hi], xs[lo:hi], bits)
        out[:, lo:hi] = _neg(acc) if party else acc
    return torch.from_numpy(out.view(np.int64))


def _eval_chunk(
    mmos: list[MMO], party: int, root: np.ndarray, cw: np.ndarray, x: np.ndarray, bits: int
) -> np.ndarray:
    m = x.shape[0]
    w = 2 * len(mmos)
    row = 2 + w
    s_lo = root[:, 0] & _CLEAR
    s_hi = root[:, 1].copy()
    mask = np.full(m, _ALL if party else 0, dtype=_U64)
    acc = np.zeros((w, m), dtype=_U64)
    for level in range(bits):
        side = (x >> np.uint64(bits - 1 - level)) & _ONE
        acc = _add(acc, _blocks(mmos, s_lo | side, s_hi, 2))  # (tweak 2 + side)
        acc = _add(acc, cw[row * level + 2 : row * (level + 1)] & mask)
        child = mmos[0](np.ascontiguousarray(np.stack([s_lo | side, s_hi], axis=-1)))
        s_lo = child[:, 0] ^ (cw[row * level] & mask)
        s_hi = child[:, 1] ^ (cw[row * level + 1] & mask)
        mask = np.negative((s_lo >> side) & _ONE)
        s_lo &= _CLEAR
    acc = _add(acc, _blocks(mmos, s_lo, s_hi, 2))
    return _add(acc, cw[row * bits :] & mask)
