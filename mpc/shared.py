"""SharedTensor: a torch.Tensor wrapper subclass whose value is additively shared.

Its shares are PointerTensors of int64 ring elements, one per party. Each aten op is
routed through :mod:`mpc.registry`; an op without a secure implementation raises
:class:`~mpc.errors.UnsupportedOpError`.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import torch

import pointers as pt
from mpc import accounting, config
from mpc.errors import MPCError, ShapeError, UnsupportedOpError
from mpc.math.encoding import abs_sums, decode, encode
from mpc.math.prg import PRG, new_seed, random_ring
from mpc.protocols.parties import run_step
from mpc.protocols.seeds.steps import share_from_seed
from mpc.protocols.truncation.run import truncate_together
from mpc.registry import HOOKS, LAZY, OPS
from mpc.session import Session

_CPU = torch.device("cpu")
# integer dtypes shared exactly (frac_bits 0); their results keep torch's result dtype
INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)
# from this many elements on, input shares 0..n-2 travel as 16-byte seeds (share_tensor)
SEEDED_FROM = 64
_MATMULS = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.Tensor.__rmatmul__}


_LINEAR = torch.nn.functional.linear


def _shape(t: Any) -> tuple[int, ...]:
    return tuple(t.shape) if isinstance(t, torch.Tensor) else ()


def _which(t: Any) -> str:
    return "shared" if isinstance(t, SharedTensor) else "public"


def check_product_shapes(func: Any, args: Any) -> None:
    """Raise :class:`~mpc.errors.ShapeError` if a matmul's (or ``F.linear``'s) operands
    do not fit, naming both shapes and the dimensions that must agree."""
    if len(args) < 2 or not all(isinstance(a, torch.Tensor) for a in args[:2]):
        return
    a, b = args[0], args[1]
    sa, sb = _shape(a), _shape(b)
    try:
        meta = [torch.empty(s, device="meta") for s in (sa, sb)]
        with torch._C.DisableTorchFunctionSubclass():
            if func is _LINEAR:
                torch.nn.functional.linear(*meta)
            else:
                torch.matmul(*meta)
        return
    except RuntimeError as e:
        cause = e
    if func is _LINEAR:
        if len(sb) != 2 or not sa:
            msg = (
                f"linear of a {_which(a)} input of shape {sa} with a {_which(b)} weight of "
                f"shape {sb}: expected a weight of shape (out_features, in_features) and an "
                "input of at least one dimension"
            )
        else:
            msg = (
                f"linear (an nn.Linear) of a {_which(a)} input of shape {sa} with a "
                f"{_which(b)} weight of shape {sb}: expected the input's last dimension to "
                f"be the layer's in_features, {sb[1]}; found {sa[-1]}. Fix: reshape the "
                f"input to (..., {sb[1]}), or build the layer as nn.Linear({sa[-1]}, {sb[0]})"
            )
    elif not sa or not sb:
        msg = f"matmul of shapes {sa} and {sb}: both operands need at least one dimension"
    else:
        k2 = sb[0] if len(sb) == 1 else sb[-2]
        where = "only" if len(sb) == 1 else "second-to-last"
        if sa[-1] == k2:
            detail = "their batch dimensions do not broadcast"
        else:
            detail = (
                f"expected the first's last dimension to equal the second's {where} "
                f"dimension; found {sa[-1]} and {k2}"
            )
        msg = (
            f"matmul of a {_which(a)} tensor of shape {sa} and a {_which(b)} tensor of shape "
            f"{sb}: {detail}. Fix: transpose or reshape an operand so that they match "
            "(e.g. a @ b.T, or b.transpose(-1, -2))"
        )
    raise ShapeError(msg) from cause


class Deferred:
    """Shares computed at their first read (a ReLU's, :mod:`mpc.ops.relu_pool`): ``source``
    is what they are computed from, until then (an op that can do better with it, a 2x2
    max-pool, takes it instead; nothing else sees the difference but the rounds)."""

    def __init__(
        self,
        session: Session,
        source: SharedTensor,
        compute: Callable[[], list[Any]],
        kind: str = "",
    ) -> None:
        self.session, self.kind = session, kind
        self.source: SharedTensor | None = source
        self._compute: Callable[[], list[Any]] | None = compute
        self._value: list[Any] | None = None
        session.deferred.add(self)
        accounting.note_deferred(self)  # (an mpc.stats block runs it by its end)

    @property
    def done(self) -> bool:
        return self._value is not None

    def value(self) -> list[Any]:
        if self._value is None:
            compute = self._compute
            assert compute is not None
            self._value = compute()
            self._compute = self.source = None
            self.session.deferred.discard(self)
        return self._value


def run_deferred(session: Session) -> None:
    """Compute every deferred value of ``session`` still alive (``session.deferred``),
    before an in-place write could change what one is computed from."""
    for d in list(session.deferred):
        d.value()


class SharedTensor(torch.Tensor):
    """A secret-shared tensor: ``shares[i]`` is held by ``session.parties[i]``.

    ``frac_bits`` is the fixed-point scale of the ring elements (0 for integers).
    ``pending`` is a truncation not yet applied: the value's precision is
    ``frac_bits - pending`` bits. Ops that cannot use it truncate first (one round);
    ReLU fuses it into its comparison, and reconstruction decodes at full scale for free.
    ``deferred``: shares not computed yet (:class:`Deferred`); reading ``shares``
    computes them.
    """

    _shares: list[pt.PointerTensor]
    deferred: Deferred | None
    session: Session
    frac_bits: int
    pending: int
    views_of_pending: bool
    keep_alive: Any  # objects whose remote values the producers of these shares still read
    # a model's weight and the layout ops applied to it (mpc.protocols.weights), or None
    fixed: tuple[Any, tuple[Any, ...]] | None
    weight_epoch: int  # in-place writes to this parameter (its weight instances' validity)
    _mpc_grad_hook: bool  # set by mpc.ops.backward.track_grad once its hook is registered

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func in _MATMULS or func is _LINEAR:
            check_product_shapes(func, args)  # (before torch folds the operands' shapes)
        refuse = HOOKS.get("function")
        if refuse is not None:  # (mpc.debugging: a value the client does not own)
            refuse(func, args, kwargs or {})
        # vector @ matrix: torch decomposes it into mm(v.unsqueeze(0), W).squeeze_(0), an
        # in-place change of shape a wrapper cannot make; do it out of place instead
        if func in _MATMULS and len(args) == 2 and not kwargs:
            v, w = args
            if isinstance(v, torch.Tensor) and isinstance(w, torch.Tensor):
                if v.dim() == 1 and w.dim() >= 2:
                    with torch._C.DisableTorchFunctionSubclass():
                        return torch.matmul(v.unsqueeze(0), w).squeeze(-2)
        return torch._C._disabled_torch_function_impl(func, types, args, kwargs or {})

    @staticmethod
    def __new__(
        cls,
        shares: list[pt.PointerTensor],
        session: Session,
        frac_bits: int,
        dtype: torch.dtype,
        pending: int = 0,
    ) -> SharedTensor:
        s0 = shares[0]
        t = torch.Tensor._make_wrapper_subclass(
            cls, s0.shape, strides=s0.stride(), dtype=dtype, device=_CPU, requires_grad=False
        )
        t.shares = shares
        t.session = session
        t.frac_bits = frac_bits
        t.pending = pending
        t.views_of_pending = False  # a view was taken while a truncation was pending
        t.keep_alive = None
        t.fixed = None
        t.weight_epoch = 0
        return t

    # get() reconstructed the value and released its shares (see get)
    released = False
    #: a number |value| cannot exceed, as far as the client knows (max |x| of what it
    #: shared, carried through each op by mpc.ranges); None: not known
    bound: float | None = None
    #: a matrix's largest sums of |entries| down a column and along a row (mpc.ranges)
    abs_sums: tuple[float, float] | None = None

    @property
    def shares(self) -> list[pt.PointerTensor]:
        if self.released:
            raise MPCError(
                "this shared value was reconstructed with get(), which frees its shares at "
                "the workers (as PySyft's get() does): use the tensor get() returned, or "
                "keep the shared value with x.get(delete=False) or x.clone().get()"
            )
        d = self.deferred
        if d is not None:
            self._shares = d.value()
            self.deferred = None
        return self._shares

    @shares.setter
    def shares(self, value: list[pt.PointerTensor]) -> None:
        self._shares = value
        self.deferred = None

    def resolve(self) -> SharedTensor:
        """Compute deferred shares now (see :class:`Deferred`)."""
        self.shares  # noqa: B018  (the read computes them)
        return self

    def materialize(self) -> SharedTensor:
        """Apply a pending truncation now (in place; the value is unchanged), and compute
        deferred shares (:meth:`resolve`)."""
        self.resolve()
        if self.pending:
            together = [self] + [t for t in self._pending_siblings() if t is not self]
            with self.session.concurrently(max(t.numel() for t in together)):
                done = truncate_together(self.session, [(t.shares, t.pending) for t in together])
            for t, shares in zip(together, done):
                t.shares = shares
                t.frac_bits -= t.pending
                t.pending = 0
        return self

    #: the pieces of one pending value (a split's outputs and their views, such as the
    #: query, key and value of one projection), weakly: materialising one truncates every
    #: piece still pending in the same round (set by the shape ops, mpc.ops.local)
    siblings: list[weakref.ref[SharedTensor]] | None = None

    def _pending_siblings(self) -> list[SharedTensor]:
        if not self.siblings:
            return []
        alive = [t for t in (r() for r in self.siblings) if t is not None]
        return [
            t
            for t in alive
            if t.pending and t.deferred is None and not t.released and t.session is self.session
        ]

    def get(self, delete: bool = True) -> torch.Tensor:
        """Reconstruct the value at the caller, and free its shares (as PySyft's ``get()``
        did): the pointers to them are dropped, and each worker deletes its share once no
        other shared value uses it (a value made from this one by a local op may hold the
        same shares). Using this SharedTensor afterwards raises an error that says so.
        ``delete=False`` (as a pointer's ``get(delete=False)``) keeps the shares and the
        shared value (CrypTen's ``get_plain_text()`` does).
        """
        value = self._open()
        if delete:
            self.release()
        return value

    def _open(self) -> torch.Tensor:
        """The value at the caller, the shares kept (what :meth:`get` returns)."""
        self.session.watch()
        # every party's share is fetched side by side (one round trip, not one per party)
        total, *rest = pt.get_all(self.shares, delete=False)
        for v in rest:
            total += v
        if self.frac_bits == 0 and not self.dtype.is_floating_point:
            # torch's wrap-around: the ring value mod 2^bits of the dtype (exact for sums
            # and products, which commute with the reduction); bool: nonzero is True
            return total.to(self.dtype)
        return decode(total, self.frac_bits, self.dtype)

    def release(self) -> None:
        """Drop this value's shares (after :meth:`get`): see :meth:`get`."""
        self._shares = []
        self.deferred = None
        self.keep_alive = None
        self.released = True

    @staticmethod
    def __module_get__(module: Any) -> Any:
        """``pointers.get(model)`` / ``model.get()`` on a model with shared tensors: each
        is reconstructed for the client that shared it (:func:`mpc.get`)."""
        return HOOKS["module_get"](module)

    def reconstruct(self) -> torch.Tensor:
        return self.get()

    # (torch's Tensor.max is overloaded in its stubs: no one signature overrides it)
    def max(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        """torch's max; over a dimension, the (values, indices) pair as a
        :class:`MaxResult`, whose ``.get()`` gives the values (PySyft 0.2's
        ``shared.max(dim=0).get()``)."""
        out = torch.Tensor.max(self, *args, **kwargs)
        return MaxResult(out[0], out[1]) if isinstance(out, tuple) else out

    def copy(self) -> SharedTensor:
        """PySyft's ``shared.copy()``: the same value, in new shares at the same parties."""
        return self.clone()

    @property
    def parties(self) -> list[Any]:
        return self.session.parties

    def with_shares(
        self, shares: list[pt.PointerTensor], frac_bits: int | None = None
    ) -> SharedTensor:
        """Same session, dtype and scale (and pending truncation) with other shares."""
        if frac_bits is None:
            return SharedTensor(shares, self.session, self.frac_bits, self.dtype, self.pending)
        return SharedTensor(shares, self.session, frac_bits, self.dtype)

    # mypy rejects any override of torch's untyped Tensor.__repr__, even its own signature
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"SharedTensor(shape={tuple(self.shape)}, dtype={self.dtype}, "
            f"parties={[p.id for p in self.session.parties]}, frac_bits={self.frac_bits})"
        )

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, proto: Any) -> Any:
        raise MPCError("a SharedTensor cannot be pickled")

    def tolist(self) -> Any:  # type: ignore[override]
        raise _needs_get("tolist()")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise _needs_get("numpy()")

    if TYPE_CHECKING:
        # Every op on shared tensors gives shared tensors (their handlers wrap each
        # output); torch's stubs say Tensor. Declared for the type checker only.
        def __add__(self, other: Any) -> SharedTensor: ...
        def __radd__(self, other: Any) -> SharedTensor: ...
        def __sub__(self, other: Any) -> SharedTensor: ...
        def __rsub__(self, other: Any) -> SharedTensor: ...
        def __mul__(self, other: Any) -> SharedTensor: ...
        def __rmul__(self, other: Any) -> SharedTensor: ...
        def __neg__(self) -> SharedTensor: ...
        def __getitem__(self, index: Any) -> SharedTensor: ...
        def clone(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def detach(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def expand(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def movedim(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def requires_grad_(self, requires_grad: bool = True) -> SharedTensor: ...
        def reshape(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def squeeze(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def sum(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def unfold(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def unsqueeze(self, *args: Any, **kwargs: Any) -> SharedTensor: ...
        def view(self, *args: Any, **kwargs: Any) -> SharedTensor: ...

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        handler = OPS.get(func)
        if handler is None:
            raise UnsupportedOpError(str(func))
        session: Session | None = None
        numel = 0
        for a in args:
            for t in a if isinstance(a, list | tuple) else (a,):
                if isinstance(t, SharedTensor):
                    if session is None:
                        session = t.session
                        session.watch()
                    numel = max(numel, t.numel())
        if session is None:
            return handler(func, args, kwargs or {})
        kwargs = kwargs or {}

        def run() -> Any:
            with session.concurrently(numel):
                if func._schema.is_mutable and session.deferred:  # (what they read)
                    run_deferred(session)
                for a in args:
                    for t in a if isinstance(a, list | tuple) else (a,):
                        if isinstance(t, SharedTensor) and t.pending and handler not in LAZY:
                            t.materialize()
                return handler(func, args, kwargs)

        runner, after = HOOKS.get("run"), HOOKS.get("result")
        out = runner(func, args, kwargs, run) if runner is not None else run()
        if after is not None:
            after(func, args, kwargs, out)
        return out


class MaxResult(NamedTuple):
    """``shared.max(dim)``: shared values and indices, as torch's pair (``values, indices =
    x.max(dim=0)``). ``.get()`` reconstructs the values, as PySyft's
    ``x.max(dim=0).get()`` did (PySyft's max over a dimension gave the values only);
    ``.indices.get()`` gives the indices."""

    values: Any
    indices: Any

    def get(self) -> Any:
        return self.values.get()


def _needs_get(what: str) -> MPCError:
    return MPCError(f"{what} needs the secret value; reconstruct it with .get() first")


def share_tensor(x: torch.Tensor, session: Session, frac_bits: int | None = None) -> SharedTensor:
    """Split ``x`` into additive shares and send share i to party i.

    The caller (the data owner) draws the shares from a CSPRNG (AES counter mode seeded by
    os.urandom); floats are encoded in fixed point, integers shared exactly. From
    :data:`SEEDED_FROM` elements on, parties 0..n-2 get a fresh 16-byte seed each and
    expand it into their share themselves (``mpc.share_from_seed``), so only the last
    party's share travels as a tensor: n-1 shares cost 16 bytes each instead of 8 per
    element.
    """
    if isinstance(x, SharedTensor):
        raise MPCError("this tensor is already secret-shared")
    if isinstance(x, pt.PointerTensor):
        raise MPCError(
            "share_tensor splits a local tensor: share a remote one with mpc.share(ptr, ...) "
            "or ptr.share(...), which has the worker holding it split it"
        )
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    session.watch()
    x = x.detach()
    if x.is_floating_point():
        f = session.config.frac_bits if frac_bits is None else frac_bits
        dtype = x.dtype
    elif x.dtype in INTEGER_DTYPES:
        f, dtype = 0, x.dtype  # (its ring value is reduced to the dtype at reconstruction)
    else:
        raise TypeError(f"cannot secret-share a tensor of dtype {x.dtype}")
    ring = encode(x, f)  # may be x itself (an int64 tensor): never changed in place
    bound = None  # (integers wrap as torch's do: no range to keep)
    if x.is_floating_point():
        bound = float(x.abs().max()) if x.numel() else 0.0
    shape = tuple(ring.shape)
    seeded = ring.numel() >= SEEDED_FROM
    shares: list[pt.PointerTensor] = []
    rest = ring
    for p in session.parties[:-1]:
        if seeded:  # party i expands a 16-byte seed into its share (no tensor travels)
            seed = new_seed()
            r = PRG(seed).int64(shape)
            (ptr,) = run_step(p, share_from_seed, [seed, list(shape)], [(shape, torch.int64)])
            assert ptr is not None  # (out= given: a pointer per output)
        else:
            r = random_ring(shape)
            ptr = pt.send(r, p)
        rest = torch.sub(rest, r) if rest is ring else rest.sub_(r)
        shares.append(ptr)
    shares.append(_send_in_pieces(rest, session.parties[-1]))
    out = SharedTensor(shares, session, f, dtype)
    out.bound = bound
    if bound is not None and x.dim() >= 2:
        out.abs_sums = abs_sums(x)
    return out


def _send_in_pieces(t: torch.Tensor, worker: Any) -> pt.PointerTensor:
    """``pt.send(t, worker)``, in pieces of at most :data:`mpc.config.PIECE_BYTES` joined
    there."""
    nbytes = t.numel() * t.element_size()
    if nbytes <= config.PIECE_BYTES:
        return pt.send(t, worker)
    per = max(config.PIECE_BYTES // t.element_size(), 1)
    pieces = [pt.send(p.contiguous(), worker) for p in t.reshape(-1).split(per)]
    return cast(pt.PointerTensor, torch.cat(pieces).view(tuple(t.shape)))


def public_to_shares(value: torch.Tensor, like: SharedTensor) -> list[pt.PointerTensor]:
    """A trivial sharing of an already-encoded public int64 value: party 0 holds it,
    the others hold zeros (made by the client and sent: they carry nothing secret)."""
    out = [pt.send(value, like.session.parties[0])]
    for p in like.session.parties[1:]:
        out.append(pt.send(torch.zeros_like(value), p))
    return out


def session_of(model: Any) -> Session:
    """The session a shared model's weights live in (a module whose parameters were
    shared with :func:`mpc.share`)."""
    for p in model.parameters():
        if isinstance(p, SharedTensor):
            return p.session
    raise MPCError("the model is not shared: call mpc.share(model, ...) first")
