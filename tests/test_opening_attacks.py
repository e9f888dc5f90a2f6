"""Where the pieces of an opening may go, attacked as a client that orchestrates the
parties sends it (raw steps and deliveries). Runs on both worker kinds (conftest.py).

A piece of an opening is a party's share minus its share of a mask that the crypto
provider (the dealer) knows: e_i = x_i - a_i of a Beaver product, c_i = z_i + r_i of a
truncation, a packed round of them. Before the workers bound protocol material to the
session's parties, the client named any peer for a delivery: every party's piece of one
opening sent to the dealer showed the dealer the value (in process it read x from its own
store and its seeds; inside a model owner's approved run, the owner's first weight), and a
dealer's correction sent to the wrong party showed that party the mask of its peer. Each
test below was accepted then; each delivery is now refused by the worker that holds the
material, whatever the client names, and each opening is checked by the party that opens.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from refusals import refused
from torch import nn

import mpc
import pointers as pt
from mpc.protocols.beaver.steps import beaver_mask
from mpc.protocols.opening.run import exchange
from mpc.protocols.opening.steps import open_unpack, pack
from mpc.protocols.seeds.steps import new_seed
from mpc.protocols.step import name_of
from mpc.protocols.truncation.steps import dealer_trunc, trunc_mask
from pointers.errors import NotAllowedError, RemoteError
from pointers.wire.messages import Describe, RunProgram, SendToPeer, StoreProgram
from pointers.wire.serde import Slot
from pointers.worker.sealing import Label, seal

I64 = torch.int64
N = 4
ONLY_PARTIES = "goes only to|again"


@pytest.fixture
def four(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any, Any]:
    """alice and bob compute, carol deals, dave is a worker outside the session."""
    return tuple(make_worker(n) for n in ("alice", "bob", "carol", "dave"))  # type: ignore[return-value]


def _sync(worker: Any) -> None:
    worker.request(Describe([]))  # a network worker's earlier errors surface here


def _refused(worker: Any, attempt: Callable[[], Any], match: str = ONLY_PARTIES) -> None:
    refused(worker, attempt, match)


def _send(ptr: Any, peer: Any) -> Any:
    """The client names ``peer`` for a delivery of ``ptr`` (linking them first)."""
    ptr.location.introduce(peer)
    out = ptr.copy_to(peer)
    _sync(ptr.location)
    return out


def _masked(x: Any, y: Any) -> tuple[int, list[Any]]:
    """Each party's [e_i | f_i] of a fresh Beaver instance on x and y, as the client
    sends the step."""
    s = x.session
    nonce = s.next_nonce()
    out = [((2 * N,), I64), ((N,), I64)]
    efs = [
        pt.call_function(
            p, name_of(beaver_mask), [s.party_seeds[i], nonce, x.shares[i], y.shares[i]], out=out
        )[0]  # fmt: skip
        for i, p in enumerate(s.parties)
    ]
    return nonce, efs


def _pair(four: Any, value: torch.Tensor) -> tuple[Any, Any]:
    alice, bob, carol, _ = four
    x = mpc.share(value, alice, bob, crypto_provider=carol)
    y = mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)
    return x, y


def test_the_dealer_never_receives_a_piece_of_an_opening(four: Any) -> None:
    """Both pieces of e = x - a sent to the dealer, which derives a from its seeds: it
    read x. Each party's worker now refuses to deliver its piece to the dealer."""
    alice, bob, carol, _ = four
    secret = torch.tensor([1.5, -2.25, 3.0, 0.125])
    x, y = _pair(four, secret)
    _, efs = _masked(x, y)
    for ef, party in zip(efs, (alice, bob)):
        _refused(party, lambda ef=ef: _send(ef, carol))
    if isinstance(carol, pt.VirtualWorker):  # the dealer's store: its seeds, nothing else
        labels = [Label.of(carol.store.entry(i).sealed) for i in carol.store.view(sealed=True)]
        assert {lb.kind for lb in labels if lb is not None} <= {"seed"}
    assert torch.allclose((x * y).get(), secret, atol=1e-3)  # the honest product still runs


def test_a_piece_goes_to_no_worker_outside_the_session(four: Any) -> None:
    """A worker outside the session (dave), even one that is a party of another session
    with alice: the piece goes to bob alone."""
    alice, bob, carol, dave = four
    x, y = _pair(four, torch.arange(N, dtype=torch.float32))
    other = mpc.share(torch.ones(N), alice, dave, crypto_provider=carol)  # alice and dave
    assert other.session is not x.session
    _, efs = _masked(x, y)
    _refused(alice, lambda: _send(efs[0], dave))
    _refused(bob, lambda: _send(efs[1], dave))
    _send(efs[0], bob)  # its one destination
    assert torch.allclose((x * y).get(), torch.arange(N, dtype=torch.float32), atol=1e-3)


def test_a_packed_round_and_a_truncation_go_to_the_parties_only(four: Any) -> None:
    """A round's packed pieces, and a truncation's c_i = z_i + r_i (the dealer knows r),
    are bound to the parties like a product's."""
    alice, bob, carol, dave = four
    x, y = _pair(four, torch.ones(N))
    s = x.session
    _, efs = _masked(x, y)
    nonce = s.next_nonce()
    cs = [
        pt.call_function(
            p, name_of(trunc_mask), [s.party_seeds[i], nonce, x.shares[i]], out=[((N,), I64)]
        )[0]  # fmt: skip
        for i, p in enumerate(s.parties)
    ]
    (packed,) = pt.call_function(alice, name_of(pack), [[efs[0], cs[0]]], out=[((3 * N,), I64)])
    for peer in (carol, dave):
        _refused(alice, lambda peer=peer: _send(packed, peer))
        _refused(bob, lambda peer=peer: _send(cs[1], peer))


def test_a_delivered_piece_is_not_sent_on(four: Any) -> None:
    """Bob's copy of alice's piece, forwarded by bob to the dealer: the route that
    reached the dealer inside an approved run, where alice's own piece was spent before
    the client could send it."""
    alice, bob, carol, dave = four
    x, y = _pair(four, torch.ones(N))
    _, efs = _masked(x, y)
    at_bob = _send(efs[0], bob)
    for peer in (carol, dave, alice):
        _refused(bob, lambda peer=peer: _send(at_bob, peer), "again")


def test_the_dealers_correction_goes_to_its_party_only(four: Any) -> None:
    """The last party's share of a truncation's U (from r >> f) sent to party 0, which
    derives its own share of r: it read r's top bits, and so z from the opened z + r.
    A dealer's material with one delivery goes to the last party only."""
    alice, bob, carol, dave = four
    x = mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)
    s = x.session
    (corrections,) = pt.call_function(
        carol, name_of(dealer_trunc), [s.dealer_seeds, s.next_nonce(), [N], 16]
    )
    assert corrections is not None
    for peer in (alice, dave):
        _refused(carol, lambda peer=peer: _send(corrections, peer))
    _send(corrections, bob)  # the last party


def test_comparison_material_goes_to_the_last_party_only(four: Any) -> None:
    """The dealer's comparison material (r's bits, the daBits, the carry tree's
    products) sent to party 0: its own shares and the last party's are r's bits, and the
    opened c = x + r then shows x. Its unpacking step takes no seed, so nothing at party 0
    refused it either."""
    alice, bob, carol, _ = four
    x = mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)
    s = x.session
    levels = [s.next_nonce() for _ in range(2)]
    (material,) = pt.call_function(
        carol, "mpc.dealer_compare", [s.dealer_seeds, s.next_nonce(), [N], levels, []]
    )
    assert material is not None
    _refused(carol, lambda: _send(material, alice))
    _send(material, bob)


def test_a_seed_goes_to_its_own_party(four: Any) -> None:
    """A seed names the session's parties and goes to the party at its place only; the
    dealer deals no seed to a group it belongs to."""
    alice, bob, carol, dave = four
    mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)  # (installs the steps)
    out = [((16,), torch.uint8)]
    (seed,) = pt.call_function(carol, name_of(new_seed), [0, [alice.id, bob.id]], out=out)
    for peer in (bob, dave):
        _refused(carol, lambda peer=peer: _send(seed, peer))
    _send(seed, alice)
    _refused(
        carol,
        lambda: pt.call_function(carol, name_of(new_seed), [0, [alice.id, carol.id]], out=out),
        "crypto provider",
    )
    _refused(
        carol,
        lambda: pt.call_function(carol, name_of(new_seed), [0, 2], out=out),
        "distinct parties",
    )


def test_an_opening_takes_one_piece_from_each_other_party(make_worker: Any) -> None:
    """With three parties, alice opened from her piece and bob's alone (dave's left
    out), and from her piece and a piece of another session's party (at the same nonce,
    which the client chooses): each is refused by alice herself."""
    alice, bob, carol, dave, erin = (make_worker(n) for n in ("alice", "bob", "carol", "dave",
                                                               "erin"))  # fmt: skip
    x = mpc.share(torch.ones(N), alice, bob, dave, crypto_provider=carol)
    y = mpc.share(torch.ones(N), alice, bob, dave, crypto_provider=carol)
    s = x.session
    nonce, efs = _masked(x, y)
    pieces = exchange(s, efs)
    meta = [((2 * N,), I64)]
    _refused(
        alice,
        lambda: pt.call_function(
            alice, name_of(open_unpack), [pieces[0][:2], [[2 * N]], False], out=meta
        ),  # fmt: skip
        "one from each other party",
    )
    # another session, alice and erin, at the same nonce: erin's piece is not of alice's
    u = mpc.share(torch.ones(N), alice, erin, crypto_provider=carol)
    v = mpc.share(torch.ones(N), alice, erin, crypto_provider=carol)
    t = u.session
    out = [((2 * N,), I64), ((N,), I64)]
    (theirs, _) = pt.call_function(erin, name_of(beaver_mask),
                                   [t.party_seeds[1], nonce, u.shares[1], v.shares[1]], out=out)  # fmt: skip
    from_erin = _send(theirs, alice)
    _refused(
        alice,
        lambda: pt.call_function(
            alice,
            name_of(open_unpack),
            [[pieces[0][0], pieces[0][1], from_erin], [[2 * N]], False],
            out=meta,
        ),
        "one from each other party",
    )


def test_a_label_names_where_it_goes() -> None:
    """The wire form of a bound label, and a malformed one (matches no rule)."""
    bound = seal("beaver.ef", 7, to=("alice", "bob"))
    assert Label.of(bound) == Label("beaver.ef", 7, to=("alice", "bob"))
    assert len(seal("beaver.ef", 7)) == 6  # (unbound: the form it always had)
    for bad in ([], ["alice", "alice"], ["alice", 3], "alice"):
        assert Label.of([*bound[:6], bad]).kind == "unlabelled"


# -- inside a model owner's approved run --------------------------------------------------


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


class _HeldBack:
    """The client library's messages to the parties, watched: the programs it stores,
    and (once ``hold`` is set) its RunProgram messages held back, so that the attacker
    starts each run when it wants."""

    def __init__(self, parties: list[Any]) -> None:
        self.programs: dict[tuple[str, int], list[Any]] = {}
        self.runs: dict[str, RunProgram] = {}
        self.hold = False
        self.parties = parties
        for w in parties:

            def spy(msg: Any, w: Any = w, post: Any = w.post) -> None:
                if isinstance(msg, StoreProgram):
                    self.programs[w.id, msg.obj_id] = msg.messages
                if isinstance(msg, RunProgram) and self.hold:
                    self.runs[w.id] = msg
                else:
                    post(msg)

            w.post = spy

    def release(self) -> None:
        for w in self.parties:
            del w.post

    def first_delivery(self, worker: Any) -> tuple[int, str, int]:
        """(object id at ``worker``, peer, id at the peer) of the first delivery of its
        held-back run: its piece of the run's first opening."""
        run = self.runs[worker.id]
        for cmd in self.programs[worker.id, run.program_id]:
            if cmd[0] == SendToPeer.KIND:
                obj, new = (run.bindings[v.index] if isinstance(v, Slot) else v
                            for v in (cmd[1], cmd[3]))  # fmt: skip
                return obj, cmd[2], new
        raise AssertionError("the run delivers nothing")


def _forward(worker: Any, obj_id: int, peer: Any, match: str) -> None:
    """``worker`` sends ``obj_id`` to ``peer``, as a raw command (once it arrived)."""
    deadline = time.monotonic() + 60
    while True:
        try:
            worker.request(SendToPeer(obj_id, peer.id, peer.new_id(), False))
        except RemoteError as e:
            if "holds no object" in str(e) and time.monotonic() < deadline:
                time.sleep(0.05)  # (the piece is on its way)
                continue
            assert re.search(match, str(e)), e
            return
        raise AssertionError(f"{worker.id} delivered object {obj_id} to {peer.id}")


def _attack_a_held_run(model_ptr: Any, parties: list[Any], carol: Any) -> None:
    """Start alice's approved run alone: her piece of the first opening (with her share
    of the owner's first weight, masked by B_0, which the dealer derives) reaches bob,
    whose run has not started. Sent from bob, and alice's own, to the dealer: refused.
    Bob's run then starts, and the query opens the right output."""
    alice, bob = parties
    x = torch.randn(8, 4)
    with torch.no_grad():
        expected = _model()(x)
    watch = _HeldBack(parties)
    try:
        held = mpc.share(model_ptr, alice, bob, crypto_provider=carol)
        query = mpc.plan(held, mpc.share(x, alice, bob, crypto_provider=carol))
        watch.hold = True
        out = query(mpc.share(x, alice, bob, crypto_provider=carol))
    finally:
        watch.release()
    own, peer, at_bob = watch.first_delivery(alice)
    assert peer == bob.id
    for worker in parties:
        worker.introduce(carol)
    alice.post(watch.runs[alice.id])
    _forward(bob, at_bob, carol, "again")
    _forward(alice, own, carol, "goes only to|spent|again")
    bob.post(watch.runs[bob.id])
    for worker in parties:
        worker.wait_programs(120)  # (the output is released when the run ends)
    assert (out.get() - expected).abs().max() < 1e-2


def test_a_held_run_sends_its_pieces_to_its_parties_only() -> None:
    """In process. Before the fix, bob's copy of alice's piece and (with bob's run bound
    to deliver under an id alice does not wait for) alice's copy of bob's reached the
    dealer, which added its masks and read the owner's first weight exactly."""
    model = _model()
    approval = mpc.approve(model, torch.randn(8, 4), parties=["alice", "bob"],
                           crypto_provider="carol")  # fmt: skip
    model_ptr = mpc.offer(model, pt.VirtualWorker("owner"), approval)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    _attack_a_held_run(model_ptr, [alice, bob], carol)


@pytest.mark.slow
@pytest.mark.network
def test_a_held_run_on_served_workers(tmp_path: Path) -> None:
    """The same attack on served workers (the owner's worker serves its offer)."""
    from network_fixtures import Cluster

    model = _model()
    approval = mpc.approve(model, torch.randn(8, 4), parties=["alice", "bob"],
                           crypto_provider="carol")  # fmt: skip
    path = tmp_path / "offer.bin"
    mpc.save_offer(model, approval, path)
    cluster = Cluster(tmp_path, ["owner", "alice", "bob", "carol"],
                      worker_args={"owner": ["--offer", str(path)]})  # fmt: skip
    cluster.start()
    try:
        owner, alice, bob, carol = (cluster.connect(w) for w in ("owner", "alice", "bob", "carol"))
        _attack_a_held_run(mpc.offered(_model(), owner), [alice, bob], carol)
    finally:
        cluster.stop()


def test_an_owners_shares_go_one_to_each_approved_party() -> None:
    """A held share left its owner once, but to any worker: both shares of the owner's
    first weight moved to the dealer (or both to alice) summed to the weight. The owner's
    worker now binds share k to the k-th party the client names, distinct parties the
    owner approved runs for."""
    model = _model()
    approval = mpc.approve(model, torch.randn(8, 4), parties=["alice", "bob"],
                           crypto_provider="carol")  # fmt: skip
    owner = pt.VirtualWorker("owner")
    mpc.offer(model, owner, approval)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    for w in (alice, bob, carol):
        owner.introduce(w)
    out = [((8, 4), I64)] * 2

    def split(*args: Any) -> list[Any]:
        shares = pt.call_function(owner, "mpc.held_share", ["0.weight", [8, 4], 16, 2, *args],
                                  out=out)  # fmt: skip
        _sync(owner)
        return shares

    _refused(owner, lambda: split()[0].move(carol), "distinct parties")  # (parties unnamed)
    _refused(owner, lambda: split(["alice", "alice"]), "distinct parties")
    _refused(owner, lambda: split(["alice", "carol"]), "approved runs for")
    s0, s1 = split(["alice", "bob"])
    _refused(owner, lambda: s0.move(carol), "goes only to 'alice'")
    _refused(owner, lambda: s1.move(alice), "goes only to 'bob'")
    s0.move(alice)
    s1.move(bob)


def test_refusals_name_the_rule() -> None:
    """The refusal says where the material may go, and why."""
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)
    y = mpc.share(torch.ones(N), alice, bob, crypto_provider=carol)
    _, efs = _masked(x, y)
    alice.introduce(carol)
    with pytest.raises((RemoteError, NotAllowedError), match="goes only to 'bob'.*crypto"):
        efs[0].copy_to(carol)
