"""The functions every worker of an mpc session runs: every protocol step, by the name the
wire carries, built from the steps' declarations (:func:`mpc.protocols.step.step`).

:data:`FUNCTIONS` is what :class:`mpc.Session` registers with in-process workers and what a
served worker loads (the ``pointers.worker_functions`` entry point ``mpc``);
:data:`MAKES_MATERIAL` names the steps whose outputs are protocol material (sealed at the
workers). A new protocol's step module joins :data:`STEP_MODULES`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mpc.material import sizes
from mpc.material.held import FUNCTIONS as HELD_FUNCTIONS
from mpc.material.owned import release_sum
from mpc.protocols.auth_beaver import steps as auth_beaver
from mpc.protocols.auth_comparison import steps as auth_comparison
from mpc.protocols.auth_fss import steps as auth_fss
from mpc.protocols.auth_local import steps as auth_local
from mpc.protocols.auth_opening import steps as auth_opening
from mpc.protocols.auth_shares import steps as auth_shares
from mpc.protocols.auth_truncation import steps as auth_truncation
from mpc.protocols.auth_weights import steps as auth_weights
from mpc.protocols.beaver import steps as beaver
from mpc.protocols.comparison import arith as comparison_arith
from mpc.protocols.comparison import arith_select as comparison_arith_select
from mpc.protocols.comparison import selection
from mpc.protocols.comparison import steps as comparison
from mpc.protocols.digit_compare import steps as digit_compare
from mpc.protocols.fourier import steps as fourier
from mpc.protocols.fss import relu as fss_relu
from mpc.protocols.fss import steps as fss
from mpc.protocols.fss import trunc_select as fss_trunc_select
from mpc.protocols.low_bits import steps as low_bits
from mpc.protocols.mac_check import steps as mac_check
from mpc.protocols.max_of_four import steps as max_of_four
from mpc.protocols.opening import steps as opening
from mpc.protocols.rank_select import steps as rank_select
from mpc.protocols.seeds import steps as seeds
from mpc.protocols.series_product import steps as series_product
from mpc.protocols.step import making_material, table
from mpc.protocols.truncated_products import steps as truncated_products
from mpc.protocols.truncation import steps as truncation
from mpc.protocols.weights import steps as weights

#: the modules that define protocol steps
STEP_MODULES = (
    seeds,
    opening,
    beaver,
    truncation,
    low_bits,
    rank_select,
    comparison,
    comparison_arith,
    comparison_arith_select,
    digit_compare,
    selection,
    max_of_four,
    fourier,
    series_product,
    truncated_products,
    weights,
    fss,
    fss_relu,
    fss_trunc_select,
    # the authenticated mode (security="malicious")
    auth_shares,
    auth_local,
    auth_opening,
    mac_check,
    auth_beaver,
    auth_truncation,
    auth_comparison,
    auth_fss,
    auth_weights,
)

FUNCTIONS: dict[str, Callable[..., Any]] = {
    **table(STEP_MODULES),
    # the steps of modules that declare them by hand (a model owner's, an owner's release)
    **HELD_FUNCTIONS,
    "mpc.release_sum": release_sum,
}
sizes.declare(FUNCTIONS)

#: the steps whose outputs are protocol material (sealed at the workers)
MAKES_MATERIAL = making_material(FUNCTIONS)

__all__ = ["FUNCTIONS", "MAKES_MATERIAL", "STEP_MODULES"]
