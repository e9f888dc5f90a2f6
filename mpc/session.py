"""A sharing session: the parties, the crypto provider, their seeds and the config.

Creating a session installs the mpc worker functions on in-process workers, introduces
the parties to each other (and the dealer to the parties), and has the dealer create one
16-byte seed per party which travels dealer -> party directly. The client keeps only
pointers to the seeds, which are sealed at the workers: no client can fetch them.

One session serves every sharing among the same group (the same party workers, in the
same order, the same crypto provider and config): :func:`session_for` finds the group's
session, so ``mpc.share`` deals seeds once per group, not once per call. A group's
session lives while something uses it (a shared value, a plan, a held reference); a
``with mpc.Session(...) as s:`` block makes ``s`` the session of its group inside it.

Nonces: every protocol step draws a fresh one from the session of its operands. While a
plan is recorded (:func:`recording_nonces`), every session hands out
:class:`~pointers.worker.program.RunValue` nonces and notes where each came from, so a recorded
program binds a fresh nonce from the same session at every run, whichever operand's
session the step drew from.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

import torch

import pointers as pt
from mpc import accounting
from mpc.config import MPCConfig
from mpc.errors import ComparisonModeError, CryptoProviderRequired, PartyMismatchError
from mpc.protocols.functions import FUNCTIONS
from mpc.protocols.seeds.steps import new_seed
from mpc.protocols.step import name_of
from pointers.worker.program import RunValue

MAX_PARTIES = 5


def install(worker: Any) -> None:
    """Register the mpc worker functions with an in-process worker (idempotent)."""
    functions = getattr(worker, "functions", None)
    if functions is not None:
        functions.register_all(FUNCTIONS)


class Session:
    """Parties (2 to 5 workers), an optional dealer and the config (fixed point, the
    comparison mode: ``comparison="fss"`` is short for ``config=MPCConfig(comparison="fss")``,
    2 parties only; ``security="malicious"`` for ``config=MPCConfig(security="malicious")``,
    authenticated shares)."""

    def __init__(
        self,
        parties: list[Any],
        crypto_provider: Any | None = None,
        config: MPCConfig | None = None,
        comparison: str | None = None,
        security: str | None = None,
    ) -> None:
        parties = list(parties)
        if not 2 <= len(parties) <= MAX_PARTIES:
            raise ValueError(f"secret sharing needs 2 to {MAX_PARTIES} parties, got {len(parties)}")
        config = config or MPCConfig()
        if comparison is not None:  # (shorthand for the config's field)
            config = dataclasses.replace(config, comparison=comparison)
        if security is not None:  # (shorthand for the config's field)
            config = dataclasses.replace(config, security=security)
        if config.comparison == "fss" and len(parties) != 2:
            raise ComparisonModeError(
                f"comparison='fss' (function secret sharing) is for 2 parties, got "
                f"{len(parties)}: use comparison='default' for 3 or more"
            )
        ids = [getattr(p, "id", None) for p in parties]
        if not all(isinstance(i, str) for i in ids):
            raise TypeError("parties must be workers (e.g. pointers.VirtualWorker)")
        if len(set(ids)) != len(ids):
            raise ValueError(f"parties must be distinct workers, got {ids}")
        if crypto_provider is not None and getattr(crypto_provider, "id", None) in ids:
            raise ValueError(
                f"the crypto provider {crypto_provider.id!r} must not be one of the parties"
            )
        self.parties = parties
        self.dealer = crypto_provider
        self.config = config
        # nonces start at a random 48-bit point: they are public, but must be unique per
        # seed, and a recorded plan tells them from other integers by their value
        self._nonces = itertools.count(int.from_bytes(os.urandom(6), "little") << 8)
        # the round of the owners' values shared into this session's aggregates (mpc.release:
        # the parties add the values of one round only); SecureAggregator starts new ones
        self.round = os.urandom(8).hex()
        for w in parties + ([crypto_provider] if crypto_provider is not None else []):
            install(w)
        for p in parties:
            for q in parties:
                if p is not q:
                    p.introduce(q)
        self._tokens: list[Any] = []
        # which run of each worker process the seeds were dealt in (network workers)
        self._incarnations: list[Any] = [None] * len(self._workers())
        self.party_seeds: list[pt.PointerTensor] = []
        # shares computed at their first read, not computed yet (mpc.shared.Deferred): an
        # in-place write in this session computes them first
        self.deferred: weakref.WeakSet[Any] = weakref.WeakSet()
        self.dealer_seeds: list[pt.PointerTensor] = []
        # the authenticated mode's state (its MAC key, its pending openings), made on the
        # first authenticated op (mpc.protocols.auth_shares.state)
        self.authenticated: Any = None
        if crypto_provider is not None:
            for i, p in enumerate(parties):
                crypto_provider.introduce(p)
                (seed,) = pt.call_function(
                    crypto_provider,
                    name_of(new_seed),
                    [i, ids],
                    out=[((16,), torch.uint8)],
                )
                assert seed is not None  # (out= given: a pointer per output)
                self.dealer_seeds.append(seed)
                self.party_seeds.append(seed.copy_to(p))
        self.is_current()  # note the workers' incarnations known now

    def _workers(self) -> list[Any]:
        return self.parties + ([self.dealer] if self.dealer is not None else [])

    def is_current(self) -> bool:
        """False once a worker restarted since the seeds were dealt (a network worker's
        process came back with an empty store): the group needs a new session."""
        return not self.restarted()

    def restarted(self) -> list[str]:
        """The ids of the workers that restarted since the seeds were dealt. A network
        worker's incarnation is checked with the worker only when its connection dropped
        since the last reply (:attr:`pointers.NetworkWorker.incarnation`), so this is free
        while nothing happened."""
        out = []
        for k, w in enumerate(self._workers()):
            now = getattr(w, "incarnation", None)
            seen = self._incarnations[k]
            if seen is None:
                self._incarnations[k] = now
            elif now is not None and now != seen:
                out.append(w.id)
        return out

    @property
    def n(self) -> int:
        return len(self.parties)

    @property
    def key(self) -> tuple[Any, ...]:
        return (tuple(p.id for p in self.parties), getattr(self.dealer, "id", None))

    def next_nonce(self) -> int:
        """A nonce never handed out before by this session (a :class:`RunValue` while a
        plan is recorded)."""
        v = next(self._nonces)
        recorder = _RECORDER.get()
        return v if recorder is None else recorder.record(self, v)

    def __enter__(self) -> Session:
        self._tokens.append(_ACTIVE.set(self))
        return self

    def __exit__(self, *exc: Any) -> None:
        _ACTIVE.reset(self._tokens.pop())

    def require_dealer(self, what: str) -> Any:
        if self.dealer is None:
            raise CryptoProviderRequired(what)
        return self.dealer

    def check_compatible(self, other: Session) -> None:
        if other is not self and other.key != self.key:
            raise PartyMismatchError(
                f"operands are shared among different parties: {self.key} and {other.key}"
            )

    def concurrently(self, numel: int) -> AbstractContextManager[Any]:
        """Run the commands of an op on ``numel``-element operands with every in-process
        worker in its own thread (:func:`pointers.concurrently`) if the op is large enough
        (``config.concurrent_from``); otherwise one after the other."""
        start = self.config.concurrent_from
        if start is None or numel < start:
            return contextlib.nullcontext()
        return pt.concurrently(*self.parties, *([self.dealer] if self.dealer is not None else []))

    def watch(self) -> None:
        accounting.watch(self.parties, self.dealer)

    def sync(self) -> None:
        """Wait until the parties and the dealer ran every command sent to them (network
        workers; in process they have already): what they hold for it is then freed
        before more is sent (:mod:`mpc.protocols.pieces`)."""
        for w in self._workers():
            sync = getattr(w, "sync", None)
            if callable(sync):
                sync()

    def __repr__(self) -> str:
        dealer = self.dealer.id if self.dealer is not None else None
        return f"Session(parties={[p.id for p in self.parties]}, crypto_provider={dealer!r})"


def _group_key(parties: list[Any], dealer: Any, config: MPCConfig) -> tuple[Any, ...]:
    # worker objects by identity: a group's session holds its workers, so while it lives
    # these ids name them
    return (tuple(id(p) for p in parties), id(dealer) if dealer is not None else None, config)


class SessionGroups:
    """The session of each group of (parties, crypto provider, config), held weakly."""

    def __init__(self) -> None:
        self._sessions: weakref.WeakValueDictionary[tuple[Any, ...], Session] = (
            weakref.WeakValueDictionary()
        )

    def session_for(
        self, parties: list[Any], crypto_provider: Any | None, config: MPCConfig
    ) -> Session:
        key = _group_key(list(parties), crypto_provider, config)
        active = _ACTIVE.get()
        if active is not None and _group_key(active.parties, active.dealer, active.config) == key:
            return active
        session = self._sessions.get(key)
        if session is None or not session.is_current():
            session = Session(list(parties), crypto_provider, config)
            self._sessions[key] = session
        return session

    def __len__(self) -> int:
        return len(self._sessions)


# The explicit default context: the groups that ``mpc.share`` looks sessions up in.
DEFAULT_GROUPS = SessionGroups()
_ACTIVE: ContextVar[Session | None] = ContextVar("mpc_active_session", default=None)


def session_for(
    parties: list[Any], crypto_provider: Any | None = None, config: MPCConfig | None = None
) -> Session:
    """The session of this group (created, with its seeds, on first use)."""
    return DEFAULT_GROUPS.session_for(parties, crypto_provider, config or MPCConfig())


class NonceRecorder:
    """The nonces drawn while a plan is recorded, and the session each came from."""

    def __init__(self) -> None:
        self.sessions: dict[int, Session] = {}

    def record(self, session: Session, value: int) -> RunValue:
        self.sessions[value] = session
        return RunValue(value)


_RECORDER: ContextVar[NonceRecorder | None] = ContextVar("mpc_nonce_recorder", default=None)


def recording() -> bool:
    """Whether a plan is being recorded (:func:`recording_nonces`)."""
    return _RECORDER.get() is not None


@contextlib.contextmanager
def recording_nonces() -> Iterator[NonceRecorder]:
    """Inside: every session's nonces are recorded (see the module docstring)."""
    recorder = NonceRecorder()
    token = _RECORDER.set(recorder)
    try:
        yield recorder
    finally:
        _RECORDER.reset(token)
