"""The parties' steps of the batched MAC check (the protocol:
:func:`mpc.protocols.mac_check.run.mac_check`).

Every authenticated opening leaves a residual at each party, w_i = m_i - alpha_i y
(:mod:`mpc.protocols.auth_opening.steps`): over the parties they sum to zero where y is
the value the MACs vouch for, and to (errors in the MACs) - alpha (errors in y) where a
party deviated. The check (SPDZ2k's, Cramer et al., CRYPTO 2018, Fig. 3):

1. :func:`mac_check_commit`: each party draws a fresh 32-byte coin seed and sends its hash.
2. :func:`mac_check_reveal`: with every peer's commitment in hand, each party freezes the
   residuals of every opening since the last check (all of them, whatever the client
   sends: the party's own record says which) and reveals its seed.
3. :func:`mac_check_combine`: each party checks the peers' seeds against their
   commitments; the coins chi (64 bits an element: s = 64) come from the hash of all the
   seeds, so no party knew them while the opened values could still change; each party
   commits to z_i = sum chi w_i (mod 2^128) with a random nonce.
4. :func:`mac_check_open`: each party opens z_i and its nonce.
5. :func:`mac_check_verify`: each party checks the commitments and sum_i z_i = 0 mod
   2^128; otherwise it raises :class:`mpc.errors.MACCheckError` and releases nothing more
   in this session. An opening of an error e != 0 mod 2^64 passes with probability at most
   about 2^-(s - log2(s + 1)) = 2^-57.9 (SPDZ2k's Theorem 1 with k = s = 64).

A party's release of an output (:func:`mpc.protocols.auth_shares.steps.auth_release`)
needs a check that covered the output's opening.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

import torch

from mpc.errors import MACCheckError
from mpc.math import ring128 as r128
from mpc.math.prg import PRG
from mpc.protocols.auth_shares.steps import RESIDUAL, party_state
from mpc.protocols.rules import nonce_of, party_seed
from mpc.protocols.sizes import SLACK, WORD, tensors
from mpc.protocols.step import step
from pointers.worker.sealing import ProtocolCall, seal

COIN_COMMIT = "mac.coin_commit"
COIN = "mac.coin"
FROZEN = "mac.frozen"
Z_COMMIT = "mac.z_commit"
Z = "mac.z"


def _hash(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _bytes(t: torch.Tensor) -> bytes:
    return bytes(t.to(torch.uint8).reshape(-1).tolist())


def _tensor(data: bytes) -> torch.Tensor:
    return torch.tensor(list(data), dtype=torch.uint8)


def _fail(st: dict[str, Any], why: str) -> MACCheckError:
    st["failed"] = why
    st["check"] = None
    return MACCheckError(
        f"the MAC check failed: {why}; nothing opened since the last check is released"
    )


def _running(call: ProtocolCall, nonce: int, stage: str) -> dict[str, Any]:
    st = party_state(call.state)
    check = st.get("check")
    if st["failed"]:
        raise call.refuse(f"a MAC check failed in this session ({st['failed']})")
    if check is None or check["nonce"] != nonce or check["stage"] != stage:
        raise call.refuse(f"no MAC check {nonce} is waiting for this step here")
    return check


def _origins(call: ProtocolCall, name: str, kind: str, nonce: int) -> list[str]:
    labels = call.pieces(name)
    for lb in labels:
        if lb.kind != kind or lb.nonce != nonce:
            raise call.refuse(f"parameter {name!r} takes the pieces of check {nonce}'s {kind}")
    return [lb.origin for lb in labels[1:]]


# -- 1. commit to a coin seed ---------------------------------------------------------------


def _commit_rule(call: ProtocolCall) -> Any:
    party_seed(call)  # (this party's place among the session's parties)
    nonce = nonce_of(call)
    st = party_state(call.state)
    if st["failed"]:
        raise call.refuse(f"a MAC check failed in this session ({st['failed']})")
    check = st.get("check")
    if check is not None and check["stage"] != "commit":
        st["failed"] = "a MAC check was left unfinished"
        raise call.refuse("a MAC check is under way here; an unfinished check fails the session")
    st["check"] = {"nonce": nonce, "stage": "commit"}
    return [seal(COIN_COMMIT, nonce)]


@step(rule=_commit_rule, size=lambda p: SLACK, makes_material=True)
def mac_check_commit(ctx: Any, seed: torch.Tensor, nonce: int) -> torch.Tensor:
    """A fresh coin seed, kept here, and its hash, for the peers."""
    check = party_state(ctx.function_state)["check"]
    check["seed"] = os.urandom(32)
    return _tensor(_hash(check["seed"]))


# -- 2. freeze the residuals, reveal the seed ----------------------------------------------


def _reveal_rule(call: ProtocolCall) -> Any:
    party_seed(call)  # (this party's place among the session's parties)
    nonce = nonce_of(call)
    check = _running(call, nonce, "commit")
    check["commit_origins"] = _origins(call, "commits", COIN_COMMIT, nonce)
    st = party_state(call.state)
    pending: dict[tuple[Any, ...], int] = st["pending"]
    a = call.args.get("residuals")
    given = a is not None and a.entries
    labels = (
        call.materials("residuals", RESIDUAL, "the residuals", local=True, consume=True)
        if given
        else []
    )
    keys = [(lb.extra[0] if lb.extra else None, lb.nonce, lb.index) for lb in labels]
    if len(set(keys)) != len(keys) or set(keys) != set(pending):
        raise call.refuse(
            f"a MAC check takes the residuals of every opening since the last check: "
            f"{len(pending)} here, {len(keys)} given"
        )
    check["order"] = sorted(range(len(keys)), key=lambda k: repr(keys[k]))
    check["covers"] = st["epoch"]
    st["pending"] = {}
    check["stage"] = "reveal"
    return [seal(COIN, nonce), seal(FROZEN, nonce, deliveries=0)]


def _reveal_size(p: dict[str, Any]) -> int:
    return 2 * sum(t.numel() * WORD for t in tensors(p.get("residuals"))) + SLACK


@step(rule=_reveal_rule, size=_reveal_size, makes_material=True)
def mac_check_reveal(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    commits: list[torch.Tensor],
    residuals: list[torch.Tensor] | None,
) -> list[torch.Tensor]:
    """This party's coin seed (for the peers) and its residuals, frozen in one (2, n)
    tensor in a fixed order."""
    check = party_state(ctx.function_state)["check"]
    if _bytes(commits[0]) != _hash(check["seed"]):
        raise _fail(party_state(ctx.function_state), "this party's own commitment changed")
    check["commits"] = dict(zip(check["commit_origins"], (_bytes(c) for c in commits[1:])))
    parts = [residuals[k].reshape(2, -1) for k in check["order"]] if residuals else []
    frozen = torch.cat(parts, dim=1) if parts else torch.zeros(2, 0, dtype=torch.int64)
    return [_tensor(check["seed"]), frozen]


# -- 3. the coins, and this party's committed z_i ------------------------------------------


def _combine_rule(call: ProtocolCall) -> Any:
    party_seed(call)  # (this party's place among the session's parties)
    nonce = nonce_of(call)
    check = _running(call, nonce, "reveal")
    check["seed_origins"] = _origins(call, "seeds", COIN, nonce)
    call.material("frozen", FROZEN, nonce, local=True, consume=True)
    check["stage"] = "combine"
    return [seal(Z_COMMIT, nonce)]


def _combine_size(p: dict[str, Any]) -> int:
    f = p.get("frozen")
    n = f.numel() if isinstance(f, torch.Tensor) else 1
    return 8 * n * WORD + SLACK


@step(rule=_combine_rule, size=_combine_size, makes_material=True)
def mac_check_combine(
    ctx: Any, seed: torch.Tensor, nonce: int, seeds: list[torch.Tensor], frozen: torch.Tensor
) -> torch.Tensor:
    """Check the peers' seeds against their commitments; the coins from all the seeds;
    z_i = sum chi w_i, and the hash of z_i with a fresh nonce (for the peers)."""
    st = party_state(ctx.function_state)
    check = st["check"]
    own = _bytes(seeds[0])
    if own != check["seed"]:
        raise _fail(st, "this party's own coin seed changed")
    all_seeds = [own]
    for origin, s in zip(check["seed_origins"], seeds[1:]):
        theirs = _bytes(s)
        if check["commits"].get(origin) != _hash(theirs):
            raise _fail(st, f"party {origin!r}'s coin seed does not match its commitment")
        all_seeds.append(theirs)
    if set(check["seed_origins"]) != set(check["commits"]):
        raise _fail(st, "the coin seeds come from other parties than the commitments")
    coin_seed = _hash(b"".join(sorted(all_seeds)))[:16]
    n = frozen.shape[1]
    z = (
        r128.sum128(r128.mul64(frozen, PRG(coin_seed).int64((n,))), [0])
        if n
        else torch.zeros(2, dtype=torch.int64)
    )
    check["z"] = _bytes(z.reshape(2).view(torch.uint8))
    check["rho"] = os.urandom(16)
    return _tensor(_hash(check["z"] + check["rho"]))


# -- 4. open z_i ---------------------------------------------------------------------------


def _open_rule(call: ProtocolCall) -> Any:
    party_seed(call)  # (this party's place among the session's parties)
    nonce = nonce_of(call)
    check = _running(call, nonce, "combine")
    check["z_origins"] = _origins(call, "commits", Z_COMMIT, nonce)
    check["stage"] = "open"
    return [seal(Z, nonce)]


@step(rule=_open_rule, size=lambda p: SLACK, makes_material=True)
def mac_check_open(
    ctx: Any, seed: torch.Tensor, nonce: int, commits: list[torch.Tensor]
) -> torch.Tensor:
    """z_i and its nonce (for the peers), once every peer committed to its own."""
    st = party_state(ctx.function_state)
    check = st["check"]
    if _bytes(commits[0]) != _hash(check["z"] + check["rho"]):
        raise _fail(st, "this party's own commitment to z changed")
    check["z_commits"] = dict(zip(check["z_origins"], (_bytes(c) for c in commits[1:])))
    return _tensor(check["z"] + check["rho"])


# -- 5. verify -----------------------------------------------------------------------------


def _verify_rule(call: ProtocolCall) -> Any:
    party_seed(call)  # (this party's place among the session's parties)
    nonce = nonce_of(call)
    check = _running(call, nonce, "open")
    check["zs_origins"] = _origins(call, "zs", Z, nonce)
    return None


@step(rule=_verify_rule, size=lambda p: SLACK)
def mac_check_verify(
    ctx: Any, seed: torch.Tensor, nonce: int, zs: list[torch.Tensor]
) -> torch.Tensor:
    """Check each peer's z_j against its commitment and that the z_j sum to zero (mod
    2^128): then every opening this check froze is vouched for. Returns the last opening
    it covers (an ordinary one-element tensor: the client waits for it)."""
    st = party_state(ctx.function_state)
    check = st["check"]
    total = int.from_bytes(check["z"], "little")
    if set(check["zs_origins"]) != set(check["z_commits"]):
        raise _fail(st, "the z values come from other parties than the commitments")
    for origin, piece in zip(check["zs_origins"], zs[1:]):
        data = _bytes(piece)
        if len(data) != 32 or check["z_commits"].get(origin) != _hash(data):
            raise _fail(st, f"party {origin!r}'s z does not match its commitment")
        total += int.from_bytes(data[:16], "little")
    if total % (1 << 128):
        raise _fail(
            st,
            "the opened values' MACs do not match (a party deviated from the protocol, or a "
            "share was changed)",
        )
    st["checked"] = check["covers"]
    st["check"] = None
    return torch.tensor([check["covers"]], dtype=torch.int64)
