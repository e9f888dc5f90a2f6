"""The ring Z/2^128 on pairs of int64 tensors (no I/O): the arithmetic of the authenticated
mode's shares and MACs (SPDZ2k with k = 64 value bits and s = 64 MAC bits).

A tensor of 128-bit ring elements has the shape ``(2, *T)``: ``t[0]`` holds the low 64
bits (read as unsigned: the int64 bit pattern), ``t[1]`` the high 64 bits, so the element
is ``(t[0] mod 2^64) + 2^64 t[1]  mod 2^128``. The low limb of a sharing is the 64-bit
ring element of the semi-honest mode: a value's low 64 bits are its fixed-point encoding,
and the high 64 bits carry what SPDZ2k needs for the MAC check.

Every operation is exact mod 2^128 (wrap-around), with torch's int64 kernels only:

- sums carry from the low limb into the high one (an unsigned comparison);
- the elementwise product of the low limbs in full (128 bits) from their 32-bit halves
  (four int64 products, each below 2^64 read unsigned); the cross terms ``a0 b1 + a1 b0``
  need only their low 64 bits;
- a matrix product or a convolution of the low limbs in full from three limbs of 22, 22
  and 20 bits of each operand, by Karatsuba's three-term form: six limb products (the
  three squares' and the three of pairwise sums, each below 2^46 a term) instead of nine,
  each exact in int64 for an inner dimension of at most 2^17 (a larger one is cut into
  pieces), summed into 128 bits with carries; the cross terms are two int64 products mod
  2^64 (:func:`mpc.math.ring.ring_bilinear`).

The ``(2, *T)`` layout keeps each limb contiguous, so a limb is a plain int64 tensor for
every kernel; leading dimensions of ``T`` broadcast as torch broadcasts.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.ring import ring_bilinear

__all__ = [
    "MASK64",
    "add",
    "add_",
    "bilinear",
    "from_int",
    "lift",
    "mul",
    "mul64",
    "neg",
    "shl",
    "sub",
    "sum128",
    "to_ints",
]

MASK64 = (1 << 64) - 1
_MIN = -(1 << 63)
_M32 = 0xFFFFFFFF
# limbs of a low 64-bit word for an exact int64 product: offsets and widths
_LIMB = 22
_LIMBS = ((0, _LIMB), (_LIMB, _LIMB), (2 * _LIMB, 64 - 2 * _LIMB))
# an inner dimension of at most this many terms stays exact: a product of two sums of two
# limbs is below 2^46, so 2^17 of them stay below 2^63
_MAX_INNER = 1 << 17


def _signed(v: int) -> int:
    """The int64 value with the bit pattern of ``v mod 2^64``."""
    v &= MASK64
    return v - (1 << 64) if v >> 63 else v


def from_int(v: int) -> tuple[int, int]:
    """(low, high) int64 words of the ring element ``v mod 2^128``."""
    v %= 1 << 128
    return _signed(v), _signed(v >> 64)


def const(v: int, like: torch.Tensor) -> torch.Tensor:
    """The ring element ``v`` as a ``(2,)`` int64 tensor on ``like``'s device, shaped to
    broadcast against tensors of ``like``'s rank (``(2, 1, ..., 1)``)."""
    lo, hi = from_int(v)
    return torch.tensor([lo, hi], dtype=torch.int64, device=like.device).view(
        2, *([1] * (like.dim() - 1))
    )


def lift(x: torch.Tensor) -> torch.Tensor:
    """The 128-bit ring elements of the signed int64 values ``x`` (sign-extended)."""
    return torch.stack([x, x >> 63])


def lift_unsigned(x: torch.Tensor) -> torch.Tensor:
    """The 128-bit ring elements of the unsigned 64-bit values ``x`` (high limb 0)."""
    return torch.stack([x, torch.zeros_like(x)])


def to_ints(t: torch.Tensor) -> list[int]:
    """The ring elements of a ``(2, n)``-shaped (or ``(2, *T)``) tensor as Python ints in
    [0, 2^128), flattened (for tests and error messages)."""
    lo, hi = t[0].reshape(-1).tolist(), t[1].reshape(-1).tolist()
    return [((h & MASK64) << 64) | (v & MASK64) for v, h in zip(lo, hi)]


def _ult(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x < y read as unsigned 64-bit words (0 or 1, int64)."""
    return torch.lt(x ^ _MIN, y ^ _MIN).to(torch.int64)


def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b mod 2^128 (broadcasting)."""
    lo = a[0] + b[0]
    hi = a[1] + b[1]
    hi += _ult(lo, a[0])
    return torch.stack([lo, hi])


def add_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a += b mod 2^128, in place (``b`` broadcasts to ``a``); returns ``a``."""
    lo, hi = a[0], a[1]
    old = lo.clone()
    lo += b[0]
    hi += b[1]
    hi += _ult(lo, old)
    return a


def sub(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a - b mod 2^128 (broadcasting)."""
    lo = a[0] - b[0]
    hi = a[1] - b[1]
    hi -= _ult(a[0], b[0])
    return torch.stack([lo, hi])


def neg(a: torch.Tensor) -> torch.Tensor:
    """-a mod 2^128."""
    lo = -a[0]
    hi = -a[1]
    hi -= (lo != 0).to(torch.int64)  # (the borrow of 0 - a0)
    return torch.stack([lo, hi])


def shl(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """a * 2^s mod 2^128 for shifts ``s`` in [0, 63] (an int64 tensor broadcasting over
    ``a``'s dims after the limbs): two shifts and a carry, no product."""
    carry = (a[0] >> (64 - s)) & ((torch.ones_like(s) << s) - 1)  # (0 where s is 0)
    return torch.stack([a[0] << s, (a[1] << s) | carry])


def _mulhi(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The high 64 bits of the unsigned 128-bit product of the 64-bit words x and y
    (broadcasting), from their 32-bit halves."""
    x0, x1 = x & _M32, (x >> 32) & _M32
    y0, y1 = y & _M32, (y >> 32) & _M32
    p00 = x0 * y0
    p01 = x0 * y1
    p10 = x1 * y0
    out = x1 * y1
    mid = (p00 >> 32) & _M32
    mid += p01 & _M32
    mid += p10 & _M32
    out += (p01 >> 32) & _M32
    out += (p10 >> 32) & _M32
    out += mid >> 32
    return out


def mul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a * b mod 2^128, elementwise (broadcasting)."""
    lo = a[0] * b[0]
    hi = _mulhi(a[0], b[0])
    hi += a[0] * b[1]
    hi += a[1] * b[0]
    return torch.stack([lo, hi])


def mul64(a: torch.Tensor, s: torch.Tensor | int) -> torch.Tensor:
    """a * s mod 2^128 for unsigned 64-bit words ``s`` (an int64 tensor's bit patterns, or
    an int in [0, 2^64)), elementwise (broadcasting)."""
    if isinstance(s, int):
        s = torch.tensor(_signed(s), dtype=torch.int64, device=a.device)
    lo = a[0] * s
    hi = _mulhi(a[0], s)
    hi += a[1] * s
    return torch.stack([lo, hi])


def sum128(a: torch.Tensor, dim: Any = None, keepdim: bool = False) -> torch.Tensor:
    """The sum of ``a``'s elements over ``dim`` (dims of ``T``: 0 is the first dim after
    the limbs; None: all of them) mod 2^128, exact for fewer than 2^31 terms."""
    lo, hi = a[0], a[1]
    if dim is None:
        dims: Any = list(range(lo.dim()))
    else:
        dims = dim
    l0 = torch.sum(lo & _M32, dim=dims, keepdim=keepdim)
    l1 = torch.sum((lo >> 32) & _M32, dim=dims, keepdim=keepdim)
    h = torch.sum(hi, dim=dims, keepdim=keepdim)
    return _normalize(l0, l1, h)


def _normalize(s0: torch.Tensor, s1: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """The ring element s0 + 2^32 s1 + 2^64 h for non-negative s0, s1 below 2^62."""
    mid = s1 + (s0 >> 32)
    lo = (s0 & _M32) | (mid << 32)
    hi = h + (mid >> 32)
    return torch.stack([lo, hi])


def _limbs(x: torch.Tensor) -> list[torch.Tensor]:
    """The three unsigned limbs (21, 21 and 22 bits) of 64-bit words (read unsigned)."""
    return [(x >> o) & ((1 << w) - 1) for o, w in _LIMBS]


def _shifted(g: torch.Tensor, o: int) -> torch.Tensor:
    """The ring element g * 2^o for non-negative int64 g below 2^63."""
    if o == 0:
        return torch.stack([g, torch.zeros_like(g)])
    if o >= 64:
        return torch.stack([torch.zeros_like(g), g << (o - 64)])
    return torch.stack([g << o, g >> (64 - o)])


def _full_low(op: str, params: dict[str, Any], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) over the integers, mod 2^128, for int64 ``a`` and ``b`` read unsigned:
    with X = 2^22 and limbs a = a0 + a1 X + a2 X^2 (b alike), the coefficients of
    X^0..X^4 from six exact limb products (Karatsuba):

        c0 = p00, c1 = s01 - p00 - p11, c2 = s02 - p00 - p22 + p11,
        c3 = s12 - p11 - p22, c4 = p22,

    p_ii = op(a_i, b_i) and s_ij = op(a_i + a_j, b_i + b_j), each coefficient a sum of
    limb products (non-negative, below 2^63), then summed into 128 bits with carries."""
    la, lb = _limbs(a), _limbs(b)

    def prod(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return ring_bilinear(op, params, x, y)

    p = [prod(la[i], lb[i]) for i in range(3)]
    s01 = prod(la[0] + la[1], lb[0] + lb[1])
    s02 = prod(la[0] + la[2], lb[0] + lb[2])
    s12 = prod(la[1] + la[2], lb[1] + lb[2])
    coefficients = [
        p[0],
        s01.sub_(p[0]).sub_(p[1]),
        s02.sub_(p[0]).sub_(p[2]).add_(p[1]),
        s12.sub_(p[1]).sub_(p[2]),
        p[2],
    ]
    out = _shifted(coefficients[0], 0)
    for k in range(1, 5):
        add_(out, _shifted(coefficients[k], k * _LIMB))
    return out


def _inner(op: str, params: dict[str, Any], b: torch.Tensor) -> int:
    """The number of terms each output of op(., b) sums (b: one limb)."""
    if op == "matmul":
        return int(b.shape[-2]) if b.dim() > 1 else int(b.shape[0])
    if op == "conv2d":
        return int(b.shape[1] * b.shape[2] * b.shape[3])
    return 1


def bilinear(op: str, params: dict[str, Any], a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """op(a, b) mod 2^128 for a bilinear ``op``: ``"mul"`` (elementwise, broadcasting),
    ``"matmul"`` (torch.matmul's broadcasting) or ``"conv2d"`` (``a`` the (N, C, H, W)
    input, ``b`` the (O, C/groups, kh, kw) weight; ``params``: stride, padding, dilation,
    groups). ``a`` and ``b`` have the ``(2, *T)`` layout."""
    if op == "mul":
        return mul(a, b)
    if op not in ("matmul", "conv2d"):
        raise ValueError(f"unknown bilinear op {op!r}")
    if _inner(op, params, b[0]) > _MAX_INNER:
        if op != "matmul":
            raise ValueError(
                f"a 128-bit convolution sums at most {_MAX_INNER} terms an output, got "
                f"{_inner(op, params, b[0])}"
            )
        return _chunked_matmul(a, b)
    out = _full_low(op, params, a[0], b[0])
    cross = ring_bilinear(op, params, a[0], b[1])
    cross += ring_bilinear(op, params, a[1], b[0])
    out[1] += cross
    return out


def _chunked_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b mod 2^128 with the inner dimension cut into exact pieces."""
    k = int(b.shape[-2])
    out: torch.Tensor | None = None
    for start in range(0, k, _MAX_INNER):
        n = min(_MAX_INNER, k - start)
        part = bilinear("matmul", {}, a.narrow(-1, start, n), b.narrow(-2, start, n))
        out = part if out is None else add_(out, part)
    assert out is not None
    return out
