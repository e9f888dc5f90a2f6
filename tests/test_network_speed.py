"""Issue 15: what makes network workers faster, checked on both worker kinds.

* ``mpc.share`` sends parties 0..n-2 a 16-byte seed each instead of their share
  (``mpc.share_from_seed``), so only the last party's share travels as a tensor;
* :func:`pointers.network.connection.hold_sends` sends what is posted inside it in one
  call per network worker;
* ``python -m benchmarks`` flags: ``--bandwidth``, ``--plan``, the latency floor table.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from benchmarks.__main__ import main as bench_main
from benchmarks.report import floor_table
from mpc.math import carry_tree
from mpc.math.prg import PRG
from mpc.protocols.comparison import steps as comparison
from mpc.protocols.opening import steps as opening
from mpc.protocols.seeds.steps import MAX_SEEDED_BYTES
from mpc.session import install
from mpc.shared import SEEDED_FROM
from pointers.wire.messages import SendToPeer
from pointers.wire.serde import ref_id

KINDS = ["virtual", pytest.param("network", marks=pytest.mark.network)]


@pytest.fixture
def net(network_cluster):
    yield network_cluster
    network_cluster.close_connections()


def _workers(kind: str, request: pytest.FixtureRequest, n: int = 2) -> list:
    names = ["alice", "bob", "dave", "erin"][:n] + ["carol"]
    if kind == "virtual":
        workers = [pt.VirtualWorker(w) for w in names]
        for w in workers:
            install(w)  # (what a session does; served workers have the functions already)
        return workers
    net = request.getfixturevalue("net")
    return [net.fresh(w) for w in names]


def _received(w) -> int:
    stats = w.stats() if callable(w.stats) else w.stats
    return stats.bytes_received


# ------------------------------------------------------------------ seeded input shares


@given(
    values=st.lists(
        st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False), min_size=1, max_size=300
    ),
    n=st.integers(2, 4),
)
@settings(max_examples=40, deadline=None)
def test_seeded_shares_reconstruct_the_plaintext_in_process(values, n):
    x = torch.tensor(values)
    *parties, dealer = [pt.VirtualWorker(f"p{i}") for i in range(n)] + [pt.VirtualWorker("d")]
    s = mpc.share(x, *parties, crypto_provider=dealer)
    assert torch.allclose(s.get(), x, atol=2e-5, rtol=0)
    # each share alone is uniform-looking: the parties' shares are not the plaintext
    if x.numel() >= SEEDED_FROM and x.abs().max() > 1:
        for p in parties:
            share = pt.PointerTensor.get(s.shares[parties.index(p)], delete=False)
            assert not torch.equal(share, mpc.math.encoding.encode(x, 16))


@pytest.mark.parametrize("kind", KINDS)
def test_seeded_sharing_sends_seeds_not_tensors(kind, request):
    alice, bob, carol = _workers(kind, request)
    x = torch.randn(10_000)
    before = [_received(alice), _received(bob)]
    s = mpc.share(x, alice, bob, crypto_provider=carol)
    y = s * s  # the seeded shares take part in a product like any others
    assert torch.allclose(y.get(), x * x, atol=1e-3, rtol=1e-3)
    for w in (alice, bob):
        if kind == "network":
            w.sync()
    got = [_received(alice) - before[0], _received(bob) - before[1]]
    # bob (the last party) gets the only share tensor, 80 kB; alice a seed and a command,
    # besides the product's traffic (alike at both parties)
    assert got[1] - got[0] >= 80_000 - 2_000, got


@pytest.mark.parametrize("kind", KINDS)
def test_a_seed_gives_one_share_and_bad_seeds_are_refused(kind, request):
    alice, _, _ = _workers(kind, request)
    seed = os.urandom(16)
    (p,) = pt.call_function(
        alice, "mpc.share_from_seed", [seed, [3, 4]], out=[((3, 4), torch.int64)]
    )
    assert torch.equal(p.get(delete=False), PRG(seed).int64((3, 4)))
    # (in process the error raises at the call, on a network worker at the next get)
    with pytest.raises(pt.PointerError, match="used before"):
        (again,) = pt.call_function(
            alice, "mpc.share_from_seed", [seed, [3, 4]], out=[((3, 4), torch.int64)]
        )
        again.get()
    for args, match in (
        ([seed[:8], [2]], "16 bytes"),
        ([os.urandom(16), [-1]], "list of (non-negative )?sizes"),
        ([os.urandom(16), "2"], "list of (at most 64 )?(non-negative )?sizes"),
        ([os.urandom(16), [MAX_SEEDED_BYTES // 8 + 1]], "exceeds"),
    ):
        with pytest.raises(pt.PointerError, match=match):
            (bad,) = pt.call_function(alice, "mpc.share_from_seed", args, out=[((1,), torch.int64)])
            bad.get()
    assert torch.equal(p.get(), PRG(seed).int64((3, 4)))  # the first share is still there


def test_small_tensors_travel_as_shares():
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    before = alice.stats.bytes_received
    s = mpc.share(torch.ones(SEEDED_FROM - 1), alice, bob, crypto_provider=carol)
    assert alice.stats.bytes_received - before >= 8 * (SEEDED_FROM - 1)
    assert torch.equal(s.get(), torch.ones(SEEDED_FROM - 1))


# ------------------------------------------------------------------ one call per op


@pytest.mark.network
def test_held_sends_leave_in_one_call(net):
    from pointers.network.connection import hold_sends

    alice, bob = net.fresh("alice"), net.fresh("bob")
    alice.sync()
    # held commands leave together when the block ends
    before = alice._conn.calls
    with hold_sends([alice, bob]):
        ps = [pt.send(torch.full((3,), float(i)), alice) for i in range(5)]
        qs = [p + 1 for p in ps]
        assert alice._conn.calls == before
    alice.sync()
    assert alice._conn.calls <= before + 2  # the batch, and the sync's deletes at most
    assert [float(q.get()[0]) for q in qs] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # a reply awaited inside a hold ends it (no deadlock), and what was held runs first
    with hold_sends([alice, bob]):
        p = pt.send(torch.arange(5.0), alice)
        q = p + 1
        assert torch.equal(q.get(), torch.arange(5.0) + 1)


# ------------------------------------------------------------------ benchmark flags


def test_benchmark_flags_need_network_and_sane_values(capsys):
    for argv, message in (
        (["--bandwidth", "100"], "--bandwidth needs --network"),
        (["--network", "--bandwidth", "0"], "--bandwidth must lie in"),
        (["--network", "--bandwidth", "-5"], "--bandwidth must lie in"),
    ):
        with pytest.raises(SystemExit) as e:
            bench_main(argv)
        assert e.value.code == 2
        assert message in capsys.readouterr().err


def test_plan_flag_runs_lenet_as_a_plan_in_process(capsys):
    assert (
        bench_main(
            ["--plan", "--workloads", "W5", "--sizes", "W5=1", "--repeat", "1", "--no-progress"]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "W5 lenet plan" in out and "as mpc.plan calls" in out


def test_floor_table_reports_rounds_times_latency():
    rows = [
        {"workload": "W1", "op": "mul", "size": "1e4", "rounds": 2, "median_s": 0.05},
        {
            "workload": "W5",
            "op": "lenet plan",
            "size": "b1",
            "rounds": 60,
            "median_s": 0.7,
            "plan": True,
            "loopback_s": 0.2,
        },
        {"workload": "W3", "op": "lt", "size": "1e4", "rounds": 4, "median_s": 0.09},
    ]
    rows[2]["loopback_s"] = 0.02
    text = floor_table(rows, 10.0)
    assert "20.00 ms" in text and "5.0 L" in text
    w1, w5, w3 = text.splitlines()[2:]
    assert "t0 =" not in w1 and w1.split()[-5:] == ["-", "-", "-", "5.0", "L"]  # no t0: no goal
    assert "600.00 ms" in w5 and "(R+1)L + t0 = 810.00 ms" in w5 and " yes " in w5
    # (R + 2) L alone (60 ms) lies below the median; the goal counts the protocol's time
    assert "(R+2)L + t0 = 80.00 ms" in w3 and "no (+12%)" in w3
    md = floor_table(rows, 10.0, markdown=True)
    assert md.splitlines()[0].startswith("| workload |") and md.count("\n") == 4


@pytest.mark.slow
@pytest.mark.network
def test_a_network_run_with_latency_states_its_goal_and_one_cpu_note(capsys):
    argv = ["--network", "--latency-ms", "5", "--workloads", "W1", "--sizes", "W1=1e3"]
    assert bench_main([*argv, "--repeat", "2", "--no-progress"]) == 0
    out = capsys.readouterr().out
    cpu_notes = [line for line in out.splitlines() if line.startswith("cpu:")]
    assert len(cpu_notes) == 1 and "all the processes together" in cpu_notes[0]
    assert "every party runs in this process" not in out  # (the in-process note)
    (row,) = [line for line in out.splitlines() if line.startswith("W1 mul") and "L + t0" in line]
    goal = row.split("(R+2)L + t0 = ")[1]
    assert goal.split()[1] in ("ms", "s")  # the goal counts the L = 0 time, measured


# ------------------------------------------------------------------ packed rounds


@pytest.mark.parametrize("kind", KINDS)
def test_a_round_opens_its_values_in_one_delivery_per_peer(kind, request):
    alice, bob, carol = _workers(kind, request)
    x, y = torch.randn(500), torch.randn(500)
    a = mpc.share(x, alice, bob, crypto_provider=carol)
    b = mpc.share(y, alice, bob, crypto_provider=carol)
    for w in (alice, bob, carol):
        if kind == "network":
            w.sync()

    def peer_messages(w) -> int:
        stats = w.stats() if callable(w.stats) else w.stats
        return stats.peer_messages_sent

    before = peer_messages(alice)
    z = a * b  # Beaver opens e and f together, packed (get() decodes the truncation away)
    assert torch.allclose(z.get(), x * y, atol=1e-3)
    if kind == "network":
        alice.sync()
    assert peer_messages(alice) - before == 1  # e and f: one delivery to bob


@pytest.mark.parametrize("kind", KINDS)
def test_unpack_refuses_shapes_that_do_not_fit(kind, request):
    # the step itself (a worker runs it only on the dealer's material: below)
    u, v = comparison.unpack(None, torch.arange(6), [[2], [2, 2]])
    assert torch.equal(u, torch.tensor([0, 1]))
    assert torch.equal(v, torch.tensor([[2, 3], [4, 5]]))
    for shapes, match in (([[2], [2]], "4 elements"), ([[-1]], "list of sizes"), ([], "non-empty")):
        with pytest.raises(ValueError, match=match):
            comparison.unpack(None, torch.arange(6), shapes)
    with pytest.raises(TypeError, match="one dtype"):
        opening.pack(None, [torch.arange(6), torch.ones(2)])
    # at a worker: a client's own tensors are not protocol material (issue 27)
    alice, _, _ = _workers(kind, request)
    flat = pt.send(torch.arange(6), alice)
    for name, args in (("mpc.unpack", [flat, [[2], [2, 2]]]), ("mpc.pack", [[flat]])):
        with pytest.raises(pt.PointerError, match="protocol material"):
            (bad,) = pt.call_function(alice, name, args, out=[((6,), torch.int64)])
            bad.get()


@pytest.mark.parametrize("kind", KINDS)
def test_open_unpack_sums_the_pieces_and_refuses_bad_ones(kind, request):
    one, two = torch.arange(6), torch.arange(6) * 10
    u, v = opening.open_unpack(None, [one, two], [[2], [2, 2]], False)
    assert torch.equal(u, torch.tensor([0, 11]))
    assert torch.equal(v, torch.tensor([[22, 33], [44, 55]]))
    (w,) = opening.open_unpack(None, [one, two], [[6]], True)
    assert torch.equal(w, torch.arange(6) ^ (torch.arange(6) * 10))
    assert torch.equal(one, torch.arange(6))  # the pieces are not modified
    short = torch.arange(4)
    for args, match in (
        ([[one], [[6]], False], "two or more"),
        ([[one, short], [[6]], False], "one shape"),
        ([[one, two], [[6]], 1], "bool"),
        ([[one, two], [[5]], False], "6 elements|5 elements"),
    ):
        with pytest.raises((ValueError, TypeError), match=match):
            opening.open_unpack(None, *args)
    # at a worker: an opening takes its own piece and its peers', never a client's values
    alice, _, _ = _workers(kind, request)
    p1, p2 = pt.send(one, alice), pt.send(two, alice)
    with pytest.raises(pt.PointerError, match="protocol material"):
        (bad,) = pt.call_function(
            alice, "mpc.open_unpack", [[p1, p2], [[6]], False], out=[((6,), torch.int64)]
        )
        bad.get()


# ------------------------------------------------------------ the dealer off round 1


def _refs(obj: object) -> list[int]:
    """Object ids referenced anywhere in a message argument."""
    found = ref_id(obj)  # (first: the wire form of a reference is a tuple too)
    if found is not None:
        return [found]
    if isinstance(obj, list | tuple):
        return [i for o in obj for i in _refs(o)]
    if isinstance(obj, dict):
        return [i for o in obj.values() for i in _refs(o)]
    return []


class CommandLog:
    """The commands each worker receives, in order, as they leave the client."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workers: list) -> None:
        self.sent: dict[str, list] = {w.id: [] for w in workers}
        for cls in {type(w) for w in workers}:
            original = cls._exchange

            def exchange(w, msg, *more, _orig=original):
                if w.id in self.sent:
                    self.sent[w.id].append(msg)
                return _orig(w, msg, *more)

            monkeypatch.setattr(cls, "_exchange", exchange)

    def before_first_send(self, party: str, dealer: str) -> list:
        """The commands the last party runs before its first delivery to a peer (round 1
        of the comparison), each with whether it needs something the dealer delivered
        (directly, or through an earlier command's output)."""
        from_dealer = {m.new_id for m in self.sent[dealer] if isinstance(m, SendToPeer)}
        out = []
        for m in self.sent[party]:
            if isinstance(m, SendToPeer):
                return out
            args = getattr(m, "args", [])
            needs = any(i in from_dealer for i in _refs(args))
            if needs:
                from_dealer.update(i for i in getattr(m, "out_ids", []) if i is not None)
            out.append((getattr(m, "name", getattr(m, "op", type(m).__name__)), needs))
        raise AssertionError(f"{party} never delivered to a peer")


def _now(t: Any) -> Any:
    """A ReLU's comparison runs at its first read (mpc/ops/relu_pool.py): read it now."""
    return t.materialize() if isinstance(t, mpc.SharedTensor) else t


def _images(a: Any, b: Any) -> tuple[Any, Any]:
    return a.reshape(1, 3, 10, 10) * b.reshape(1, 3, 10, 10), b


CMP_OPS = {  # (before the comparison, the comparison): shared -> shared, plain alike
    "lt": (lambda a, b: (a, b), lambda a, b: a < b),
    "relu": (lambda a, b: (a, b), lambda a, b: _now(torch.relu(a))),
    # the product's truncation is pending, so ReLU fuses it into its first round
    "relu of a product": (lambda a, b: (a * b, b), lambda p, b: _now(torch.relu(p))),
    "max over a dim": (lambda a, b: (a, b), lambda a, b: a.reshape(100, 3).max(dim=1).values),
    # a ReLU and the 2x2 max-pool after it in one run, the product's truncation fused too
    "max pool of a relu of a product": (
        _images,
        lambda p, b: torch.nn.functional.max_pool2d(torch.relu(p), 2),
    ),
}


@pytest.mark.parametrize("op", list(CMP_OPS))
@pytest.mark.parametrize("kind", KINDS)
def test_round_one_of_a_comparison_needs_nothing_from_the_dealer(kind, op, request, monkeypatch):
    """A worker runs its commands in order, so a command that waits for the dealer's
    delivery holds up everything after it: the comparison's first round (c = x + r, the
    products' e = v - a, a fused truncation's mask) must leave the last party before any
    command that needs the dealer (which reaches it one hop later, client -> dealer ->
    party). Also checks the result against plaintext."""
    alice, bob, carol = _workers(kind, request)
    x, y = torch.randn(300), torch.randn(300)
    before, compare = CMP_OPS[op]
    a, b = before(
        mpc.share(x, alice, bob, crypto_provider=carol),
        mpc.share(y, alice, bob, crypto_provider=carol),
    )
    log = CommandLog(monkeypatch, [alice, bob, carol])
    out = compare(a, b)
    first = log.before_first_send("bob", "carol")
    assert first, "the last party ran nothing before round 1"
    assert not [name for name, needs in first if needs], first
    expected = compare(*before(x, y))
    got = out.get()
    if op == "lt":
        assert torch.equal(got.to(torch.bool), expected)
    else:
        assert torch.allclose(got, expected, atol=2e-3)


@pytest.mark.parametrize("kind", KINDS)
def test_the_dealer_refuses_malformed_product_nonces(kind, request):
    """A client calling the dealer's comparison step itself gets a clear refusal for
    product nonces that are not a short list of ints, and nothing is dealt."""
    alice, bob, carol = _workers(kind, request)
    s = mpc.share(torch.randn(4), alice, bob, crypto_provider=carol)
    session = s.session
    levels = [session.next_nonce() for _ in range(carry_tree.LEVELS - 1)]
    for bad in ([1.5], list(range(17)), "12"):
        with pytest.raises(pt.PointerError, match="at most 16 values"):
            pt.call_function(
                carol,
                "mpc.dealer_compare",
                [session.dealer_seeds, session.next_nonce(), [4], levels, bad],
                out=[((64,), torch.int64)],
            )
            carol.sync() if kind == "network" else None
    assert torch.equal(
        (s < s.clone().get() + 1).get().to(torch.bool), torch.ones(4, dtype=torch.bool)
    )


def test_a_selection_of_too_many_values_is_refused_before_anything_moves():
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    s = mpc.share(torch.randn(4), alice, bob, crypto_provider=carol)
    from mpc.protocols.compare import select_by_msb

    before = {w.id: len(w.objects) for w in (alice, bob, carol)}
    with pytest.raises(ValueError, match="at most 16 values"):
        select_by_msb(s.session, s.shares, [s.shares] * 17)
    assert {w.id: len(w.objects) for w in (alice, bob, carol)} == before
