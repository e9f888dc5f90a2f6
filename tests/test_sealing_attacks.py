"""Issue 27, as an attacker sends it: a client that does not follow the protocol (raw
messages, the protocol steps called with operands of its choosing, in any order) learns
nothing sealed and makes no material be used twice. Runs on both worker kinds
(conftest.py): on network workers this is the trust boundary.

Each test here succeeded as an attack before protocol steps were bound to their instance
(commit 8a1d80d): a sealed zero made with ``sub(s, s)`` fed as an operand, a finish step
called twice, a client value accepted as a seed, in-place writes into seeds, a seed
delivered again after its record was wiped, and protocol steps inside a stored plan.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from refusals import refused

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols import parties as party_calls
from pointers.plans.wire import plan_to_wire
from pointers.wire.messages import Describe, StorePlan

I64 = torch.int64


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _sync(worker: Any) -> None:
    worker.request(Describe([]))  # a network worker's earlier errors surface here


def _refused(worker: Any, attempt: Callable[[], Any], match: str = "sealed|protocol") -> None:
    refused(worker, attempt, match)


def step(worker: Any, name: str, args: list[Any], out: Any) -> Any:
    return pt.call_function(worker, name, args, out=out)


class Recorder:
    """Every protocol step the client library sends: (worker, name, args, outputs)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[tuple[Any, str, list[Any], Any]] = []
        orig = party_calls.call

        def call(worker: Any, name: str, args: list[Any], out: Any) -> Any:
            got = orig(worker, name, args, out)
            self.calls.append((worker, name, list(args), got))
            return got

        monkeypatch.setattr(party_calls, "call", call)

    def of(self, name: str) -> list[tuple[Any, str, list[Any], Any]]:
        return [c for c in self.calls if c[1] == name]


def test_a_sealed_zero_is_never_made(trio: Any) -> None:
    """``sub(s, s)`` of a seed was a sealed zero that, fed as an operand, returned any
    sealed object in the clear; ``add(zero, K)`` was then a seed of the client's choosing."""
    alice, bob, carol = trio
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    seed = x.session.party_seeds[0]
    _refused(alice, lambda: torch.sub(seed, seed), "running aten::sub")
    _refused(alice, lambda: seed.add_(1), "running aten::add_")
    _refused(alice, lambda: seed.bitwise_xor(seed), "running aten::bitwise_xor")
    assert torch.equal(x.get(), torch.ones(3))


def test_a_client_value_is_never_material(trio: Any) -> None:
    alice, bob, carol = trio
    x = mpc.share(torch.ones(4), alice, bob, crypto_provider=carol)
    s = x.session
    mine = pt.send(torch.zeros(16, dtype=torch.uint8), alice)
    out = [((4,), I64)]
    _refused(
        alice,
        lambda: step(alice, "mpc.cmp_mask", [mine, s.next_nonce(), x.shares[0]], out),
        "takes protocol material only",
    )
    # the dealer's seeds passed to a party step at the dealer: not a delivered seed
    theirs = pt.send(torch.zeros(4, dtype=I64), carol)
    _refused(
        carol,
        lambda: step(carol, "mpc.cmp_mask", [s.dealer_seeds[0], s.next_nonce(), theirs], out),
        "delivered",
    )
    # a party's seed passed to a dealer step: not the dealer's own
    _refused(
        alice,
        lambda: step(alice, "mpc.dealer_trunc", [[s.party_seeds[0]], s.next_nonce(), [4], 16], out),
        "own",
    )
    assert torch.equal(x.get(), torch.ones(4))


def test_beaver_steps_run_once_in_order_on_their_own_instance(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a real x * y the client rebuilt e and f (and with the seeds, x and y) by
    calling the combine step again with operands of its choosing. Every such call is
    refused: the step's material is consumed, bound to its instance and its place."""
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    a, b = torch.tensor([1.5, -2.0, 3.0]), torch.tensor([0.5, 4.0, -1.0])
    x = mpc.share(a, alice, bob, crypto_provider=carol)
    y = mpc.share(b, alice, bob, crypto_provider=carol)
    z = x * y
    assert torch.allclose(z.get(), a * b, atol=1e-3)
    (_, _, margs, (ef, a0)) = rec.of("mpc.beaver_mask")[0]
    seed, nonce, _, y0 = margs
    (_, _, cargs, _) = rec.of("mpc.beaver_combine")[0]
    opened_ef = cargs[5]
    zeros = pt.send(torch.zeros(3, dtype=I64), alice)
    out = [((3,), I64)]
    # the finish step again, with y = 0: its material was consumed
    _refused(
        alice,
        lambda: step(
            alice, "mpc.beaver_combine", [seed, nonce, None, zeros, a0, opened_ef, "mul", {}], out
        ),
        "not a beaver|spent|takes a",
    )
    # the opened [e | f] (material) fed as the share of a new product: refused
    _refused(
        alice,
        lambda: step(
            alice, "mpc.beaver_mask", [seed, x.session.next_nonce(), opened_ef, y0], out * 2
        ),
        "takes a share",
    )
    # a fresh instance: its mask and opening, then a combine with another y than it masked
    n2 = x.session.next_nonce()
    ef2, a2 = step(
        alice, "mpc.beaver_mask", [seed, n2, x.shares[0], y0], [((6,), I64), ((3,), I64)]
    )
    _refused(
        alice,
        lambda: step(alice, "mpc.beaver_combine", [seed, n2, None, zeros, a2, ef2, "mul", {}], out),
        "open:beaver.ef",  # the unopened mask is not the opened value
    )
    # the step of one instance with the material of another
    _refused(
        alice,
        lambda: step(
            alice, "mpc.beaver_combine", [seed, nonce, None, y0, a2, opened_ef, "mul", {}], out
        ),
        "instance|spent|takes a",
    )
    # an opening: this party's piece twice is not an opening among distinct parties
    _refused(
        alice,
        lambda: step(alice, "mpc.open_unpack", [[ef2, ef2], [[6]], False], out),
        "distinct peers",
    )
    assert torch.allclose((x * y).get(), a * b, atol=1e-3)  # the workers stay usable


def test_a_comparison_finish_runs_once(trio: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Calling the selection's finish step twice with v = 0 and v = 1 gave the opened d,
    and so the daBit, as their difference."""
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    a = torch.tensor([1.0, -2.0, 3.0, -0.5])
    # (d is opened past three_round_up_to elements: here, at every size)
    x = mpc.share(a, alice, bob, crypto_provider=carol, config=MPCConfig(three_round_up_to=None))
    r = torch.relu(x)
    assert torch.allclose(r.get(), torch.relu(a), atol=1e-3)
    selects = [c for c in rec.of("mpc.cmp_select_finish") if c[0] is alice]
    assert selects
    _, _, (complement, d, v, vt), _ = selects[0]
    out = [((4,), I64)]
    for value in (0, 1):
        v_mine = pt.send(torch.full((4,), value, dtype=I64), alice)
        _refused(
            alice,
            lambda v_mine=v_mine: step(
                alice, "mpc.cmp_select_finish", [complement, d, v_mine, vt], out
            ),
            "spent|takes a|instance|mask",
        )
    # the daBit step of the comparison, with the v of the client's choosing: refused too
    _refused(
        alice,
        lambda: step(alice, "mpc.cmp_select_finish", [complement, d, v, d], out),
        "takes a",
    )


def test_a_seed_is_delivered_once_so_a_reset_cannot_replay_a_nonce(trio: Any) -> None:
    """Use nonce N, wipe the parties' record of it (reset, a lapsed lease, a restart),
    have the dealer deliver its seed copies again: N was accepted again, and the same mask
    derived twice. A seed now leaves its dealer once; its copies cannot be sent on."""
    alice, bob, carol = trio
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    s = x.session
    assert torch.allclose((x * x).get(), torch.ones(3), atol=1e-3)
    for w in (alice, bob):
        reset = getattr(w, "reset", None)
        if reset is not None:
            reset()
    for k, party in enumerate(s.parties):
        _refused(carol, lambda k=k, party=party: s.dealer_seeds[k].copy_to(party), "again")
        _refused(carol, lambda k=k, party=party: s.dealer_seeds[k].move(party), "again")


def test_a_plan_cannot_call_a_protocol_step(trio: Any) -> None:
    """A stored plan that called ``mpc.derive`` on a plan input, or ``mpc.new_seed``,
    returned their outputs unsealed."""
    alice, bob, carol = trio
    mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)  # the steps are installed

    @pt.func2plan()
    def twice(u: torch.Tensor) -> torch.Tensor:
        return u + u

    wire = plan_to_wire(twice.build(torch.ones(16, dtype=torch.uint8)).graph)
    for node in (
        ["fn::mpc.derive", [pt.wire.serde.Ref(0), 1, 7, [4]], {}],
        ["fn::mpc.new_seed", [], {}],
    ):
        wire[6] = [node]
        wire[7] = [pt.wire.serde.Ref(1)]
        _refused(alice, lambda: alice.request(StorePlan(alice.new_id(), wire)), "protocol step")


def test_the_seed_tells_a_party_its_place(trio: Any) -> None:
    """Which party adds the public term (``first``) and which takes the dealer's
    corrections is the seed's, not the client's word: two parties or none made first
    turned a truncation's result into a function of its mask."""
    alice, bob, carol = trio
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    s = x.session
    out = [((3,), I64)]
    n = s.next_nonce()
    _refused(
        bob,
        lambda: step(
            bob, "mpc.trunc_finish", [s.party_seeds[1], n, True, None, x.shares[1], 16], out
        ),
        "'first' must be False",
    )
    _refused(
        bob,
        lambda: step(
            bob,
            "mpc.beaver_combine",
            [s.party_seeds[1], n, None, x.shares[1], x.shares[1], x.shares[1], "mul", {}],
            out,
        ),
        "the last party takes",
    )
    # a seed for a place that does not exist, and the dealer's seeds out of order
    _refused(
        carol,
        lambda: step(carol, "mpc.new_seed", [2, [alice.id, bob.id]], [((16,), torch.uint8)]),
        "party 0 to 1",
    )
    _refused(
        carol,
        lambda: step(carol, "mpc.dealer_trunc", [s.dealer_seeds[::-1], n, [3], 16], [((5,), I64)]),
        "in their order",
    )
    assert torch.equal(x.get(), torch.ones(3))


def test_in_process_objects_and_shares_reveal_no_material(trio: Any) -> None:
    """``worker.objects`` listed seeds in process, and an integer product's share kept a
    view of the opened [e | f] (its storage read f)."""
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([3, -4, 5]), alice, bob, crypto_provider=carol)
    y = mpc.share(torch.tensor([2, 2, -1]), alice, bob, crypto_provider=carol)
    z = x * y
    assert torch.equal(z.clone().get(), torch.tensor([6, -8, -5]))
    seed = x.session.party_seeds[0]
    assert seed.id_at_location in alice.objects  # listed, as a network worker lists it
    with pytest.raises((pt.RemoteError, pt.NotAllowedError), match="sealed"):
        alice.objects[seed.id_at_location]  # but not readable
    if isinstance(alice, pt.VirtualWorker):
        share = alice.store.get(z.shares[0].id_at_location)
        assert share.untyped_storage().nbytes() == share.numel() * share.element_size()
