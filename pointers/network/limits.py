"""What a client namespace may hold at a served worker, and what things cost there.

* :func:`footprint`: the bytes a stored object holds (a tensor's storage; a program's or a
  plan's Python objects, walked once), and what tags and bookkeeping cost;
* :func:`op_bytes`: the bytes an op's outputs take, found on the ``meta`` device before it
  runs (:func:`warm_meta` loads those kernels at startup);
* :class:`CountedStore`: an object store that counts those bytes, and its objects, against
  the session's limits (``serve --max-stored-mb``, ``--max-objects``), refusing before
  anything is allocated.

Imports only :mod:`pointers.errors` and :mod:`pointers.worker.store` (see the package
docstring for the order of this package's modules).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from typing import Any

import torch

from pointers.errors import LimitExceeded, NotAllowedError, UnknownObjectError
from pointers.worker.store import Entry, ObjectStore

_MISSING: Any = object()

# What the bookkeeping of one id costs a namespace (an announced, expected, promised,
# dropped or failed id: a dict entry and its int), counted against its byte limit; and
# the longest reason a failed delivery keeps (longer ones are cut).
BOOK_BYTES = 96
MAX_REASON = 2000


def held_size(value: Any) -> int:
    """What a held delivery counts: a tensor's storage, or a failure's reason."""
    if isinstance(value, torch.Tensor):
        return value.untyped_storage().nbytes()
    if isinstance(value, str):
        return len(value) + BOOK_BYTES
    return 0


def storage_of(value: Any) -> tuple[int, int]:
    """(data pointer, bytes) of the storage a plain tensor keeps alive; (0, 0) otherwise."""
    if type(value) is torch.Tensor:
        st = value.untyped_storage()
        return st.data_ptr(), st.nbytes()
    return 0, 0


TAG_BYTES = 64  # what one tag counts beyond its characters (a set slot and a str object)
_ATOMS = (int, float, complex, str, bytes, bool, type(None))


def footprint(value: Any) -> int:
    """The bytes a stored object holds: a tensor's storage (all of it: a view keeps its
    base's storage alive), or for anything else (a program, a plan) its Python containers
    and values walked once (tensors by their data; functions and op handles, shared by
    every plan, count nothing)."""
    if type(value) is torch.Tensor:
        return value.untyped_storage().nbytes()
    total = 0
    seen: set[int] = set()
    stack = [value]
    while stack:
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            total += obj.numel() * obj.element_size() + 64
        elif isinstance(obj, _ATOMS):
            total += sys.getsizeof(obj)
        elif isinstance(obj, list | tuple | set | frozenset):
            total += sys.getsizeof(obj)
            stack.extend(obj)
        elif isinstance(obj, dict):
            total += sys.getsizeof(obj)
            stack.extend(obj.keys())
            stack.extend(obj.values())
        elif type(obj).__module__.startswith("pointers."):  # plan nodes, program slots
            total += sys.getsizeof(obj)
            slots = getattr(type(obj), "__slots__", ())
            stack.extend(getattr(obj, n) for n in slots if hasattr(obj, n))
            d = getattr(obj, "__dict__", None)
            if d is not None:
                stack.append(d)
    return total


def tag_bytes(tags: set[str] | list[str] | None, description: str) -> int:
    return sum(len(t) + TAG_BYTES for t in tags or ()) + len(description)


class CountedStore(ObjectStore):
    """An object store whose objects, and the ids it keeps books of, count against a
    byte limit (``max_bytes``) and an object limit (``max_objects``), checked before a
    write (or an op's outputs, :meth:`charge_check`) is allocated.

    Its writes happen under ``_cond``'s lock. The books of ids (announced, expected,
    promised, dropped and failed deliveries, held ones) are kept by
    :class:`~pointers.network.waiting.WaitingStore`; they live here because they count."""

    def __init__(self, owner: str, *, max_bytes: int | None, max_objects: int | None) -> None:
        super().__init__(owner)
        self.max_bytes = max_bytes
        self.max_objects = max_objects
        # stored objects (a storage once however many views share it), held deliveries
        self.bytes = 0
        self.kept = 0  # what registered functions keep in function_state (see used())
        self._storages: dict[int, list[int]] = {}  # data pointer -> [bytes, stored tensors]
        self._cond = threading.Condition()
        self._expected: dict[int, str] = {}  # object id -> peer that will deliver it
        self._failed: dict[int, str] = {}  # object id -> why its delivery failed
        # ids a peer may deliver into: announced by the client (``expect``: that peer only)
        # or promised by a program (None: any accepted peer), until they arrive
        self._announced: dict[int, str | None] = {}
        self._dropped: dict[int, str | None] = {}  # announced ids deleted before they arrived
        # deliveries that came before their announcement, in the order they came (see
        # WaitingStore._hold): each counts as an object
        self._held_order: OrderedDict[tuple[str, int], float] = OrderedDict()

    def _ref(self, key: int, nbytes: int) -> int:
        """One more stored tensor keeps storage ``key`` alive; the bytes newly counted."""
        if not key:
            return 0
        rec = self._storages.get(key)
        if rec is not None:
            rec[1] += 1
            return 0
        self._storages[key] = [nbytes, 1]
        return nbytes

    def _unref(self, key: int) -> int:
        """One stored tensor fewer keeps storage ``key`` alive; the bytes no longer counted."""
        rec = self._storages.get(key) if key else None
        if rec is None:
            return 0
        rec[1] -= 1
        if rec[1] > 0:
            return 0
        del self._storages[key]
        return rec[0]

    def used(self) -> int:
        """What this namespace counts against its byte limit: its stored objects and held
        deliveries (:attr:`bytes`), what its functions keep (:attr:`kept`: nonce records,
        input seeds) and the bookkeeping of its announced, promised and failed ids."""
        ids = len(self._announced) + len(self._expected) + len(self._promised)
        ids += len(self._dropped)
        return (
            self.bytes
            + self.kept
            + BOOK_BYTES * ids
            + (BOOK_BYTES + MAX_REASON) * len(self._failed)
        )

    def keep(self, nbytes: int, what: str) -> None:
        """Count ``nbytes`` that a registered function keeps (in ``function_state``, for as
        long as the namespace lives) against the limit, or refuse them."""
        if not nbytes:
            return
        with self._cond:
            total = self.used() + nbytes
            if self.max_bytes is not None and total > self.max_bytes:
                raise LimitExceeded(
                    f"{what} would keep {nbytes} more bytes of records at worker "
                    f"{self.owner!r}, taking this client's storage there to {total} bytes, "
                    f"over its limit of {self.max_bytes} bytes (serve --max-stored-mb); "
                    "records of used nonces last as long as the session: start a new one"
                )
            self.kept += nbytes

    def _check_ids(self, n: int, what: str) -> None:
        """Refuse the bookkeeping of ``n`` more ids past the limit (lock held)."""
        if self.max_bytes is None or not n:
            return
        total = self.used() + 2 * BOOK_BYTES * n
        if total > self.max_bytes:
            raise LimitExceeded(
                f"{what} {n} object ids would take this client's storage at worker "
                f"{self.owner!r} to {total} bytes ({2 * BOOK_BYTES} bytes an id), over its "
                f"limit of {self.max_bytes} bytes (serve --max-stored-mb)"
            )

    def _check_count(self, obj_id: int) -> None:
        """Refuse a new object over the count limit (with the store's lock held)."""
        limit = self.max_objects
        if limit is not None and len(self._entries) + len(self._held_order) >= limit:
            raise LimitExceeded(
                f"storing object {obj_id} would take this client's objects at worker "
                f"{self.owner!r} past its limit of {limit} objects (serve --max-objects); "
                "get() or drop objects"
            )

    def charge_check(self, obj_id: int | None, size: int, what: str) -> None:
        """Refuse, before it is allocated, an object of ``size`` bytes for ``obj_id``
        (None: a temporary) that would take the client past its byte limit."""
        if self.max_bytes is None or not size:
            return
        with self._cond:
            old = self._entries.get(obj_id) if obj_id is not None else None
            total = self.used() + size - (old.nbytes if old is not None else 0)
        if total > self.max_bytes:
            raise LimitExceeded(
                f"{what} would allocate {size} bytes, taking this client's storage at worker "
                f"{self.owner!r} to {total} bytes, over its limit of {self.max_bytes} bytes "
                "(serve --max-stored-mb); refused before running; get() or drop objects"
            )

    def retag(self, obj_id: int, tags: list[str], description: str) -> None:
        """Add ``tags`` (and set ``description`` if given) to a stored object, counting
        them against the client's byte limit."""
        with self._cond:
            e = self._entries.get(obj_id)
            if e is None:
                raise UnknownObjectError(f"worker {self.owner!r} holds no object with id {obj_id}")
            new_tags = e.tags | set(tags)
            new_desc = description or e.description
            extra = tag_bytes(new_tags, new_desc) - tag_bytes(e.tags, e.description)
            if self.max_bytes is not None and extra > 0 and self.used() + extra > self.max_bytes:
                raise LimitExceeded(
                    f"tagging object {obj_id} ({extra} bytes of tags and description) would "
                    f"take this client's storage at worker {self.owner!r} over its limit of "
                    f"{self.max_bytes} bytes (serve --max-stored-mb)"
                )
            e.tags, e.description = new_tags, new_desc
            e.nbytes += extra
            self.bytes += extra

    def forget(self, obj_id: int) -> Entry:
        """Drop the entry of ``obj_id`` (which must exist) and return it (a move: the
        caller holds the value). Its bytes no longer count."""
        with self._cond:
            e = self._entries.pop(obj_id)
            self.bytes -= e.nbytes + self._unref(e.storage)
            return e


_OP_BYTES: dict[Any, int | None] = {}  # (op, shapes and arguments) -> bytes it allocates
_OP_BYTES_MAX = 4096


def _meta_key(obj: Any) -> Any:
    t = type(obj)
    if t is torch.Tensor or isinstance(obj, torch.Tensor):
        return (tuple(obj.shape), obj.dtype)
    if t is list or t is tuple:
        return (t, *(_meta_key(o) for o in obj))
    if t is dict:
        return (dict, *((k, _meta_key(v)) for k, v in obj.items()))
    hash(obj)  # an unhashable value: no key (TypeError)
    return obj


def _to_meta(obj: Any) -> Any:
    if isinstance(obj, torch.Tensor):
        return torch.empty_strided(obj.shape, obj.stride(), dtype=obj.dtype, device="meta")
    if isinstance(obj, list):
        return [_to_meta(o) for o in obj]
    if isinstance(obj, tuple):
        return tuple(_to_meta(o) for o in obj)
    if isinstance(obj, dict):
        return {k: _to_meta(v) for k, v in obj.items()}
    return obj


def warm_meta() -> None:
    """Run the meta path once: torch loads its meta kernels on first use (1 to 2 s on a
    busy machine), which a worker does at startup rather than inside a client's deadline."""
    op_bytes("aten::add.Tensor", torch.ops.aten.add.Tensor, [torch.ones(1), torch.ones(1)], {})
    op_bytes("aten::ones.default", torch.ops.aten.ones.default, [[1]], {})


def op_bytes(name: str, op: Any, args: list[Any], kwargs: dict[str, Any]) -> int:
    """The bytes the outputs of ``op(*args, **kwargs)`` take, found by running it on the
    ``meta`` device (no data: shapes only), cached by op, input shapes and other arguments.

    An op whose output's size depends on the values (a boolean mask's ``index``,
    ``where(cond)``) is bounded by its inputs (:func:`_data_dependent_bytes`: as if every
    element of the mask were set); any other op that the ``meta`` device cannot run is
    refused (``NotAllowedError``), and an op that fails there raises that error: nothing
    runs unsized."""
    try:
        key: Any = (name, _meta_key(args), _meta_key(kwargs))
        hit = _OP_BYTES.get(key, _MISSING)
    except TypeError:
        key, hit = None, _MISSING
    if hit is _MISSING:
        hit = _op_bytes(name, op, args, kwargs)
        if key is not None:
            if len(_OP_BYTES) >= _OP_BYTES_MAX:
                _OP_BYTES.clear()
            _OP_BYTES[key] = hit
    if isinstance(hit, BaseException):
        raise hit.with_traceback(None)
    return hit  # type: ignore[no-any-return]


def _leaf_bytes(result: Any) -> int:
    return sum(
        t.numel() * t.element_size()
        for t in torch.utils._pytree.tree_leaves(result)
        if isinstance(t, torch.Tensor)
    )


def _op_bytes(name: str, op: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """:func:`op_bytes` uncached: the bytes, or the exception to raise."""
    margs, mkwargs = _to_meta(args), _to_meta(kwargs)
    if "device" in mkwargs:
        mkwargs["device"] = "meta"
    elif not any(isinstance(a, torch.Tensor) for a in args):  # a factory: ones, arange, ...
        schema = getattr(op, "_schema", None)
        if schema is not None and any(a.name == "device" for a in schema.arguments):
            mkwargs["device"] = "meta"
    try:
        return _leaf_bytes(op(*margs, **mkwargs)) + _mask_bytes(name, margs)
    except NotImplementedError:
        bound = _data_dependent_bytes(name, op, margs, mkwargs)
        if bound is not None:
            return bound
        return NotAllowedError(
            f"op {name!r} cannot be sized before it runs (the size of its output depends "
            "on the values), so a worker with a storage limit refuses it (serve "
            "--max-stored-mb)"
        )
    except Exception as e:  # the op itself would fail the same way: it does not run
        return e


def _masks(name: str, margs: list[Any]) -> list[torch.Tensor]:
    """The boolean index tensors of an ``index``/``index_put`` op (empty for other ops)."""
    base = name.partition("::")[2].partition(".")[0]
    if base not in ("index", "index_put", "index_put_") or len(margs) < 2:
        return []
    indices = margs[1]
    if not isinstance(indices, list | tuple):
        return []
    return [
        i for i in indices if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
    ]


def _mask_bytes(name: str, margs: list[Any]) -> int:
    """What torch allocates for the boolean masks of an index op besides its output: the
    indices of the set elements (``nonzero``), as if every element were set."""
    return sum(m.numel() * max(m.dim(), 1) * 8 for m in _masks(name, margs))


def _data_dependent_bytes(name: str, op: Any, margs: list[Any], mkwargs: dict[str, Any]) -> Any:
    """An upper bound of the bytes of an op whose output size depends on the values:
    ``index`` with boolean masks sized as if every element of each mask were set (each
    mask of k dims is k index tensors of its element count), ``where(cond)`` likewise;
    None for any other op."""
    base = name.partition("::")[2].partition(".")[0]
    masks = _masks(name, margs)
    if base == "index" and masks:
        indices = []
        for i in margs[1]:
            if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8):
                full = torch.empty((i.numel(),), dtype=torch.int64, device="meta")
                indices.extend([full] * max(i.dim(), 1))
            else:
                indices.append(i)
        try:
            out = op(margs[0], indices, *margs[2:], **mkwargs)
        except Exception as e:
            return e
        return _leaf_bytes(out) + _mask_bytes(name, margs)
    if base == "where" and len(margs) == 1 and isinstance(margs[0], torch.Tensor):
        cond = margs[0]
        return 2 * cond.numel() * max(cond.dim(), 1) * 8  # nonzero, then its columns
    return None
