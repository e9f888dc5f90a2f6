"""A worker's object store: object id -> object, with search tags."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from .errors import UnknownObjectError


@dataclass(slots=True)
class Entry:
    value: Any
    tags: set[str] = field(default_factory=set)
    description: str = ""


class ObjectStore:
    """Objects a worker holds, keyed by the id their sender chose."""

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._entries: dict[int, Entry] = {}

    def put(
        self, obj_id: int, value: Any, tags: set[str] | None = None, description: str = ""
    ) -> None:
        self._entries[obj_id] = Entry(value, set(tags) if tags else set(), description)

    def get(self, obj_id: int) -> Any:
        try:
            return self._entries[obj_id].value
        except KeyError:
            raise UnknownObjectError(
                f"worker {self.owner!r} holds no object with id {obj_id}"
            ) from None

    def entry(self, obj_id: int) -> Entry:
        try:
            return self._entries[obj_id]
        except KeyError:
            raise UnknownObjectError(
                f"worker {self.owner!r} holds no object with id {obj_id}"
            ) from None

    def pop(self, obj_id: int) -> Any:
        value = self.get(obj_id)
        del self._entries[obj_id]
        return value

    def discard(self, obj_id: int) -> None:
        self._entries.pop(obj_id, None)

    def search(self, query: list[str]) -> list[int]:
        """Ids of objects carrying every tag in ``query`` (an exact tag match)."""
        wanted = set(query)
        return [i for i, e in self._entries.items() if wanted <= e.tags]

    def view(self) -> Mapping[int, Any]:
        return _ReadOnlyView(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, obj_id: object) -> bool:
        return obj_id in self._entries


class _ReadOnlyView(Mapping[int, Any]):
    """A read-only mapping of object id -> stored value."""

    def __init__(self, entries: dict[int, Entry]) -> None:
        self._entries = entries

    def __getitem__(self, key: int) -> Any:
        return self._entries[key].value

    def __iter__(self) -> Iterator[int]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"ObjectsView({len(self)} objects: {list(self._entries)[:10]})"
