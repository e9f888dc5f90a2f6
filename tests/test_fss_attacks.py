"""The FSS/DCF keys and comparison material at run time, attacked (issue 39).

A client that drives the steps itself tries to reuse a key, swap keys or their parts
between instances, parties or protocols, and evaluate a key at a point of its choosing:
a value it stored, a value opened for another purpose, another party's opening. Each
attempt is sent as raw steps, the way the protocol sends them (mpc.protocols.fss), and
every one is refused at the worker; the honest run beside them still gives the right
answer. Runs on both worker kinds (conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from refusals import refused

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.fss import relu as fss_relu
from mpc.protocols.fss import steps as material
from mpc.protocols.opening.run import Round

FSS = MPCConfig(comparison="fss")
I64 = torch.int64
N = 4
REFUSED = "protocol material|takes a|belongs to|instance|spent|already used|must be"


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


@dataclass
class Dealt:
    """One comparison instance's keys, dealt and delivered as the protocol does, and its
    opened c at both parties."""

    nonce: int
    cws: list[Any]
    u1: Any
    c: list[Any]


def at_parties(s: Any, name: str, args: Callable[[int], list[Any]], out: Any) -> list[Any]:
    """Step ``name`` at every party, by its wire name (as a client sends it)."""
    per_party = [pt.call_function(p, name, args(i), out=out) for i, p in enumerate(s.parties)]
    return [list(col) for col in zip(*per_party)]


def _session(trio: Any) -> tuple[Any, Any]:
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([1.5, -2.0, 0.25, -0.5]), alice, bob, crypto_provider=carol)
    x = mpc.share(x.get(), alice, bob, crypto_provider=carol, config=FSS)
    return x.session, x


def _deal(s: Any, x: Any, *, opened: bool = True) -> Dealt:
    nonce = s.next_nonce()
    cw, key1 = pt.call_function(
        s.dealer,
        "mpc.dealer_fss",
        [s.dealer_seeds, nonce, [N], [], None, False, 64],
        out=[((material.words(N, 64),), torch.int64), ((N,), torch.int64)],
    )
    cws = [cw.copy_to(p, lend=True) for p in s.parties]
    key1 = key1.move(s.parties[1])
    (u1,) = pt.call_function(
        s.parties[1], "mpc.fss_unpack", [s.party_seeds[1], nonce, key1, [[N]]], out=[((N,), I64)]
    )
    c: list[Any] = []
    if opened:
        (masked,) = at_parties(
            s, "mpc.cmp_mask", lambda i: [s.party_seeds[i], nonce, x.shares[i]], [([N], I64)]
        )
        r = Round(s)
        handle = r.add(masked)
        r.open()
        c = handle.value
    return Dealt(nonce, cws, u1, c)


def _eval(
    s: Any, d: Dealt, i: int, *, key: Any = None, u: Any = None, c: Any = None, packed: bool = False
) -> Any:
    us = [None, d.u1]
    (out,) = pt.call_function(
        s.parties[i],
        "mpc.fss_eval",
        [
            s.party_seeds[i],
            d.nonce,
            i == 0,
            d.cws[i] if key is None else key,
            us[i] if u is None else u,
            d.c[i] if c is None else c,
            64,
            packed,
        ],
        out=[((N,), I64)],
    )
    return out


def _refused(worker: Any, attempt: Callable[[], Any], match: str = REFUSED) -> None:
    refused(worker, attempt, match)


def _honest(s: Any, d: Dealt) -> torch.Tensor:
    """The comparison's result from the instance's honest evaluations (msb of x)."""
    outs = [_eval(s, d, i) for i in range(2)]
    return (outs[0].get() + outs[1].get()) & 1


def test_reuse_a_key(trio: Any) -> None:
    """The last party's copy of the correction words sent on to party 0 (a second key
    there), a key evaluated twice, a replayed evaluation, a second dealing of one
    instance (as a comparison, then as a ReLU)."""
    s, x = _session(trio)
    alice, bob, carol = trio
    d = _deal(s, x)
    _refused(bob, lambda: d.cws[1].copy_to(alice).get(), "again")  # a copy of a copy
    first = _eval(s, d, 0)
    _refused(alice, lambda: _eval(s, d, 0))  # its key and its c: spent
    second = _eval(s, d, 1)
    assert ((first.get() + second.get()) & 1).tolist() == [0, 1, 0, 1]
    _refused(bob, lambda: _eval(s, d, 1))  # replayed at the last party
    # the same nonce dealt again, as a ReLU's key: the dealer's streams are spent
    _refused(
        carol,
        lambda: pt.call_function(
            carol,
            "mpc.dealer_fss_relu",
            [s.dealer_seeds, d.nonce, [N], 16],
            out=[((fss_relu.key_words(N),), I64), ((5 * N,), I64)],
        ),
        "used|again|nonce",
    )


def test_a_comparison_key_result_is_not_packed_as_a_selection_d(trio: Any) -> None:
    """A key of a comparison without selections gives the bit itself (an arithmetic
    share, kept): evaluating it as a selection's d, packed to be opened, is refused."""
    s, x = _session(trio)
    alice, bob, _ = trio
    d = _deal(s, x)
    _refused(alice, lambda: _eval(s, d, 0, packed=True), REFUSED + "|selecting key")
    _refused(bob, lambda: _eval(s, d, 1, packed=True), REFUSED + "|selecting key")
    assert _honest(s, d).tolist() == [0, 1, 0, 1]


def test_swap_keys_between_instances_parties_and_protocols(trio: Any) -> None:
    s, x = _session(trio)
    alice, bob, _ = trio
    a, b = _deal(s, x), _deal(s, x)
    # instance a's key at instance b's opened c
    _refused(alice, lambda: _eval(s, a, 0, c=b.c[0]))
    # instance b's last-party share of u with instance a's key
    _refused(bob, lambda: _eval(s, a, 1, u=b.u1))
    # party 0 evaluating as the last party (its place is its seed's), with its u
    _refused(
        alice,
        lambda: pt.call_function(
            alice,
            "mpc.fss_eval",
            [s.party_seeds[0], a.nonce, False, a.cws[0], None, a.c[0], 64, False],
            out=[((N,), I64)],
        ),
        REFUSED + "|first",
    )
    # a ReLU's key where a comparison's is expected (and its f as the bits)
    nonce = s.next_nonce()
    cw, _ = pt.call_function(
        s.dealer,
        "mpc.dealer_fss_relu",
        [s.dealer_seeds, nonce, [N], 16],
        out=[((fss_relu.key_words(N),), I64), ((5 * N,), I64)],
    )
    relu_cw = cw.copy_to(alice, lend=True)
    _refused(alice, lambda: _eval(s, b, 0, key=relu_cw))
    # the honest evaluations of both instances still agree with torch
    assert _honest(s, a).tolist() == [0, 1, 0, 1]
    assert _honest(s, b).tolist() == [0, 1, 0, 1]


def test_evaluate_at_a_point_the_client_chooses(trio: Any) -> None:
    """A key is evaluated at its own instance's opened c only: not at a tensor the client
    stored, not at a value opened for another purpose under the same nonce, not at the
    other party's opening delivered to it, not at the key's own words."""
    s, x = _session(trio)
    alice, bob, _ = trio
    d = _deal(s, x, opened=False)
    chosen = pt.send(torch.tensor([0, 1 << 40, 1 << 62, -1]), alice)
    _refused(alice, lambda: _eval(s, d, 0, c=chosen))
    # a Beaver product under the instance's nonce: its opened e | f at the parties
    y = mpc.share(torch.ones(N), session=s)
    ef, _ = at_parties(
        s,
        "mpc.beaver_mask",
        lambda i: [s.party_seeds[i], d.nonce, x.shares[i], y.shares[i]],
        [([2 * N], I64), ([N], I64)],
    )
    r = Round(s)
    opened_ef = r.add(ef)
    r.open()
    _refused(alice, lambda: _eval(s, d, 0, c=opened_ef.value[0]))
    # an opened c of the same nonce, but alice's delivered to bob
    (masked,) = at_parties(
        s, "mpc.cmp_mask", lambda i: [s.party_seeds[i], d.nonce, x.shares[i]], [([N], I64)]
    )
    r = Round(s)
    handle = r.add(masked)
    r.open()
    d.c = handle.value
    _refused(alice, lambda: _eval(s, d, 1, c=d.c[0].copy_to(bob)), "sending a open:cmp")
    _refused(alice, lambda: _eval(s, d, 0, c=d.cws[0]))
    assert _honest(s, d).tolist() == [0, 1, 0, 1]


def test_a_partys_share_of_a_mask_never_leaves_it(trio: Any) -> None:
    """Before, the client could copy the last party's share of u (u = the mask's top bit,
    XOR the daBit) to party 0, the last party's share of a Beaver mask to party 0, or a
    value opened at a party to the dealer: each time one worker then held both shares of
    a mask (or the mask's maker the masked value), and a curious party saw the value the
    protocol hides (msb(x); x = e + a). Material made at a party for its own use stays
    there; only the pieces of an opening travel, to be opened."""
    s, x = _session(trio)
    alice, bob, carol = trio
    d = _deal(s, x)
    _refused(bob, lambda: d.u1.copy_to(alice).get(), r"sending a fss\.u to a peer")
    _refused(alice, lambda: d.c[0].copy_to(carol).get(), r"sending a open:cmp\.c to a peer")
    y = mpc.share(torch.ones(N), session=s)
    nonce = s.next_nonce()
    _, a = at_parties(
        s,
        "mpc.beaver_mask",
        lambda i: [s.party_seeds[i], nonce, x.shares[i], y.shares[i]],
        [([2 * N], I64), ([N], I64)],
    )
    _refused(bob, lambda: a[1].copy_to(alice).get(), r"sending a beaver\.a to a peer")
    assert _honest(s, d).tolist() == [0, 1, 0, 1]
