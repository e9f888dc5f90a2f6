"""Plans over shared values: one recorded program per party and dealer, one message each.

Runs on both worker kinds (conftest.py): in process, and network workers in their own
processes, where each party's program runs in a thread of its served namespace.
"""

import copy
import gc
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpc
import pointers as pt
from pointers.wire.messages import Delete


@pytest.fixture
def trio(make_worker):
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))


def _share(t, trio):
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


def _settled_sizes(workers):
    """Objects per worker once every command sent so far ran: a network worker's commands
    are pipelined, and may deliver to the others while the first ones are counted."""
    for w in workers:
        if isinstance(w, pt.NetworkWorker):
            w.sync()
    return [len(w.objects) for w in workers]


def test_relu_plan_matches_plaintext_and_reruns(trio):
    x = _share(torch.tensor([1.0, -2.0, 3.0]), trio)
    relu_plan = mpc.plan(F.relu, x)
    for values in ([-5.0, 6.0, 0.5], [1.0, -2.0, 3.0], [0.25, -0.25, -9.0]):
        y = _share(torch.tensor(values), trio)
        assert torch.allclose(relu_plan(y).get(), F.relu(torch.tensor(values)), atol=1e-4)


def test_one_message_per_worker_per_call_and_no_leak(trio):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(16, 3)
    ).eval()
    images = torch.rand(2, 1, 4, 4)
    with torch.no_grad():
        expected = model(images)
    alice, bob, carol = trio
    mpc.share(model, alice, bob, crypto_provider=carol)
    x = _share(images, trio)
    model_plan = mpc.plan(model, x)
    x2 = _share(images, trio)
    gc.collect()
    sizes = _settled_sizes(trio)
    with mpc.stats() as s:
        out = model_plan(x2)
        for w in trio:
            w.wait_programs(10)
    assert s.client_messages == 3  # one RunProgram per party and one for the dealer
    assert s.rounds == model_plan.rounds > 0
    got = out.get()
    assert torch.allclose(got, expected, atol=1e-3)
    del out
    gc.collect()
    assert _settled_sizes(trio) == sizes
    with mpc.stats() as op_by_op:
        ref = model(x2).get()
    assert op_by_op.client_messages > 50 * s.client_messages
    assert torch.allclose(got, ref, atol=1e-3)  # as op by op (other masks, same value)
    # op by op, the model's weights keep their masks (mpc.protocols.weights): a second
    # query leaves nothing more behind
    gc.collect()
    sizes = _settled_sizes(trio)
    assert torch.allclose(model(x2).get(), ref, atol=1e-3)
    gc.collect()
    assert _settled_sizes(trio) == sizes


def test_a_new_input_shape_records_once_then_runs_by_one_message_per_worker(trio):
    """As in PySyft, the example only serves to record: another batch size works, records
    its program set once, and its later calls cost one message per worker."""
    x = _share(torch.ones(3), trio)
    p = mpc.plan(lambda a: F.relu(a * a - 2.0), x)
    values = torch.tensor([[1.0, -2.0, 3.0, 0.5], [2.0, 0.0, -1.0, -3.0]])
    first = p(_share(values, trio)).get()  # (2, 4): recorded now, run op by op
    expected = F.relu(values * values - 2.0)
    assert torch.allclose(first, expected, atol=1e-3)
    assert len(p.signatures) == 2
    y = _share(values.flip(0), trio)
    gc.collect()
    _settled_sizes(trio)  # (earlier deletes travel before the count)
    with mpc.stats() as s:
        out = p(y)
        for w in trio:
            w.wait_programs(10)
    assert s.client_messages == 3
    assert torch.allclose(out.get(), expected.flip(0), atol=1e-3)
    assert len(p.signatures) == 2
    with pytest.raises(TypeError, match="takes 1 inputs"):
        p(x, x)


def test_a_shape_the_function_rejects_fails_with_its_own_error(trio):
    w = _share(torch.ones(3, 2), trio)

    def fn(a):
        return a @ w

    p = mpc.plan(fn, _share(torch.ones(4, 3), trio))
    bad = _share(torch.ones(4, 5), trio)
    with pytest.raises(RuntimeError) as eager:
        fn(bad)
    with pytest.raises(RuntimeError) as planned:
        p(bad)
    assert str(planned.value) == str(eager.value)
    assert "shape (4, 5) and a shared tensor of shape (3, 2)" in str(planned.value)
    assert isinstance(planned.value, mpc.ShapeError)
    ok = torch.ones(2, 3) * 0.5  # and the plan still works on a shape fn accepts
    assert torch.allclose(p(_share(ok, trio)).get(), torch.full((2, 2), 1.5), atol=1e-3)


def test_fetch_inside_a_plan_is_refused(trio):
    x = _share(torch.ones(2), trio)
    with pytest.raises(pt.PointerError, match="cannot be part of a program"):
        mpc.plan(lambda a: _share(a.get(), trio), x)


def test_a_failing_party_program_reports_instead_of_hanging(trio, worker_kind):
    x = _share(torch.tensor([1.0, -1.0]), trio)
    p = mpc.plan(F.relu, x)
    y = _share(torch.tensor([2.0, -2.0]), trio)
    party0 = y.shares[0].location
    party0.post(Delete([y.shares[0].id_at_location]))  # break party 0's input
    if worker_kind == "virtual":
        for w in trio:
            w.store.wait_seconds = 2.0
    # (a served party's failed program tells the peers it was to deliver to: no waiting)
    start = time.monotonic()
    out = p(y)
    with pytest.raises((pt.RemoteError, pt.PartyUnavailable), match="program failed|waited"):
        out.get()
    assert time.monotonic() - start < 8.0
    # the workers stay usable, and the plan runs again on good inputs
    z = _share(torch.tensor([3.0, -3.0]), trio)
    assert torch.allclose(p(z).get(), torch.tensor([3.0, 0.0]), atol=1e-4)


# --------------------------------------------------------------- material dealt ahead


def _received(w) -> int:
    """Messages ``w`` received so far (a network worker's after a sync)."""
    if isinstance(w, pt.NetworkWorker):
        w.sync()
    return w.stats.messages_received


def test_preprocessed_calls_leave_the_dealer_out_and_match_plaintext(trio):
    """plan.preprocess(k): the crypto provider deals k calls' material ahead; those calls
    send no message to it, and their results are those of plaintext torch."""
    alice, bob, carol = trio
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 2)).eval()
    plain = copy.deepcopy(model)
    mpc.share(model, alice, bob, crypto_provider=carol)
    x = _share(torch.randn(3, 5), trio)
    model_plan = mpc.plan(model, x)
    with mpc.stats() as offline:
        mpc.preprocess(model_plan, 2)
        carol.wait_programs(10)
    assert model_plan.prepared() == 2
    assert offline.client_messages >= 2  # one RunProgram to the dealer per prepared call
    for k in range(3):  # two prepared calls, then one that deals as it goes
        images = torch.randn(3, 5)
        y = _share(images, trio)
        before = _received(carol)
        with mpc.stats() as online:
            out = model_plan(y)
            for w in trio:
                w.wait_programs(10)
        # the prepared calls send the dealer nothing, and it sends nothing
        if k < 2:
            assert _received(carol) == before and online.dealer_bytes == 0
        else:
            assert _received(carol) > before and online.dealer_bytes > 0
        assert online.rounds == model_plan.rounds
        with torch.no_grad():
            assert torch.allclose(out.get(), plain(images), atol=1e-3)
    assert model_plan.prepared() == 0


def test_preprocess_for_another_signature_and_bad_arguments(trio):
    x = _share(torch.tensor([1.0, -2.0, 3.0]), trio)
    square_relu = mpc.plan(lambda t: F.relu(t * t - 1), x)
    with pytest.raises(ValueError, match="at least 0"):
        square_relu.preprocess(-1)
    wide = _share(torch.tensor([[0.5, -3.0], [2.0, 1.5]]), trio)
    with pytest.raises(mpc.MPCError, match="no program set was recorded"):
        square_relu.preprocess(1, wide)
    assert torch.allclose(square_relu(wide).get(), torch.tensor([[0.0, 8.0], [3.0, 1.25]]))
    square_relu.preprocess(1, wide)  # now recorded: dealt for that signature only
    assert square_relu.prepared(wide) == 1 and square_relu.prepared() == 0
    again = _share(torch.tensor([[1.0, 0.0], [-2.0, 0.5]]), trio)
    assert torch.allclose(square_relu(again).get(), torch.tensor([[0.0, 0.0], [3.0, 0.0]]))
    assert square_relu.prepared(wide) == 0


def test_a_plan_without_a_dealer_has_nothing_to_preprocess(make_worker):
    alice, bob = make_worker("alice"), make_worker("bob")
    x = mpc.share(torch.tensor([1.0, 2.0]), alice, bob)
    double = mpc.plan(lambda t: t + t, x)
    with pytest.raises(mpc.MPCError, match="no crypto provider"):
        double.preprocess(1)


def test_a_recording_that_runs_nothing_records_the_same_programs(trio):
    """``runs=False`` (how a held plan records on stand-in weights): the workers receive
    the stored program only, and it is the program a running recording records (but for
    where the deletes of temporaries fall, which no run depends on); a recorded command
    whose reply the caller waits for is refused there."""
    from mpc.plan import Programs
    from pointers.errors import PointerError
    from pointers.wire.messages import Tag
    from pointers.worker.program import Recording

    x = _share(torch.tensor([[1.0, -2.0], [0.5, 3.0]]), trio)

    def fn(t):
        return torch.relu(t @ t) * 2.0

    def commands(p):
        return {w: [c for c in cmds if c[0] != Delete.KIND] for w, cmds in p.programs.items()}

    ran = Programs(fn, list(trio), (x,))
    ran.output = None
    gc.collect()
    before = _settled_sizes(trio)
    dry = Programs(fn, list(trio), (x,), runs=False)
    dry.output = None
    gc.collect()
    assert _settled_sizes(trio) == [n + 1 for n in before]  # its stored program
    assert commands(dry) == commands(ran)
    assert dry.slots.kind == ran.slots.kind
    alice = trio[0]
    with Recording([alice], runs=False), pytest.raises(PointerError, match="reply"):
        alice.request(Tag(x.shares[0].id_at_location, ["t"], ""))
