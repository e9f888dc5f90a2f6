"""PySyft 0.2 compatible names: thin layers over this package, so PySyft users feel at home.

Each name here exists because PySyft 0.2's tutorials type it; each is documented as
PySyft-compatible and maps onto our own vocabulary (docs/coming-from-pysyft.md):

* ``worker._objects``: a read-only view of the worker's objects (ours: ``worker.objects``).
* ``pt.local_worker`` / ``hook.local_worker``: the client, a worker named ``"me"`` with
  ``is_client_worker = True``; ``ptr.owner`` is it.
* ``model.copy()``, ``model.move(worker)``: a copy of a (possibly sent) model; a move.
* ``VirtualWorker(hook, id="bob")``: PySyft's signature (the hook is dropped);
  :class:`Optims`, one optimizer per worker.
* ``worker.search(["#a", "#b"])`` (a list, as well as ``search("#a", "#b")``), the found
  pointers carrying ``.tags`` and ``.description``; ``x.describe(text)``;
  ``worker._tensors`` (the tensors it stores, protocol material listed but not readable);
  ``me.request_search(tags, location=worker)`` (tensors and protocols found there).
* ``x.fix_precision()`` / ``x.float_precision()``: :class:`FixedPrecisionTensor`, an
  explicit fixed-point encoding that ``share(...)`` accepts (on a pointer: a pointer marked
  with the precision, so that its worker encodes and shares it); ``model.fix_precision()``
  marks a model's precision for ``share``; ``optimizer.fix_precision()`` is the optimizer.

This module knows nothing about cryptography: ``mpc.share`` reads the precision a
:class:`FixedPrecisionTensor` (or a marked model) carries.
"""

from __future__ import annotations

import copy as _copy
import math
from collections.abc import Iterator, Mapping
from typing import Any, cast

import torch
from torch import nn

from pointers.pointer_tensor import PointerTensor

#: PySyft's default ``precision_fractional`` (decimal digits)
PYSYFT_PRECISION_FRACTIONAL = 3
#: our default fractional bits (mpc's default encoding)
DEFAULT_FRAC_BITS = 16
_MODEL_MARK = "_pointers_frac_bits"


# -- the client worker ----------------------------------------------------------------------

_local_worker: Any = None


def local_worker() -> Any:
    """The client as a worker (PySyft's ``sy.local_worker``): a worker named ``"me"`` with
    ``is_client_worker = True``. Our client is not a worker that others send to: this one
    exists for code that reads ``ptr.owner`` or ``local_worker.id``."""
    global _local_worker
    if _local_worker is None:
        from pointers.worker.base import VirtualWorker

        _local_worker = VirtualWorker("me")
        _local_worker.is_client_worker = True
    return _local_worker


def objects_view(worker: Any) -> Any:
    """PySyft's ``worker._objects``: the read-only view ``worker.objects``."""
    return worker.objects


def tensors_view(worker: Any) -> Mapping[int, Any]:
    """PySyft's ``worker._tensors``: the tensors ``worker`` stores (id -> tensor), read-only.
    Protocol material (sealed) is listed, as ``worker.objects`` lists it, but reading one is
    refused; stored objects that are not tensors are left out."""
    return _TensorsView(worker.objects)


class _TensorsView(Mapping[int, Any]):
    def __init__(self, objects: Mapping[int, Any]) -> None:
        self._objects = objects

    def _listed(self, key: int) -> bool:
        try:
            return isinstance(self._objects[key], torch.Tensor)
        except KeyError:
            return False
        except Exception:  # sealed: listed, its value refused (as in worker.objects)
            return True

    def __getitem__(self, key: int) -> Any:
        value = self._objects[key]  # (a sealed object: refused here)
        if not isinstance(value, torch.Tensor):
            raise KeyError(key)
        return value

    def __iter__(self) -> Iterator[int]:
        return iter([k for k in self._objects if self._listed(k)])

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def __repr__(self) -> str:
        return f"TensorsView({len(self)} tensors: {list(self)[:10]})"


def _search_query(query: tuple[Any, ...]) -> tuple[str, ...]:
    if len(query) == 1 and isinstance(query[0], list | tuple):  # PySyft: search(["#a", "#b"])
        query = tuple(query[0])
    if not query or not all(isinstance(q, str) for q in query):
        raise TypeError("search() takes one or more tag strings, or a list of them")
    return query


def worker_search(worker: Any, *query: Any) -> list[PointerTensor]:
    """``worker.search("#a", "#b")`` or PySyft's ``worker.search(["#a", "#b"])``: pointers
    to the stored tensors carrying every tag, each with its ``.tags`` and ``.description``
    (PySyft's ``results[0].description``). The pointers do not own the objects."""
    from pointers.wire.messages import Search
    from pointers.wire.serde import dtype_from_name

    found = worker.request(Search(list(_search_query(query))))
    out = []
    for i, shape, stride, dt, tags, description in found:
        p = PointerTensor.from_meta(worker, i, shape, stride, dtype_from_name(dt), owned=False)
        p.tags, p.description = set(tags), description  # type: ignore[attr-defined]
        out.append(p)
    return out


def request_search(me: Any, query: Any, location: Any) -> list[Any]:
    """PySyft's ``me.request_search(["tag"], location=james)``: pointers to what ``location``
    stores under every tag in ``query``: a protocol as a pointer to the protocol (its
    ``.get()`` gives the :class:`~pointers.Protocol`), a tensor as a pointer to it."""
    from pointers.plans.protocol import PROTOCOL_TAG, PointerProtocol

    if isinstance(query, str):
        query = [query]
    out: list[Any] = []
    for p in worker_search(location, *_search_query(tuple(query))):
        is_protocol = PROTOCOL_TAG in p.tags  # type: ignore[attr-defined]
        out.append(PointerProtocol(p) if is_protocol else p)
    return out


def describe(x: Any, description: str) -> Any:
    """PySyft's ``x.describe(text)``: a description that ``worker.search`` results carry;
    returns ``x``."""
    if not isinstance(description, str):
        raise TypeError("describe() takes a string")
    if isinstance(x, PointerTensor):
        return x.tag(description=description)
    x.description = description
    return x


def pointer_owner(ptr: PointerTensor) -> Any:
    """PySyft's ``ptr.owner``: the worker holding the pointer (the client, ``local_worker``)."""
    return local_worker()


# -- models ----------------------------------------------------------------------------------


def module_copy(module: nn.Module) -> nn.Module:
    """A deep copy of ``module`` (PySyft's ``model.copy()``). A sent model's copy has its own
    copies of the parameters at the same worker (copied there, never fetched)."""
    memo: dict[int, Any] = {}
    for sub in module.modules():
        for p in sub._parameters.values():
            if isinstance(p, PointerTensor) and id(p) not in memo:
                new = nn.Parameter(p.detach().copy(), requires_grad=p.requires_grad)
                if isinstance(p.grad, PointerTensor):
                    new.grad = p.grad.copy()
                memo[id(p)] = new
        for b in sub._buffers.values():
            if isinstance(b, PointerTensor) and id(b) not in memo:
                memo[id(b)] = b.copy()
    return _copy.deepcopy(module, memo)


def module_move(module: nn.Module, worker: Any) -> nn.Module:
    """PySyft's ``model.move(worker)``: the parameters go party to party to ``worker``."""
    from pointers.module import send

    return send(module, worker)


# -- fixed precision -------------------------------------------------------------------------


def frac_bits_for(precision_fractional: int | None = None, frac_bits: int | None = None) -> int:
    """Fractional bits for PySyft's ``precision_fractional`` (decimal digits: at least as
    fine, ``ceil(digits * log2(10))``), or ``frac_bits`` itself; default 16 bits."""
    if precision_fractional is not None and frac_bits is not None:
        raise TypeError("pass precision_fractional (decimal digits) or frac_bits, not both")
    if frac_bits is None:
        if precision_fractional is None:
            return DEFAULT_FRAC_BITS
        if isinstance(precision_fractional, bool) or not isinstance(precision_fractional, int):
            raise TypeError("precision_fractional must be an int (decimal digits)")
        if not 0 <= precision_fractional <= 12:
            raise ValueError(f"precision_fractional must be in [0, 12], got {precision_fractional}")
        return math.ceil(precision_fractional * math.log2(10))
    if isinstance(frac_bits, bool) or not isinstance(frac_bits, int) or not 0 <= frac_bits <= 40:
        raise ValueError(f"frac_bits must be an int in [0, 40], got {frac_bits!r}")
    return frac_bits


_INTEGER_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


class FixedPrecisionTensor(torch.Tensor):
    """A float tensor encoded in fixed point (PySyft's ``x.fix_precision()``): int64 values
    ``round(x * 2**frac_bits)``. ``share(...)`` shares it with its ``frac_bits``;
    ``float_precision()`` decodes it. Ops on it return plain int64 tensors."""

    frac_bits: int
    float_dtype: torch.dtype
    # (torch's stubs type it as a classmethod; it is the plain function torch checks for)
    __torch_function__ = cast(Any, torch._C._disabled_torch_function_impl)

    @staticmethod
    def encode(x: torch.Tensor, frac_bits: int) -> FixedPrecisionTensor:
        if isinstance(x, PointerTensor):
            raise TypeError(
                "FixedPrecisionTensor.encode() takes a local tensor; ptr.fix_precision() "
                "marks a remote one, which its worker encodes when it is shared"
            )
        x = x.detach()
        if not x.is_floating_point():
            if x.dtype not in _INTEGER_DTYPES:
                raise TypeError(f"fix_precision() expects a float or integer tensor, got {x.dtype}")
            # integers are exact already: no fractional bits (shared as integers)
            t = torch.Tensor._make_subclass(FixedPrecisionTensor, x.to(torch.int64))
            t.frac_bits = 0
            t.float_dtype = x.dtype
            return t
        limit = 2.0 ** (62 - frac_bits)
        if x.numel() and not bool(x.abs().max() < limit):
            raise ValueError(
                f"a value is too large for {frac_bits} fractional bits (|x| < {limit})"
            )
        ring = torch.round(x.double() * 2.0**frac_bits).to(torch.int64)
        t = torch.Tensor._make_subclass(FixedPrecisionTensor, ring)
        t.frac_bits = frac_bits
        t.float_dtype = x.dtype
        return t

    def float_precision(self) -> torch.Tensor:
        """The decoded float tensor (an integer tensor's own values)."""
        raw = self.as_subclass(torch.Tensor)
        if not self.float_dtype.is_floating_point:
            return raw.to(self.float_dtype)
        return (raw.double() / 2.0**self.frac_bits).to(self.float_dtype)

    def fix_precision(self, *args: Any, **kwargs: Any) -> FixedPrecisionTensor:
        raise TypeError("this tensor is already in fixed precision")

    # mypy rejects any override of torch's untyped Tensor.__repr__, even its own signature
    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        raw = self.as_subclass(torch.Tensor)
        return f"FixedPrecisionTensor({raw.tolist()}, frac_bits={self.frac_bits})"


def fix_precision(
    x: Any, precision_fractional: int | None = None, frac_bits: int | None = None, **_: Any
) -> Any:
    """PySyft's ``x.fix_precision()``: a :class:`FixedPrecisionTensor`; on a model, marks
    its precision for ``share`` (the parameters stay floats until shared); on an
    optimizer, the optimizer itself (shared training keeps its own fixed point).
    PySyft's other keywords (``base=``, ``dtype=``) are accepted and ignored."""
    bits = frac_bits_for(precision_fractional, frac_bits)
    if isinstance(x, PointerTensor):
        return _mark_remote(x, bits)
    if isinstance(x, nn.Module):
        setattr(x, _MODEL_MARK, bits)
        return x
    if isinstance(x, torch.optim.Optimizer):
        return x
    return FixedPrecisionTensor.encode(x, bits)


_POINTER_MARK = "_pointers_frac_bits"


def _mark_remote(ptr: PointerTensor, bits: int) -> PointerTensor:
    """PySyft's ``ptr.fix_precision()``: a pointer to the same remote float tensor, marked
    with the fractional bits ``share(...)`` encodes it with, at the worker that holds it
    (the value never comes to the client)."""
    if not ptr.is_floating_point():
        raise TypeError(f"fix_precision() expects a float tensor, got {ptr.dtype}")
    if getattr(ptr, _POINTER_MARK, None) is not None:
        raise TypeError("this pointer is already in fixed precision")
    alias = ptr.detach()  # shares the remote object
    setattr(alias, _POINTER_MARK, bits)
    return alias


def float_precision(x: Any) -> Any:
    """PySyft's ``x.float_precision()``: decode a :class:`FixedPrecisionTensor`; a float
    tensor (what ``shared.get()`` returns here: it decodes) is returned as it is; on a
    model, clears the mark."""
    if isinstance(x, FixedPrecisionTensor):
        return x.float_precision()
    if isinstance(x, PointerTensor) and getattr(x, _POINTER_MARK, None) is not None:
        return x.detach()  # the unmarked pointer
    if isinstance(x, nn.Module):
        if hasattr(x, _MODEL_MARK):
            delattr(x, _MODEL_MARK)
        return x
    if isinstance(x, torch.Tensor):  # already decoded (what shared.get() returns)
        return x
    raise TypeError(f"float_precision() expects a fixed-precision tensor, got {type(x).__name__}")


def precision_of(x: Any) -> int | None:
    """The fractional bits a :class:`FixedPrecisionTensor` or a marked model carries."""
    if isinstance(x, FixedPrecisionTensor):
        return x.frac_bits
    if isinstance(x, PointerTensor):
        return getattr(x, _POINTER_MARK, None)
    return getattr(x, _MODEL_MARK, None) if isinstance(x, nn.Module) else None


# -- PySyft's worker signature ----------------------------------------------------------------

#: PySyft 0.2 ``VirtualWorker`` keywords that have no meaning here (accepted, ignored)
_IGNORED_WORKER_KEYWORDS = ("log_msgs", "verbose", "auto_add")


class Hooked(list):  # type: ignore[type-arg]
    """What :func:`pointers.hook` returns: the names it added (a list), and, as PySyft's
    ``sy.TorchHook(torch)`` object, ``local_worker`` (the client, ``pointers.local_worker``).
    Defined here, below :mod:`pointers.hook`, so that a worker made with PySyft's signature
    recognises the hook it is handed."""

    @property
    def local_worker(self) -> Any:
        return local_worker()


def _is_hook(obj: Any) -> bool:
    return isinstance(obj, Hooked)


def _accepting_pysyft_signature(init: Any) -> Any:
    """``VirtualWorker(hook, id="bob", data=(...), is_client_worker=False)`` as PySyft
    0.2 wrote it: the hook is dropped (ours needs none), ``is_client_worker`` is kept as an
    attribute, PySyft's logging keywords are ignored; ``VirtualWorker("bob")`` unchanged."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if args and _is_hook(args[0]):
            args = args[1:]
        if "hook" in kwargs and _is_hook(kwargs["hook"]):  # VirtualWorker(id=..., hook=hook)
            del kwargs["hook"]
        elif args and not isinstance(args[0], str) and "id" in kwargs:
            raise TypeError(
                "VirtualWorker(hook, id=...) expects the object pointers.hook(torch) returns "
                f"first, got {type(args[0]).__name__}"
            )
        client = kwargs.pop("is_client_worker", None)
        for k in _IGNORED_WORKER_KEYWORDS:
            kwargs.pop(k, None)
        if isinstance(kwargs.get("data"), dict):  # PySyft's default data={}
            kwargs["data"] = list(kwargs["data"].values())
        init(self, *args, **kwargs)
        if client is not None:
            self.is_client_worker = bool(client)

    __init__.__doc__ = init.__doc__
    __init__.__wrapped__ = init  # type: ignore[attr-defined]
    __init__._pysyft_signature = True  # type: ignore[attr-defined]
    return __init__


# -- PySyft's Optims (one optimizer per worker) ------------------------------------------------


class Optims:
    """PySyft's ``sy.Optims(workers, optim=...)`` (its ``floptimizer``): one optimizer per
    worker, each a fresh optimizer of ``optim``'s class over the same parameters with the
    same settings, so that state such as momentum or Adam's moments is never mixed
    between workers' data. ``get_optim(worker)`` takes a worker or its id."""

    def __init__(self, workers: Any, optim: torch.optim.Optimizer) -> None:
        if not isinstance(optim, torch.optim.Optimizer):
            raise TypeError(f"Optims(workers, optim=...) expects an optimizer, got {optim!r}"[:200])
        self.optim = optim
        self.workers = [getattr(w, "id", w) for w in workers]
        if not self.workers or not all(isinstance(w, str) for w in self.workers):
            raise TypeError("Optims(workers, ...) expects workers or their ids")
        self.optimizers: dict[str, torch.optim.Optimizer] = {}
        for w in self.workers:
            groups = [dict(g) for g in optim.param_groups]
            self.optimizers[w] = type(optim)(groups, **optim.defaults)

    def get_optim(self, worker: Any) -> torch.optim.Optimizer:
        key = getattr(worker, "id", worker)
        try:
            return self.optimizers[key]
        except KeyError:
            raise KeyError(f"no optimizer for worker {key!r}; Optims has {self.workers}") from None

    def count(self) -> int:
        return len(self.optimizers)


def install() -> None:
    """Attach the attribute-style names to our own classes (idempotent)."""
    from pointers.worker.base import VirtualWorker, Worker

    Worker._objects = property(objects_view)  # type: ignore[attr-defined]
    Worker._tensors = property(tensors_view)  # type: ignore[attr-defined]
    Worker.request_search = request_search  # type: ignore[attr-defined]
    if VirtualWorker.search is not worker_search:
        VirtualWorker.search = worker_search  # type: ignore[method-assign, assignment]
    PointerTensor.owner = property(pointer_owner)  # type: ignore[attr-defined]
    if not hasattr(Worker, "is_client_worker"):
        Worker.is_client_worker = False  # type: ignore[attr-defined]
    if not getattr(VirtualWorker.__init__, "_pysyft_signature", False):
        VirtualWorker.__init__ = _accepting_pysyft_signature(VirtualWorker.__init__)  # type: ignore[method-assign]
