"""PySyft 0.2 compatible names on shared tensors (see pointers.compat, docs/coming-from-pysyft.md).

* ``share(..., protocol="fss" | "snn")``: PySyft's two comparison protocols. Both names run
  our comparison protocol (one protocol, its rounds and bytes in docs/secret-sharing.md);
  any other value is refused before anything is shared.
* ``x.fix_precision().share(...)``: a :class:`pointers.FixedPrecisionTensor` (or a model
  marked by ``model.fix_precision()``) is shared with the fractional bits it carries.
* ``x_ptr.share(...)`` / ``x_ptr.fix_precision().share(...)``: :func:`share_remote`, the
  worker holding the value splits it (the client never sees it).
* ``shared.copy()``: a new sharing of the same value (the parties copy their shares):
  :meth:`mpc.shared.SharedTensor.copy`.
* ``shared.max(dim=0)``: torch's (values, indices) pair of shared tensors; its ``.get()``
  gives the values, as PySyft's ``shared.max(dim=0).get()`` did (``.indices.get()`` the
  indices): :meth:`mpc.shared.SharedTensor.max`.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.errors import MPCError
from mpc.shared import SharedTensor
from pointers.compat import FixedPrecisionTensor, precision_of
from pointers.pointer_tensor import PointerTensor
from pointers.pointer_tensor import call_function as pt_call_function

#: PySyft 0.2's ``protocol=`` values: "fss" with 2 parties runs the comparison by function
#: secret sharing (``MPCConfig(comparison="fss")``), otherwise the default comparison
PROTOCOLS = ("fss", "snn")


def check_protocol(protocol: Any) -> None:
    """Accept PySyft's ``protocol=`` names; refuse others with a clear error."""
    if protocol is None or protocol in PROTOCOLS:
        return
    raise MPCError(
        f"protocol={protocol!r} is not implemented: PySyft's 'fss' (function secret sharing "
        "with 2 parties) and 'snn' are accepted, or leave protocol out"
    )


def unwrap_fixed_precision(x: Any, frac_bits: int | None) -> tuple[Any, int | None]:
    """A fixed-precision tensor or marked model as (what to share, its fractional bits)."""
    bits = precision_of(x)
    if bits is None:
        return x, frac_bits
    if isinstance(x, FixedPrecisionTensor) and not x.float_dtype.is_floating_point:
        return x.float_precision(), frac_bits  # integers are shared exactly
    if frac_bits is not None and frac_bits != bits:
        raise MPCError(
            f"the value is in fixed precision with {bits} fractional bits, but frac_bits="
            f"{frac_bits} was asked for"
        )
    if isinstance(x, FixedPrecisionTensor):
        x = x.float_precision()  # exact: share() encodes it again with the same bits
    if isinstance(x, PointerTensor):
        x = x.detach()  # the unmarked pointer
    return x, bits


def share_remote(
    x: PointerTensor, session: Any, frac_bits: int | None, requires_grad: bool = False
) -> SharedTensor:
    """PySyft's ``x_ptr.share(...)`` (Part 10): the worker holding ``x`` encodes it in
    fixed point and splits it into one additive share per party with its own CSPRNG
    (:func:`mpc.secure_aggregation.share_update`), then delivers each share to its party,
    party to party. The client never holds the value nor a share; the worker keeps the
    original (and a share only if it is a party). The value opens only inside an
    aggregate of at least two owners' values (``(a + b).get()``, its release rule,
    :mod:`mpc.release`); a data owner's own data (:mod:`pointers.worker.owners`) is shared
    this way only if its owner's count is 1 (its weight here), into the session's round."""
    from mpc.release import MIN_OWNERS, owned
    from mpc.secure_aggregation import SHARE_FUNCTION, install, update_bound

    if not x.is_floating_point():
        raise MPCError(
            f"sharing a remote tensor shares floats in fixed point; this one is {x.dtype} "
            "(get() it and share it, or convert it with .float() first)"
        )
    x._ref.check()
    if x._ref.chain is not None:
        raise MPCError("sharing a pointer chain is not supported: get() one hop first")
    f = session.config.frac_bits if frac_bits is None else frac_bits
    worker = x.location
    install(worker)
    session.watch()
    shape = tuple(x.shape)
    shares = pt_call_function(
        worker,
        SHARE_FUNCTION,
        [x, f, session.n, update_bound(f, 1), 1, MIN_OWNERS, session.round],
        out=[(shape, torch.int64)] * session.n,
    )
    moved = [s.move(p) for s, p in zip(shares, session.parties)]  # type: ignore[union-attr]
    if requires_grad:
        raise MPCError(
            "a value shared by its owner at its worker opens only inside an aggregate of "
            "owners' values (its release rule): it cannot be trained on"
        )
    return owned(moved, session, f, x.dtype, worker.id, MIN_OWNERS)
