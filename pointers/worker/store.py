"""A worker's object store: object id -> object, with search tags."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pointers.errors import PartyUnavailable, UnknownObjectError
from pointers.worker.sealing import is_owners_data, refused


@dataclass(slots=True)
class Entry:
    value: Any
    tags: set[str] = field(default_factory=set)
    description: str = ""
    # protocol material: no client may fetch, describe or find it; its label (a list, see
    # pointers.worker.sealing) or False
    sealed: Any = False
    nbytes: int = 0  # what it counts against a served client's limit (see pointers.network.limits)
    # the storage a tensor keeps alive (its data pointer; 0: none), counted once however
    # many stored tensors (views) share it (see pointers.network.limits.CountedStore)
    storage: int = 0


class ObjectStore:
    """Objects a worker holds, keyed by the id their sender chose.

    Ids can be *promised* (by a running program, see :mod:`pointers.worker.program`): a lookup of
    a promised id waits on ``condition`` (whose lock the caller holds) until the object
    arrives, the promise fails, or ``wait_seconds`` pass.
    """

    def __init__(
        self, owner: str, condition: threading.Condition | None = None, wait_seconds: float = 10.0
    ) -> None:
        self.owner = owner
        self._entries: dict[int, Entry] = {}
        self._promised: dict[int, str | None] = {}  # id -> failure message (None: pending)
        self._patient: set[int] = set()  # promised ids whose lookups wait without a deadline
        self.condition = condition or threading.Condition(threading.RLock())
        self.wait_seconds = wait_seconds

    def put(
        self,
        obj_id: int,
        value: Any,
        tags: set[str] | None = None,
        description: str = "",
        sealed: Any = False,
    ) -> None:
        self._entries[obj_id] = Entry(value, set(tags) if tags else set(), description, sealed)
        if self._promised and self._promised.pop(obj_id, 0) is None:
            self._patient.discard(obj_id)
            with self.condition:
                self.condition.notify_all()

    def promise(self, ids: list[int], patient: bool = False) -> None:
        """Lookups of ``ids`` wait for them; ``patient``: without a deadline (an in-process
        delivery posted earlier, see :mod:`pointers.worker.lanes`, which fails the promise
        rather than leave it hanging)."""
        for i in ids:
            if i not in self._entries:
                self._promised[i] = None
                if patient:
                    self._patient.add(i)

    def release_promises(self, ids: list[int]) -> None:
        """Forget the pending promises among ``ids`` (failed ones stay until a waiter reads
        them) and wake the waiters so that they re-check."""
        with self.condition:
            for i in ids:
                if self._promised.get(i, 0) is None:
                    del self._promised[i]
                self._patient.discard(i)
            self.condition.notify_all()

    def fail_promises(self, ids: list[int], why: str) -> None:
        with self.condition:
            for i in ids:
                if i in self._promised:
                    self._promised[i] = why
            self.condition.notify_all()

    def get(self, obj_id: int) -> Any:
        return self.entry(obj_id).value

    def _wait(self, obj_id: int) -> Entry | None:
        patient = obj_id in self._patient
        deadline = time.monotonic() + self.wait_seconds
        with self.condition:
            while obj_id not in self._entries:
                why = self._promised.get(obj_id)
                if why is not None:
                    self._promised.pop(obj_id, None)
                    raise PartyUnavailable(f"worker {self.owner!r}: {why}")
                left = self.wait_seconds if patient else deadline - time.monotonic()
                if left <= 0 or obj_id not in self._promised:
                    self._promised.pop(obj_id, None)
                    raise PartyUnavailable(
                        f"worker {self.owner!r} waited {self.wait_seconds:g} s for object "
                        f"{obj_id}, which a program or a peer was to produce"
                    )
                self.condition.wait(left)
        return self._entries.get(obj_id)

    def entry(self, obj_id: int) -> Entry:
        """The entry of ``obj_id`` (waiting for it if it is promised)."""
        entry = self._entries.get(obj_id)
        if entry is None and obj_id in self._promised:
            entry = self._wait(obj_id)
        if entry is None:
            raise UnknownObjectError(f"worker {self.owner!r} holds no object with id {obj_id}")
        return entry

    def pop(self, obj_id: int) -> Any:
        value = self.get(obj_id)
        self._entries.pop(obj_id, None)
        return value

    def forget(self, obj_id: int) -> Entry:
        """Drop the entry of ``obj_id`` (which must exist) and return it."""
        return self._entries.pop(obj_id)

    def is_sealed(self, obj_id: int) -> bool:
        entry = self._entries.get(obj_id)
        return entry is not None and entry.sealed

    def discard(self, obj_id: int) -> None:
        self._entries.pop(obj_id, None)

    def search(self, query: list[str]) -> list[int]:
        """Ids of objects carrying every tag in ``query`` (an exact tag match): ordinary
        objects and an owner's data, never protocol material."""
        wanted = set(query)
        return [
            i
            for i, e in self._entries.items()
            if wanted <= e.tags and (not e.sealed or is_owners_data(e.sealed))
        ]

    def view(self, sealed: bool = True) -> Mapping[int, Any]:
        """A read-only view of the stored objects (``sealed=False``: the ids of protocol
        material are listed, but reading one is refused, as a network worker does)."""
        return _ReadOnlyView(self._entries, sealed)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, obj_id: object) -> bool:
        return obj_id in self._entries


class _ReadOnlyView(Mapping[int, Any]):
    """A read-only mapping of object id -> stored value."""

    def __init__(self, entries: dict[int, Entry], sealed: bool = True) -> None:
        self._entries = entries
        self._sealed = sealed

    def __getitem__(self, key: int) -> Any:
        e = self._entries[key]
        if e.sealed and not self._sealed:
            raise refused("reading it", key)
        return e.value

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._entries))

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ObjectsView({len(self)} objects: {list(self._entries)[:10]})"
