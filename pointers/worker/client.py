"""The client-side API of a worker, shared by in-process and network workers.

:class:`WorkerClient` names what pointers, plans, programs and the ``mpc`` protocols use
of a worker they drive: :class:`~pointers.worker.base.VirtualWorker` (in process) and
:class:`~pointers.network.client.NetworkWorker` (``pointers.connect``) both provide it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from pointers.errors import PointerError
from pointers.wire.messages import Delete, Message

__all__ = ["Recorder", "WorkerClient", "WorkerStats", "sends"]


class Recorder(Protocol):
    """What a worker client tells a :class:`pointers.worker.program.Recording`: every
    command it sends (before it is sent; may refuse it by raising) and every id it
    allocates. Set with the client's ``set_recorder``. ``runs`` False: the client sends
    no command it records (it only records them)."""

    runs: bool

    def record_command(self, worker_id: str, msg: Message) -> None: ...
    def record_new_id(self, worker_id: str, obj_id: int) -> None: ...


def sends(recorder: Recorder, msg: Message, wants_reply: bool) -> bool:
    """Whether a client sends a command ``recorder`` recorded: always, but in a recording
    that runs nothing (``runs`` False), where only deletes are sent (of the objects of
    earlier runs that died meanwhile: a recorded-only command made nothing to delete) and
    a command whose reply its caller waits for is refused (there is no reply to give)."""
    if recorder.runs or isinstance(msg, Delete):
        return True
    if wants_reply:
        raise PointerError(
            f"a {msg.KIND!r} command waits for a reply: a recording that runs nothing "
            "(runs=False) cannot give one"
        )
    return False


@dataclass
class WorkerStats:
    """What a worker received and sent, in messages and bytes (header plus buffers)."""

    messages_received: int = 0
    messages_sent: int = 0
    bytes_received: int = 0
    bytes_sent: int = 0
    peer_messages_sent: int = 0
    peer_bytes_sent: int = 0

    def snapshot(self) -> WorkerStats:
        return WorkerStats(**vars(self))


@runtime_checkable
class WorkerClient(Protocol):
    """A worker as its clients see it: ids, commands, deletes, peers, search, counters."""

    id: str
    recorder: Recorder | None  # a program recording this client (see set_recorder)

    def new_id(self) -> int:
        """A fresh object id at this worker (ids are chosen by the sender)."""
        ...

    def post(self, msg: Message) -> None:
        """Send ``msg`` without waiting for its value (errors raise at the next sync)."""
        ...

    def request(self, msg: Message) -> Any:
        """Send ``msg`` and return its reply value (raises the worker's error)."""
        ...

    def introduce(self, peer: Any) -> None:
        """Let this worker deliver objects to ``peer`` directly."""
        ...

    def queue_delete(self, obj_id: int) -> None:
        """A pointer died: its object's delete travels with a later command (no I/O)."""
        ...

    def flush_deletes(self) -> None:
        """Send the queued deletes now, as one ``Delete`` command."""
        ...

    def set_recorder(self, recorder: Recorder | None) -> None:
        """While set, ``recorder`` sees every command and new id of this client."""
        ...

    def search(self, *query: str) -> list[Any]:
        """Pointers to the stored tensors carrying every tag in ``query``."""
        ...

    @property
    def objects(self) -> Mapping[int, Any]:
        """A read-only view of the objects stored for this client."""
        ...

    @property
    def stats(self) -> WorkerStats:
        """The worker's message and byte counters."""
        ...

    def wait_programs(self, timeout: float | None = None) -> None:
        """Wait until the programs this client started at the worker ended."""
        ...
