"""The errors of the CrypTen-shaped layer: a CrypTen name that has no honest equivalent
here raises :class:`NotAvailableError`, whose message names what to use instead."""

from __future__ import annotations

from typing import NoReturn

from mpc.errors import MPCError


class NotAvailableError(MPCError, AttributeError):
    """A CrypTen name with no equivalent in this layer. The message says why and names
    what this project offers instead. (An ``AttributeError`` too, so ``hasattr`` and
    ``getattr(obj, name, default)`` answer as they would for a missing attribute.)"""


class NotInitializedError(MPCError):
    """A call that needs ``crypten.init()`` first (as CrypTen's own)."""

    def __init__(self) -> None:
        super().__init__("CrypTen not initialized: call crypten.init() first")


class EncryptedBoolError(MPCError):
    """``if x_enc < y_enc:``: an encrypted value has no truth value. A RuntimeError, as
    CrypTen raises."""


class CollectiveMismatchError(MPCError):
    """The ranks of a ``run_multiprocess`` function made different crypten calls (or one
    returned while another still called): every rank must make the same calls in the same
    order, as in CrypTen."""


class WorldAbortedError(MPCError):
    """Another rank of the same ``run_multiprocess`` call failed; its error is the one
    ``run_multiprocess`` raises."""


def unavailable(name: str, why: str) -> NoReturn:
    """Raise :class:`NotAvailableError` for the CrypTen name ``name``."""
    raise NotAvailableError(f"{name} is not available here: {why}")


def lookup(table: dict[str, str], owner: str, name: str) -> NoReturn:
    """``__getattr__`` of a module or class that stands in for a CrypTen one: a name in
    ``table`` raises :class:`NotAvailableError` with its entry; any other name a plain
    ``AttributeError``."""
    if name in table:
        unavailable(f"{owner}.{name}", table[name])
    raise AttributeError(f"{owner!r} has no attribute {name!r}")
