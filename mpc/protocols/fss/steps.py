"""The steps of the 2-party comparison by function secret sharing (FSS), at the dealer and
at the parties (the protocol: :class:`mpc.protocols.fss.run.FssRun`; the DCF:
:mod:`mpc.math.dcf`).

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
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import dcf
from mpc.math.bits import pack_bits
from mpc.math.prg import PRG, new_seed
from mpc.protocols.comparison.arith_select import check_bits as check_product_bits
from mpc.protocols.comparison.selection import check_selection, selected_count
from mpc.protocols.comparison.thresholds import check_thresholds, threshold_values
from mpc.protocols.fss.trunc_select import TRUNC_PRODUCT, TRUNC_WORDS, selection_parts
from mpc.protocols.max_of_four.steps import group_material, group_terms, group_words
from mpc.protocols.opening.steps import split
from mpc.protocols.rules import OPENED, SEED, dealer_seeds, kept, nonce_of, party_seed
from mpc.protocols.sizes import (
    WORD,
    declared,
    fixed,
    int_param,
    numel,
    records,
    stream_records,
    tensor_elems,
)
from mpc.protocols.step import BITS, step
from mpc.protocols.streams import (
    TAG_FSS_ROOT,
    TAG_R,
    TAG_T_ARITH,
    TAG_U,
    consume,
    derive,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

#: with thresholds, the comparisons evaluated in one call of the DCF (the keys repeated for
#: them: 1.5 KB each at 64 bits)
EVAL_GROUP = 4096
DCF_CHUNK_BYTES = (
    1 << 20
)  # the DCF's level loop: one chunk's temporaries (mpc.math.dcf; measured under 1 MiB)


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


# -- the dealer ----------------------------------------------------------------------------


def _fss_words(p: dict[str, Any], n: int) -> int:
    """Words of the correction words of ``n`` elements' keys (3 per compared bit)."""
    bits = int_param(p.get("bits"), "bits", 2, 64)
    return (3 * (bits - 1) + 1) * n


def _dealer_fss_rule(call: ProtocolCall) -> Any:
    """The correction words, common to both keys (one object, a delivery to each of the
    2 parties), and the last party's part (index 1: the party's place)."""
    dealer_seeds(call)
    if len(call.materials("seeds", SEED, "the dealer's seeds")) != 2:
        raise call.refuse("the FSS comparison is for 2 parties")
    select = call.value("select")
    if type(select) is not bool:
        raise call.refuse("parameter 'select' is a bool")
    keys = ("select", "bits", "shape", "product_nonces", "group_nonce")
    extra = (*(call.value(k) for k in keys), call.value("thresholds") or 0)
    extra += (call.value("product_bits") or None,)
    nonce = nonce_of(call)
    return [  # (the correction words say how many thresholds a key is evaluated at)
        seal("dealer.fss.cw", nonce, deliveries=2, extra=(extra[0], extra[1], extra[5])),
        seal("dealer.fss", nonce, 1, deliveries=1, extra=extra),
    ]


def _dealer_fss_size(p: dict[str, Any]) -> int:
    """The correction words (one object for both parties) and a tenth more for a
    chunk's copies on the way (measured: 1.05 to 1.14 times them, all included, from
    98,304 to 2^20 comparisons; tests/test_mpc_fss_costs.py), the mask, roots and
    payloads (10 words an element), the selections and one chunk of the level loop."""
    n = numel(p.get("shape"))
    keys = n // p["shape"][0] if p.get("thresholds") else n  # (thresholds: a key a value)
    truncated = p.get("product_bits")
    truncated = sum(1 for f in truncated if f) if isinstance(truncated, list) else 0
    extra = (2 * selected_count(p) + 2 * TRUNC_WORDS * truncated + 10 + group_words(p)) * n
    return declared(WORD * (1.1 * _fss_words(p, keys) + extra)) + DCF_CHUNK_BYTES


def _dealer_fss_keeps(p: dict[str, Any]) -> int:
    return records(p.get("seeds"), 4 + 2 * selected_count(p) + 3)


@step(rule=_dealer_fss_rule, size=_dealer_fss_size, keeps=_dealer_fss_keeps, makes_material=True)
def dealer_fss(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    shape: list[int],
    product_nonces: list[int],
    group_nonce: int | None,
    select: bool,
    bits: int,
    thresholds: int = 0,
    product_bits: list[int] | None = None,
) -> list[torch.Tensor]:
    """The keys (see the module docstring): the correction words, one object that goes
    to both parties, and the last party's share of u, then with ``select`` its share of
    the daBit t and the selections' material
    (:func:`~mpc.protocols.fss.trunc_select.selection_parts`: ``product_bits``, per
    product nonce, the bits its value comes down by in its selection; 0 or None: none),
    flat.

    ``thresholds`` T > 0: ``shape`` is [T, *x], and one key a value of x is evaluated at
    its T points c - theta_k (:func:`fss_eval`): the T comparisons share the mask r and
    the key, whose results stay shares (no selection, nothing opened)."""
    if len(seeds) != 2:
        raise ValueError("the FSS comparison is for 2 parties")
    check_bits(bits)
    check_selection(shape, product_nonces, group_nonce)
    check_thresholds(shape, thresholds, select)
    truncations = check_product_bits(product_bits, len(product_nonces))
    if type(select) is not bool or (not select and (product_nonces or group_nonce is not None)):
        raise ValueError("a comparison that selects values deals its daBit (select=True)")
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_FSS_ROOT, *([TAG_T_ARITH] if select else []))
    n = 1
    for d in shape[1:] if thresholds else shape:
        n *= d
    r = sum_derived(seeds, nonce, TAG_R, [n])
    top = (r >> (bits - 1)) & 1
    t = (PRG(new_seed()).int64(tuple(shape)) & 1) if select else torch.zeros(n, dtype=r.dtype)
    u = top ^ t.reshape(-1)
    roots = (
        derive(seeds[0], nonce, TAG_FSS_ROOT, [n, 2]),
        derive(seeds[1], nonce, TAG_FSS_ROOT, [n, 2]),
    )
    cw = dcf.gen(r & _low(bits), 1 - 2 * u, bits - 1, roots).reshape(-1)
    parts = [u - derive(seeds[0], nonce, TAG_U, [n])]
    if select:
        parts.append((t - derive(seeds[0], nonce, TAG_T_ARITH, shape)).reshape(-1))
        parts += selection_parts(ctx, seeds, t, shape, product_nonces, truncations)
        if group_nonce is not None:
            parts += group_material(ctx, seeds, t, shape, group_nonce)
    return [cw, torch.cat(parts) if len(parts) > 1 else parts[0]]


# -- the parties ---------------------------------------------------------------------------


def _fss_unpack_rule(call: ProtocolCall) -> Any:
    """The last party splits its own part of the key (the index the dealer gave it) once."""
    nonce = nonce_of(call)
    seed = party_seed(call)
    label = call.material("packed", "dealer.fss", nonce, local=False, consume=True)
    assert label is not None
    if label.index != seed.index or seed.index != 1:
        raise call.refuse(f"party {seed.index} takes the key of party {label.index}")
    select, bits, shape, products, group, thresholds, truncations = label.extra
    truncations = truncations or [0] * len(products)
    n = 1
    for d in shape[1:] if thresholds else shape:
        n *= d
    want = [[n]]
    if select:
        want.append(shape)
        want += [[TRUNC_WORDS * n] if f else shape for f in truncations]
        if group is not None:
            want += [[group_terms(call, shape)]]
    if call.value("shapes") != want:
        raise call.refuse("the shapes do not split the dealer's FSS key")
    seals = [kept("fss.u", nonce, seed.index, extra=(select, bits))]
    if select:
        seals.append(kept("dealer.cmp.tarith", nonce))
        seals += [
            kept(TRUNC_PRODUCT, pn, extra=(nonce, f))
            if f
            else kept("dealer.cmp.prod", pn, extra=(nonce,))
            for pn, f in zip(products, truncations)
        ]
        if group is not None:
            seals.append(kept("dealer.cmp.group", group, extra=(nonce,)))
    return seals


@step(rule=_fss_unpack_rule, size=fixed, makes_material=True)
def fss_unpack(
    ctx: Any, seed: torch.Tensor, nonce: int, packed: torch.Tensor, shapes: list[list[int]]
) -> list[torch.Tensor]:
    """The last party splits its part of the key: its share of u, then with a selection
    its daBit share and the selections' material (views)."""
    return split(packed, shapes)


def _fss_eval_rule(call: ProtocolCall) -> Any:
    """A party evaluates the key once, at the opened c of the same instance: the
    correction words delivered to it (each party its own copy, consumed), and at the last
    party its share of u that it split from its own part. With a selection the result is
    d's share (opened next), else the comparison's result."""
    nonce = nonce_of(call)
    seed = party_seed(call, "u")
    key = call.material("key", "dealer.fss.cw", nonce, local=False, consume=True)
    assert key is not None
    u = call.material("u", "fss.u", nonce, local=True, optional=True, consume=True)
    if u is not None and u.index != seed.index:
        raise call.refuse(f"party {seed.index} takes its own key, not party {u.index}'s")
    select, bits, count = key.extra[0], key.extra[1], key.extra[2]
    if call.value("bits") != bits:
        raise call.refuse(f"the key reads {bits} bits")
    thresholds = call.value("thresholds")
    if count != (len(thresholds) if thresholds else 0):
        raise call.refuse("the thresholds are not the ones the dealer's key is for")
    if call.value("packed") is not bool(select):
        raise call.refuse("a selecting key's result is d, packed to open; another's is the bit")
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    c = call.value("c")
    shape = tuple(int(d) for d in c.shape) if isinstance(c, torch.Tensor) else ()
    return [seal("fss.d", nonce, extra=shape)] if select else None


def _fss_eval_size(p: dict[str, Any]) -> int:
    """The root seeds, the input's low bits, the output and its terms (6 words an
    element compared) and one chunk of the level loop; with thresholds, a group's copies
    of the keys (:data:`EVAL_GROUP` comparisons' at most)."""
    thresholds = p.get("thresholds")
    count = len(thresholds) if isinstance(thresholds, list) and thresholds else 1
    n = tensor_elems(p, "c")
    # a DCF call's repeated keys and roots, and the DCF's own copy of part of them (1.7
    # times the keys measured with 1,024 values' keys at 4 points a call)
    group = min(count, EVAL_GROUP // max(n, 1))  # (the points of one DCF call, a value's)
    copies = group * n * WORD * (3 * 63 + 3) * 7 // 4 if group > 1 else 0
    return declared(6 * WORD * n * count + copies) + DCF_CHUNK_BYTES


@step(rule=_fss_eval_rule, size=_fss_eval_size, keeps=stream_records(2), opens={"fss.d": BITS})
def fss_eval(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    key: torch.Tensor,
    u: torch.Tensor | None,
    c: torch.Tensor,
    bits: int,
    packed: bool,
    thresholds: list[int] | None = None,
) -> torch.Tensor:
    """The party's share of m ^ t (see the module docstring) from the correction words
    ``key`` (read only: in process both parties read the dealer's one object), its share
    of u (the last party: dealt, ``u``; party 0: derived) and the opened c.

    ``packed`` (a selecting key's): the result is d = m ^ t, opened next: the low bits of
    the two arithmetic shares, packed 64 to a word (:func:`mpc.math.bits.pack_bits`),
    are XOR shares of d (the low bit of a sum is the XOR of the low bits), one bit an
    element on the wire.

    ``thresholds`` (public ring values theta_k): the key of each element of c = x + r is
    evaluated at c - theta_k, [T, *x]: the T comparisons x - theta_k share r and the key
    (:func:`dealer_fss`)."""
    check_bits(bits)
    theta = threshold_values(thresholds) if thresholds else None  # (before any stream)
    consume(ctx, [seed], nonce, TAG_FSS_ROOT, *([TAG_U] if first else []))
    n = c.numel()
    w = words(n, bits)
    if key.dim() != 1 or key.numel() != w:
        raise ValueError(f"correction words of {key.numel()} words for {n} elements at {bits} bits")
    if (u is None) != first or (u is not None and (u.dim() != 1 or u.numel() != n)):
        raise ValueError(f"the last party's share of u is {n} words (party 0 derives its own)")
    root = derive(seed, nonce, TAG_FSS_ROOT, [n, 2])
    flat = c.reshape(-1)
    shape = list(c.shape)
    if theta is None:
        y = dcf.evaluate(0 if first else 1, root, key.view(-1, n), flat & _low(bits), bits - 1)
    else:  # each key at its T points, EVAL_GROUP comparisons a call (the keys repeated)
        flat = (flat.unsqueeze(0) - theta.view(-1, 1)).reshape(-1)
        shape = [theta.numel(), *shape]
        y = _evaluate_at(0 if first else 1, root, key.view(-1, n), flat & _low(bits), bits)
    share_u = derive(seed, nonce, TAG_U, [n]) if u is None else u
    if theta is None:
        y += share_u
    else:  # (the same u for an element's T points)
        y = y.view(-1, n).add_(share_u).view(-1)
    top = (flat >> (bits - 1)) & 1
    y *= 1 - 2 * top
    if first:
        y += top
    return pack_bits(y) if packed else y.view(shape)


def _evaluate_at(
    party: int, root: torch.Tensor, cw: torch.Tensor, points: torch.Tensor, bits: int
) -> torch.Tensor:
    """The n keys (``root`` [n, 2], ``cw`` [words, n]) each evaluated at its T points
    (``points`` [T n], threshold-major), in calls of at most :data:`EVAL_GROUP` points."""
    n = root.shape[0]
    out = torch.empty(points.numel(), dtype=torch.int64)
    group = max(1, EVAL_GROUP // max(n, 1))
    for lo in range(0, points.numel() // max(n, 1), group):
        hi = min(lo + group, points.numel() // n)
        k = hi - lo
        at = points[lo * n : hi * n]
        keys = (root, cw) if k == 1 else (root.repeat(k, 1), cw.repeat(1, k))
        out[lo * n : hi * n] = dcf.evaluate(party, keys[0], keys[1], at, bits - 1).view(-1)
    return out
