"""A distributed comparison function (DCF) for two parties, batched over whole tensors.

A DCF key pair for (alpha, beta) on ``bits``-bit inputs gives each party b a key k_b such
that, for every public x in [0, 2^bits),

    evaluate(0, k_0, x) + evaluate(1, k_1, x) = beta * [x < alpha]   (mod 2^64),

while each key alone is pseudorandom: it tells nothing of alpha or beta. This is the DCF
of Boyle, Chandran, Gilboa, Gupta, Ishai, Kohli and Boyle, "Function Secret Sharing for
Mixed-Mode and Fixed-Point Secure Computation" (Eurocrypt 2021, Fig. 1; the tree of
Boyle, Gilboa and Ishai's DPF, CCS 2016, with a group value corrected on every level).
This module is written from the paper; it has no I/O and knows nothing of workers.

Tree walk. Each party holds a seed s and a control bit t per node (root: its own seed,
t = b). At level i (the input's bits from the most significant) the PRG expands s into a
left and a right child (a seed and a control bit each) and a value v per child. Off the
path to alpha, the parties' seeds and control bits agree after the correction words, so
everything they add from there on cancels; on the path they differ (t_0 ^ t_1 = 1), and
the value correction V_cw of the level makes the sum over the two parties, at the point
where x leaves the path, equal to beta if x went left where alpha went right (x < alpha)
and 0 otherwise. Party b adds (-1)^b (v + t V_cw) per level and (-1)^b (s + t CW_final)
at the leaf.

Key layout, per element: the root seed (16 bytes, which the parties derive from their
session seeds: it never travels) and the correction words, common to both parties,
``key_words(bits)`` int64 words: per level the seed correction s_cw (two words; its two
low bits hold the control-bit corrections t_cw^L and t_cw^R, since seeds keep their two
low bits clear) and V_cw (one word), then CW_final (one word). For the 63-bit domain of a
64-bit comparison that is 3 * 63 + 1 = 190 words, 1,520 bytes per element and party; a
domain of k bits takes 24 k + 8 bytes.

PRG. A fixed-key AES-128 in the Matyas-Meyer-Oseas mode, H(u) = AES_K(u) xor u, with the
public key K = SHA-256("mpc.math.dcf fixed-key AES")[:16]; the children of seed s are
H(s | 0) (left seed and bit) and H(s | 1) (right), the values H(s | 2) and H(s | 3) (a
word each). The two low bits of a seed are clear, so the four inputs differ only in that
tweak. Fixed-key block ciphers as PRGs and correlation-robust hashes: Guo, Katz, Wang and
Yu, "Efficient and Secure Multiparty Computation from Fixed-Key Block Ciphers" (IEEE S&P
2020), and Bellare, Hoang, Keelveedhi and Rogaway (IEEE S&P 2013); the FSS libraries of
Boyle et al. and of Google use fixed-key AES the same way. The cipher runs in ECB mode
over a whole chunk of elements at once (``cryptography``, OpenSSL's AES-NI code): the
evaluation costs two AES blocks per element and level, the key generation eight.

A payload of several ring words. The group may be any abelian group (the paper's Fig. 1):
here (Z/2^64)^p for p <= 3, so that one tree walk gives shares of beta_q * [x < alpha]
for q = 1..p at once. A node's value is then p words: the words of the value block
H(s | 2 + side) (two words), then, for p = 3, the first word of H_K2(s | 2 + side) under
a second fixed public key K2 = SHA-256("mpc.math.dcf_vec second fixed-key AES")[:16]
(the label is fixed: it defines the keys). The seed tree, its corrections and the
control bits do not change; each payload word has its own value correction per level
and its own final correction, so the key of an element is 2 + p words a level and p
final words ((2 + p) bits + p words: the layout above for p = 1). The leaf's words are
the seed's high word and, for p > 1, the words of H_K2(s). Evaluation costs two AES
blocks per element and level for p <= 2, three for p > 2; generation four or six per
party and level. The comparison uses p = 1; the one-round ReLU of a product
(:mod:`mpc.protocols.fss.relu`) p = 3.

Seeds: the caller supplies the roots (uniform 128-bit words, e.g. from :class:`~mpc.math.
prg.PRG`); nothing here draws randomness itself.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["FIXED_KEY", "FIXED_KEY2", "MAX_WORDS", "evaluate", "gen", "key_bytes", "key_words"]

FIXED_KEY = hashlib.sha256(b"mpc.math.dcf fixed-key AES").digest()[:16]
MAX_BITS = 64
FIXED_KEY2 = hashlib.sha256(b"mpc.math.dcf_vec second fixed-key AES").digest()[:16]
MAX_WORDS = 3  # words of a payload
CHUNK = 4096  # elements per pass of the level loop: every temporary stays in the cache
GEN_CHUNK = 4096  # (key generation: temporaries of about 2.5 MB a chunk; 2048 was 8-13% slower)

_U64 = np.dtype("<u8")
_LOW = np.uint64(3)
_CLEAR = np.uint64(~3 & ((1 << 64) - 1))
_ONE = np.uint64(1)
_ALL = np.uint64((1 << 64) - 1)
_TWO = np.uint64(2)


def check_bits(bits: int) -> None:
    if type(bits) is not int or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"a DCF domain has 1 to {MAX_BITS} bits, got {bits!r}")


def as_u64(t: torch.Tensor, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A contiguous int64 tensor's words as a uint64 array (no copy)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.detach().contiguous().numpy().view(_U64)


class MMO:
    """H(u) = AES_K(u) xor u over a buffer of 16-byte blocks (a fixed public key K:
    :data:`FIXED_KEY`, or :data:`FIXED_KEY2` for a payload's third word)."""

    def __init__(self, key: bytes = FIXED_KEY) -> None:
        self.encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()

    def __call__(self, u: np.ndarray) -> np.ndarray:
        out, buf = block_buffer(u.shape)
        self.into(u, buf)
        out ^= u
        return out

    def into(self, u: np.ndarray, buf: np.ndarray, offset: int = 0) -> None:
        """AES_K of the contiguous blocks ``u`` written to ``buf``'s bytes from ``offset``
        (a :func:`block_buffer`'s: the caller XORs u in where it wants H)."""
        self.encryptor.update_into(u.data.cast("B"), buf.data[offset:])  # (.data: memoryview)


def block_buffer(shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """An uninitialised uint64 array of ``shape`` and the bytes behind it, one AES block
    longer (:meth:`MMO.into` writes there: update_into wants room for one more block)."""
    size = 8 * math.prod(shape)
    buf = np.empty(size + 16, dtype=np.uint8)
    return buf[:size].view(_U64).reshape(shape), buf


def empty_words(*shape: int) -> np.ndarray:
    """An uninitialised uint64 array from torch's allocator. (numpy asks the kernel for
    transparent huge pages for arrays of 4 MB and more; where memory is fragmented, the
    kernel then compacts it inside the page faults: the first generation of 1e5 keys of
    four 128-bit elements took 3x as long, 2.3 s of it in the kernel.)"""
    return torch.empty(shape, dtype=torch.int64).numpy().view(_U64)


def _bit(x: np.ndarray, shift: int) -> np.ndarray:
    return (x >> np.uint64(shift)) & _ONE


def _check_words(p: int) -> None:
    if type(p) is not int or not 1 <= p <= MAX_WORDS:
        raise ValueError(f"a payload has 1 to {MAX_WORDS} words, got {p!r}")


def key_words(bits: int, p: int = 1) -> int:
    """int64 words of one element's correction words (common to both parties), for a
    payload of ``p`` words."""
    check_bits(bits)
    _check_words(p)
    return (2 + p) * bits + p


def key_bytes(bits: int, p: int = 1) -> int:
    """Bytes of one element's key that travel to each party (the root seed is derived)."""
    return 8 * key_words(bits, p)


def gen(
    alpha: torch.Tensor, beta: torch.Tensor, bits: int, roots: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The correction words ([key_words(bits, p), n] int64) of the keys for
    beta[q] * [x < alpha], elementwise: ``alpha`` n values in [0, 2^bits) (a flat int64
    tensor), ``beta`` [p, n] ring words (or [n]: one word), ``roots`` the two parties' root
    seeds ([n, 2] int64 each, uniform; their two low bits are ignored)."""
    check_bits(bits)
    n = alpha.numel()
    if beta.dim() == 1 and beta.shape[0] == n:
        beta = beta.view(1, n)
    if beta.dim() != 2 or beta.shape[1] != n:
        raise ValueError(f"beta must have shape [p, {n}] or [{n}], got {list(beta.shape)}")
    p = beta.shape[0]
    _check_words(p)
    a = as_u64(alpha.reshape(-1), "alpha")
    if bits < 64 and np.any(a >> np.uint64(bits)):
        raise ValueError(f"alpha must lie in [0, 2^{bits})")
    b = as_u64(beta, "beta")
    r0, r1 = (as_u64(r, "root", (n, 2)) for r in roots)
    cw = empty_words(key_words(bits, p), n)
    mmo, mmo2 = MMO(), MMO(FIXED_KEY2)
    for lo in range(0, n, GEN_CHUNK):
        hi = min(lo + GEN_CHUNK, n)
        _gen_chunk(mmo, mmo2, a[lo:hi], b[:, lo:hi], bits, r0[lo:hi], r1[lo:hi], cw[:, lo:hi])
    return torch.from_numpy(cw.view(np.int64))


def _leaf(mmo2: MMO, s: np.ndarray, p: int) -> list[np.ndarray]:
    """The p leaf words of seeds ``s`` ([party, m, 2], low bits clear)."""
    words = [s[..., 1]]
    if p > 1:
        h = mmo2(np.ascontiguousarray(s))
        words += [h[..., 0], h[..., 1]]
    return words[:p]


def expand(u: np.ndarray) -> None:
    """Fill the tweaks 1-3 of ``u`` ([tweak, party, m, word]) from tweak 0's seeds."""
    for k in (1, 2, 3):
        np.bitwise_or(u[0, :, :, 0], np.uint64(k), out=u[k, :, :, 0])
        u[k, :, :, 1] = u[0, :, :, 1]


def seed_level(
    h: np.ndarray, a: np.ndarray, am: np.ndarray, t: np.ndarray, seeds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One level of the seed tree at the dealer, whatever the payload's group: from the
    parties' blocks ``h`` ([tweak, party, m, word]; tweaks 0 and 1 are the children), the
    level's bits ``a`` of alpha (``am`` = -a) and the parties' control bits ``t``
    ([party, m]): writes the parties' next seeds along alpha's path to ``seeds``
    ([party, m, 2], low bits clear) and returns the seed correction word's two words (its
    control-bit corrections in the low word's low bits) and the next control bits.
    (Every operand is a view of the blocks with a stride of two words, and every result
    is written in place: a third of the operations and none of the copies of a
    [party, m, tweak, word] layout.)"""
    left_lo, left_hi, right_lo, right_hi = h[0, ..., 0], h[0, ..., 1], h[1, ..., 0], h[1, ..., 1]
    both_left = left_lo[0] ^ left_lo[1]
    both_right = right_lo[0] ^ right_lo[1]
    # the seed correction: the parties' XOR of the child off alpha's path
    lo = both_left ^ both_right
    lo &= am
    lo ^= both_right
    hi = left_hi[0] ^ left_hi[1]
    right = right_hi[0] ^ right_hi[1]
    hi ^= right
    hi &= am
    hi ^= right
    # its control-bit corrections: t_cw^L = t_L ^ a ^ 1 (bit 0), t_cw^R = t_R ^ a (bit 1)
    both_left &= _ONE
    both_left ^= a
    both_left ^= _ONE
    both_right >>= _ONE
    both_right &= _ONE
    both_right ^= a
    both_right <<= _ONE
    lo &= _CLEAR
    lo |= both_left
    lo |= both_right
    # the kept child on alpha's path, corrected where the party's control bit is set
    tm = np.negative(t)
    keep_lo, keep_hi = seeds[..., 0], seeds[..., 1]
    np.bitwise_xor(left_lo, right_lo, out=keep_lo)
    keep_lo &= am
    keep_lo ^= left_lo
    keep_lo ^= lo & tm
    np.bitwise_xor(left_hi, right_hi, out=keep_hi)
    keep_hi &= am
    keep_hi ^= left_hi
    keep_hi ^= hi & tm
    t_next = (keep_lo >> a) & _ONE
    keep_lo &= _CLEAR
    return lo, hi, t_next


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
    p = beta.shape[0]
    m = alpha.shape[0]
    row = 2 + p
    # the AES input, [tweak, party, m, word]: tweak 0 holds the parties' seeds on alpha's
    # path (seed_level writes the next ones there), tweaks 1-3 are filled from it
    u = np.empty((4, 2, m, 2), dtype=_U64)
    u[0, 0], u[0, 1] = r0, r1
    u[0, :, :, 0] &= _CLEAR
    h, buf = block_buffer(u.shape)
    t = np.zeros((2, m), dtype=_U64)
    t[1] = 1
    acc = np.zeros((p, m), dtype=_U64)  # the path's values so far, party 1 minus party 0
    masked_beta = np.empty(m, dtype=_U64)
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)
        am = np.negative(a)
        expand(u)
        mmo.into(u, buf)  # H(u) = AES_K(u) xor u
        h ^= u
        # (a third word: the value blocks under K2, [side, party, m, word])
        h2 = mmo2(np.ascontiguousarray(u[2:4])) if p > 2 else h[2:4]
        lo, hi, t_next = seed_level(h, a, am, t, u[0])
        cw[row * level], cw[row * level + 1] = lo, hi
        sign = _ONE - (t[1] << _ONE)
        for q in range(p):
            left, right = (h[2, ..., q], h[3, ..., q]) if q < 2 else (h2[0, ..., 0], h2[1, ..., 0])
            # the sides' differences party 1 - party 0: lose is the side off alpha's path
            d_left, d_right = left[1] - left[0], right[1] - right[0]
            lose = d_left ^ d_right
            lose &= am
            lose ^= d_right
            keep = d_left + d_right - lose
            np.bitwise_and(beta[q], am, out=masked_beta)
            lose += masked_beta  # lose + beta [alpha goes right]
            # the correction lose - acc + beta [alpha goes right]; the path's values after
            # it, acc + keep_0 - keep_1 + correction: acc cancels
            w = lose - acc[q]
            np.subtract(lose, keep, out=acc[q])
            np.multiply(w, sign, out=cw[row * level + 2 + q])
        t = t_next
    for q, leaf in enumerate(_leaf(mmo2, u[0], p)):
        last = leaf[1] - leaf[0] - acc[q]
        cw[row * bits + q] = np.where(t[1].astype(bool), np.negative(last), last)


def evaluate(
    party: int,
    root: torch.Tensor,
    cw: torch.Tensor,
    x: torch.Tensor,
    bits: int,
    words: int | None = None,
) -> torch.Tensor:
    """Party ``party``'s (0 or 1) additive shares of beta[q] * [x < alpha] from its root
    seeds ([n, 2] int64), the correction words ([key_words(bits, p), n]) and the public
    inputs ``x`` (n values; only their low ``bits`` bits are read): [p, n] int64 for a
    payload of ``words`` = p words, or for None (one word) in ``x``'s shape."""
    check_bits(bits)
    p = 1 if words is None else words
    _check_words(p)
    if party not in (0, 1):
        raise ValueError(f"a DCF has parties 0 and 1, got {party!r}")
    n = x.numel()
    xs = as_u64(x.reshape(-1), "x")
    s0 = as_u64(root, "root", (n, 2))
    cws = as_u64(cw, "cw", (key_words(bits, p), n))
    out = empty_words(p, n)
    mmo, mmo2 = MMO(), MMO(FIXED_KEY2)
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        out[:, lo:hi] = _eval_chunk(mmo, mmo2, party, s0[lo:hi], cws[:, lo:hi], xs[lo:hi], bits, p)
    if party == 1:
        np.negative(out, out=out)
    result = torch.from_numpy(out.view(np.int64))
    return result.view(x.shape) if words is None else result


def _eval_chunk(
    mmo: MMO,
    mmo2: MMO,
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
    h, buf = block_buffer(u.shape)
    h2, buf2 = block_buffer(u[1].shape)
    for level in range(bits):
        np.right_shift(x, np.uint64(bits - 1 - level), out=side)
        side &= _ONE
        np.bitwise_or(s_lo, side, out=u[0, :, 0])
        np.bitwise_or(u[0, :, 0], _TWO, out=u[1, :, 0])
        u[1, :, 1] = u[0, :, 1]
        mmo.into(u, buf)
        h ^= u
        np.bitwise_and(cw[row * level : row * (level + 1)], mask, out=corr)
        acc[0] += h[1, :, 0]
        if p > 1:
            acc[1] += h[1, :, 1]
        if p > 2:
            mmo2.into(u[1], buf2)  # AES_K2 of the value blocks (u[1], unchanged)
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
