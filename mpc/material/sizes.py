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
``(seed, nonce, stream)`` records of :func:`mpc.protocols.streams.consume`
(:data:`RECORD_BYTES` each, never freed while the session lives) and the input seeds of
``share_from_seed``.

A malformed shape parameter raises ``ValueError`` naming the parameter (the step itself
would refuse it too); a missing or non-tensor argument counts as one element (the step
refuses it).
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.protocols.comparison.selection import selected_count
from mpc.protocols.max_of_four.steps import group_words
from mpc.protocols.sizes import (
    SLACK,
    WORD,
    bilinear,
    elems,
    int_param,
    nbytes,
    numel,
    records,
    shape_of,
    tensor_elems,
    tensors,
)
from pointers.worker.functions import SizeFunction, sized

# -- the dealer ----------------------------------------------------------------------------


def _terms(p: dict[str, Any]) -> int:
    if "terms" in p:
        return int_param(p["terms"], "terms", 1, 1 << 12)
    sin = p.get("sin")
    return min(len(sin), 1 << 12) if isinstance(sin, list) else 1


def dealer_fourier(p: dict[str, Any]) -> int:
    return (8 * _terms(p) + 6) * WORD * numel(p.get("shape")) + SLACK


# -- the parties ---------------------------------------------------------------------------


def derive(p: dict[str, Any]) -> int:
    return WORD * numel(p.get("shape")) + SLACK


def fourier_finish(p: dict[str, Any]) -> int:
    return (8 * _terms(p) + 6) * WORD * tensor_elems(p, "c") + SLACK


def release_sum(p: dict[str, Any]) -> int:
    ts = tensors(p.get("parts"))
    return 2 * (nbytes(ts[0]) if ts else WORD) + SLACK


def share_update(p: dict[str, Any]) -> int:
    n = int_param(p.get("n_shares"), "n_shares", 2, 5)
    update = p.get("update")
    return (n + 5) * WORD * elems(update) + 2 * nbytes(update) + SLACK


def dealer_weight(p: dict[str, Any]) -> int:
    return 3 * WORD * numel(p.get("shape")) + SLACK


def dealer_weight_triple(p: dict[str, Any]) -> int:
    x_shape, b = p.get("x_shape"), shape_of(p.get("b"))
    first, second = (b, x_shape) if p.get("w_first") is True else (x_shape, b)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 2 * WORD * numel(x_shape, "x_shape") + 3 * out + temp + SLACK


def weight_product(p: dict[str, Any]) -> int:
    x, w = shape_of(p.get("a")), shape_of(p.get("w"))
    first, second = (w, x) if p.get("w_first") is True else (x, w)
    out, temp = bilinear(p.get("op"), p.get("params"), first, second)
    return 3 * out + 2 * temp + SLACK


def new_seed(p: dict[str, Any]) -> int:
    return 2 * SLACK  # (new_seed: measured 68 KiB at its peak once, over one SLACK)


# the steps declared in modules of others' (registered name -> (peak, keeps))
DECLARED: dict[str, tuple[SizeFunction, SizeFunction | int]] = {
    "mpc.release_sum": (release_sum, 0),
    "mpc.secagg.share_update": (share_update, 0),
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
    bits = int_param(p.get("bits"), "bits", 2, 64)
    return (3 * (bits - 1) + 1) * n


def dealer_fss(p: dict[str, Any]) -> int:
    """The correction words once (one object for both parties) and half again for the
    copies on the way (measured: 1.14 times the correction words of a max-pool's 98,304
    comparisons, all included, where it was 2.15 while the last party's copy was packed
    with its share of u; tests/test_mpc_fss_costs.py), the mask, roots and payloads (a few
    words an element) and the selections."""
    n = numel(p.get("shape"))
    extra = (2 * selected_count(p) + 24 + group_words(p)) * n
    return WORD * (3 * _fss_words(p, n) // 2 + extra) + DCF_CHUNK_BYTES + SLACK


def dealer_fss_keeps(p: dict[str, Any]) -> int:
    return records(p.get("seeds"), 4 + 2 * selected_count(p) + 3)


def fss_eval(p: dict[str, Any]) -> int:
    """The root seeds, the input's low bits, the output and its terms (a few words an
    element) and one chunk of the level loop."""
    return 12 * WORD * tensor_elems(p, "c") + DCF_CHUNK_BYTES + SLACK


# -- products of truncated values (mpc.material.tprod) ---------------------------------


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
    cs = tensors(p.get("cs"))
    if not cs:
        return SLACK
    shapes = [list(c.shape) for c in cs]
    values = sum(c.numel() for c in cs)
    return WORD * (8 * values + 10 * _pair_elems(shapes, p.get("pairs"))) + SLACK


def batch_keeps(per_value: int) -> Any:
    def keeps(p: dict[str, Any]) -> int:
        tn = p.get("trunc_nonces")
        values = min(len(tn), 64) if isinstance(tn, list) else 1
        return records(p.get("seeds", p.get("seed")), 1 + per_value * values)

    return keeps
