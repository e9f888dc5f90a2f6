"""PointerTensor: a torch.Tensor wrapper subclass whose data lives on a worker.

Every aten op on a pointer becomes one :class:`~pointers.wire.messages.ExecuteOp` to its worker.
The output's shape, stride and dtype are inferred locally by running the op on meta
tensors (cached by op and input signature), and output ids are chosen here, so no reply is
awaited. Because a pointer is a real tensor, autograd, ``nn.Module`` and ``torch.optim``
work on it unchanged.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, cast

import torch
import torch.utils._pytree as pytree

from pointers.errors import (
    ChainError,
    LocationMismatchError,
    ObjectGoneError,
    PointerError,
    ValueRequiresGetError,
)
from pointers.wire.messages import CallFunction, ExecuteOp, Fetch, Search, SendToPeer, Tag
from pointers.wire.ops import op_name
from pointers.wire.serde import dtype_from_name, ref_ext

if TYPE_CHECKING:
    from pointers.worker.client import WorkerClient

aten = torch.ops.aten
_CPU = torch.device("cpu")
_META = torch.device("meta")


class RemoteRef:
    """Ownership of one object at one worker; deletes it when the last holder goes."""

    __slots__ = ("location", "obj_id", "owned", "gone", "_wire", "chain")

    def __init__(self, location: WorkerClient, obj_id: int, owned: bool = True) -> None:
        self.location = location
        self.obj_id = obj_id
        self._wire: Any = None
        self.owned = owned
        self.gone = False
        # a pointer chain: the object at ``location`` is that worker's pointer to an
        # object at this worker (see pointers.worker.chains); None: a plain pointer
        self.chain: WorkerClient | None = None

    def __del__(self) -> None:
        # Only queues the id (no I/O here): the delete travels with a later message.
        # Cheaper than weakref.finalize on this hot path (one RemoteRef per op output).
        if self.owned and not self.gone:
            try:
                self.location.queue_delete(self.obj_id)
            except Exception:  # interpreter shutdown: nothing left to release
                pass

    def wire(self) -> Any:
        """The reference's encoded form (built once)."""
        w = self._wire
        if w is None:
            w = self._wire = ref_ext(self.obj_id)
        return w

    def release(self) -> None:
        """The object left the worker (get/move): nothing to delete any more."""
        self.gone = True

    def check(self) -> None:
        if self.gone:
            raise ObjectGoneError(
                f"the object {self.obj_id} at {self.location.id!r} was already retrieved with "
                "get() or moved away; this pointer no longer points to anything"
            )


class Chains(Protocol):
    """What a pointer on a chain asks of :mod:`pointers.worker.chains`, which sits above
    this module (chains make pointers): ``pointers/__init__`` hands it in with
    :func:`use_chains` as the package loads."""

    def send(
        self, ptr: PointerTensor, destination: WorkerClient, *args: Any, **kwargs: Any
    ) -> PointerTensor: ...
    def get_hop(self, ptr: PointerTensor, delete: bool) -> PointerTensor: ...
    def remote_get(self, ptr: PointerTensor) -> PointerTensor: ...


_CHAINS: list[Chains] = []  # the one Chains, handed in by pointers/__init__


def use_chains(chains: Chains) -> None:
    """Hand in the chain methods (``pointers/__init__`` does, once)."""
    _CHAINS[:] = [chains]


def _chains() -> Chains:
    if not _CHAINS:  # (importing pointers loads them)
        raise ChainError("pointer chains need pointers.worker.chains, which is not loaded")
    return _CHAINS[0]


class PointerTensor(torch.Tensor):
    """A pointer to a tensor held by a worker (``location``) under ``id_at_location``."""

    _ref: RemoteRef
    # (torch's stubs type it as a classmethod; it is the plain function torch checks for)
    __torch_function__ = cast(Any, torch._C._disabled_torch_function_impl)

    @staticmethod
    def __new__(cls, ref: RemoteRef, shape, stride, dtype, requires_grad=False):  # type: ignore[no-untyped-def]
        t = torch.Tensor._make_wrapper_subclass(
            cls, shape, strides=stride, dtype=dtype, device=_CPU, requires_grad=requires_grad
        )
        t._ref = ref
        return t

    @classmethod
    def from_meta(
        cls,
        location: WorkerClient,
        obj_id: int,
        shape: Any,
        stride: Any,
        dtype: torch.dtype,
        owned: bool = True,
    ) -> PointerTensor:
        return cls(RemoteRef(location, obj_id, owned), tuple(shape), tuple(stride), dtype)

    # -- identity ------------------------------------------------------------------------
    @property
    def location(self) -> WorkerClient:
        """The worker that holds the data."""
        return self._ref.location

    @property
    def id_at_location(self) -> int:
        return self._ref.obj_id

    # mypy rejects any override of torch's untyped Tensor.__repr__, even its own signature
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        state = " (retrieved)" if self._ref.gone else ""
        grad = ", requires_grad=True" if self.requires_grad else ""
        chain = self._ref.chain
        via = "" if chain is None else f", then {chain.id!r}"
        return (
            f"PointerTensor(location={self._ref.location.id!r}{via}, id={self._ref.obj_id}, "
            f"shape={tuple(self.shape)}, dtype={self.dtype}{grad}){state}"
        )

    def __format__(self, spec: str) -> str:
        return repr(self)

    def __reduce_ex__(self, proto: Any) -> Any:
        raise PointerError("a PointerTensor cannot be pickled; get() its value first")

    # -- values stay remote ------------------------------------------------------------
    def _no_value(self, what: str) -> PointerError:
        return ValueRequiresGetError(
            f"{what} needs the value of a remote tensor at {self._ref.location.id!r}; "
            "call .get() first to bring it back"
        )

    def tolist(self) -> Any:  # type: ignore[override]
        raise self._no_value("tolist()")

    def item(self) -> Any:  # type: ignore[override]
        raise self._no_value("item()")

    def __bool__(self) -> bool:
        raise self._no_value("bool()")

    def __float__(self) -> float:
        raise self._no_value("float()")

    def __int__(self) -> int:
        raise self._no_value("int()")

    def __index__(self) -> int:
        raise self._no_value("use as an index")

    def numpy(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
        raise self._no_value("numpy()")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._no_value("conversion to a numpy array")

    # -- ownership -----------------------------------------------------------------------
    def get(self, delete: bool = True) -> torch.Tensor:
        """Bring the value back and remove it from the worker (``delete=False``: keep it
        there, and this pointer stays valid)."""
        ref = self._ref
        ref.check()
        if ref.chain is not None:
            return self._get_hop(delete)
        value = ref.location.request(Fetch(ref.obj_id, delete))
        if delete:
            ref.release()
        if self.requires_grad and self.is_leaf and value.is_floating_point():
            # as PySyft: a sent leaf that requires grad comes back requiring grad, with
            # the gradient a remote backward() left on it
            value.requires_grad_(True)
            grad = self.grad
            if isinstance(grad, PointerTensor) and not grad._ref.gone:
                value.grad = grad.get(delete) if delete else grad.get(delete=False)
        return value

    # -- pointer chains (PySyft 0.2; in-process workers only, see pointers.worker.chains) --
    def _get_hop(self, delete: bool) -> PointerTensor:
        """A chain's ``get()``: one hop. The worker's pointer is dropped (``delete=False``:
        kept) and the client gets a pointer to the object at the next worker."""
        return _chains().get_hop(self, delete)

    def remote_get(self) -> PointerTensor:
        """PySyft's ``remote_get()``: on a pointer chain (the client -> bob -> alice), bring
        alice's object to bob, in the place of bob's pointer to it; returns this pointer,
        now to the object at bob."""
        return _chains().remote_get(self)

    @property
    def chain_location(self) -> WorkerClient | None:
        """The worker at the far end of a pointer chain (``x.send(bob).send(alice)``:
        alice), or None for a plain pointer."""
        return self._ref.chain

    def copy(self) -> PointerTensor:
        """A new pointer to a new copy of the object at the same worker."""
        return self.detach().clone()  # type: ignore[return-value]

    def move(self, destination: WorkerClient) -> PointerTensor:
        """Move the object to another worker, party to party; this pointer is spent."""
        ref = self._ref
        ref.check()
        if ref.chain is not None:  # along the chain: the first hop goes, then the object
            return self._get_hop(True).move(destination)
        if destination is ref.location or getattr(destination, "id", None) == ref.location.id:
            return self
        moved = self._send_to_peer(destination, delete=True, lend=False)
        ref.release()
        return moved

    def copy_to(self, destination: WorkerClient, lend: bool = False) -> PointerTensor:
        """A copy of the object at another worker, delivered party to party; this pointer
        keeps its object.

        ``lend=True``: a promise that neither the object nor its copy will be changed
        in place (both are only read, as the shares of an opening are); between
        in-process workers the destination then keeps the same memory, not a copy."""
        self._ref.check()
        if self._ref.chain is not None:
            raise ChainError(
                f"copy_to() of a pointer chain ({self._ref.location.id!r} -> "
                f"{self._ref.chain.id!r}) is not supported: get() one hop first"
            )
        return self._send_to_peer(destination, delete=False, lend=bool(lend))

    def _send_to_peer(self, destination: WorkerClient, delete: bool, lend: bool) -> PointerTensor:
        """Have the object's worker deliver it to ``destination``; a pointer to it there."""
        ref = self._ref
        ref.location.introduce(destination)
        new_id = destination.new_id()
        ref.location.post(SendToPeer(ref.obj_id, destination.id, new_id, delete, lend))
        return PointerTensor.from_meta(
            destination, new_id, self.shape, contiguous_stride(self.shape), self.dtype
        )

    def send(self, destination: WorkerClient, *args: Any, **kwargs: Any) -> PointerTensor:
        """PySyft's pointer chain: ``x.send(bob).send(alice)`` moves bob's tensor to alice,
        party to party, and leaves bob holding a pointer to it; returns the client's
        pointer to bob's pointer. Ops on it run at alice (bob forwards them), ``get()``
        goes one hop, ``remote_get()`` brings the tensor to bob, ``move`` collapses the
        chain. In-process workers only: network workers refuse (they are never clients
        of one another; see :mod:`pointers.worker.chains`)."""
        return _chains().send(self, destination, *args, **kwargs)

    def tag(self, *tags: str, description: str = "") -> PointerTensor:
        """Add search tags to the remote object."""
        self._ref.check()
        if self._ref.chain is not None:
            raise ChainError(
                "a pointer chain cannot be tagged (the worker holds a pointer, not a tensor, "
                "and search finds tensors): tag the tensor before sending it on"
            )
        self._ref.location.post(Tag(self._ref.obj_id, list(tags), description))
        return self

    if TYPE_CHECKING:
        # Every op on pointers gives pointers (``__torch_dispatch__`` wraps each output);
        # torch's stubs say Tensor. Declared for the type checker only: no runtime change.
        def __add__(self, other: Any) -> PointerTensor: ...
        def __radd__(self, other: Any) -> PointerTensor: ...
        def __sub__(self, other: Any) -> PointerTensor: ...
        def __rsub__(self, other: Any) -> PointerTensor: ...
        def __mul__(self, other: Any) -> PointerTensor: ...
        def __rmul__(self, other: Any) -> PointerTensor: ...
        def __neg__(self) -> PointerTensor: ...
        def __getitem__(self, index: Any) -> PointerTensor: ...
        def clone(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def detach(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def expand(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def new_zeros(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def repeat(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def reshape(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def squeeze(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def sum(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def unsqueeze(self, *args: Any, **kwargs: Any) -> PointerTensor: ...
        def view(self, *args: Any, **kwargs: Any) -> PointerTensor: ...

    # -- dispatch ------------------------------------------------------------------------
    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is aten.new_empty_strided.default:
            # autograd's gradient accumulation asks for scratch memory to copy a gradient
            # into; workers refuse uninitialised memory, so ask for zeros of that shape
            return _dispatch(aten.new_zeros.default, args[:2], _creation_kwargs(kwargs))
        return _dispatch(func, args, kwargs or {})


# ----------------------------------------------------------------------------------------
# Dispatch: unwrap, check location, infer outputs (cached), send, wrap.
# ----------------------------------------------------------------------------------------

_VALUE_OPS = {aten._local_scalar_dense.default, aten.is_nonzero.default, aten.equal.default}


class _Scan:
    """One pass over an op's arguments: wire form, cache signature, tensors, location."""

    __slots__ = ("tensors", "location", "func", "chain")

    def __init__(self, func: Any) -> None:
        self.tensors: list[torch.Tensor] = []
        self.location: WorkerClient | None = None
        self.func = func
        self.chain: WorkerClient | None = None  # the next hop of a pointer chain

    def walk(self, obj: Any, sig: list[Any]) -> Any:
        if type(obj) is PointerTensor:  # the common case first
            self.tensors.append(obj)
            ref = obj._ref
            if ref.gone:
                ref.check()
            if self.location is None:
                self.location = ref.location
            elif ref.location is not self.location:
                raise LocationMismatchError(op_name(self.func), self.location.id, ref.location.id)
            if ref.chain is not None:
                self.chain = ref.chain
            sig.append((obj.dtype, obj.shape, obj.stride(), True))
            return ref.wire()
        if isinstance(obj, torch.Tensor):
            self.tensors.append(obj)
            if isinstance(obj, PointerTensor):  # a Parameter-marked pointer
                return self.walk(PointerTensor(obj._ref, obj.shape, obj.stride(), obj.dtype), sig)
            sig.append((obj.dtype, obj.shape, obj.stride(), False))
            return obj.detach()
        if isinstance(obj, list | tuple):
            sig.append(len(obj))
            out = [self.walk(o, sig) for o in obj]
            return out if isinstance(obj, list) else tuple(out)
        if isinstance(obj, torch.Size):
            sig.append(tuple(obj))
            return list(obj)
        sig.append((type(obj), obj))
        return obj


def _dispatch(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    if func is aten.detach.default or func is aten.alias.default:
        # A detached pointer shares the remote object (as detach shares storage).
        (src,) = args
        return PointerTensor(src._ref, src.shape, src.stride(), src.dtype)
    if func in _VALUE_OPS:
        p = next(a for a in args if isinstance(a, PointerTensor))
        raise p._no_value(f"{func.__name__} (e.g. .item(), bool(), comparisons as values)")

    scan = _Scan(func)
    sig: list[Any] = [func]
    wire_args = [scan.walk(a, sig) for a in args]
    wire_kwargs = {}
    for k, v in kwargs.items():
        sig.append(k)
        wire_kwargs[k] = scan.walk(v, sig)
    location = scan.location
    assert location is not None  # the op was dispatched here for a pointer argument
    try:
        key: Any = tuple(sig)
        out = _meta_cache.get(key)
    except TypeError:  # an unhashable argument: no caching
        key, out = None, None
    if out is None:
        out = _infer(func, args, kwargs, scan.tensors)
        if key is not None:
            if len(_meta_cache) >= _MAX_CACHE:
                _meta_cache.clear()
            _meta_cache[key] = out

    new_id = location.new_id
    # (Any: an int wherever the leaf is "new", which mypy cannot see; no cast on this path)
    out_ids: list[Any] = [new_id() if s is not None and s[0] == "new" else None for s in out.leaves]
    location.post(ExecuteOp(out.name, wire_args, wire_kwargs, out_ids, False))

    leaves: list[Any] = []
    for s, obj_id in zip(out.leaves, out_ids):
        if s is None:
            leaves.append(None)
        elif s[0] == "alias":
            leaves.append(scan.tensors[s[1]])
        else:
            ref = RemoteRef(location, obj_id)
            if scan.chain is not None:  # an op on a chain: its outputs are chains too
                ref.chain = scan.chain
            leaves.append(PointerTensor(ref, s[1], s[2], s[3]))
    if out.spec is None:
        return leaves[0]
    return pytree.tree_unflatten(leaves, out.spec)


class _OutSpec:
    """Cached outputs of one op signature: each leaf ("new", shape, stride, dtype),
    ("alias", index of the input tensor it returns) or None; spec None: a single tensor."""

    __slots__ = ("name", "leaves", "spec")

    def __init__(self, name: str, leaves: list[Any], spec: Any) -> None:
        self.name = name
        self.leaves = leaves
        self.spec = spec


_meta_cache: dict[Any, _OutSpec] = {}
_MAX_CACHE = 20_000


def _infer(func: Any, args: Any, kwargs: Any, tensors: list[torch.Tensor]) -> _OutSpec:
    """Run ``func`` on meta tensors to learn its outputs without the data."""
    metas = {id(t): _to_meta(t) for t in tensors}
    meta_list = [metas[id(t)] for t in tensors]

    def conv(a: Any) -> Any:
        if isinstance(a, torch.Tensor):
            return metas[id(a)]
        if isinstance(a, torch.device):
            return _META
        return a

    margs, mkwargs = pytree.tree_map(conv, (args, kwargs))
    try:
        result = func(*margs, **mkwargs)
    except NotImplementedError as e:
        raise PointerError(
            f"{op_name(func)} cannot run on a pointer: its output shape cannot be inferred ({e})"
        ) from e
    if isinstance(result, torch.Tensor):
        out_leaves, out_spec = [result], None
    else:
        out_leaves, out_spec = pytree.tree_flatten(result)
    leaves: list[Any] = []
    for leaf in out_leaves:
        if leaf is None:
            leaves.append(None)
        elif isinstance(leaf, torch.Tensor):
            alias = next((i for i, m in enumerate(meta_list) if m is leaf), None)
            if alias is not None:
                if not isinstance(tensors[alias], PointerTensor):
                    raise PointerError(
                        f"{op_name(func)} would write a remote result into a local tensor; "
                        "get() the pointer first"
                    )
                leaves.append(("alias", alias))
            else:
                leaves.append(("new", tuple(leaf.shape), leaf.stride(), leaf.dtype))
        else:
            raise ValueRequiresGetError(
                f"{op_name(func)} returns a Python {type(leaf).__name__}, which needs the "
                "remote value; call .get() first"
            )
    return _OutSpec(op_name(func), leaves, out_spec)


def _to_meta(a: torch.Tensor) -> torch.Tensor:
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=_META)


# ----------------------------------------------------------------------------------------
# Function forms
# ----------------------------------------------------------------------------------------


def send_tensor(x: torch.Tensor, worker: WorkerClient) -> PointerTensor:
    """Send a local tensor to ``worker``; returns a pointer owning the remote copy."""
    if isinstance(x, PointerTensor):
        return x.send(worker)
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"send() expects a tensor or nn.Module, got {type(x).__name__}")
    from pointers.wire.messages import Store

    obj_id = worker.new_id()
    value = x.detach()
    tags = sorted(getattr(x, "tags", None) or ())
    worker.post(Store(obj_id, value, tags, getattr(x, "description", "") or ""))
    # The worker decodes a contiguous copy, so the pointer describes a contiguous tensor.
    ptr = PointerTensor.from_meta(
        worker, obj_id, value.shape, contiguous_stride(value.shape), value.dtype
    )
    if x.requires_grad:
        ptr.requires_grad_(True)  # a leaf at the client: remote backward() reaches it
    return ptr


def _creation_kwargs(kwargs: Any) -> dict[str, Any]:
    return {k: v for k, v in (kwargs or {}).items() if k in ("dtype", "layout", "device")}


def contiguous_stride(shape: Any) -> tuple[int, ...]:
    stride, acc = [], 1
    for s in reversed(tuple(shape)):
        stride.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(stride))


def search_worker(worker: WorkerClient, query: tuple[str, ...]) -> list[PointerTensor]:
    """Pointers to ``worker``'s stored tensors carrying every tag in ``query`` (one
    ``Search`` request; the pointers do not own the objects)."""
    if not query or not all(isinstance(q, str) for q in query):
        raise TypeError("search() takes one or more tag strings")
    found = worker.request(Search(list(query)))
    return [
        PointerTensor.from_meta(worker, i, shape, stride, dtype_from_name(dt), owned=False)
        for i, shape, stride, dt, _tags, _desc in found
    ]


def is_pointer(x: Any) -> bool:
    return isinstance(x, PointerTensor)


def call_function(
    location: WorkerClient,
    name: str,
    args: list[Any],
    kwargs: dict[str, Any] | None = None,
    out: list[tuple[Any, torch.dtype]] | None = None,
) -> list[PointerTensor | None]:
    """Run the registered function ``name`` at ``location``; returns pointers to its outputs.

    Pointer arguments (also inside lists) must live at ``location``. ``out`` lists the
    (shape, dtype) of each tensor output so no reply is awaited; without it the call waits
    for the worker to describe its outputs.
    """
    scan = _Scan(aten.add.Tensor)
    sig: list[Any] = []
    wire_args = [scan.walk(a, sig) for a in args]
    wire_kwargs = {k: scan.walk(v, sig) for k, v in (kwargs or {}).items()}
    if scan.location is not None and scan.location is not location:
        raise LocationMismatchError(name, location.id, scan.location.id)
    if out is not None:
        ids = [location.new_id() for _ in out]
        location.post(CallFunction(name, wire_args, wire_kwargs, list(ids), False))
        return [
            PointerTensor(RemoteRef(location, i), tuple(shape), contiguous_stride(shape), dtype)
            for i, (shape, dtype) in zip(ids, out)
        ]
    base = location.new_id()
    for _ in range(63):  # reserve a block of ids for the outputs
        location.new_id()
    _, metas = location.request(CallFunction(name, wire_args, wire_kwargs, [base], True))
    result: list[PointerTensor | None] = []
    for k, m in enumerate(metas):
        if m is None:
            result.append(None)
        else:
            shape, stride, dtype = m
            result.append(
                PointerTensor(
                    RemoteRef(location, base + k),
                    tuple(shape),
                    tuple(stride),
                    dtype_from_name(dtype),
                )
            )
    return result
