"""Release rules: values shared by an owner other than the client open only as the owner
allowed.

A value a worker shares into an aggregation (:func:`mpc.secure_aggregation.share_update`,
run by ``SecureAggregator`` and by PySyft's ``x_ptr.share(...)``) is not the client's to
open. Its shares leave the worker sealed, labelled with the worker, its rule, where the
value came from (a data owner's own data, :mod:`pointers.worker.owners`, or a value the
client sent), its weight, scale and round (:mod:`mpc.material.owned`): no client can fetch
them, run an op on them, or send them on. The rule, **an aggregate of at least k owners**
(k >= 2), is enforced by every party: the one step that takes such shares,
``mpc.release_sum``, adds a party's shares into an ordinary share of the sum, which the
client may open, only for values of one kind, one scale, at least k distinct workers; an
owner's data only of the deployment's listed owners, of one round, each within the
deployment's bound on weights. The owner's worker shares an owner's data at the owner's
count, once. Each party checks this on its own, so whatever the client sends to whom, what
it can open are sums over groups of owners (a party's share of one owner's value is
uniformly random on its own).

On the client, an :class:`OwnedShared` refuses every op but ``+`` with other owned
values; ``a + b + c`` is an :class:`OwnedSum`, whose ``get()`` runs the release at every
party and opens the sum. ``a.get()`` is PySyft's fetch of the shared tensor (Part 10's
``encrypted_param.get()``): it returns the value *still shared*, an :class:`OwnedShared`
marked fetched, and moves and reveals nothing; ``get()`` on that, which would open the one
owner's value, raises :class:`ReleaseRuleError`, as does ``float_precision()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

import pointers as pt
from mpc.errors import MPCError
from mpc.material.owned import MIN_OWNERS, ReleaseRuleError
from mpc.session import Session
from mpc.shared import SharedTensor

RELEASE_FUNCTION = "mpc.release_sum"


class OwnedShared(SharedTensor):
    """A value shared by its owner at its worker: it opens only inside an aggregate of at
    least ``min_owners`` owners' values (``a + b``, then ``.get()``)."""

    owner: str
    min_owners: int
    #: ``get()`` was called: this is the value fetched still shared (PySyft's semantics)
    fetched: bool

    def get(self) -> OwnedShared:  # type: ignore[override]
        """PySyft's ``encrypted.get()`` on a value its owner shared: the value, still
        shared (the pointers to its shares, which the client holds already): nothing moves
        and nothing opens. Opening it, ``get()`` again, raises :class:`ReleaseRuleError`:
        add it to other owners' values and open the sum, ``(a + b).get()``."""
        if self.fetched:
            raise ReleaseRuleError(
                f"this value was shared by its owner at worker {self.owner!r}, and get() "
                "brought it here still shared (as PySyft's did): opening it would reveal that "
                f"one owner's value. Its release rule opens only a sum of at least "
                f"{self.min_owners} owners' values: (a + b).get() for values of two owners "
                "(docs/security.md, release rules)"
            )
        return owned(
            self.shares,
            self.session,
            self.frac_bits,
            self.dtype,
            self.owner,
            self.min_owners,
            fetched=True,
        )

    def float_precision(self) -> torch.Tensor:
        raise ReleaseRuleError(
            f"this value, shared by its owner at worker {self.owner!r}, is still shared: "
            "decode the opened sum of owners' values instead, (a + b).get().float_precision()"
        )

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        state = ", fetched" if self.fetched else ""
        return (
            f"OwnedShared(shape={tuple(self.shape)}, owner={self.owner!r}, parties="
            f"{[p.id for p in self.session.parties]}, frac_bits={self.frac_bits}{state}: "
            f"opens only in a sum of at least {self.min_owners} owners' values)"
        )

    def __add__(self, other: Any) -> OwnedSum:  # type: ignore[override]
        return OwnedSum([self]) + other

    def __radd__(self, other: Any) -> OwnedSum:  # type: ignore[override]
        if isinstance(other, int) and other == 0:  # sum([a, b, c])
            return OwnedSum([self])
        return OwnedSum([self]) + other

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        raise ReleaseRuleError(
            f"{func} on a value shared by its owner: its release rule allows only sums of "
            "owners' values (a + b), opened with .get()"
        )


class OwnedSum:
    """A sum of owned values, released (opened) as one aggregate by :meth:`get`."""

    def __init__(self, terms: Sequence[OwnedShared]) -> None:
        self.terms = list(terms)

    def __add__(self, other: Any) -> OwnedSum:
        if isinstance(other, OwnedSum):
            return OwnedSum(self.terms + other.terms)
        if isinstance(other, OwnedShared):
            return OwnedSum([*self.terms, other])
        raise ReleaseRuleError(
            "values shared by their owners add only to other such values (their release "
            f"rule opens only an aggregate), not to a {type(other).__name__}"
        )

    __radd__ = __add__

    def shared(self) -> SharedTensor:
        """Release the sum at every party: an ordinary SharedTensor of the aggregate."""
        first = self.terms[0]
        session = first.session
        for t in self.terms[1:]:
            session.check_compatible(t.session)
            if t.frac_bits != first.frac_bits or t.shape != first.shape:
                raise MPCError("owned values to add must have one shape and one precision")
        owners = {t.owner for t in self.terms}
        need = max(t.min_owners for t in self.terms)
        if len(owners) < need:
            raise ReleaseRuleError(
                f"this sum holds values of {len(owners)} owner(s) ({sorted(owners)}); their "
                f"release rule opens only an aggregate of at least {need} owners' values"
            )
        shape = tuple(first.shape)
        shares = [
            pt.call_function(
                p,
                RELEASE_FUNCTION,
                [[t.shares[i] for t in self.terms]],
                out=[(shape, torch.int64)],
            )[0]
            for i, p in enumerate(session.parties)
        ]
        return SharedTensor(shares, session, first.frac_bits, first.dtype)  # type: ignore[arg-type]

    def get(self) -> torch.Tensor:
        return self.shared().get()

    def __repr__(self) -> str:
        return f"OwnedSum({len(self.terms)} owned values, owners {[t.owner for t in self.terms]})"


def owned(
    shares: list[pt.PointerTensor],
    session: Session,
    frac_bits: int,
    dtype: torch.dtype,
    owner: str,
    min_owners: int,
    fetched: bool = False,
) -> OwnedShared:
    s0 = shares[0]
    t = torch.Tensor._make_wrapper_subclass(
        OwnedShared,
        s0.shape,
        strides=s0.stride(),
        dtype=dtype,
        device=torch.device("cpu"),
        requires_grad=False,
    )
    t.shares, t.session, t.frac_bits, t.pending = shares, session, frac_bits, 0
    t.views_of_pending, t.keep_alive = False, None
    t.owner, t.min_owners, t.fetched = owner, min_owners, fetched
    return t  # type: ignore[no-any-return]


__all__ = ["MIN_OWNERS", "OwnedShared", "OwnedSum", "ReleaseRuleError", "owned"]
