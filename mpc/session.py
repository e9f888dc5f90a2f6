"""A sharing session: the parties, the crypto provider, their seeds and the config.

Creating a session installs the mpc worker functions on in-process workers, introduces
the parties to each other (and the dealer to the parties), and has the dealer create one
16-byte seed per party which travels dealer -> party directly. The client keeps only
pointers to the seeds; it never fetches them.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from contextlib import AbstractContextManager
from typing import Any

import torch

import pointers as pt

from . import accounting
from .config import MPCConfig
from .errors import CryptoProviderRequired, PartyMismatchError
from .material import FUNCTIONS

MAX_PARTIES = 5


def install(worker: Any) -> None:
    """Register the mpc worker functions with an in-process worker (idempotent)."""
    functions = getattr(worker, "functions", None)
    if functions is not None:
        functions.register_all(FUNCTIONS)


class Session:
    """Parties (2 to 5 workers), an optional dealer and the fixed-point config."""

    def __init__(
        self,
        parties: list[Any],
        crypto_provider: Any | None = None,
        config: MPCConfig | None = None,
    ) -> None:
        parties = list(parties)
        if not 2 <= len(parties) <= MAX_PARTIES:
            raise ValueError(f"secret sharing needs 2 to {MAX_PARTIES} parties, got {len(parties)}")
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
        self.config = config or MPCConfig()
        # nonces start at a random 48-bit point: they are public, but must be unique per
        # seed, and a recorded plan tells them from other integers by their value
        self._nonces = itertools.count(int.from_bytes(os.urandom(6), "little") << 8)
        for w in parties + ([crypto_provider] if crypto_provider is not None else []):
            install(w)
        for p in parties:
            for q in parties:
                if p is not q:
                    p.introduce(q)
        self.party_seeds: list[pt.PointerTensor] = []
        self.dealer_seeds: list[pt.PointerTensor] = []
        if crypto_provider is not None:
            for p in parties:
                crypto_provider.introduce(p)
                (seed,) = pt.call_function(
                    crypto_provider, "mpc.new_seed", [], out=[((16,), torch.uint8)]
                )
                self.dealer_seeds.append(seed)
                self.party_seeds.append(seed.copy_to(p))

    @property
    def n(self) -> int:
        return len(self.parties)

    @property
    def key(self) -> tuple[Any, ...]:
        return (tuple(p.id for p in self.parties), getattr(self.dealer, "id", None))

    def next_nonce(self) -> int:
        return next(self._nonces)

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

    def __repr__(self) -> str:
        dealer = self.dealer.id if self.dealer is not None else None
        return f"Session(parties={[p.id for p in self.parties]}, crypto_provider={dealer!r})"
