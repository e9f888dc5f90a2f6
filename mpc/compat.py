"""PySyft 0.2 compatible names on shared tensors (see pointers.compat, docs/coming-from-pysyft.md).

* ``share(..., protocol="fss" | "snn")``: PySyft's two comparison protocols. Both names run
  our comparison protocol (one protocol, its rounds and bytes in docs/secret-sharing.md);
  any other value is refused before anything is shared.
* ``x.fix_precision().share(...)``: a :class:`pointers.FixedPrecisionTensor` (or a model
  marked by ``model.fix_precision()``) is shared with the fractional bits it carries.
* ``shared.copy()``: a new sharing of the same value (the parties copy their shares).
* ``shared.max(dim=0)``: values and indices, with ``.get()`` on the pair (PySyft users call
  ``.get()`` on the result).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from mpc.errors import MPCError
from mpc.shared import SharedTensor
from pointers.compat import FixedPrecisionTensor, precision_of

#: PySyft 0.2's ``protocol=`` values; each runs our comparison protocol
PROTOCOLS = ("fss", "snn")


def check_protocol(protocol: Any) -> None:
    """Accept PySyft's ``protocol=`` names; refuse others with a clear error."""
    if protocol is None or protocol in PROTOCOLS:
        return
    raise MPCError(
        f"protocol={protocol!r} is not implemented: PySyft's 'fss' and 'snn' are accepted "
        "(both run this package's comparison protocol), or leave protocol out"
    )


def unwrap_fixed_precision(x: Any, frac_bits: int | None) -> tuple[Any, int | None]:
    """A fixed-precision tensor or marked model as (what to share, its fractional bits)."""
    bits = precision_of(x)
    if bits is None:
        return x, frac_bits
    if frac_bits is not None and frac_bits != bits:
        raise MPCError(
            f"the value is in fixed precision with {bits} fractional bits, but frac_bits="
            f"{frac_bits} was asked for"
        )
    if isinstance(x, FixedPrecisionTensor):
        x = x.float_precision()  # exact: share() encodes it again with the same bits
    return x, bits


class MaxResult(NamedTuple):
    """``shared.max(dim)``: shared values and indices; ``.get()`` reconstructs both."""

    values: Any
    indices: Any

    def get(self) -> Any:
        return torch.return_types.max((self.values.get(), self.indices.get()))


def _shared_max(self: SharedTensor, *args: Any, **kwargs: Any) -> Any:
    out = torch.Tensor.max(self, *args, **kwargs)
    if isinstance(out, tuple):
        return MaxResult(out[0], out[1])
    return out


def _shared_copy(self: SharedTensor) -> SharedTensor:
    """PySyft's ``shared.copy()``: the same value, in new shares at the same parties."""
    return self.clone()


def install() -> None:
    # (a patch over torch's overloaded Tensor.max, whose stub no plain function matches)
    SharedTensor.max = _shared_max  # type: ignore[method-assign, assignment]
    SharedTensor.copy = _shared_copy  # type: ignore[attr-defined]
