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

Seeds: the caller supplies the roots (uniform 128-bit words, e.g. from :class:`~mpc.math.
prg.PRG`); nothing here draws randomness itself.
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

__all__ = ["FIXED_KEY", "evaluate", "gen", "key_bytes", "key_words"]

FIXED_KEY = hashlib.sha256(b"mpc.math.dcf fixed-key AES").digest()[:16]
MAX_BITS = 64
CHUNK = 4096  # elements per pass of the level loop: every temporary stays in the cache
GEN_CHUNK = 4096  # (key generation: temporaries of about 2.5 MB a chunk; 2048 was 8-13% slower)

_U64 = np.dtype("<u8")
_LOW = np.uint64(3)
_CLEAR = np.uint64(~3 & ((1 << 64) - 1))
_ONE = np.uint64(1)
_ALL = np.uint64((1 << 64) - 1)
_TWO = np.uint64(2)


def key_words(bits: int) -> int:
    """int64 words of the correction words of one element's key (common to both parties)."""
    _check_bits(bits)
    return 3 * bits + 1


def key_bytes(bits: int) -> int:
    """Bytes of one element's key that travel to each party (the root seed is derived)."""
    return 8 * key_words(bits)


def _check_bits(bits: int) -> None:
    if type(bits) is not int or not 1 <= bits <= MAX_BITS:
        raise ValueError(f"a DCF domain has 1 to {MAX_BITS} bits, got {bits!r}")


def _u64(t: torch.Tensor, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A contiguous int64 tensor's words as a uint64 array (no copy)."""
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int64:
        raise TypeError(f"{name} must be an int64 tensor")
    if shape is not None and tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    return t.detach().contiguous().numpy().view(_U64)


class _MMO:
    """H(u) = AES_K(u) xor u over a buffer of 16-byte blocks (fixed public key K)."""

    def __init__(self) -> None:
        self.encryptor = Cipher(algorithms.AES(FIXED_KEY), modes.ECB()).encryptor()

    def __call__(self, u: np.ndarray) -> np.ndarray:
        # (update_into wants room for one more block than the payload: a fresh buffer a
        # block longer, of which the result is a view)
        buf = np.empty(u.nbytes + 16, dtype=np.uint8)
        self.encryptor.update_into(u.data.cast("B"), buf.data)  # (ndarray.data: its memoryview)
        out = buf[: u.nbytes].view(_U64).reshape(u.shape)
        out ^= u
        return out


def _bit(x: np.ndarray, shift: int) -> np.ndarray:
    return (x >> np.uint64(shift)) & _ONE


def gen(
    alpha: torch.Tensor, beta: torch.Tensor, bits: int, roots: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """The correction words ([key_words(bits), n] int64) of the keys for
    beta * [x < alpha], elementwise: ``alpha`` (n values in [0, 2^bits)) and ``beta`` (n
    ring elements) flat int64 tensors, ``roots`` the two parties' root seeds ([n, 2] int64
    each, uniform; their two low bits are ignored)."""
    _check_bits(bits)
    n = alpha.numel()
    a = _u64(alpha.reshape(-1), "alpha")
    if bits < 64 and np.any(a >> np.uint64(bits)):
        raise ValueError(f"alpha must lie in [0, 2^{bits})")
    b = _u64(beta.reshape(-1), "beta", (n,))
    r0, r1 = (_u64(r, "root", (n, 2)) for r in roots)
    cw = np.empty((key_words(bits), n), dtype=_U64)
    mmo = _MMO()
    for lo in range(0, n, GEN_CHUNK):
        hi = min(lo + GEN_CHUNK, n)
        _gen_chunk(mmo, a[lo:hi], b[lo:hi], bits, r0[lo:hi], r1[lo:hi], cw[:, lo:hi])
    return torch.from_numpy(cw.view(np.int64))


def _gen_chunk(
    mmo: _MMO,
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
    acc = np.zeros(m, dtype=_U64)  # the path's value so far, summed over both parties
    u = np.empty((2, m, 4, 2), dtype=_U64)  # [party, element, tweak, word]
    tweak = np.arange(4, dtype=_U64)
    for level in range(bits):
        a = _bit(alpha, bits - 1 - level)  # alpha's bit: the side of the path
        am = np.negative(a)  # all ones where the path goes right (keep right, lose left)
        u[:, :, :, 0] = s[:, :, None, 0] | tweak
        u[:, :, :, 1] = s[:, :, None, 1]
        h = mmo(u)
        # per party and side j: the raw child block h[:, :, j] (its control bit is bit j
        # of the low word) and the value, the low word of block 2 + j. Selections by a are
        # XOR selections: x ^ ((x ^ y) & am) is y where a = 1, x elsewhere
        both = h[0] ^ h[1]  # [m, tweak, word]: what the correction words are made of
        left, right = both[:, 0], both[:, 1]
        s_cw = right ^ ((left ^ right) & am[:, None])  # the lost child's seeds, XORed
        t_cw = ((left[:, 0] & _ONE) ^ a ^ _ONE) | ((_bit(right[:, 0], 1) ^ a) << _ONE)
        s_cw[:, 0] &= _CLEAR
        s_cw[:, 0] |= t_cw
        v_left, v_right = h[:, :, 2, 0], h[:, :, 3, 0]  # [party, m]
        v_keep = v_left ^ ((v_left ^ v_right) & am)
        v_lose = v_keep ^ v_left ^ v_right
        # V_cw = (-1)^t1 w, w = v_lose_1 - v_lose_0 - acc + [alpha's bit is 1] beta
        w = v_lose[1] - v_lose[0] - acc + (beta & am)
        acc += v_keep[0] - v_keep[1] + w
        cw[3 * level] = s_cw[:, 0]
        cw[3 * level + 1] = s_cw[:, 1]
        np.multiply(w, _ONE - (t[1] << _ONE), out=cw[3 * level + 2])
        # the children on the path, corrected as the evaluation corrects them
        k_left, k_right = h[:, :, 0], h[:, :, 1]  # [party, m, word]
        raw_keep = k_left ^ ((k_left ^ k_right) & am[None, :, None])
        raw_keep ^= s_cw[None] & np.negative(t)[:, :, None]
        t = (raw_keep[:, :, 0] >> a[None]) & _ONE
        s = raw_keep
        s[:, :, 0] &= _CLEAR
    last = s[1, :, 1] - s[0, :, 1] - acc
    cw[3 * bits] = np.where(t[1].astype(bool), np.negative(last), last)


def evaluate(
    party: int, root: torch.Tensor, cw: torch.Tensor, x: torch.Tensor, bits: int
) -> torch.Tensor:
    """Party ``party``'s (0 or 1) additive share of beta * [x < alpha] (int64, shaped as
    ``x``) from its root seeds ([n, 2] int64), the correction words ``cw``
    ([key_words(bits), n]) and the public inputs ``x`` (n values; only their low ``bits``
    bits are read)."""
    _check_bits(bits)
    if party not in (0, 1):
        raise ValueError(f"a DCF has parties 0 and 1, got {party!r}")
    n = x.numel()
    xs = _u64(x.reshape(-1), "x")
    s0 = _u64(root, "root", (n, 2))
    words = _u64(cw, "cw", (key_words(bits), n))
    out = np.empty(n, dtype=_U64)
    mmo = _MMO()
    for lo in range(0, n, CHUNK):
        hi = min(lo + CHUNK, n)
        out[lo:hi] = _eval_chunk(mmo, party, s0[lo:hi], words[:, lo:hi], xs[lo:hi], bits)
    if party == 1:
        np.negative(out, out=out)
    return torch.from_numpy(out.view(np.int64)).view(x.shape)


def _eval_chunk(
    mmo: _MMO, party: int, root: np.ndarray, cw: np.ndarray, x: np.ndarray, bits: int
) -> np.ndarray:
    # The state lives in the AES input itself: u[0] holds the seed blocks (s | side) of
    # the children taken, u[1] their value blocks (s | side | 2), each a contiguous run of
    # blocks. Every step writes into a buffer made once (no temporaries in the level
    # loop), and the three correction words of a level are masked by the control bit in
    # one pass over their rows.
    m = x.shape[0]
    u = np.empty((2, m, 2), dtype=_U64)  # [seed block | value block, element, word]
    s_lo = root[:, 0] & _CLEAR
    u[0, :, 1] = root[:, 1]  # the seed's high word, kept in place
    mask = np.full(m, _ALL if party else 0, dtype=_U64)  # all ones where t = 1
    acc = np.zeros(m, dtype=_U64)
    side = np.empty(m, dtype=_U64)
    corr = np.empty((3, m), dtype=_U64)
    buf = np.empty(u.nbytes + 16, dtype=np.uint8)  # (update_into: one block of room)
    h = buf[: u.nbytes].view(_U64).reshape(u.shape)
    src, dst, enc = u.data.cast("B"), buf.data, mmo.encryptor
    for level in range(bits):
        np.right_shift(x, np.uint64(bits - 1 - level), out=side)
        side &= _ONE
        np.bitwise_or(s_lo, side, out=u[0, :, 0])
        np.bitwise_or(u[0, :, 0], _TWO, out=u[1, :, 0])
        u[1, :, 1] = u[0, :, 1]
        enc.update_into(src, dst)  # H(u) = AES_K(u) xor u
        h ^= u
        np.bitwise_and(cw[3 * level : 3 * level + 3], mask, out=corr)
        acc += h[1, :, 0]
        acc += corr[2]
        np.bitwise_xor(h[0, :, 0], corr[0], out=s_lo)
        np.bitwise_xor(h[0, :, 1], corr[1], out=u[0, :, 1])
        np.right_shift(s_lo, side, out=mask)  # the child's control bit t ...
        mask &= _ONE
        np.negative(mask, out=mask)  # ... as a mask: all ones where t = 1
        s_lo &= _CLEAR
    acc += u[0, :, 1]
    acc += cw[3 * bits] & mask
    return acc
