"""The max of groups of four values, the client's side (the steps:
:mod:`mpc.protocols.max_of_four.steps`; the math: :mod:`mpc.math.groups_of_four`)."""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import groups_of_four
from mpc.protocols import pieces
from mpc.protocols.compare import comparison_run, in_pieces
from mpc.protocols.parties import Shares
from mpc.protocols.truncation.run import TruncRun
from mpc.session import Session

# column c: +1 at PAIRS[c][0], -1 at PAIRS[c][1]: groups [G, 4] @ this = the six differences
_PAIR_DIFFERENCES = torch.tensor(
    [[(k == i) - (k == j) for i, j in groups_of_four.PAIRS] for k in range(4)], dtype=torch.int64
)
# after a ReLU: the six differences, then the four values (msb(a_i) = [a_i < 0])
_PAIRS_AND_VALUES = torch.cat([_PAIR_DIFFERENCES, torch.eye(4, dtype=torch.int64)], dim=1)


def max_of_four(
    session: Session, groups: Shares, onehot: bool = False, relu: bool = False, pending: int = 0
) -> Any:
    """[max] of each group of four values (``groups``: [G, 4] shares), and with
    ``onehot`` its one-hot argmax ([G, 4] shared 0/1 integers, first index on ties), in one
    comparison's 4 rounds: the six pairwise comparisons at once, the selection riding on
    their daBits (:mod:`mpc.math.groups_of_four`). A pairwise tree takes two comparisons'
    rounds.

    ``relu``: the max of 0 and the four, max(relu(a_0), .., relu(a_3)), in the same run
    (the four values' own comparisons join the six: :data:`mpc.math.groups_of_four.RELU`),
    where a ReLU and then the max took two runs. ``pending``: of the groups truncated by
    that many bits (a product not yet truncated, as
    :func:`mpc.protocols.compare.relu_truncating`: the comparisons run on the product, the
    truncation opens in round 1 and the truncated values' masked opening rides on round 2)."""
    if onehot and relu:
        raise ValueError("max_of_four: the one-hot argmax is of the values, not of a ReLU's")
    rows = int(groups[0].shape[0])
    k = in_pieces(session, [rows, 10 if relu else 6], grouped=True)
    if k > 1:  # (an operand too big for one run: in pieces of its groups)
        parts = pieces.split(groups, k, True)
        runs = pieces.each(session, parts, lambda p: max_of_four(session, p, onehot, relu, pending))
        best = pieces.join([r[0] for r in runs])
        return best, (pieces.join([r[1] for r in runs]) if onehot else None)
    # x_c = a_i - a_j (msb(x_c) = [a_i < a_j]) for all six pairs: one product by a public
    # matrix of 1, -1 and 0 at each party (exact in the ring), not 18 ops and a stack
    matrix = _PAIRS_AND_VALUES if relu else _PAIR_DIFFERENCES
    x = [g @ matrix for g in groups]
    trunc = TruncRun(session, groups, pending) if pending else None
    run = comparison_run(session, x, [], trunc=trunc, group=groups)  # type: ignore[arg-type]
    return run.finish_group(onehot)


__all__ = ["max_of_four"]
