"""The seeds' steps: the dealer's :func:`new_seed` (one per party of a session, called by
:class:`mpc.Session`) and a party's :func:`share_from_seed` (its share of an input,
expanded from a seed the input's owner drew: :func:`mpc.share`).

A party's seed and a public ``(nonce, tag)`` give the stream of every piece of material
the party derives (:mod:`mpc.protocols.streams`).
"""

from __future__ import annotations

import os
from typing import Any

import torch

from mpc.math.prg import PRG, SEED_BYTES
from mpc.protocols.rules import SEED
from mpc.protocols.sizes import INPUT_SEED_BYTES, SLACK, derived
from mpc.protocols.step import step
from pointers.errors import LimitExceeded, NotAllowedError
from pointers.worker.sealing import ProtocolCall, seal

# -- the dealer ----------------------------------------------------------------------------


def _new_seed_rule(call: ProtocolCall) -> Any:
    """Party ``index``'s seed of the session's computing ``parties`` (their worker ids, in
    order): it leaves the dealer once, to that party only (its label's ``to``), and tells
    it its place and the parties (the label's extra: their count, then their ids), to whom
    alone the material made under the seed may go (:func:`mpc.protocols.rules.bind_outputs`).
    The dealer is never one of the parties."""
    index, parties = call.value("index"), call.value("parties")
    if not (
        type(parties) is list
        and 2 <= len(parties) <= 5
        and all(type(p) is str and p for p in parties)
        and len(set(parties)) == len(parties)
    ):
        raise call.refuse("a seed is for a group of 2 to 5 distinct parties, by worker id")
    if call.worker_id in parties:
        raise call.refuse(
            f"the crypto provider {call.worker_id!r} cannot be one of the parties it deals to"
        )
    if type(index) is not int or not 0 <= index < len(parties):
        raise call.refuse(f"a seed is for party 0 to {len(parties) - 1}")
    group = (len(parties), *parties)
    return [seal(SEED, 0, index, deliveries=1, extra=group, to=(parties[index],))]


def _new_seed_size(p: dict[str, Any]) -> int:
    return 2 * SLACK  # (new_seed: measured 68 KiB at its peak once, over one SLACK)


@step(rule=_new_seed_rule, size=_new_seed_size, makes_material=True)
def new_seed(ctx: Any, index: int, parties: list[str]) -> torch.Tensor:
    """A fresh 16-byte seed from the operating system (stored at the dealer) for party
    ``index`` of ``parties`` (worker ids; its label records the party's place and the
    parties)."""
    return torch.tensor(list(os.urandom(16)), dtype=torch.uint8)


# -- the parties ---------------------------------------------------------------------------


# An input share drawn from a seed: at most this many bytes (1 GiB), checked before the
# tensor is allocated (a sent tensor is bounded by the message size limit the same way).
MAX_SEEDED_BYTES = 1 << 30


@step(size=derived, keeps=INPUT_SEED_BYTES)
def share_from_seed(ctx: Any, seed: bytes, shape: list[int]) -> torch.Tensor:
    """Party i's input share, expanded from a 16-byte seed the data owner drew (os.urandom)
    and sent it instead of the share itself: the owner expands the same seed to compute the
    last party's share. Each seed gives one share at a worker; a second use is refused."""
    if type(seed) is not bytes or len(seed) != SEED_BYTES:
        raise ValueError(f"an input seed is {SEED_BYTES} bytes, got {type(seed).__name__}")
    if not (
        isinstance(shape, list)
        and len(shape) <= 64
        and all(type(d) is int and d >= 0 for d in shape)
    ):
        raise ValueError(f"an input share's shape is a list of sizes, got {shape!r}")
    numel = 1
    for d in shape:
        numel *= d
    if numel * 8 > MAX_SEEDED_BYTES:
        raise LimitExceeded(
            f"an input share of {numel} elements exceeds the {MAX_SEEDED_BYTES} bytes a "
            "seeded share may take"
        )
    used: set[bytes] = ctx.function_state.setdefault("mpc.input_seeds", set())
    if seed in used:
        raise NotAllowedError(
            f"worker {ctx.id!r}: this input seed was used before; a seed gives one share"
        )
    used.add(seed)
    return PRG(seed).int64(tuple(shape))
