"""The parties' step of an authenticated opening (the protocol:
:mod:`mpc.protocols.auth_opening.run`).

A value to open is masked by the step that makes it (x - a, z + r, ...: uniform over all
128 bits, so no bit of the value above 2^64 shows either) and comes as a *piece* (kind
``auth.piece:<what>``: this party's value share, sent to every peer) with its MAC share
(``auth.pmac:<what>``, kept here). :func:`auth_open` sums this party's piece and its peers'
into the opened value y and records the residual m_i - alpha_i y, which the MAC check
combines (:mod:`mpc.protocols.mac_check`): every opening is checked before any output is
released to the client.

Only the authenticated pieces open here, and they open nowhere else: the semi-honest
opening (:mod:`mpc.protocols.opening`) takes only the kinds a step declared with
``opens``, which these are not, so no opening escapes the check.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.protocols.auth_shares.steps import (
    OPENED,
    PIECE,
    PIECE_MAC,
    RESIDUAL,
    W128,
    key_of,
    party_state,
    residual,
)
from mpc.protocols.sizes import SLACK, nbytes, tensors
from mpc.protocols.step import step
from pointers.worker.sealing import ProtocolCall, seal

RECORD = 256  # bytes of a party's record of one pending opening


def _open_rule(call: ProtocolCall) -> Any:
    key_of(call)
    labels = call.pieces("pieces")
    first = labels[0]
    if not first.kind.startswith(PIECE):
        raise call.refuse(f"a {first.kind} is not an authenticated value to open")
    what = first.kind[len(PIECE) :]
    call.material("mac", PIECE_MAC + what, first.nonce, local=True, consume=True)
    st = party_state(call.state)
    if st["failed"]:
        raise call.refuse(f"a MAC check failed in this session ({st['failed']})")
    st["epoch"] += 1
    st["pending"][(what, first.nonce, first.index)] = st["epoch"]
    return [
        seal_kept(OPENED + what, first.nonce, first.index, (st["epoch"],)),
        seal_kept(RESIDUAL, first.nonce, first.index, (what,)),
    ]


def seal_kept(kind: str, nonce: int, index: int, extra: tuple[Any, ...]) -> list[Any]:
    return seal(kind, nonce, index, deliveries=0, extra=extra)


def _open_size(p: dict[str, Any]) -> int:
    sizes = [nbytes(t) for t in tensors(p.get("pieces"))]
    return sum(sizes) + 8 * max(sizes, default=W128) + SLACK


@step(rule=_open_rule, size=_open_size, keeps=RECORD, makes_material=True)
def auth_open(
    ctx: Any, key: torch.Tensor, pieces: list[torch.Tensor], mac: torch.Tensor
) -> list[torch.Tensor]:
    """The opened value y (all 128 bits) from this party's piece and its peers' (not
    modified: in process they are the senders' own), and this party's residual
    m_i - alpha_i y for the MAC check."""
    if not (
        isinstance(pieces, list)
        and len(pieces) >= 2
        and all(
            isinstance(t, torch.Tensor) and t.shape == pieces[0].shape and t.dtype == torch.int64
            for t in pieces
        )
        and pieces[0].dim() >= 1
        and pieces[0].shape[0] == 2
        and mac.shape == pieces[0].shape
    ):
        raise ValueError("the pieces of an authenticated opening are (2, *S) int64 tensors")
    y = r128.add(pieces[0], pieces[1])
    for t in pieces[2:]:
        r128.add_(y, t)
    return [y, residual(key, mac, y)]
