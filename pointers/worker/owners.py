"""Data owners: an owner's data at its own worker, and a deployment's list of owners.

A *data owner* puts its data at its own worker through a call at the owner's side, never
a client's message: :func:`own` for an in-process worker, ``python -m pointers serve
--data FILE`` (written by :func:`save_data`) for a served one. Each item is stored sealed
(:mod:`pointers.worker.sealing`) with an :data:`OWNERS_DATA` label: the owner, the digest
of the value (:func:`data_digest`) and the owner's count (its weight in an aggregation;
0: it joins none). A sealed item can be found (``worker.search(tag)``) and described (its
shape and dtype), and nothing else: no client fetches it, copies it, sends it on, tags it,
or runs an op, a plan or an ordinary function on it. The one protocol step that takes it
is the owner's share of it into an aggregation (``mpc``'s ``secagg.share_update``), whose
rule checks the owner's count and shares each value once (:meth:`DataPolicy.record`).

``allowed_users`` (PySyft's ``private_tensor(allowed_users=...)``): the client identities
to whom an item is an ordinary object of their own (a served worker's client certificate
names the identity; in process, the client is :data:`IN_PROCESS_CLIENT`).

What a client itself sends to a worker stays the client's, and so does what PySyft's
``VirtualWorker(id, data=...)`` puts there: in process, the script that makes the worker
is its client.

A deployment's parties know its data owners: :class:`DataPolicy` ``owners`` (``serve
--owner NAME``, repeatable; ``VirtualWorker(id, owners=...)`` in process), the least number
of them an aggregate spans (``min_owners``) and the bound on each owner's weight
(``max_weight``). A party or the dealer is never an owner (``serve`` refuses an owner
that is also one of its ``--peer`` workers, or itself).
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack
import torch

from pointers.errors import NotAllowedError
from pointers.wire.files import read_document, write_document
from pointers.worker.sealing import OWNERS_DATA, Label

__all__ = [
    "DEFAULT_MAX_WEIGHT",
    "DEFAULT_MIN_OWNERS",
    "IN_PROCESS_CLIENT",
    "OWNERS_DATA",
    "DataPolicy",
    "OwnedData",
    "data_digest",
    "data_policy",
    "load_data",
    "own",
    "save_data",
]

IN_PROCESS_CLIENT = "me"  # the identity of an in-process client (PySyft's local worker)
DEFAULT_MIN_OWNERS = 2  # an aggregate spans at least this many distinct listed owners
DEFAULT_MAX_WEIGHT = 1 << 16  # the largest weight (an owner's count) a party adds
DATA_IDS = 1 << 61  # the ids of an owner's data at its worker (a client's ids stay below)
MAX_COUNT = 1 << 31
MAX_TAGS = 64
MAX_TEXT = 512


def data_digest(value: torch.Tensor) -> str:
    """The digest of an owner's value: its dtype, shape and bytes."""
    t = value.detach().contiguous().reshape(-1)
    h = hashlib.sha256()
    h.update(msgpack.packb(["owners-data", str(value.dtype), list(value.shape)]))
    if t.numel():
        h.update(t.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _identity(name: Any, what: str) -> str:
    if type(name) is not str or not 0 < len(name) <= 64 or name != name.strip():
        raise ValueError(f"{what} is a name of 1 to 64 characters, got {name!r}")
    return name


@dataclass(frozen=True)
class OwnedData:
    """One item of an owner's data: the value, its search tags and description, the
    owner's ``count`` (its weight when its worker shares the value into an aggregation;
    0: the owner joins none) and ``allowed_users`` (client identities that use it as their
    own). ``digest`` is computed."""

    value: torch.Tensor
    tags: tuple[str, ...] = ()
    description: str = ""
    count: int = 0
    allowed_users: tuple[str, ...] = ()
    digest: str = field(default="", init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.value, torch.Tensor) or type(self.value) is not torch.Tensor:
            raise TypeError(f"an owner's data is a plain tensor, got {type(self.value).__name__}")
        tags = tuple(self.tags)
        if len(tags) > MAX_TAGS or not all(type(t) is str and 0 < len(t) <= MAX_TEXT for t in tags):
            raise ValueError(f"tags are up to {MAX_TAGS} strings of 1 to {MAX_TEXT} characters")
        if type(self.description) is not str or len(self.description) > MAX_TEXT:
            raise ValueError(f"a description is a str of at most {MAX_TEXT} characters")
        if type(self.count) is not int or not 0 <= self.count <= MAX_COUNT:
            raise ValueError(f"count is an int in [0, 2**31], got {self.count!r}")
        users = tuple(_identity(u, "an allowed user") for u in self.allowed_users)
        value = self.value.detach().clone()
        object.__setattr__(self, "value", value)
        object.__setattr__(self, "tags", tags)
        object.__setattr__(self, "allowed_users", users)
        object.__setattr__(self, "digest", data_digest(value))


class DataPolicy:
    """What a worker knows about data owners: as a party, its deployment's listed owners,
    the least number of them an aggregate spans and the bound on each weight; as an
    owner's worker, the owner's data, and which of its values were shared already.

    One object per worker, shared by every session of a served worker (so a value is
    shared once whichever session asks)."""

    def __init__(
        self,
        owners: Iterable[str] = (),
        *,
        min_owners: int = DEFAULT_MIN_OWNERS,
        max_weight: int = DEFAULT_MAX_WEIGHT,
        data: Iterable[OwnedData] = (),
    ) -> None:
        if isinstance(owners, str):
            raise TypeError("owners is a list of worker names, e.g. ('dave', 'emma')")
        self.owners = frozenset(_identity(o, "a data owner") for o in owners)
        if type(min_owners) is not int or min_owners < DEFAULT_MIN_OWNERS:
            raise ValueError(f"min_owners is an int of at least {DEFAULT_MIN_OWNERS}")
        if type(max_weight) is not int or not 1 <= max_weight <= MAX_COUNT:
            raise ValueError("max_weight is an int in [1, 2**31]")
        self.min_owners = min_owners
        self.max_weight = max_weight
        self.data: list[tuple[int, OwnedData]] = []
        self._lock = threading.Lock()
        self._shared: dict[str, str] = {}  # digest of a value shared -> the round it went to
        for item in data:
            self.add(item)

    def add(self, item: OwnedData) -> int:
        """Add an item of the owner's data; its id at the worker."""
        if not isinstance(item, OwnedData):
            raise TypeError(f"expected OwnedData, got {type(item).__name__}")
        with self._lock:
            obj_id = DATA_IDS + len(self.data)
            self.data.append((obj_id, item))
        return obj_id

    def seal(self, owner: str, item: OwnedData) -> list[Any]:
        """The label of ``item`` at its owner's worker ``owner``: never delivered."""
        return Label(OWNERS_DATA, 0, 0, "", 0, (owner, item.digest, item.count)).wire()

    def place(self, worker: Any, client: str, only: int | None = None) -> None:
        """Put the owner's data (or the item of id ``only``) into ``worker``'s store, as
        ``client`` sees it: sealed, or ordinary where ``client`` is an allowed user."""
        for obj_id, item in list(self.data):
            if only is not None and obj_id != only:
                continue
            sealed: Any
            if client in item.allowed_users:  # (a copy of its own: the user may write it)
                value, sealed = item.value.clone(), False
            else:
                value, sealed = item.value, self.seal(worker.id, item)
            worker.store.put(obj_id, value, set(item.tags), item.description, sealed)

    def record(self, worker: str, round_id: str, digest: str) -> None:
        """Record that the owner's value of ``digest`` is shared into round ``round_id``;
        refused if it was shared before, in any round: two aggregates holding one value
        could be subtracted."""
        with self._lock:
            prior = self._shared.get(digest)
            if prior is not None:
                raise NotAllowedError(
                    f"worker {worker!r}: this value of its owner's was shared before (round "
                    f"{prior!r}): an owner's value is shared once, into one round"
                )
            self._shared[digest] = round_id


def data_policy(worker: Any) -> DataPolicy:
    """The :class:`DataPolicy` of ``worker`` (made empty on first use)."""
    policy = getattr(worker, "data_policy", None)
    if policy is None:
        policy = worker.data_policy = DataPolicy()
    return policy  # type: ignore[no-any-return]


def own(
    worker: Any,
    value: torch.Tensor,
    *tags: str,
    description: str = "",
    count: int = 0,
    allowed_users: Iterable[str] = (),
) -> None:
    """The owner of in-process ``worker`` puts ``value`` there as its own (a call at the
    owner's side, not a message): clients find it by ``tags`` and use it only as the
    owner allows (module docstring). ``count``: the owner's weight when it joins an
    aggregation (0: it joins none)."""
    if not hasattr(worker, "store") or not hasattr(worker, "new_id"):
        raise TypeError("own() puts data at an in-process worker (serve --data for a served one)")
    if isinstance(allowed_users, str):
        raise TypeError("allowed_users is a list of identities, e.g. ('ds',)")
    item = OwnedData(value, tuple(tags), description, count, tuple(allowed_users))
    policy = data_policy(worker)
    obj_id = policy.add(item)
    with worker.lock:
        policy.place(worker, IN_PROCESS_CLIENT, only=obj_id)


DATA_MAGIC = b"pointers-data-1\n"


def save_data(path: Any, items: Iterable[OwnedData]) -> None:
    """Write an owner's data to ``path`` for ``python -m pointers serve --data PATH``
    (:mod:`pointers.wire.files`: msgpack and the tensors' bytes, never pickle)."""
    doc = [
        [it.value, list(it.tags), it.description, it.count, list(it.allowed_users)] for it in items
    ]
    write_document(path, DATA_MAGIC, doc)


def load_data(path: Any) -> list[OwnedData]:
    """The items :func:`save_data` wrote (each checked as :class:`OwnedData` checks it)."""
    what = "an owner's data file (pointers.save_data writes one)"
    doc = read_document(path, DATA_MAGIC, what)
    try:
        rows = [(r[0], tuple(r[1]), r[2], r[3], tuple(r[4])) for r in doc]
        return [OwnedData(*row) for row in rows]
    except (TypeError, ValueError, IndexError, KeyError) as e:
        raise ValueError(f"{what} {str(path)!r} is malformed: {e}") from None
