"""Products of freshly truncated values, with no round of their own: the steps (the
protocol: :func:`mpc.protocols.truncated_products.run.truncate_and_multiply`).

A truncation opens c = z + r and each party then holds [x] = p + [a] for x = z >> f, with
the public p = c >> f (party 0 adds it) and a = U + m D, m = msb(c) public and U, D the
dealer's (:func:`mpc.protocols.truncation.steps.trunc_finish`). So a truncated value is already
"opened" up to a mask a that the dealer knows up to the public bit m: a Beaver product
of two such values needs no opening of its own (cf. the mask of a Beaver triple chosen
equal to the value's existing mask). For x = p_x + a_x and y = p_y + a_y:

    x y = p_x [y] + p_y [x] - p_x p_y + [a_x a_y],
    a_x a_y = U_x U_y + m_x D_x U_y + m_y U_x D_y + m_x m_y D_x D_y,

so the dealer deals shares of U_x U_y, D_x U_y, U_x D_y (and D_x D_y, which is 0 mod 2^64
when f_x + f_y <= 64, D being a multiple of 2^(64-f)), and each party combines them with
the public bits m (:func:`trunc_products`). A level of products after a truncation round
(``x`` a value still to be truncated, the products of the truncated values) then costs
that one round instead of two. The inverse powers of
softmax and layer norm use it (:mod:`mpc.protocols.inverse`).

A *plain* operand y (shared, nothing pending: a cache of keys) multiplies a truncated x
in the same round too: the parties open e = y - b beside the truncations' c (b the
parties' derived mask of the batch's nonce, :func:`plain_mask`), and

    x y = x e + p_x [b] + [U_x b] + m_x [D_x b],

with the dealer's U_x b and D_x b per product element (2 words: :func:`dealer_trunc_products`'
``plain_pairs``), where a Beaver product after the truncation took its own round.

The rules (sealing): the dealer's products are bound to the
truncations' nonces, bits and pairs, and each truncation joins at most one batch of
products (the dealer marks its nonce's otherwise unused C stream); the parties' step takes
the opened c of each of those truncations and, at the last party, their corrections and
the products, all consumed.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.rules import OPENED, dealer_seeds, kept, nonce_of, party_seed
from mpc.protocols.sizes import (
    SLACK,
    WORD,
    declared,
    elementwise,
    int_param,
    numel,
    records,
    stream_records,
    tensors,
)
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
    TAG_D,
    TAG_R,
    TAG_U,
    consume,
    derive,
    last_share,
    sum_derived,
)
from mpc.protocols.truncation.steps import unpack_trunc_correction
from pointers.worker.sealing import ProtocolCall, seal

MAX_VALUES = 8  # truncations in one batch
MAX_PAIRS = 8  # products in one batch
PLAIN_E, PLAIN_B = "tprod.e", "tprod.b"  # a plain operand's opened e and its mask's share


def terms(bits_x: int, bits_y: int) -> int:
    """Words the dealer deals per product element: U U, D U, U D, and D D unless it is 0
    mod 2^64 (f_x + f_y <= 64)."""
    return 3 if bits_x + bits_y <= 64 else 4


def out_shape(shape_x: list[int], shape_y: list[int]) -> list[int]:
    return list(torch.broadcast_shapes(tuple(shape_x), tuple(shape_y)))


def material_words(
    shapes: list[list[int]],
    bits: list[int],
    pairs: list[list[int]],
    plain_shape: list[int] | None = None,
    plain_pairs: list[int] | None = None,
) -> int:
    """int64 words of a batch's product material (one party's share, flat): the pairs'
    terms, then 2 a product element of each value with the plain operand."""
    total = 0
    for i, j in pairs:
        total += terms(bits[i], bits[j]) * torch.Size(out_shape(shapes[i], shapes[j])).numel()
    for i in plain_pairs or []:
        assert plain_shape is not None
        total += 2 * torch.Size(out_shape(shapes[i], plain_shape)).numel()
    return total


def check_plain(shapes: list[list[int]] | None, plain_shape: Any, plain_pairs: Any) -> None:
    """A plain operand: a shape (or None with no pairs) and the values it multiplies
    (indices, 1 to MAX_PAIRS), whose shapes broadcast with it."""
    if plain_pairs is None and plain_shape is None:
        return
    n = len(shapes) if shapes is not None else MAX_VALUES
    if not (
        isinstance(plain_pairs, list)
        and 1 <= len(plain_pairs) <= MAX_PAIRS
        and all(type(k) is int and 0 <= k < n for k in plain_pairs)
    ):
        raise ValueError(f"a plain operand multiplies 1 to {MAX_PAIRS} of the batch's values")
    if not (isinstance(plain_shape, list) and all(type(d) is int and d >= 0 for d in plain_shape)):
        raise ValueError("a plain operand takes its shape (a list of sizes)")
    if shapes is not None:
        for i in plain_pairs:
            try:
                out_shape(shapes[i], plain_shape)
            except (RuntimeError, TypeError) as e:
                raise ValueError(f"value {i} and the plain operand do not broadcast: {e}") from None


def check_batch(shapes: Any, bits: Any, pairs: Any, count: int | None = None) -> None:
    """A batch: 1 to MAX_VALUES truncations of 1 to 62 bits, 1 to MAX_PAIRS pairs of them
    (indices), whose shapes broadcast."""
    n = len(bits) if isinstance(bits, list) else 0
    if not 1 <= n <= MAX_VALUES or not all(type(b) is int and 1 <= b <= 62 for b in bits):
        raise ValueError(f"a batch truncates 1 to {MAX_VALUES} values by 1 to 62 bits each")
    if count is not None and count != n:
        raise ValueError(f"{count} values for {n} truncations")
    if not (
        isinstance(pairs, list)
        and 1 <= len(pairs) <= MAX_PAIRS
        and all(
            isinstance(p, list) and len(p) == 2 and all(type(k) is int and 0 <= k < n for k in p)
            for p in pairs
        )
    ):
        raise ValueError(f"a batch multiplies 1 to {MAX_PAIRS} pairs of its values (indices)")
    if shapes is not None:
        if not (isinstance(shapes, list) and len(shapes) == n):
            raise ValueError("one shape per truncation")
        for i, j in pairs:
            try:
                out_shape(shapes[i], shapes[j])
            except (RuntimeError, TypeError) as e:
                raise ValueError(f"the shapes of pair {[i, j]} do not broadcast: {e}") from None


def _masks(r: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(U, D) of a truncation by ``bits`` with mask r (see dealer.dealer_trunc)."""
    r = r.sub(1 << 62)
    d = (r >> 63).add_(1).bitwise_left_shift_(64 - bits)
    u = r.bitwise_right_shift_(bits).neg_().sub_(1 << (62 - bits))
    return u, d


def _terms(ux: Any, dx: Any, uy: Any, dy: Any, bx: int, by: int) -> list[torch.Tensor]:
    out = [ux * uy, dx * uy, ux * dy]
    if terms(bx, by) == 4:
        out.append(dx * dy)
    return out


# -- sizes --------------------------------------------------------------------------------


def _pair_elems(shapes: list[list[int]], pairs: Any) -> int:
    """Elements of the products of ``pairs`` (index pairs into ``shapes``)."""
    if not isinstance(pairs, list) or len(pairs) > 64:
        raise ValueError("parameter 'pairs' is a list of at most 64 index pairs")
    total = 0
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ValueError("parameter 'pairs' is a list of index pairs")
        i, j = (int_param(k, "pairs", 0, len(shapes) - 1) for k in pair)
        try:
            total += torch.broadcast_shapes(tuple(shapes[i]), tuple(shapes[j])).numel()
        except RuntimeError as e:
            raise ValueError(f"the shapes of a pair do not broadcast: {e}") from None
    return total


def _plain_elems(shapes: list[list[int]], plain_shape: Any, plain_pairs: Any) -> int:
    """Elements of the products with the plain operand (0 without one)."""
    if plain_pairs is None:
        return 0
    check_plain(shapes, plain_shape, plain_pairs)
    return sum(torch.Size(out_shape(shapes[i], plain_shape)).numel() for i in plain_pairs)


def _dealer_size(p: dict[str, Any]) -> int:
    """Each truncation's mask, U and D, and per product element its four terms (twice:
    the parts and their concatenation), the others' derived shares and their temporaries
    (measured: 4 words a truncated value and 10.5 a product element, for a softmax over
    4096 x 256); a plain operand's mask and its products likewise."""
    shapes = p.get("shapes")
    if not isinstance(shapes, list) or not 1 <= len(shapes) <= 64:
        raise ValueError("parameter 'shapes' is a list of 1 to 64 shapes")
    values = sum(numel(s, "shapes") for s in shapes)
    plain = p.get("plain_shape")
    values += numel(plain, "plain_shape") if plain is not None else 0
    elems = _pair_elems(shapes, p.get("pairs")) + _plain_elems(shapes, plain, p.get("plain_pairs"))
    return declared(WORD * (4 * values + 10.5 * elems))


def _party_size(p: dict[str, Any]) -> int:
    """Per truncation a few of its elements (U, s, D, m, p, x), per product element the
    material's four terms and the product's temporaries."""
    cs = tensors(p.get("cs"))
    if not cs:
        return SLACK
    shapes = [list(c.shape) for c in cs]
    values = sum(c.numel() for c in cs)
    elems = _pair_elems(shapes, p.get("pairs"))
    e = p.get("plain_e")
    if isinstance(e, torch.Tensor):
        elems += _plain_elems(shapes, list(e.shape), p.get("plain_pairs"))
    return declared(WORD * (5.5 * values + 7 * elems))


def _batch_keeps(per_value: int) -> Any:
    def keeps(p: dict[str, Any]) -> int:
        tn = p.get("trunc_nonces")
        values = min(len(tn), 64) if isinstance(tn, list) else 1
        return records(p.get("seeds", p.get("seed")), 1 + per_value * values)

    return keeps


# -- the steps ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    tn, bits, pairs, plain = (
        call.value(k) for k in ("trunc_nonces", "bits", "pairs", "plain_pairs")
    )
    if not (isinstance(tn, list) and all(type(v) is int for v in tn)):
        raise call.refuse("parameter 'trunc_nonces' is a list of ints")
    extra = (tn, bits, pairs, plain)
    return [seal("dealer.tprod", nonce_of(call), deliveries=1, extra=extra)]


@step(
    rule=_dealer_rule,
    size=_dealer_size,
    keeps=_batch_keeps(1),
    makes_material=True,
)
def dealer_trunc_products(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    trunc_nonces: list[int],
    shapes: list[list[int]],
    bits: list[int],
    pairs: list[list[int]],
    plain_shape: list[int] | None = None,
    plain_pairs: list[int] | None = None,
) -> torch.Tensor:
    """The last party's shares of the products of the truncations' masks (module
    docstring), per pair U_x U_y, D_x U_y, U_x D_y (and D_x D_y), then per value of
    ``plain_pairs`` U_x b and D_x b with the plain operand's mask b, flat."""
    check_batch(shapes, bits, pairs, len(trunc_nonces))
    check_plain(shapes, plain_shape, plain_pairs)
    consume(ctx, seeds, nonce, TAG_C)
    if plain_pairs is not None:
        consume(ctx, seeds, nonce, TAG_A)
    # (a truncation's C stream is otherwise unused: it marks its nonce as in one batch)
    for tn in set(trunc_nonces):
        consume(ctx, seeds, tn, TAG_C)
    masks = [
        _masks(sum_derived(seeds, tn, TAG_R, shape), b)
        for tn, shape, b in zip(trunc_nonces, shapes, bits)
    ]
    parts = []
    for i, j in pairs:
        parts += [
            t.reshape(-1) for t in _terms(*masks[i], *masks[j], bits[i], bits[j])
        ]  # fmt: skip
    if plain_pairs is not None:
        assert plain_shape is not None
        b = sum_derived(seeds, nonce, TAG_A, plain_shape)
        for i in plain_pairs:
            u, d = masks[i]
            parts += [(u * b).reshape(-1), (d * b).reshape(-1)]
    return last_share(torch.cat(parts), seeds, nonce, TAG_C)


def _plain_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("y")
    return [seal(PLAIN_E, nonce), kept(PLAIN_B, nonce)]


@step(
    rule=_plain_mask_rule,
    size=elementwise(2, "y"),  # (e and b: two words an element, measured at 2^16)
    keeps=stream_records(1),
    makes_material=True,
    opens={PLAIN_E: SUM},
)
def plain_mask(ctx: Any, seed: torch.Tensor, nonce: int, y: torch.Tensor) -> list[torch.Tensor]:
    """Party i: e_i = y_i - b_i (opened with the batch's truncations) and b_i (kept for
    the batch's products), b_i derived for the batch's nonce."""
    consume(ctx, [seed], nonce, TAG_A)
    b = derive(seed, nonce, TAG_A, list(y.shape))
    return [y - b, b]


def _party_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corrections", "products")
    tn, bits, pairs = (call.value(k) for k in ("trunc_nonces", "bits", "pairs"))
    if not (isinstance(tn, list) and all(type(v) is int for v in tn)):
        raise call.refuse("parameter 'trunc_nonces' is a list of ints")
    cs = call.materials(
        "cs", OPENED + "trunc.c", "the opened truncations", local=True, consume=True
    )
    if [lb.nonce for lb in cs] != tn:
        raise call.refuse("the opened values are not those of the batch's truncations")
    plain = call.value("plain_pairs")
    e = call.material("plain_e", OPENED + PLAIN_E, nonce, local=True, optional=True, consume=True)
    b = call.material("plain_b", PLAIN_B, nonce, local=True, optional=True, consume=True)
    if (e is None) != (plain is None) or (b is None) != (plain is None):
        raise call.refuse("a plain operand's products take its opened e and its mask b")
    prod = call.material(
        "products", "dealer.tprod", nonce, local=False, optional=True, consume=True
    )
    if prod is not None:
        want = [tn, bits, [list(p) for p in pairs], plain]
        if [list(v) if isinstance(v, list | tuple) else v for v in prod.extra] != want:
            raise call.refuse("the dealer's products are for another batch")
        corr = call.materials(
            "corrections", "dealer.trunc", "the truncations' corrections", local=False,
            consume=True,
        )  # fmt: skip
        if [(lb.nonce, lb.index) for lb in corr] != list(zip(tn, bits)):
            raise call.refuse("the corrections are not those of the batch's truncations")
    return None


@step(rule=_party_rule, size=_party_size, keeps=_batch_keeps(2))
def trunc_products(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    corrections: list[torch.Tensor] | None,
    products: torch.Tensor | None,
    cs: list[torch.Tensor],
    trunc_nonces: list[int],
    bits: list[int],
    offsets: list[int],
    pairs: list[list[int]],
    plain_e: torch.Tensor | None = None,
    plain_b: torch.Tensor | None = None,
    plain_pairs: list[int] | None = None,
) -> list[torch.Tensor]:
    """Party i's shares of each truncated value x_k = (z_k >> f_k) + offset_k (the
    offset, public, in ring units) from its opened c_k, then of each pair's product x_i
    x_j (untruncated), then of each product x_k y with the plain operand y (``plain_e``: the
    opened y - b, ``plain_b``: this party's share of b; ``plain_pairs``: the k's), with
    no opening (module docstring)."""
    shapes = [list(c.shape) for c in cs]
    check_batch(shapes, bits, pairs, len(trunc_nonces))
    e, mask = plain_e, plain_b
    if (e is None) != (plain_pairs is None) or (mask is None) != (plain_pairs is None):
        raise ValueError("a plain operand's products take its opened e and its mask b")
    if e is not None and mask is not None:
        if e.shape != mask.shape:
            raise ValueError(f"e {list(e.shape)} and b {list(mask.shape)} differ in shape")
        check_plain(shapes, list(e.shape), plain_pairs)
    if not (
        isinstance(offsets, list)
        and len(offsets) == len(bits)
        and all(type(o) is int and -(1 << 62) <= o < 1 << 62 for o in offsets)
    ):
        raise ValueError("one int offset per truncation, below 2^62")
    if corrections is not None and len(corrections) != len(bits):
        raise ValueError("one correction per truncation")
    consume(ctx, [seed], nonce, TAG_C)
    for tn in trunc_nonces:
        consume(ctx, [seed], tn, TAG_U, TAG_D)
    xs, ps, ms, us, ds = [], [], [], [], []
    for k, (tn, c, b) in enumerate(zip(trunc_nonces, cs, bits)):
        if corrections is None:
            u = derive(seed, tn, TAG_U, list(c.shape))
            s = derive(seed, tn, TAG_D, list(c.shape))
        else:
            u, s = unpack_trunc_correction(corrections[k], list(c.shape), b)
            s = s.to(torch.int64, copy=True)  # (widened: the dealer's f-bit s_{n-1})
        d = s.bitwise_left_shift_(64 - b)
        m = c >> 63  # all ones where msb(c) = 1
        p = (c >> b).add_(offsets[k])
        x = u + (d & m)
        if first:
            x += p
        xs.append(x)
        ps.append(p)
        ms.append(m)
        us.append(u)
        ds.append(d)
    want = material_words(
        shapes, bits, pairs, list(e.shape) if e is not None else None, plain_pairs
    )
    if products is None:
        material = derive(seed, nonce, TAG_C, [want])
    elif products.dtype != torch.int64 or products.dim() != 1 or products.numel() != want:
        raise ValueError(f"the dealer's products are {want} int64 words")
    else:
        material = products
    out = list(xs)
    at = 0
    for i, j in pairs:
        shape = out_shape(shapes[i], shapes[j])
        n = torch.Size(shape).numel()
        k = terms(bits[i], bits[j])
        t = material[at : at + k * n].view(k, *shape)
        at += k * n
        z = ps[i] * xs[j] + ps[j] * xs[i]
        if first:
            z -= ps[i] * ps[j]
        z += t[0]
        z += t[1] & ms[i]
        z += t[2] & ms[j]
        if k == 4:
            z += t[3] & ms[i] & ms[j]
        out.append(z)
    for i in plain_pairs or []:
        assert e is not None and mask is not None
        shape = out_shape(shapes[i], list(e.shape))
        n = torch.Size(shape).numel()
        t = material[at : at + 2 * n].view(2, *shape)
        at += 2 * n
        z = xs[i] * e + ps[i] * mask  # x e + p [b]
        z += t[0]  # [U b]
        z += t[1] & ms[i]  # m [D b]
        out.append(z)
    return out
