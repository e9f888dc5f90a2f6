"""Typed errors of the pointer layer: each says what was expected, what was found, how to fix."""

from __future__ import annotations


class PointerError(RuntimeError):
    """Base class of every error raised by the pointer layer."""


class LocationMismatchError(PointerError):
    """An operation mixed pointers that live on different workers."""

    def __init__(self, op: str, first: str, second: str) -> None:
        super().__init__(
            f"{op}: operands live on different workers, {first!r} and {second!r}; "
            f"move one of them first (e.g. ptr.move({second}) or ptr.move({first}))"
        )
        self.locations = (first, second)


class SendError(PointerError, TypeError):
    """``send`` was given something other than one worker (``x.send(bob, alice)``)."""


class ValueRequiresGetError(PointerError):
    """A Python value of a remote tensor was requested without an explicit get()."""


class ObjectGoneError(PointerError):
    """The pointer's object was already retrieved with get() or moved away."""


class ChainError(PointerError):
    """A pointer chain was asked for something it cannot do (see pointers.worker.chains)."""


class RemoteError(PointerError):
    """The worker failed to run a command; the message is the worker's own."""

    def __init__(self, worker: str, kind: str, message: str) -> None:
        super().__init__(f"worker {worker!r} raised {kind}: {message}")
        self.worker = worker
        self.kind = kind
        self.remote_message = message


class DecodeError(PointerError):
    """A message could not be decoded into a known type."""


class NotAllowedError(PointerError):
    """A command named an operation or function outside the worker's allow-list."""


class UnknownObjectError(PointerError, KeyError):
    """A command referred to an object id the worker does not hold."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class PartyUnavailable(PointerError):
    """A worker, or a peer a worker waited for, is down or did not answer within the deadline.

    ``party`` names the worker that is unavailable (when known)."""

    def __init__(self, message: str, party: str | None = None) -> None:
        super().__init__(message)
        self.party = party


class LimitExceeded(PointerError):
    """A message or a client's stored bytes went past a limit the worker was started with."""
