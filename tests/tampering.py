"""A client that sends a protocol's steps with other arguments than the protocol would:
the protocol tests' attacks. A protocol's run module calls its steps at the parties
through ``at_parties`` (mpc.protocols.parties); these patch that name in the module."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest


def tamper(
    monkeypatch: pytest.MonkeyPatch,
    module: ModuleType,
    step: Any,
    change: Callable[[int, list[Any]], list[Any]],
) -> None:
    """``module`` sends ``step`` to party i with ``change(i, the arguments it would send)``."""
    real = module.at_parties

    def at_parties(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is step:
            return real(session, fn, lambda i: change(i, args(i)), out)
        return real(session, fn, args, out)

    monkeypatch.setattr(module, "at_parties", at_parties)


def args_of(monkeypatch: pytest.MonkeyPatch, module: ModuleType, step: Any) -> list[list[Any]]:
    """Each call of ``step`` that ``module`` sends: every party's arguments, recorded."""
    real = module.at_parties
    calls: list[list[Any]] = []

    def at_parties(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is step:
            calls.append([args(i) for i in range(session.n)])
        return real(session, fn, args, out)

    monkeypatch.setattr(module, "at_parties", at_parties)
    return calls
