"""AuthenticatedTensor: a torch.Tensor wrapper subclass over authenticated shares (the
malicious mode, ``security="malicious"``).

Its shares are pointers to each party's authenticated share, laid out ``(2, 2, *shape)``
(limbs, then value and MAC: :mod:`mpc.protocols.auth_shares.steps`) and sealed at the
parties. Each aten op is routed through :data:`mpc.registry.AUTH_OPS` (the malicious
mode's table in the one registry, beside the semi-honest one: the two modes share no op
code); an op without an authenticated implementation raises
:class:`~mpc.errors.UnsupportedOpError`.
``get()`` runs the MAC check over every opening of the session since the last one before
anything reaches the client.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

import pointers as pt
from mpc import registry
from mpc.errors import MPCError, UnsupportedOpError
from mpc.math.encoding import decode, encode
from mpc.protocols.auth_shares.run import reveal, share_input
from mpc.protocols.auth_truncation.run import auth_truncate
from mpc.session import Session

_CPU = torch.device("cpu")

Handler = Callable[[Any, tuple[Any, ...], dict[str, Any]], Any]


def register(*ops: Any) -> Callable[[Handler], Handler]:
    """Register an op on authenticated tensors (in the one registry: mpc.registry.AUTH_OPS)."""
    return registry.register(*ops, authenticated=True)


class AuthenticatedTensor(torch.Tensor):
    """A secret-shared tensor whose every share carries a MAC share: ``shares[i]`` is held
    by ``session.parties[i]``. ``frac_bits`` is the fixed-point scale (0 for integers);
    ``pending`` a truncation not applied yet (a product's: ``get()`` decodes at the full
    scale, any other op truncates first)."""

    shares: list[pt.PointerTensor]
    session: Session
    frac_bits: int
    pending: int

    @staticmethod
    def __new__(
        cls,
        shares: list[pt.PointerTensor],
        session: Session,
        frac_bits: int,
        dtype: torch.dtype,
        pending: int = 0,
    ) -> AuthenticatedTensor:
        shape = tuple(shares[0].shape[2:])
        t = torch.Tensor._make_wrapper_subclass(
            cls, shape, dtype=dtype, device=_CPU, requires_grad=False
        )
        t.shares = shares
        t.session = session
        t.frac_bits = frac_bits
        t.pending = pending
        return t

    def materialize(self) -> AuthenticatedTensor:
        """Apply a pending truncation now (in place; the value is unchanged)."""
        if self.pending:
            self.shares = auth_truncate(self.session, self.shares, self.pending)
            self.frac_bits -= self.pending
            self.pending = 0
        return self

    def get(self) -> torch.Tensor:
        """The value, at the caller, after the MAC check of every opening of the session
        so far: :class:`~mpc.errors.MACCheckError` (and no value) if a party deviated."""
        self.session.watch()
        ring = reveal(self.session, self.shares)
        if self.frac_bits == 0 and not self.dtype.is_floating_point:
            return ring.to(self.dtype)
        return decode(ring, self.frac_bits, self.dtype)

    def reconstruct(self) -> torch.Tensor:
        return self.get()

    def backward(self, *args: Any, **kwargs: Any) -> None:  # type: ignore[override]
        raise MPCError(
            "training (backward) is not available in the authenticated mode "
            "(security='malicious') yet: train in a semi-honest session "
            "(docs/encrypted-training.md)"
        )

    @property
    def parties(self) -> list[Any]:
        return self.session.parties

    def with_shares(
        self, shares: list[pt.PointerTensor], frac_bits: int | None = None, pending: int = 0
    ) -> AuthenticatedTensor:
        return AuthenticatedTensor(
            shares,
            self.session,
            self.frac_bits if frac_bits is None else frac_bits,
            self.dtype,
            pending,
        )

    # mypy rejects any override of torch's untyped Tensor.__repr__, even its own signature
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"AuthenticatedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"parties={[p.id for p in self.session.parties]}, frac_bits={self.frac_bits})"
        )

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, proto: Any) -> Any:
        raise MPCError("an AuthenticatedTensor cannot be pickled")

    def tolist(self) -> Any:  # type: ignore[override]
        raise MPCError("tolist() needs the secret value; reconstruct it with .get() first")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise MPCError("numpy() needs the secret value; reconstruct it with .get() first")

    if TYPE_CHECKING:

        def __add__(self, other: Any) -> AuthenticatedTensor: ...
        def __sub__(self, other: Any) -> AuthenticatedTensor: ...
        def __mul__(self, other: Any) -> AuthenticatedTensor: ...
        def __matmul__(self, other: Any) -> AuthenticatedTensor: ...
        def __neg__(self) -> AuthenticatedTensor: ...
        def __getitem__(self, index: Any) -> AuthenticatedTensor: ...

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        handler = registry.AUTH_OPS.get(func)
        if handler is None:
            raise UnsupportedOpError(
                str(func), "not available in the authenticated mode (security='malicious') yet"
            )
        for a in args:
            for t in a if isinstance(a, list | tuple) else (a,):
                if isinstance(t, AuthenticatedTensor):
                    t.session.watch()
                    break
        return handler(func, args, kwargs or {})


def share_authenticated(
    x: torch.Tensor, session: Session, frac_bits: int | None = None
) -> AuthenticatedTensor:
    """Authenticated shares of ``x`` (the client's input): floats in fixed point, integers
    exactly (see :func:`mpc.protocols.auth_shares.run.share_input`)."""
    if isinstance(x, AuthenticatedTensor):
        raise MPCError("this tensor is already secret-shared")
    if isinstance(x, pt.PointerTensor):
        raise MPCError(
            "the authenticated mode shares local tensors: bring the value here with .get()"
        )
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    if session.dealer is None:
        raise MPCError("the authenticated mode (security='malicious') needs a crypto provider")
    session.watch()
    x = x.detach()
    if x.is_floating_point():
        f = session.config.frac_bits if frac_bits is None else frac_bits
        dtype = x.dtype
    elif x.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool):
        f, dtype = 0, torch.int64
    else:
        raise TypeError(f"cannot secret-share a tensor of dtype {x.dtype}")
    if math.prod(x.shape) == 0:
        raise MPCError("cannot secret-share an empty tensor")
    ring = encode(x, f)
    return AuthenticatedTensor(share_input(session, ring), session, f, dtype)
