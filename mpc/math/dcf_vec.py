"""A DCF with a payload of several ring words: one tree walk gives shares of
beta_q * [x < alpha] for q = 1..p (p <= 3) at once.

The same construction as :mod:`mpc.math.dcf` (Boyle et al., Eurocrypt 2021, Fig. 1, whose
group may be any abelian group: here (Z/2^64)^p), with a value of p words per node and
side instead of one: the words of the value block H_K(s | 2 + side) (two words), then,
for p = 3, the first word of H_K2(s | 2 + side) under a second fixed public key K2. The seed
tree, its corrections and the control bits are those of the scalar DCF; each payload word
has its own value correction per level and its own final correction, so the key of an
element is 2 + p words a level and p final words: (2 + p) bits + p words. The leaf's
words are the seed's high word (as in the scalar DCF) and, for p > 1, the words of
H_K2(s). Evaluation costs two AES blocks per element and level for p <= 2, three for
p > 2 (the scalar DCF: two); generation four or six per party and level.

Used by the one-round ReLU of a product by FSS (:mod:`mpc.material.fss_relu`), whose
result is b * (public + dealer-known values) and takes three payload words.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from mpc.math.dcf import _ALL, _CLEAR, _MMO, _ONE, _U64, _bit, _check_bits, _u64

__all__ = ["FIXED_KEY2", "MAX_WORDS", "evaluate", "gen", "key_words"]

FIXED_KEY2 = hashlib.sha256(b"mpc.math.dcf_vec second fixed-key AES").digest()[:16]
MAX_WORDS = 3
CHUNK = 4096
_TWO = np.uint64(2)


class _MMO2(_MMO):
    """H_K2(u) = AES_K2(u) xor u (the second fixed key)."""

    def __init__(self) -> None:
        self.encryptor = Cipher(algorithms.AES(FIXED_KEY2), modes.ECB()).encryptor()


def _check_words(p: int) -> None:
    if type(p) is not int or not 1 <= p <= MAX_WORDS:
        raise ValueError(f"a payload has 1 to {MAX_WORDS} words, got {p!r}")


def key_words(bits: int, p: int) -> int:
    """int64 words of one element's correction words (common to both parties)."""
    _check_bits(bits)
    _check_words(p)
    return (2 + p) * bits + p


def gen(
    alpha: torch.Tensor, beta: torch.Tensor, bits: int, roots: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The correction words ([key_words(bits, p), n] int64) of the keys for
    beta[q] * [x < alpha]: ``alpha`` n values in [0, 2^bits), ``beta`` [p, n] ring words,
    ``roots`` the parties' root seeds ([n, 2] int64 each, uniform)."""
    _check_bits(bits)
    n = alpha.numel()
    if beta.dim() != 2 or beta.shape[1] != n:
        raise ValueError(f"beta must have shape [p, {n}], got {list(beta.shape)}")
    p = beta.shape[0]
    _check_words(p)
    a = _u64(alpha.reshape(-1), "alpha")
    if bits < 64 and np.any(a >> np.uint64(bits)):
        raise ValueError(f"alpha must lie in [0, 2^{bits})")
    b = _u64(beta, "beta")
    r0, r1 = (_u64(r, "root", (n, 2)) for r in roots)
    cw = np.empty((key_words(bits, p), n), dtype=_U64)
    mmo, mmo2 = _MMO(), _MMO2()
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        _gen_chunk(mmo, mmo2, a[lo:hi], b[:, lo:hi], bits, r0[lo:hi], r1[lo:hi], cw[:, lo:hi])
    return torch.from_numpy(cw.view(np.int64))


def _values(h: np.ndarray, h2: np.ndarray | None, j: int, p: int) -> list[np.ndarray]:
    """The p value words of side j ([party, m] each) from the blocks of one level."""
    words = [h[:, :, 2 + j, 0], h[:, :, 2 + j, 1]]
    if h2 is not None:
        words.append(h2[:, :, j, 0])
    return words[:p]


def _leaf(mmo2: _MMO2, s: np.ndarray, p: int) -> list[np.ndarray]:
    """The p leaf words of seeds ``s`` ([party, m, 2], low bits clear)."""
    words = [s[..., 1]]
    if p > 1:
        h = mmo2(np.ascontiguousarray(s))
        words += [h[..., 0], h[..., 1]]
    return words[:p]


def _gen_chunk(
    mmo: _MMO,
    mmo2: _MMO2,
    alpha: np.ndarray,
    beta: np.ndarray,
    bits: int,
    r0: np.ndarray,
    r1: np.ndarray,
    cw: np.ndarray,
) -> None:
    p = beta.shape[0]
    m = alpha.shape[0]
    s = np.stack([r0, r1])  # [party, m, word]
    s[:, :, 0] &= _CLEAR
    t = np.zeros((2, m), dtype=_U64)
    t[1] = 1
    acc = np.zeros((p, m), dtype=_U64)  # the path's values so far, over both parties
    u = np.empty((2, m, 4, 2), dtype=_U64)
    tweak = np.arange(4, dtype=_U64)
    row = 2 + p
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)
        am = np.negative(a)
        u[:, :, :, 0] = s[:, :, None, 0] | tweak
        u[:, :, :, 1] = s[:, :, None, 1]
        h = mmo(u)
        h2 = mmo2(np.ascontiguousarray(u[:, :, 2:4])) if p > 2 else None
        both = h[0] ^ h[1]
        left, right = both[:, 0], both[:, 1]
        s_cw = right ^ ((left ^ right) & am[:, None])
        t_cw = ((left[:, 0] & _ONE) ^ a ^ _ONE) | ((_bit(right[:, 0], 1) ^ a) << _ONE)
        s_cw[:, 0] &= _CLEAR
        s_cw[:, 0] |= t_cw
        cw[row * level] = s_cw[:, 0]
        cw[row * level + 1] = s_cw[:, 1]
        sign = _ONE - (t[1] << _ONE)
        for q, (v_left, v_right) in enumerate(
            zip(_values(h, h2, 0, p), _values(h, h2, 1, p), strict=True)
        ):
            v_keep = v_left ^ ((v_left ^ v_right) & am)
            v_lose = v_keep ^ v_left ^ v_right
            w = v_lose[1] - v_lose[0] - acc[q] + (beta[q] & am)
            acc[q] += v_keep[0] - v_keep[1] + w
            np.multiply(w, sign, out=cw[row * level + 2 + q])
        k_left, k_right = h[:, :, 0], h[:, :, 1]
        raw_keep = k_left ^ ((k_left ^ k_right) & am[None, :, None])
        raw_keep ^= s_cw[None] & np.negative(t)[:, :, None]
        t = (raw_keep[:, :, 0] >> a[None]) & _ONE
        s = raw_keep
        s[:, :, 0] &= _CLEAR
    for q, leaf in enumerate(_leaf(mmo2, s, p)):
        last = leaf[1] - leaf[0] - acc[q]
        cw[row * bits + q] = np.where(t[1].astype(bool), np.negative(last), last)


def evaluate(
    party: int, root: torch.Tensor, cw: torch.Tensor, x: torch.Tensor, bits: int, p: int
) -> torch.Tensor:
    """Party ``party``'s additive shares ([p, n] int64) of beta[q] * [x < alpha] from its
    root seeds ([n, 2]), the correction words ([key_words(bits, p), n]) and the public
    inputs ``x`` (n values; their low ``bits`` bits are read)."""
    _check_bits(bits)
    _check_words(p)
    if party not in (0, 1):
        raise ValueError(f"a DCF has parties 0 and 1, got {party!r}")
    n = x.numel()
    xs = _u64(x.reshape(-1), "x")
    s0 = _u64(root, "root", (n, 2))
    words = _u64(cw, "cw", (key_words(bits, p), n))
    out = np.empty((p, n), dtype=_U64)
    mmo, mmo2 = _MMO(), _MMO2()
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        out[:, lo:hi] = _eval_chunk(
            mmo, mmo2, party, s0[lo:hi], words[:, lo:hi], xs[lo:hi], bits, p
        )
    if party == 1:
        np.negative(out, out=out)
    return torch.from_numpy(out.view(np.int64))


def _eval_chunk(
    mmo: _MMO,
    mmo2: _MMO2,
    party: int,
    root: np.ndarray,
    cw: np.ndarray,
    x: np.ndarray,
    bits: int,
    p: int,
) -> np.ndarray:
    m = x.shape[0]
    row = 2 + p
    # the AES input: the seed blocks (s | side) of the children taken, then their value
    # blocks (s | side | 2), each a contiguous run of m blocks (K2 reads the second one)
    u = np.empty((2, m, 2), dtype=_U64)
    s_lo = root[:, 0] & _CLEAR
    u[0, :, 1] = root[:, 1]  # the seed's high word, kept in place
    mask = np.full(m, _ALL if party else 0, dtype=_U64)
    acc = np.zeros((p, m), dtype=_U64)
    side = np.empty(m, dtype=_U64)
    corr = np.empty((row, m), dtype=_U64)
    buf = np.empty(u.nbytes + 16, dtype=np.uint8)
    h = buf[: u.nbytes].view(_U64).reshape(u.shape)
    src, dst, enc = u.data.cast("B"), buf.data, mmo.encryptor
    buf2 = np.empty(u[1].nbytes + 16, dtype=np.uint8)
    h2 = buf2[: u[1].nbytes].view(_U64).reshape(u[1].shape)
    src2, dst2, enc2 = u[1].data.cast("B"), buf2.data, mmo2.encryptor
    for level in range(bits):
        np.right_shift(x, np.uint64(bits - 1 - level), out=side)
        side &= _ONE
        np.bitwise_or(s_lo, side, out=u[0, :, 0])
        np.bitwise_or(u[0, :, 0], _TWO, out=u[1, :, 0])
        u[1, :, 1] = u[0, :, 1]
        enc.update_into(src, dst)
        h ^= u
        np.bitwise_and(cw[row * level : row * (level + 1)], mask, out=corr)
        acc[0] += h[1, :, 0]
        if p > 1:
            acc[1] += h[1, :, 1]
        if p > 2:
            enc2.update_into(src2, dst2)  # AES_K2 of the value blocks (u[1], unchanged)
            acc[2] += h2[:, 0] ^ u[1, :, 0]  # H_K2(v) = AES_K2(v) xor v
        acc += corr[2:]
        np.bitwise_xor(h[0, :, 0], corr[0], out=s_lo)
        np.bitwise_xor(h[0, :, 1], corr[1], out=u[0, :, 1])
        np.right_shift(s_lo, side, out=mask)
        mask &= _ONE
        np.negative(mask, out=mask)
        s_lo &= _CLEAR
    s = np.stack([s_lo, u[0, :, 1]], axis=-1)[None]  # [1, m, 2]
    for q, leaf in enumerate(_leaf(mmo2, s, p)):
        acc[q] += leaf[0]
    acc += cw[row * bits :] & mask
    return acc
