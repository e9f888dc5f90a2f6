"""Errors of the mpc layer."""

from __future__ import annotations


class MPCError(RuntimeError):
    """Base class of mpc errors."""


class CryptoProviderRequired(MPCError):
    """A protocol needs correlated randomness but the tensor was shared without a dealer."""

    def __init__(self, what: str) -> None:
        super().__init__(
            f"{what} on secret-shared values needs a crypto provider: share with "
            "mpc.share(x, alice, bob, crypto_provider=carol)"
        )


# what to do instead, for unsupported ops a user meets through a well-known call
_HINTS = {
    "aten.isin": "if this comes from transformers' model.generate(...), generate with "
    "mpc.generate(model, input_ids, max_new_tokens=...) instead: greedy decoding that "
    "reveals only the new tokens, one recorded program per token",
}


class UnsupportedOpError(MPCError, NotImplementedError):
    """An aten op has no secure implementation."""

    def __init__(self, op: str, why: str = "") -> None:
        why = why or _HINTS.get(op.rpartition(".")[0], "")
        msg = f"{op} is not supported on secret-shared tensors"
        super().__init__(msg + (f": {why}" if why else ""))
        self.op = op


class PartyMismatchError(MPCError):
    """Shared operands belong to different sets of parties."""


class ComparisonModeError(MPCError, ValueError):
    """The session's comparison mode does not fit its parties (FSS is 2-party only)."""


class MACCheckError(MPCError):
    """The authenticated mode's MAC check failed: a party deviated from the protocol (or a
    value was changed where it is stored). Nothing opened since the previous check reaches
    the client, and the session releases nothing more. The message names the check."""


class ShapeError(MPCError, ValueError):
    """The operands' shapes do not fit the op (a matmul's inner dimensions, a broadcast)."""
