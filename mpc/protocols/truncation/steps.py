"""The steps of a truncation with known MSB (the protocol:
:func:`mpc.protocols.truncation.run.truncate`): the dealer's U and D, each party's mask
and its finish.

Instance: one nonce. The dealer's correction (U and the narrow s of D, packed: one
delivery) goes to the last party, the others derive theirs; each party masks z with its
derived r (c = z + r, opened), then finishes from the opened c.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.rules import OPENED, dealer_seeds, int_of, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, elementwise, numel, stream_records
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import TAG_D, TAG_R, TAG_U, consume, derive, last_share, sum_derived
from pointers.worker.sealing import ProtocolCall, seal

# -- the dealer ----------------------------------------------------------------------------


def trunc_correction_dtype(bits: int) -> torch.dtype:
    """The narrowest integer dtype that holds ``bits`` bits (two's complement): the dtype
    in which the dealer ships the last party's share of [D] (see :func:`dealer_trunc`)."""
    if bits <= 8:
        return torch.int8
    if bits <= 16:
        return torch.int16
    if bits <= 32:
        return torch.int32
    return torch.int64


def trunc_correction_words(numel: int, bits: int) -> int:
    """int64 words of the last party's packed truncation correction for ``numel``
    elements (see :func:`pack_trunc_correction`)."""
    narrow = numel * trunc_correction_dtype(bits).itemsize
    return numel + (narrow + 7) // 8


def narrow_words(s: torch.Tensor) -> torch.Tensor:
    """A narrow tensor's bytes padded to whole int64 words (flat): to travel beside words."""
    raw = s.reshape(-1).view(torch.uint8)
    return torch.cat([raw, raw.new_zeros((-raw.numel()) % 8)]).view(torch.int64)


def narrow_of(words: torch.Tensor, count: int, bits: int) -> torch.Tensor:
    """The ``count`` values of :func:`narrow_words`'s words in the narrow dtype of ``bits``
    (:func:`trunc_correction_dtype`), a view of them (flat)."""
    dtype = trunc_correction_dtype(bits)
    return words.view(torch.uint8)[: count * dtype.itemsize].view(dtype)


def pack_trunc_correction(u: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """U (int64) and the narrow s of D in one flat int64 tensor, s's bytes padded to whole
    words: the dealer's truncation correction travels as one delivery, not two."""
    return torch.cat([u.reshape(-1), narrow_words(s)])


def unpack_trunc_correction(
    packed: torch.Tensor, shape: list[int], bits: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, s) from :func:`pack_trunc_correction`'s tensor, as views of it, in ``shape``."""
    n = 1
    for d in shape:
        n *= d
    if (
        packed.dtype != torch.int64
        or packed.dim() != 1
        or packed.numel() != trunc_correction_words(n, bits)
    ):
        raise ValueError(
            f"a truncation correction for {n} elements at {bits} bits is "
            f"{trunc_correction_words(n, bits)} int64 words, got {packed.dtype} "
            f"{list(packed.shape)}"
        )
    return packed[:n].view(shape), narrow_of(packed[n:], n, bits).view(shape)


def _dealer_trunc_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal("dealer.trunc", nonce_of(call), int_of(call, "bits"), deliveries=1)]


def _dealer_trunc_size(p: dict[str, Any]) -> int:
    """r, U and D (and the narrow s), the others' derived shares, the packed output: 4
    words an element where s is int16 or narrower, 5 above (measured at 2^20)."""
    bits = p.get("bits")
    words = 4 if type(bits) is int and bits <= 16 else 5
    return declared(words * WORD * numel(p.get("shape")))


@step(
    rule=_dealer_trunc_rule, size=_dealer_trunc_size, keeps=stream_records(3), makes_material=True
)
def dealer_trunc(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int
) -> torch.Tensor:
    """Truncation material for the mask r = sum of derived shares (see :func:`trunc_finish`):
    the last party's shares of U = -(r' >> f) - 2^(62-f) and D = 2^(64-f) (1 - msb(r')),
    where r' = r - 2^62 and f = ``bits``.

    D is a multiple of 2^(64-f), so it is shared as D_i = 2^(64-f) s_i with s_i in Z/2^f:
    party i < n-1 takes s_i from its seed (its derived word shifted left by 64 - f keeps
    the word's low f bits as the top f bits of D_i), and the last party gets only
    s_{n-1} = (1 - h) - sum_{i<n-1} s_i mod 2^f, f bits, in the narrowest dtype that holds
    them (:func:`trunc_correction_dtype`: int16 at f = 16, 2 bytes an element instead of
    8); it widens it and shifts it left by 64 - f where it uses it. Nothing leaks: s_0 is
    uniform in Z/2^f and independent of h and of the other s_i, so s_{n-1} is uniform in
    Z/2^f given everything the last party holds besides it (a one-time pad of 1 - h), and
    any n - 1 of the s_i are independent and uniform, as the full-width shares were.
    Both travel packed in one int64 tensor (:func:`pack_trunc_correction`): one delivery."""
    if type(bits) is not int or not 1 <= bits <= 62:
        raise ValueError(f"a truncation drops 1 to 62 bits, got {bits!r}")
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_D)
    r = sum_derived(seeds, nonce, TAG_R, shape).sub_(1 << 62)
    d = (r >> 63).add_(1)  # s = 1 - h, in Z/2^f
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    u, d = last_share(u, seeds, nonce, TAG_U), last_share(d, seeds, nonce, TAG_D)
    # s_{n-1} mod 2^f as a signed f-bit value (sign-extended from bit f - 1): it fits the
    # narrow dtype exactly, and widened and shifted left by 64 - f it is D_{n-1} mod 2^64
    d = d.bitwise_left_shift_(64 - bits).bitwise_right_shift_(64 - bits)
    return pack_trunc_correction(u, d.to(trunc_correction_dtype(bits)))


# -- the parties ---------------------------------------------------------------------------


def _trunc_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("z")
    return [seal("trunc.c", nonce)]


@step(
    rule=_trunc_mask_rule,
    size=elementwise(1, "z"),
    keeps=stream_records(1),
    makes_material=True,
    opens={"trunc.c": SUM},
)
def trunc_mask(ctx: Any, seed: torch.Tensor, nonce: int, z: torch.Tensor) -> torch.Tensor:
    """Party i: c_i = z_i + r_i."""
    consume(ctx, [seed], nonce, TAG_R)
    return derive(seed, nonce, TAG_R, list(z.shape)).add_(z)


def _trunc_finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corrections")
    corr = call.material(
        "corrections", "dealer.trunc", nonce, local=False, optional=True, consume=True
    )
    if corr is not None and corr.index != call.value("bits"):
        raise call.refuse(f"the dealer's correction is for {corr.index} bits")
    call.material("c", OPENED + "trunc.c", nonce, local=True, consume=True)
    return None


@step(rule=_trunc_finish_rule, size=elementwise(3, "c"), keeps=stream_records(2))
def trunc_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    corrections: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """Party i's share of z >> bits from the opened c = z + r = (z + 2^62) + r'.

    With w = z + 2^62 (in [0, 2^63) for |z| < 2^62), h = msb(r') and b = msb(c) xor h,
    the carry out of the low 63 bits of w + r': w = (c mod 2^63) - (r' mod 2^63) + 2^63 b.
    Shifting by f (floor(A / 2^f) - floor(B / 2^f) is floor((A - B) / 2^f) or one more)
    and writing x mod 2^63 >> f = (x >> f) + 2^(63-f) msb(x) for the arithmetic shift:
    z >> f ~ (c >> f) - (r' >> f) - 2^(62-f) + 2^(63-f) (msb(c) - h + b)
           = (c >> f) + U + msb(c) D,
    since msb(c) - h + b = 2 msb(c) (1 - h). The public msb(c) selects [D] or 0, so:
    [z >> f] = [U] + ([D] & (c >> 63)) (+ c >> f at party 0).

    D's shares are D_i = 2^(64-f) s_i (see :func:`dealer_trunc`):
    s_i is the derived word (its low f bits count) here, the dealer's narrow correction
    s_{n-1} (f bits, int16 at f = 16) at the last party, packed with its U in one tensor
    (:func:`pack_trunc_correction`); both are shifted left by 64 - f.
    """
    consume(ctx, [seed], nonce, TAG_U, TAG_D)
    if corrections is None:
        u = derive(seed, nonce, TAG_U, list(c.shape))
        s = derive(seed, nonce, TAG_D, list(c.shape))
    else:
        u, s = unpack_trunc_correction(corrections, list(c.shape), bits)
        s = s.to(torch.int64)  # widen the dealer's f-bit s_{n-1}
    d = s.bitwise_left_shift_(64 - bits)  # D_i = 2^(64-f) s_i
    u += d.bitwise_and_(c >> 63)  # c >> 63: all ones where msb(c) = 1, else 0
    if first:  # c is the opened copy, this call's own
        u += c.bitwise_right_shift_(bits)
    return u
