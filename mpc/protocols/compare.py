"""Comparisons of shared values in the session's mode: the most significant bit, and the
selections that ride on it (ReLU, the max of two values, |x|).

Two modes (the session's ``comparison``): the carry tree (``"default"``, any number of
parties, 4 rounds, 3 up to the session's ``three_round_up_to`` elements:
:class:`mpc.protocols.comparison.run.CarryRun`) and function secret
sharing (``"fss"``, 2 parties, 1 round for the bit and 2 with selections:
:class:`mpc.protocols.fss.run.FssRun`). Both share the selections' steps and local
last steps (:mod:`mpc.protocols.comparison.base`).
"""

from __future__ import annotations

import math

import torch

from mpc.errors import MPCError
from mpc.protocols import pieces
from mpc.protocols.comparison.base import ComparisonRun, Late
from mpc.protocols.comparison.run import CarryRun, three_rounds
from mpc.protocols.comparison.steps import dealer_compare
from mpc.protocols.digit_compare.run import digit_msb, digits_fit
from mpc.protocols.fss import run as fss
from mpc.protocols.fss.relu import dealer_fss_relu
from mpc.protocols.fss.steps import dealer_fss
from mpc.protocols.parties import Shares
from mpc.protocols.truncation.run import TruncRun
from mpc.session import Session

#: the comparison run of each mode (the session's ``config.comparison``)
MODES: dict[str, type[ComparisonRun]] = {"default": CarryRun, "fss": fss.FssRun}


def comparison_run(
    session: Session,
    x: Shares,
    values: list[Shares],
    trunc: Late | None = None,
    group: Shares | None = None,
    bits: list[int] | None = None,
) -> ComparisonRun:
    """The comparison run of the session's mode (:data:`MODES`) on ``x``, selecting
    ``values`` (and a pending truncation's result, or groups of four); ``bits``: each
    selected value's truncation in its selection (:func:`truncating_fits`)."""
    mode = session.config.comparison
    run = MODES.get(mode)
    if run is None:
        raise MPCError(f"no comparison protocol {mode!r}: use one of {sorted(MODES)}")
    if bits is not None:
        selecting = fss.FssRun if mode == "fss" else CarryRun
        return selecting(session, x, values, trunc=trunc, group=group, bits=bits)
    return run(session, x, values, trunc=trunc, group=group)


def in_pieces(
    session: Session,
    shape: list[int],
    selected: int = 0,
    grouped: bool = False,
    truncated: int = 0,
) -> int:
    """How many pieces a comparison of ``shape`` (with ``selected`` products, of groups
    of four; ``truncated`` of the selected values truncated in their selection) runs in:
    its dealer's step, the run's largest, declares at most :data:`mpc.config.STEP_BYTES`
    a piece (:mod:`mpc.protocols.pieces`)."""
    fss_mode = session.config.comparison == "fss"
    params = {
        "shape": list(shape),
        "product_nonces": [0] * selected,
        "product_bits": [1] * truncated + [0] * (selected - truncated),
        "group_nonce": 0 if grouped else None,
        "select": selected > 0 or grouped,
        "bits": session.config.fss_bits,
        "arith": three_rounds(session, math.prod(shape), grouped),
    }
    rows = shape[0] if grouped else math.prod(shape)
    return pieces.count(dealer_fss if fss_mode else dealer_compare, params, rows)


def comparison_rounds(
    session: Session, elements: int, selected: bool = False, grouped: bool = False
) -> int:
    """The rounds of one comparison run of ``elements`` compared elements in the session's
    mode: with FSS 1 for the bit, 2 with selections or groups of four; by default 3 up to
    the session's ``three_round_up_to`` elements (not for groups of four), else 4; the
    bit alone (not ``selected``, not ``grouped``) 2 up to ``two_round_up_to`` compared
    values (:mod:`mpc.protocols.digit_compare`). (A run too big for one piece,
    :func:`in_pieces`, pays its rounds once a piece: not counted.)"""
    if session.config.comparison == "fss":
        return 2 if selected or grouped else 1
    if not (selected or grouped) and digits_fit(session, elements):
        return 2
    return 3 if three_rounds(session, elements, grouped) else 4


def msb(session: Session, x: Shares) -> Shares:
    """[msb(x)] as arithmetic shares of 0/1 (1 where x is negative). 4 rounds (3 up to
    the session's ``three_round_up_to`` elements, where the carry tree's last level gives
    additive shares: :mod:`mpc.protocols.comparison.arith`; 1 with the session option
    ``comparison="fss"``: :mod:`mpc.protocols.fss`); an operand too big
    for one run runs in pieces (:func:`in_pieces`), each piece its rounds. 2 rounds by
    digit look-ups up to the session's ``two_round_up_to`` elements
    (:mod:`mpc.protocols.digit_compare`)."""
    shape = list(x[0].shape)
    if digits_fit(session, math.prod(shape)):
        return digit_msb(session, x)
    k = in_pieces(session, shape)
    if k > 1:
        return pieces.join(
            pieces.each(session, pieces.split(x, k), lambda p: msb(session, p)), shape
        )
    return comparison_run(session, x, []).finish_bit()


def msb_thresholds(session: Session, x: Shares, thresholds: list[int]) -> Shares:
    """[msb(x - theta_k)] for public ring values theta_k, stacked [T, *x] (3 or 4 rounds
    as :func:`msb`; 1 with FSS), in one comparison run whose T comparisons of an element share its mask r: one
    opening of c = x + r an element, not T (the tree's openings and the daBits stay one
    a comparison; with FSS, one key an element, evaluated at its T points). Where one run
    would not fit a piece: the stacked differences x - theta_k. 2 rounds by digit
    look-ups up to the session's ``two_round_up_to`` compared values (T elements an
    element of x: :mod:`mpc.protocols.digit_compare`)."""
    shape = [len(thresholds), *x[0].shape]
    if digits_fit(session, math.prod(shape)):
        return digit_msb(session, x, list(thresholds))
    if in_pieces(session, shape) > 1:
        enc = torch.tensor(thresholds, dtype=torch.int64).view([-1] + [1] * x[0].dim())
        stacked = [s.unsqueeze(0).repeat([len(thresholds)] + [1] * s.dim()) for s in x]
        stacked[0] = stacked[0] - enc
        return msb(session, stacked)
    mode = MODES.get(session.config.comparison)
    if mode is None:
        raise MPCError(f"no comparison protocol {session.config.comparison!r}")
    return mode(session, x, [], thresholds=thresholds).finish_bit()


def select_by_msb(
    session: Session, x: Shares, values: list[Shares], complement: bool = False
) -> list[Shares]:
    """[v * msb(x)] for each v (``complement``: [v * (1 - msb(x))]), in 4 rounds (3 up to
    ``three_round_up_to`` elements; 2 with ``comparison="fss"``).

    The products ride on the daBit: with d = msb(x) ^ t opened in the last round,
    msb(x) = d + (1 - 2d) t, so v * msb(x) = d v + (1 - 2d) [v t]; the Beaver product
    [v t] is opened in round 1, together with c. ReLU is x * (1 - msb(x)), the max of a
    and b is b + (a - b) msb(b - a): both cost exactly one comparison's rounds (an
    operand too big for one run: in pieces, :func:`in_pieces`).
    """
    shape = list(x[0].shape)
    k = in_pieces(session, shape, len(values))
    if k > 1:
        parts = [pieces.split(v, k) for v in [x, *values]]
        runs = pieces.each(
            session, zip(*parts), lambda p: select_by_msb(session, p[0], list(p[1:]), complement)
        )
        return [pieces.join(list(col), shape) for col in zip(*runs)]
    return comparison_run(session, x, values).finish_select(complement)


def late_fits(session: Session, shape: list[int], selected: int, truncated: bool = False) -> bool:
    """Whether a comparison of ``shape`` with ``selected`` values and a late one
    (:func:`select_late`; ``truncated``: all of them truncated in their selection) runs
    in one piece."""
    count = selected + 1
    return in_pieces(session, shape, count, truncated=count if truncated else 0) == 1


def truncating_fits(session: Session, shape: list[int], selected: int) -> bool:
    """Whether a comparison of ``shape`` selecting ``selected`` values and a late one can
    truncate them in their selection (:func:`select_late` with ``bits``): the default
    mode's arithmetic last level (3 rounds, up to ``three_round_up_to`` elements) or the
    FSS comparison's daBit (2 rounds, :mod:`mpc.protocols.fss.trunc_select`),
    semi-honest, in one piece."""
    config = session.config
    if config.security != "semi-honest" or not late_fits(session, shape, selected, True):
        return False
    if config.comparison == "fss":
        return True
    return config.comparison == "default" and three_rounds(session, math.prod(shape), False)


def select_late(
    session: Session, x: Shares, values: list[Shares], late: Late, bits: list[int] | None = None
) -> list[Shares]:
    """[v (1 - msb(x))] for each v, then for the value ``late`` yields, in one
    comparison run (4 rounds, 3 up to ``three_round_up_to`` elements, 2 with FSS): the
    late value's opening rides in the comparison's first round and its product with the
    daBit (or its opening for the arithmetic last level) in the next
    (:class:`~mpc.protocols.comparison.base.Late`). For operands :func:`late_fits`.
    ``bits`` (for operands :func:`truncating_fits`): [(v >> bits_k) (1 - msb(x))], each
    value truncated in its selection, the late one's last (no round after the
    comparison's for the truncation)."""
    if not late_fits(session, list(x[0].shape), len(values), bits is not None):
        raise ValueError("internal: a comparison with a late value runs in one piece")
    run = comparison_run(session, x, values, trunc=late, bits=bits)
    return run.finish_select(complement=True)


def relu_truncating(session: Session, z: Shares, bits: int) -> Shares:
    """[relu(z >> bits)] in 4 rounds (3 up to ``three_round_up_to`` elements), for a
    product z not yet truncated.

    The comparison runs on z itself (same sign as z >> bits, up to the one-unit rounding
    of the truncation); the truncation's opening shares the comparison's first round and
    the product (z >> bits) * t opens with the first carry-tree level. This saves the
    round a separate truncation would cost before every ReLU of a linear layer. With
    ``comparison="fss"``: one round where it applies (:func:`mpc.protocols.fss.run.
    relu_truncating`).
    """
    shape = list(z[0].shape)
    k = in_pieces(session, shape, 1)
    if session.config.comparison == "fss":
        params = {"shape": [math.prod(shape)], "f": bits}
        k = max(k, pieces.count(dealer_fss_relu, params, math.prod(shape)))
    if k > 1:
        parts = pieces.each(
            session, pieces.split(z, k), lambda p: relu_truncating(session, p, bits)
        )
        return pieces.join(parts, shape)
    if session.config.comparison == "fss":
        out = fss.relu_truncating(session, z, bits)
        if out is not None:
            return out
    run = comparison_run(session, z, [], trunc=TruncRun(session, z, bits))
    return run.finish_select(complement=True)[0]


def relu_with_mask(session: Session, x: Shares, pending: int = 0) -> tuple[Shares, Shares]:
    """[relu(x)] (``pending``: of x >> pending, as :func:`relu_truncating`) and the
    arithmetic bit [x >= 0] that ReLU's backward multiplies the gradient by, from one
    comparison: the bit is d + (1 - 2d) [t] complemented, local once d is open."""
    shape = list(x[0].shape)
    k = in_pieces(session, shape, 1)
    if k > 1:
        runs = pieces.each(
            session, pieces.split(x, k), lambda p: relu_with_mask(session, p, pending)
        )
        relus, masks = zip(*runs)
        return pieces.join(list(relus), shape), pieces.join(list(masks), shape)
    trunc = TruncRun(session, x, pending) if pending else None
    run = comparison_run(session, x, [] if pending else [x], trunc=trunc)
    (out,) = run.finish_select(complement=True)
    return out, run.finish_mask()


__all__ = [
    "MODES",
    "comparison_rounds",
    "comparison_run",
    "in_pieces",
    "late_fits",
    "msb",
    "relu_truncating",
    "relu_with_mask",
    "select_by_msb",
    "select_late",
    "truncating_fits",
]
