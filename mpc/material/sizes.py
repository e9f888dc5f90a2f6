"""What each registered step allocates, declared from its parameters
(:func:`pointers.worker.functions.sized`): a worker with a storage limit checks it against
the client's limit before the step runs (``serve --max-stored-mb``), so that no call,
however small its message, allocates past the limit. :data:`DECLARED` maps each
registered name to its declaration, and :func:`declare` attaches them (``mpc.material``
does, for its table of functions).

Each peak function takes the call's arguments by parameter name and bounds the bytes one
call allocates at its peak, its outputs included (from the shapes of its tensor arguments
and its shape parameters; int64 words of 8 bytes); ``tests/test_limits_memory.py``
measures every step's peak against its declaration. The keeps functions give what a step
keeps at the worker after it returned: the
``(seed, nonce, stream)`` records of :func:`mpc.material.streams.consume`
(:data:`RECORD_BYTES` each, never freed while the session lives) and the input seeds of
``share_from_seed``.

A malformed shape parameter raises ``ValueError`` naming the parameter (the step itself
would refuse it too); a missing or non-tensor argument counts as one element (the step
refuses it).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.ring import ring_conv2d, ring_matmul
from pointers.worker.functions import SizeFunction, sized

WORD = 8  # bytes of an int64 ring element
RECORD_BYTES = 192  # one (seed, nonce, stream) record (measured: about 170 bytes)
INPUT_SEED_BYTES = 128  # one input seed remembered by share_from_seed
# per call: small tensors, Python objects, the allocator's rounding (a CI machine measured
# 108 KiB for a 1,024-element mpc.trunc_mask, whose tensors are 24 KiB: 64 KiB was too little)
SLACK = 128 << 10
MAX_DIMS = 64


def numel(shape: Any, name: str = "shape") -> int:
    """The element count of a shape parameter (a list of non-negative ints)."""
    if not isinstance(shape, list | tuple) or len(shape) > MAX_DIMS:
        raise ValueError(f"parameter {name!r} is a list of at most {MAX_DIMS} sizes, got {shape!r}")
    n = 1
    for d in shape:
        if type(d) is not int or d < 0:
            raise ValueError(f"parameter {name!r} is a list of non-negative sizes, got {shape!r}")
        n *= d
    return n


def elems(t: Any) -> int:
    """Elements of a tensor argument (1 for anything else: the step refuses it)."""
    return t.numel() if isinstance(t, torch.Tensor) else 1


def nbytes(t: Any) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else WORD


def _tensors(ts: Any) -> list[torch.Tensor]:
    return [t for t in ts if isinstance(t, torch.Tensor)] if isinstance(ts, list | tuple) else []


def _count(seeds: Any) -> int:
    return len(seeds) if isinstance(seeds, list | tuple) else 1


def _shape(t: Any) -> list[int]:
    return list(t.shape) if isinstance(t, torch.Tensor) else [1]


def _int(v: Any, name: str, lo: int, hi: int) -> int:
    """An int parameter clamped to the range the step accepts (it refuses the others)."""
    if type(v) is not int:
        raise ValueError(f"parameter {name!r} is an int, got {type(v).__name__}")
    return min(max(v, lo), hi)


def records(seeds: Any, tags: int) -> int:
    return _count(seeds) * tags * RECORD_BYTES


def _meta(shape: list[int]) -> torch.Tensor:
    return torch.empty(shape, dtype=torch.int64, device="meta")


def bilinear(op: Any, params: Any, a_shape: Any, b_shape: Any) -> tuple[int, int]:
    """(output bytes, temporary bytes) of ``ring_bilinear(op, params, a, b)`` on int64
    operands of these shapes (the output's shape found on the ``meta`` device)."""
    numel(a_shape, "a_shape")
    numel(b_shape, "b_shape")
    a, b = _meta(list(a_shape)), _meta(list(b_shape))
    try:
        if op == "mul":
            return torch.mul(a, b).numel() * WORD, 0
        if op == "matmul":
            out = ring_matmul(a, b, method="int64")
            a2 = list(a_shape) if len(a_shape) > 1 else [1, *a_shape]
            b2 = list(b_shape) if len(b_shape) > 1 else [*b_shape, 1]
            batch = max(out.numel() // max(a2[-2] * b2[-1], 1), 1)
            int64 = batch * (numel(a2[-2:]) + numel(b2[-2:]))
            # the float64 limb method, where this CPU measured it faster (mpc.math.ring.
            # _limbs_pay): three limbs of each operand, the products in float64 and in
            # int64, the sum (and a chunked one's output)
            limbs = 3 * numel(a2) + 3 * numel(b2) + 8 * out.numel()
            return out.numel() * WORD, max(int64, limbs) * WORD
        if op == "conv2d" and isinstance(params, dict):
            out = ring_conv2d(
                a,
                b,
                stride=tuple(params["stride"]),
                padding=tuple(params["padding"]),
                dilation=tuple(params["dilation"]),
                groups=int(params["groups"]),
                method="int64",
            )
            n = a_shape[0] if len(a_shape) == 4 else 1
            taps = numel(list(b_shape)[1:]) * (int(params["groups"]) or 1)
            cols = n * taps * numel(list(out.shape)[-2:])  # im2col's unfolded input
            return out.numel() * WORD, cols * WORD
    except (RuntimeError, ValueError, TypeError, KeyError, IndexError) as e:
        raise ValueError(f"malformed operands of a {op!r} product: {e}") from None
    raise ValueError(f"unknown bilinear op {op!r}")


def _t(p: dict[str, Any], name: str) -> int:
    """Elements of tensor argument ``name`` (1 if it is missing or not a tensor)."""
    return elems(p.get(name))


def _all_bytes(p: dict[str, Any]) -> int:
    """Bytes of every tensor argument, lists of tensors included."""
    total = 0
    for v in p.values():
        if isinstance(v, torch.Tensor):
            total += nbytes(v)
        elif isinstance(v, list | tuple):
            total += sum(nbytes(t) for t in _tensors(v))
    return total


def _largest(p: dict[str, Any]) -> int:
    """Elements of the largest tensor argument, lists of tensors included."""
    n = 1
    for v in p.values():
        for t in [v] if isinstance(v, torch.Tensor) else _tensors(v):
            n = max(n, t.numel())
    return n


def _keeps(tags: int) -> Any:
    """The records of ``tags`` streams of each seed the step consumes."""

    def keeps(p: dict[str, Any]) -> int:
        return records(p.get("seeds", p.get("seed")), tags)

    return keeps


def _elementwise(k: int, name: str) -> Any:
    """``k`` int64 tensors of the size of argument ``name``."""

    def peak(p: dict[str, Any]) -> int:
        return k * WORD * _t(p, name) + SLACK

    return peak


# -- the dealer ----------------------------------------------------------------------------


def dealer_triple(p: dict[str, Any]) -> int:
    a_shape, b_shape = p.get("a_shape"), p.get("b_shape")
    out, temp = bilinear(p.get("op"), p.get("params"), a_shape, b_shape)
    ea, eb = numel(a_shape, "a_shape"), numel(b_shape, "b_shape")
    return 2 * WORD * (ea + eb) + 3 * out + temp + SLACK


def dealer_trunc(p: dict[str, Any]) -> int:
    return 8 * WORD * numel(p.get("shape")) + SLACK


def _selected(p: dict[str, Any]) -> int:
    nonces = p.get("product_nonces")
    return min(len(nonces), 16) if isinstance(nonces, list) else 0


def dealer_compare(p: dict[str, Any]) -> int:
    group = 30 if p.get("group_nonce") is not None else 0  # (groups of four: group4.py)
    # (per element of [G, 6]: 180 words a group for 44 terms; [G, 10]: 300 for 104)
    return (2 * _selected(p) + 64 + group) * WORD * numel(p.get("shape")) + SLACK


def dealer_compare_keeps(p: dict[str, Any]) -> int:
    levels = p.get("level_nonces")
    n_levels = min(len(levels), 16) if isinstance(levels, list) else 0
    return records(p.get("seeds"), 5 + 3 * n_levels + 2 * _selected(p))


def _terms(p: dict[str, Any]) -> int:
    if "terms" in p:
        return _int(p["terms"], "terms", 1, 1 << 12)
    sin = p.get("sin")
    return min(len(sin), 1 << 12) if isinstance(sin, list) else 1


def dealer_fourier(p: dict[str, Any]) -> int:
    return (8 * _terms(p) + 6) * WORD * numel(p.get("shape")) + SLACK


# -- the parties ---------------------------------------------------------------------------


def derive(p: dict[str, Any]) -> int:
    return WORD * numel(p.get("shape")) + SLACK


def beaver_mask(p: dict[str, Any]) -> int:
    return 3 * WORD * (_t(p, "x") + _t(p, "y")) + SLACK


def beaver_combine(p: dict[str, Any]) -> int:
    out, temp = bilinear(p.get("op"), p.get("params"), _shape(p.get("a")), _shape(p.get("y")))
    return 3 * out + temp + SLACK


def fourier_finish(p: dict[str, Any]) -> int:
    return (8 * _terms(p) + 6) * WORD * _t(p, "c") + SLACK


def comparison_step(p: dict[str, Any]) -> int:
    """A carry-tree step (cmp_init, carry_step): a few copies of everything it is given,
    and of the largest of them."""
    return 4 * _all_bytes(p) + 128 * WORD * _largest(p) + SLACK


def cmp_bit_mask(p: dict[str, Any]) -> int:
    return WORD * (6 * _t(p, "top") + 2 * _t(p, "g")) + SLACK


def dabit_product(p: dict[str, Any]) -> int:
    return 3 * WORD * max(_t(p, "t"), _t(p, "e")) + SLACK


def cmp_select_finish(p: dict[str, Any]) -> int:
    shapes = [_shape(p.get(x)) for x in ("d", "v", "vt")]
    try:
        n = numel(list(torch.broadcast_shapes(*shapes)))
    except RuntimeError as e:
        raise ValueError(f"the shares of a selection do not broadcast: {e}") from None
    return 6 * WORD * n + SLACK


def bilinear_public(p: dict[str, Any]) -> int:
    share, public = _shape(p.get("share")), _shape(p.get("public"))
    first, second = (public, share) if p.get("public_first") is True else (share, public)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 2 * out + temp + SLACK


def pack(p: dict[str, Any]) -> int:
    return 2 * _all_bytes(p) + SLACK


def open_unpack(p: dict[str, Any]) -> int:
    sizes = [nbytes(t) for t in _tensors(p.get("pieces"))]
    return sum(sizes) + 2 * max(sizes, default=0) + SLACK


def release_sum(p: dict[str, Any]) -> int:
    ts = _tensors(p.get("parts"))
    return 2 * (nbytes(ts[0]) if ts else WORD) + SLACK


def share_update(p: dict[str, Any]) -> int:
    n = _int(p.get("n_shares"), "n_shares", 2, 5)
    update = p.get("update")
    return (n + 5) * WORD * elems(update) + 2 * nbytes(update) + SLACK


def group_select(p: dict[str, Any]) -> int:
    """The max of groups of four: the daBits' products ([G, 44] derived or viewed; [G, 104]
    after a ReLU, d [G, 10]), the expansion's coefficients and terms (a few [G] words per
    product)."""
    groups = elems(p.get("a")) // 4 + 1
    per = 160 if elems(p.get("d")) <= 6 * groups else 200  # (measured 127 at 2^18)
    return per * WORD * groups + SLACK


def dealer_weight(p: dict[str, Any]) -> int:
    return 3 * WORD * numel(p.get("shape")) + SLACK


def dealer_weight_triple(p: dict[str, Any]) -> int:
    x_shape, b = p.get("x_shape"), _shape(p.get("b"))
    first, second = (b, x_shape) if p.get("w_first") is True else (x_shape, b)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 2 * WORD * numel(x_shape, "x_shape") + 3 * out + temp + SLACK


def weight_product(p: dict[str, Any]) -> int:
    x, w = _shape(p.get("a")), _shape(p.get("w"))
    first, second = (w, x) if p.get("w_first") is True else (x, w)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 3 * out + 2 * temp + SLACK


def _twice_fixed(p: dict[str, Any]) -> int:
    return 2 * SLACK  # (new_seed: measured 68 KiB at its peak once, over one SLACK)


def _fixed(p: dict[str, Any]) -> int:
    return SLACK


# registered name -> (peak, keeps)
DECLARED: dict[str, tuple[SizeFunction, SizeFunction | int]] = {
    "mpc.new_seed": (_twice_fixed, 0),
    "mpc.dealer_triple": (dealer_triple, _keeps(3)),
    "mpc.dealer_trunc": (dealer_trunc, _keeps(3)),
    "mpc.dealer_compare": (dealer_compare, dealer_compare_keeps),
    "mpc.dealer_fourier": (dealer_fourier, _keeps(2)),
    "mpc.derive": (derive, _keeps(1)),
    "mpc.beaver_mask": (beaver_mask, _keeps(2)),
    "mpc.beaver_combine": (beaver_combine, _keeps(1)),
    "mpc.trunc_mask": (_elementwise(3, "z"), _keeps(1)),
    "mpc.trunc_finish": (_elementwise(5, "c"), _keeps(2)),
    "mpc.bilinear_public": (bilinear_public, 0),
    "mpc.fourier_finish": (fourier_finish, _keeps(1)),
    "mpc.cmp_mask": (_elementwise(3, "x"), _keeps(1)),
    "mpc.cmp_init": (comparison_step, _keeps(4)),
    "mpc.carry_step": (comparison_step, _keeps(3)),
    "mpc.cmp_bit_mask": (cmp_bit_mask, _keeps(1)),
    "mpc.cmp_bit_finish": (_elementwise(5, "d"), _keeps(1)),
    "mpc.dabit_mask": (_elementwise(3, "v"), _keeps(1)),
    "mpc.dabit_product": (dabit_product, _keeps(1)),
    "mpc.cmp_select_finish": (cmp_select_finish, 0),
    "mpc.share_from_seed": (derive, INPUT_SEED_BYTES),
    "mpc.pack": (pack, 0),
    "mpc.unpack": (_fixed, 0),  # views of the packed tensor
    "mpc.open_unpack": (open_unpack, 0),
    "mpc.release_sum": (release_sum, 0),
    "mpc.group_mask": (_elementwise(3, "a"), _keeps(1)),
    "mpc.group_select": (group_select, _keeps(2)),
    "mpc.secagg.share_update": (share_update, 0),
    "mpc.dealer_weight": (dealer_weight, _keeps(1)),
    "mpc.dealer_weight_triple": (dealer_weight_triple, _keeps(2)),
    "mpc.weight_mask": (_elementwise(3, "w"), _keeps(1)),
    "mpc.weight_product_mask": (_elementwise(3, "x"), _keeps(1)),
    "mpc.weight_product": (weight_product, _keeps(1)),
}


def declare(functions: dict[str, Any]) -> None:
    """Attach the declaration of :data:`DECLARED` to each function of ``functions`` named
    there (:func:`pointers.worker.functions.sized`)."""
    for name, fn in functions.items():
        spec = DECLARED.get(name)
        if spec is not None:
            sized(*spec)(fn)


# -- the comparison by function secret sharing (mpc.material.fss) -----------------------

DCF_CHUNK_BYTES = 4 << 20  # the DCF's level loop: one chunk's temporaries (mpc.math.dcf)


def _fss_words(p: dict[str, Any], n: int) -> int:
    """Words of the correction words of ``n`` elements' keys (3 per compared bit)."""
    bits = _int(p.get("bits"), "bits", 2, 64)
    return (3 * (bits - 1) + 1) * n


def dealer_fss(p: dict[str, Any]) -> int:
    """The correction words once (one object for both parties) and half again for the
    copies on the way (measured: 1.14 times the correction words of a max-pool's 98,304
    comparisons, all included, where it was 2.15 while the last party's copy was packed
    with its share of u; tests/test_mpc_fss_costs.py), the mask, roots and payloads (a few
    words an element) and the selections."""
    n = numel(p.get("shape"))
    group = 30 if p.get("group_nonce") is not None else 0
    extra = (2 * _selected(p) + 24 + group) * n
    return WORD * (3 * _fss_words(p, n) // 2 + extra) + DCF_CHUNK_BYTES + SLACK


def dealer_fss_keeps(p: dict[str, Any]) -> int:
    return records(p.get("seeds"), 4 + 2 * _selected(p) + 3)


def fss_eval(p: dict[str, Any]) -> int:
    """The root seeds, the input's low bits, the output and its terms (a few words an
    element) and one chunk of the level loop."""
    return 12 * WORD * _t(p, "c") + DCF_CHUNK_BYTES + SLACK


DECLARED.update(
    {
        "mpc.dealer_fss": (dealer_fss, dealer_fss_keeps),
        "mpc.fss_unpack": (_fixed, 0),  # views of the packed key
        "mpc.fss_eval": (fss_eval, _keeps(2)),
    }
)


# -- products of truncated values (mpc.material.tprod) ---------------------------------


def _pair_elems(shapes: list[list[int]], pairs: Any) -> int:
    """Elements of the products of ``pairs`` (index pairs into ``shapes``)."""
    if not isinstance(pairs, list) or len(pairs) > 64:
        raise ValueError("parameter 'pairs' is a list of at most 64 index pairs")
    total = 0
    for pair in pairs:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise ValueError("parameter 'pairs' is a list of index pairs")
        i, j = (_int(k, "pairs", 0, len(shapes) - 1) for k in pair)
        try:
            total += torch.broadcast_shapes(tuple(shapes[i]), tuple(shapes[j])).numel()
        except RuntimeError as e:
            raise ValueError(f"the shapes of a pair do not broadcast: {e}") from None
    return total


def dealer_trunc_products(p: dict[str, Any]) -> int:
    """Each truncation's mask, U and D, and per product element its four terms (twice:
    the parts and their concatenation), the others' derived shares and their temporaries
    (measured: 117.4 MB for a softmax over 1024 x 1024, where 10 words an element
    declared 117.6)."""
    shapes = p.get("shapes")
    if not isinstance(shapes, list) or not 1 <= len(shapes) <= 64:
        raise ValueError("parameter 'shapes' is a list of 1 to 64 shapes")
    values = sum(numel(s, "shapes") for s in shapes)
    return WORD * (6 * values + 16 * _pair_elems(shapes, p.get("pairs"))) + SLACK


def trunc_products(p: dict[str, Any]) -> int:
    """Per truncation a few of its elements (U, s, D, m, p, x), per product element the
    material's four terms and the product's temporaries."""
    cs = _tensors(p.get("cs"))
    if not cs:
        return SLACK
    shapes = [list(c.shape) for c in cs]
    values = sum(c.numel() for c in cs)
    return WORD * (8 * values + 10 * _pair_elems(shapes, p.get("pairs"))) + SLACK


def _batch_keeps(per_value: int) -> Any:
    def keeps(p: dict[str, Any]) -> int:
        tn = p.get("trunc_nonces")
        values = min(len(tn), 64) if isinstance(tn, list) else 1
        return records(p.get("seeds", p.get("seed")), 1 + per_value * values)

    return keeps


DECLARED.update(
    {
        "mpc.dealer_trunc_products": (dealer_trunc_products, _batch_keeps(1)),
        "mpc.trunc_products": (trunc_products, _batch_keeps(2)),
    }
)
