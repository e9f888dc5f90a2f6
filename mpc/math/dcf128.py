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

from mpc.math.dcf import (
    FIXED_KEY,
    FIXED_KEY2,
    MMO,
    as_u64,
    block_buffer,
    check_bits,
    empty_words,
    expand,
    seed_level,
)

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
_TWO = np.uint64(2)
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


def _neg(a: np.ndarray) -> np.ndarray:
    out = np.negative(a)
    for k in range(0, out.shape[0], 2):
        out[k + 1] -= (a[k] != _Z).astype(_U64)
    return out


def _mmos(elements: int) -> list[MMO]:
    return [MMO(k) for k in _KEYS[:elements]]


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
    cw = empty_words(key_words(bits, q), n)
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
    q = len(mmos)
    row = 2 + 2 * q
    # the AES input, [tweak, party, m, word]: tweak 0 holds the seeds on alpha's path, the
    # children (tweaks 0, 1) and values (2, 3) under K; the values' further words under
    # K2, K3, ... written beside them: values [q, side, party, m, word], element e's low
    # and high words from the e-th key
    u = np.empty((4, 2, m, 2), dtype=_U64)
    u[0, 0], u[0, 1] = r0, r1
    u[0, :, :, 0] &= _CLEAR
    h, buf = block_buffer(u.shape)
    sides = u[2:4]
    size = sides.nbytes
    values, vbuf = block_buffer((q, *sides.shape))
    t = np.zeros((2, m), dtype=_U64)
    t[1] = 1
    acc = [np.zeros((q, m), dtype=_U64) for _ in range(2)]  # party 1 minus party 0
    beta_lo, beta_hi = beta[0::2], beta[1::2]
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)
        am = np.negative(a)
        expand(u)
        mmos[0].into(u, buf)
        h ^= u
        for e in range(1, q):
            mmos[e].into(sides, vbuf, e * size)
        values[1:] ^= sides
        values[0] = h[2:4]
        lo, hi, t_next = seed_level(h, a, am, t, u[0])  # (the tree of mpc.math.dcf)
        cw[row * level], cw[row * level + 1] = lo, hi
        # the sides' differences party 1 - party 0 ([q, m] words); lose is the side off
        # alpha's path, keep the other
        left = _sub2(values[:, 0, 1], values[:, 0, 0])
        right = _sub2(values[:, 1, 1], values[:, 1, 0])
        lose, keep = [], []
        for d_left, d_right in zip(left, right, strict=True):
            word = d_left ^ d_right
            word &= am
            keep.append(word ^ d_left)
            word ^= d_right
            lose.append(word)
        # the correction: lose - acc + beta [alpha goes right]; the path's values after
        # it (acc + keep_0 - keep_1 + correction): acc cancels
        base = _add2(lose, [beta_lo & am, beta_hi & am])
        corr = _sub2s(base, acc)
        acc = _sub2s(base, keep)
        _store(cw[row * level + 2 : row * (level + 1)], corr, t[1])
        t = t_next
    s2 = u[0].copy()
    s2[..., 0] |= _TWO
    leaf = np.stack([mmo(s2) for mmo in mmos])  # [q, party, m, word]
    _store(cw[row * bits :], _sub2s(_sub2(leaf[:, 1], leaf[:, 0]), acc), t[1])


def _sub2(a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    """a - b for ``[..., word]`` blocks of Z/2^128: the low and high words."""
    return _sub2s([a[..., 0], a[..., 1]], [b[..., 0], b[..., 1]])


def _sub2s(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
    """a - b for (low, high) word pairs of Z/2^128."""
    high = a[1] - b[1]
    high -= a[0] < b[0]
    return [a[0] - b[0], high]


def _add2(a: list[np.ndarray], b: list[np.ndarray]) -> list[np.ndarray]:
    """a + b for (low, high) word pairs of Z/2^128."""
    low = a[0] + b[0]
    high = a[1] + b[1]
    high += low < b[0]
    return [low, high]


def _store(out: np.ndarray, value: list[np.ndarray], negate: np.ndarray) -> None:
    """Write (low, high) word pairs ([q, m] each) to the correction rows ``out``
    ([2q, m], low then high word of each element), negated where ``negate`` (0 or 1)."""
    flip = np.negative(negate)
    low, high = value[0] ^ flip, value[1] ^ flip  # -v = ~v + 1
    low += negate
    high += (low == _Z) & (negate == _ONE)
    rows = out.reshape(-1, 2, out.shape[-1])
    rows[:, 0], rows[:, 1] = low, high


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
    out = empty_words(2 * q, n)
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
    q = len(mmos)
    row = 2 + 2 * q
    # the AES input: the seed block (s | side) of the child taken, then its value block
    # (s | side | 2), m blocks each; K reads both, K2, K3, ... the value block
    u = np.empty((2, m, 2), dtype=_U64)
    u[0, :, 1] = root[:, 1]  # the seed's high word, kept in place
    s_lo = root[:, 0] & _CLEAR
    h, buf = block_buffer(u.shape)
    size = u[1].nbytes
    values, vbuf = block_buffer((q, m, 2))
    acc = np.zeros((2, q, m), dtype=_U64)  # the low words, then the high words
    mask = np.full(m, _ALL if party else 0, dtype=_U64)
    side = np.empty(m, dtype=_U64)
    corr = np.empty((row, m), dtype=_U64)
    for level in range(bits):
        np.right_shift(x, np.uint64(bits - 1 - level), out=side)
        side &= _ONE
        np.bitwise_or(s_lo, side, out=u[0, :, 0])
        np.bitwise_or(u[0, :, 0], _TWO, out=u[1, :, 0])
        u[1, :, 1] = u[0, :, 1]
        mmos[0].into(u, buf)
        h ^= u
        for e in range(1, q):
            mmos[e].into(u[1], vbuf, e * size)
        values[1:] ^= u[1]
        values[0] = h[1]
        np.bitwise_and(cw[row * level : row * (level + 1)], mask, out=corr)
        pairs = corr[2:].reshape(q, 2, m)
        _accumulate(acc, values[..., 0], values[..., 1])
        _accumulate(acc, pairs[:, 0], pairs[:, 1])
        np.bitwise_xor(h[0, :, 0], corr[0], out=s_lo)
        np.bitwise_xor(h[0, :, 1], corr[1], out=u[0, :, 1])
        np.right_shift(s_lo, side, out=mask)
        mask &= _ONE
        np.negative(mask, out=mask)
        s_lo &= _CLEAR
    u[1, :, 0] = s_lo | _TWO
    u[1, :, 1] = u[0, :, 1]
    for e, mmo in enumerate(mmos):
        values[e] = mmo(u[1])
    _accumulate(acc, values[..., 0], values[..., 1])
    last = cw[row * bits :].reshape(q, 2, m) & mask
    _accumulate(acc, last[:, 0], last[:, 1])
    out = np.empty((2 * q, m), dtype=_U64)
    pairs = out.reshape(q, 2, m)
    pairs[:, 0], pairs[:, 1] = acc[0], acc[1]
    return out


def _accumulate(acc: np.ndarray, low: np.ndarray, high: np.ndarray) -> None:
    """acc += (low, high) in Z/2^128, in place (``acc`` [2, q, m]: low words, high words)."""
    acc[0] += low
    acc[1] += high
    acc[1] += acc[0] < low
