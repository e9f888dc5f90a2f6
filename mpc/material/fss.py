"""The steps of the 2-party comparison by function secret sharing (FSS), at the dealer and
at the parties (the protocol: :mod:`mpc.protocols.fss`; the DCF: :mod:`mpc.math.dcf`).

With k = ``bits`` (the low bits of x the comparison reads, 64 by default) and
m = msb of x mod 2^k: the parties open c = x + r for the dealer's mask r (shared
additively, derived from the seeds). With c' and r' the low k - 1 bits of c and r,
x mod 2^k = c - r mod 2^k gives

    m = c_(k-1) ^ r_(k-1) ^ [c' < r']      (the borrow out of the low k - 1 bits).

The dealer deals a DCF key pair for alpha = r', beta = 1 - 2u with u = t ^ r_(k-1), and
additive shares of u, where t is a random bit of its own (a daBit, also shared
additively) when the comparison selects values, and 0 when it only outputs the bit. Each
party evaluates its key at the public c' and adds its share of u: the sum is
u + (1 - 2u) [c' < r'] = u ^ [c' < r']; then, c_(k-1) being public,

    [m ^ t] = c_(k-1) (at party 0) + (1 - 2 c_(k-1)) [u ^ [c' < r']],

a local step. Without a selection (t = 0) that is [m] itself: the comparison's result,
one round (the opening of c). With one it is opened (a second round) as d = m ^ t, and
the selections ride on the daBit t exactly as in the default protocol
(:mod:`mpc.protocols.compare`). Exact for every x whose value mod 2^k, read in two's
complement, has x's sign: at k = 64, every ring element.

Key material per element: the DCF's correction words (:func:`mpc.math.dcf.key_words`,
common to both parties: 1,520 bytes at k = 64) are one object at the dealer, delivered to
each party (in process the parties read the dealer's buffer: no copy); the root seeds
are derived from each party's session seed; the last party also gets, in a second
delivery, its share of u (and with a selection, of t and of the selections' products).
Before issue 25's follow-up the last party's correction words travelled inside one packed
tensor with its share of u: the dealer built them twice (a copy of every key).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.material import rules, sizes
from mpc.math import dcf
from mpc.math.prg import PRG, new_seed
from mpc.protocols.comparison.selection import check_selection, selection_material
from mpc.protocols.max_of_four.steps import group_material
from mpc.protocols.opening.steps import split
from mpc.protocols.sizes import fixed, stream_records
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_FSS_ROOT,
    TAG_R,
    TAG_T_ARITH,
    TAG_U,
    consume,
    derive,
    sum_derived,
)


def check_bits(bits: Any) -> int:
    """The compared bits k, 2 to 64 (the DCF's domain is k - 1 bits)."""
    if type(bits) is not int or not 2 <= bits <= 64:
        raise ValueError(f"an FSS comparison reads 2 to 64 bits, got {bits!r}")
    return bits


def words(n: int, bits: int) -> int:
    """int64 words of the correction words of ``n`` elements' keys."""
    return dcf.key_words(bits - 1) * n


def _low(bits: int) -> int:
    return (1 << (bits - 1)) - 1


@step(
    rule=rules.dealer_fss, size=sizes.dealer_fss, keeps=sizes.dealer_fss_keeps, makes_material=True
)
def dealer_fss(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    shape: list[int],
    product_nonces: list[int],
    group_nonce: int | None,
    select: bool,
    bits: int,
) -> list[torch.Tensor]:
    """The keys (see the module docstring): the correction words, one object that goes
    to both parties, and the last party's share of u, then with ``select`` its share of
    the daBit t and the selections' material
    (:func:`~mpc.protocols.comparison.selection.selection_material`), flat."""
    if len(seeds) != 2:
        raise ValueError("the FSS comparison is for 2 parties")
    check_bits(bits)
    check_selection(shape, product_nonces, group_nonce)
    if type(select) is not bool or (not select and (product_nonces or group_nonce is not None)):
        raise ValueError("a comparison that selects values deals its daBit (select=True)")
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_FSS_ROOT, *([TAG_T_ARITH] if select else []))
    n = 1
    for d in shape:
        n *= d
    r = sum_derived(seeds, nonce, TAG_R, [n])
    top = (r >> (bits - 1)) & 1
    t = (PRG(new_seed()).int64(tuple(shape)) & 1) if select else torch.zeros(shape, dtype=r.dtype)
    u = top ^ t.reshape(-1)
    roots = (
        derive(seeds[0], nonce, TAG_FSS_ROOT, [n, 2]),
        derive(seeds[1], nonce, TAG_FSS_ROOT, [n, 2]),
    )
    cw = dcf.gen(r & _low(bits), 1 - 2 * u, bits - 1, roots).reshape(-1)
    parts = [u - derive(seeds[0], nonce, TAG_U, [n])]
    if select:
        parts.append((t - derive(seeds[0], nonce, TAG_T_ARITH, shape)).reshape(-1))
        parts += selection_material(ctx, seeds, t, shape, product_nonces)
        if group_nonce is not None:
            parts += group_material(ctx, seeds, t, shape, group_nonce)
    return [cw, torch.cat(parts) if len(parts) > 1 else parts[0]]


@step(rule=rules.fss_unpack, size=fixed, makes_material=True)
def fss_unpack(
    ctx: Any, seed: torch.Tensor, nonce: int, packed: torch.Tensor, shapes: list[list[int]]
) -> list[torch.Tensor]:
    """The last party splits its part of the key: its share of u, then with a selection
    its daBit share and the selections' material (views)."""
    return split(packed, shapes)


@step(rule=rules.fss_eval, size=sizes.fss_eval, keeps=stream_records(2), opens={"fss.d": SUM})
def fss_eval(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    key: torch.Tensor,
    u: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
) -> torch.Tensor:
    """The party's share of m ^ t (see the module docstring) from the correction words
    ``key`` (read only: in process both parties read the dealer's one object), its share
    of u (the last party: dealt, ``u``; party 0: derived) and the opened c."""
    check_bits(bits)
    consume(ctx, [seed], nonce, TAG_FSS_ROOT, *([TAG_U] if first else []))
    n = c.numel()
    w = words(n, bits)
    if key.dim() != 1 or key.numel() != w:
        raise ValueError(f"correction words of {key.numel()} words for {n} elements at {bits} bits")
    if (u is None) != first or (u is not None and (u.dim() != 1 or u.numel() != n)):
        raise ValueError(f"the last party's share of u is {n} words (party 0 derives its own)")
    root = derive(seed, nonce, TAG_FSS_ROOT, [n, 2])
    flat = c.reshape(-1)
    y = dcf.evaluate(0 if first else 1, root, key.view(-1, n), flat & _low(bits), bits - 1)
    y += derive(seed, nonce, TAG_U, [n]) if u is None else u
    top = (flat >> (bits - 1)) & 1
    y *= 1 - 2 * top
    if first:
        y += top
    return y.view(c.shape)
