"""A ReLU whose comparisons wait for the first read of its shares, so that a max-pool of
it pools first: max(relu(a_1), .., relu(a_k)) = relu(max(a_1, .., a_k)), exactly (both
are selections of the same ring values). LeNet's ReLU then max-pool (2x2) compares each
window's four values in a tree (3 comparisons) and takes one ReLU, where the ReLU of every
value first took 4 more; the rounds are the same (the ReLU's round moves after the
tree's).

Any other read of the shares (``get()``, any op, :meth:`DeferredRelu.materialize`) runs
the ReLU as it ran before. The authenticated mode has no in-place ops, so the source that
the ReLU reads cannot change before it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

import pointers as pt
from mpc.authenticated.tensor import AuthenticatedTensor


class DeferredRelu(AuthenticatedTensor):
    """relu(source) (``run(source)``), run at the first read of its shares."""

    _source: AuthenticatedTensor | None
    _run: Callable[[AuthenticatedTensor], AuthenticatedTensor]
    _shares: list[pt.PointerTensor] | None

    @staticmethod
    def __new__(  # type: ignore[override]
        cls,
        source: AuthenticatedTensor,
        run: Callable[[AuthenticatedTensor], AuthenticatedTensor],
    ) -> DeferredRelu:
        if source.pending:
            raise ValueError("internal: a deferred ReLU reads a source at one scale")
        t = torch.Tensor._make_wrapper_subclass(
            cls, tuple(source.shape), dtype=source.dtype, device=source.device, requires_grad=False
        )
        t._source, t._run, t._shares = source, run, None
        t.session, t.frac_bits, t.pending = source.session, source.frac_bits, 0
        return t

    @property  # type: ignore[override]
    def shares(self) -> list[pt.PointerTensor]:
        if self._shares is None:
            assert self._source is not None
            out = self._run(self._source)
            self._shares, self._source = out.shares, None
        return self._shares

    @shares.setter
    def shares(self, value: list[pt.PointerTensor]) -> None:
        self._shares, self._source = value, None

    def source(self) -> AuthenticatedTensor | None:
        """The ReLU's input while it has not run (None once it has)."""
        return self._source if self._shares is None else None

    def materialize(self) -> AuthenticatedTensor:
        """Run the ReLU now (a benchmark's or a caller's way to force it)."""
        _ = self.shares
        return self


def relu_source(x: Any) -> AuthenticatedTensor | None:
    """x's ReLU input if x is a ReLU that has not run yet, else None."""
    return x.source() if isinstance(x, DeferredRelu) else None
