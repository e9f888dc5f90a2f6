"""The arithmetic of the comparison by digit look-ups (the protocol:
:mod:`mpc.protocols.digit_compare`): the carry into bit 63 of c + ~r + 1 as a sum of
zero tests of small integers, each linear in one-hot tables of r's digits.

x = c - r = c + ~r + 1 over 64 bits, so msb(x) = msb(c) ^ msb(~r) ^ carry, where the carry
into bit 63 is [R >= C] for R = the low 63 bits of ~r (secret) and C = 2^63 - 1 - the low
63 bits of c (public once c is open). Split both into :data:`DIGITS` digits of
:data:`DIGIT_BITS` bits (the top one has 7). Per digit i, from a one-hot table O_i of R's
digit (O_i[v] = [R_i = v]), the comparisons with C's digit are sums of table entries:
g_i = [R_i > C_i] (and g_0 = [R_0 >= C_0]: the lowest digit decides a tie) and
eq_i = [R_i = C_i]. Then

    [R >= C] = sum_i g_i prod_{j > i} eq_j,

a sum of terms of which at most one is 1, and term i is 1 exactly where the integer

    w_i = 2 sum_{j > i} (1 - eq_j) + 1 - g_i,   0 <= w_i <= 2 (7 - i) + 1 <= 15,

is 0. So the carry is sum_i [w_i = 0], each w_i linear in the tables (shares of them,
modulo 16, are enough) and each zero test one masked opening of w_i modulo 16 and a
look-up in a one-hot table of the mask.

The tables travel as their prefix sums (:func:`prefix_tables`: entry s of digit i is
[R_i <= s]), shared modulo 16 and packed two entries a byte: g_i and eq_i are then two
entries each, read from the packed words where they lie (:func:`zero_test_operands`), and
no party unpacks or sums a table.
"""

from __future__ import annotations

import torch

DIGITS = 8  # digits of the 63 low bits (7 of 8 bits, the top one of 7)
DIGIT_BITS = 8
RADIX = 1 << DIGIT_BITS
#: each digit's zero test modulo the least power of two above its largest w_i,
#: 2 (7 - i) + 1: 16, 16, 16, 16, 8, 8, 4, 2 from the lowest digit (86 entries, not 128)
MODULI = [1 << (2 * (DIGITS - 1 - i) + 1).bit_length() for i in range(DIGITS)]
OFFSETS = [sum(MODULI[:i]) for i in range(DIGITS)]
TEST_ENTRIES = sum(MODULI)
LOW63 = (1 << 63) - 1
#: int64 words of an element's packed tables (two 4-bit entries a byte)
PACKED_WORDS = DIGITS * RADIX // 16


def digits(v: torch.Tensor) -> torch.Tensor:
    """The :data:`DIGITS` base-2^8 digits of v's low 63 bits, least significant first:
    [*v.shape, DIGITS] int64 in [0, 256)."""
    shifts = torch.arange(0, DIGITS * DIGIT_BITS, DIGIT_BITS, dtype=torch.int64)
    return ((v & LOW63).unsqueeze(-1) >> shifts) & (RADIX - 1)


def secret_digits(r: torch.Tensor) -> torch.Tensor:
    """R's digits for the mask r (R = the low 63 bits of ~r)."""
    return digits(~r)


def public_digits(c: torch.Tensor) -> torch.Tensor:
    """C's digits for the opened c (C = 2^63 - 1 - the low 63 bits of c)."""
    return digits(LOW63 - (c & LOW63))


def prefix_tables(d: torch.Tensor) -> torch.Tensor:
    """[*d.shape, 256] uint8 prefix sums of the one-hot tables of digits d: entry s is
    [d <= s] (the one-hot table's sum over u <= s)."""
    return torch.arange(RADIX, dtype=torch.int64).ge(d.unsqueeze(-1)).to(torch.uint8)


#: each 4-bit lane's top bit, in an int64 word (SWAR: :func:`sub_packed_`)
_HIGH = int.from_bytes(b"\x88" * 8, "little", signed=True)


def sub_packed_(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Packed 4-bit entries a - b modulo 16, lane by lane, on the int64 words of
    :func:`pack` (no unpacking), in place: a holds the result, b is overwritten. Each
    lane's top bit is set in a and cleared in b before the words subtract, so that no
    borrow crosses a lane, then set right."""
    top = torch.bitwise_not(b).bitwise_xor_(a).bitwise_and_(_HIGH)  # (a ^ ~b) & H
    return a.bitwise_or_(_HIGH).sub_(b.bitwise_and_(~_HIGH)).bitwise_xor_(top)


def packed_prefix_tables(d: torch.Tensor) -> torch.Tensor:
    """:func:`pack` of :func:`prefix_tables` for digits d ([n, DIGITS]), built packed:
    byte j holds entries 2j and 2j + 1, 0x11 where d <= 2j, 0x10 where d = 2j + 1."""
    n = d.shape[0]
    even = torch.arange(0, RADIX, 2, dtype=torch.int64)
    at = d.unsqueeze(-1)
    out = at.le(even).to(torch.uint8).mul_(0x11)
    out.add_(at.eq(even + 1).to(torch.uint8).mul_(0x10))
    return out.view(torch.int64).reshape(n, PACKED_WORDS)


def pack(tables: torch.Tensor) -> torch.Tensor:
    """Tables [n, DIGITS, 256] of 4-bit entries (uint8) as [n, PACKED_WORDS] int64."""
    n = tables.shape[0]
    pairs = tables.reshape(n, DIGITS * RADIX // 2, 2)
    packed = (pairs[..., 0] | (pairs[..., 1] << 4)).contiguous()
    return packed.view(torch.int64).reshape(n, PACKED_WORDS)


def unpack(words: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack`: [n, DIGITS, 256] uint8 entries in [0, 16) (uniform
    ones from uniform words)."""
    n = words.shape[0]
    b = words.contiguous().view(torch.uint8).reshape(n, DIGITS * RADIX // 2)
    out = torch.empty([n, DIGITS * RADIX // 2, 2], dtype=torch.uint8)
    torch.bitwise_and(b, 15, out=out[..., 0])
    torch.bitwise_right_shift(b, 4, out=out[..., 1])
    return out.view(n, DIGITS, RADIX)


def zero_test_operands(words: torch.Tensor, c_digits: torch.Tensor, first: bool) -> torch.Tensor:
    """A party's shares (modulo 16: only w mod 16 is opened) of w_i (the module
    docstring) for each compared element and digit, [T, n, DIGITS] int64, from its shares
    of the prefix tables of R's digits (:func:`prefix_tables`, modulo 16, packed:
    [n, PACKED_WORDS] int64) and C's digits ([T, n, DIGITS]: T public values compared
    with each element's R). ``first``: the party that adds the constants."""
    n = words.shape[0]
    flat = words.contiguous().view(torch.uint8).reshape(-1)
    # digit i's entry s of element j lies in byte j * 1024 + (i * 256 + s) / 2, its low
    # nibble for even s, the high one for odd s
    base = (torch.arange(n, dtype=torch.int64) * (DIGITS * RADIX)).view(n, 1)
    base = base + torch.arange(0, DIGITS * RADIX, RADIX, dtype=torch.int64)  # [n, DIGITS]

    def below(v: torch.Tensor) -> torch.Tensor:  # sum_{u < v} O[u]: entry v - 1, 0 at v = 0
        s = (v - 1).clamp_(min=0).add_(base)
        got = flat[s >> 1].to(torch.int64).bitwise_right_shift_((s & 1) << 2).bitwise_and_(15)
        return got.masked_fill_(v == 0, 0)

    total = below(torch.full([n, DIGITS], RADIX, dtype=torch.int64))  # (a share of 1)
    p_c, p_c1 = below(c_digits), below(c_digits + 1)
    eq = p_c1 - p_c
    g = total - p_c1  # [R_i > C_i]
    g[..., 0] += eq[..., 0]  # digit 0 counts R_0 >= C_0
    higher_eq = eq.flip(-1).cumsum(-1).flip(-1) - eq  # sum_{j > i} eq_j
    w = -2 * higher_eq - g
    if first:
        higher = torch.arange(DIGITS - 1, -1, -1, dtype=torch.int64)  # digits above i
        w += 2 * higher + 1
    return w


def test_index(v: torch.Tensor) -> torch.Tensor:
    """Each digit's entry in a compared value's zero-test tables (:data:`TEST_ENTRIES`
    words, digit i's :data:`MODULI` [i] from :data:`OFFSETS` [i]) for v = w + rho (or
    rho itself) modulo 256, [..., DIGITS] of any integer dtype: OFFSETS + v mod MODULI."""
    mask = torch.tensor(MODULI, dtype=torch.int64) - 1
    return (v.to(torch.int64) & mask) + torch.tensor(OFFSETS, dtype=torch.int64)


def carry(r: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """[R >= C] in the clear (the reference the tests compare the protocol's math with)."""
    return ((~r & LOW63) >= (LOW63 - (c & LOW63))).to(torch.int64)


__all__ = [
    "DIGITS",
    "PACKED_WORDS",
    "RADIX",
    "MODULI",
    "OFFSETS",
    "TEST_ENTRIES",
    "carry",
    "digits",
    "pack",
    "prefix_tables",
    "public_digits",
    "secret_digits",
    "packed_prefix_tables",
    "sub_packed_",
    "unpack",
    "zero_test_operands",
]
