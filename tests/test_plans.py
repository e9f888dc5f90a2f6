"""Plans and Protocols: tracing, one message per call, state, serialisation, errors."""

import gc

import msgpack
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from byte_mutation import mutated
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pointers as pt
from pointers.plans.wire import plan_from_wire, plan_to_wire
from pointers.wire.messages import Fetch, RunPlan, StorePlan
from pointers.wire.serde import Ref

FAST = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _calls(worker: pt.VirtualWorker) -> int:
    return worker.stats.messages_received


@pt.func2plan()
def plan_double_abs(x):
    x = x + x
    return torch.abs(x)


@pt.func2plan(args_shape=[(1, 2), (-1, 2)])
def plan_sum_abs(x, y):
    return torch.abs(x + y)


@pt.func2plan(args_shape=[(-1, 4)])
def plan_reshape(x):
    # sizes flow into view/expand/new_zeros: traced as size arithmetic, not constants
    y = x.view(x.shape[0], 2, 2).sum(2)
    z = y.expand(3, *y.shape)
    return z.reshape(-1) + x.new_zeros(x.shape[0] * 6)


class Net(pt.Plan):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(2, 3)
        self.fc2 = nn.Linear(3, 2)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=0)


# -- the issue's scenario ------------------------------------------------------------------


def test_build_send_and_one_message_per_call(alice):
    plan = pt.func2plan()(lambda x: torch.abs(x + x))
    assert not plan.is_built
    with pytest.raises(pt.PlanNotBuiltError, match="not built yet"):
        plan.send(alice)
    with pytest.raises(pt.PlanNotBuiltError, match="cannot be run at a worker"):
        plan(pt.send(torch.ones(2), alice))
    assert torch.equal(plan(torch.tensor([1.0, -3.0])), torch.tensor([2.0, 6.0]))  # runs as fn
    assert plan.build(torch.tensor([1.0, -2.0])) is plan and plan.is_built
    ptr_plan = plan.send(alice)
    assert isinstance(ptr_plan, pt.PointerPlan) and ptr_plan.location is alice
    ptr = pt.send(torch.tensor([3.0, -4.0]), alice)
    before = _calls(alice)
    out = ptr_plan(ptr)
    assert _calls(alice) == before + 1  # one request message for the whole plan
    assert isinstance(out, pt.PointerTensor) and out.shape == (2,) and out.dtype == torch.float32
    assert torch.equal(out.get(), torch.tensor([6.0, 8.0]))
    for _ in range(3):  # every further call is one message too
        before = _calls(alice)
        ptr_plan(ptr)
        assert _calls(alice) == before + 1


def test_decorated_plan_runs_locally_and_remotely(alice):
    x = torch.tensor([1.0, -2.0])
    assert torch.equal(plan_double_abs(x), torch.tensor([2.0, 4.0]))
    plan_double_abs.build(x)
    assert plan_double_abs.graph.op_names() == ["aten::add.Tensor", "aten::abs.default"]
    assert torch.equal(plan_double_abs(x), torch.tensor([2.0, 4.0]))  # the traced ops
    # calling with a pointer sends the plan there once, then one message per call
    p = pt.send(x, alice)
    assert torch.equal(plan_double_abs(p).get(), torch.tensor([2.0, 4.0]))
    before = _calls(alice)
    plan_double_abs(p)
    assert _calls(alice) == before + 1


def test_args_shape_builds_at_decoration_with_dynamic_dims(alice):
    assert plan_sum_abs.is_built
    for n in (1, 2, 5):
        x, y = torch.randn(1, 2), torch.randn(n, 2)
        expected = torch.abs(x + y)
        assert torch.equal(plan_sum_abs(x, y), expected)
        out = plan_sum_abs.send(alice)(pt.send(x, alice), pt.send(y, alice))
        assert out.shape == (n, 2)
        assert torch.equal(out.get(), expected)
    # x was fixed to (1, 2) by args_shape: another shape is traced again, and fails only
    # where the function itself fails, with its own error
    x, y = torch.randn(2, 2), torch.randn(2, 2)
    assert torch.equal(plan_sum_abs(x, y), torch.abs(x + y))
    with pytest.raises(RuntimeError, match=r"size of tensor a \(2\) must match .* b \(3\)"):
        plan_sum_abs(torch.ones(2, 2), torch.ones(3, 2))


def test_dynamic_sizes_reach_view_expand_and_factories(alice):
    ops = plan_reshape.graph.op_names()
    assert "aten::sym_size.int" in ops and "sym::mul" in ops
    ptr_plan = plan_reshape.send(alice)
    for n in (1, 2, 7):
        x = torch.randn(n, 4)
        expected = plan_reshape._fn(x)
        assert torch.equal(plan_reshape(x), expected)
        out = ptr_plan(pt.send(x, alice))
        assert out.shape == (3 * n * 2,)
        assert torch.equal(out.get(), expected)


def test_static_plan_runs_other_shapes_and_dtypes_or_fails_as_the_function(alice):
    plan = pt.func2plan()(lambda x: x.view(2, 2) * 2).build(torch.ones(4))
    # another dtype: traced again, the same result as the function
    x64 = torch.arange(4, dtype=torch.float64)
    assert torch.equal(plan(x64), x64.view(2, 2) * 2) and plan(x64).dtype == torch.float64
    # a shape the function cannot take: the function's own error, not a PlanCallError
    with pytest.raises(RuntimeError, match=r"shape '\[2, 2\]' is invalid for input of size 6"):
        plan(torch.ones(6))
    ptr_plan = plan.send(alice)
    p = pt.send(torch.ones(6), alice)
    before = _calls(alice)
    with pytest.raises(RuntimeError, match=r"shape '\[2, 2\]' is invalid for input of size 6"):
        ptr_plan(p)
    assert _calls(alice) == before  # raised while tracing, before any message
    out = ptr_plan(pt.send(torch.arange(4), alice))  # int64
    assert torch.equal(out.get(), torch.arange(4).view(2, 2) * 2)


def test_plan_without_its_function_runs_only_its_traced_signatures(alice):
    plan = pt.func2plan(args_shape=[(4,)])(lambda x: x * 2)
    loaded = pt.Plan.from_bytes(plan.to_bytes())
    assert not loaded.can_trace and plan.can_trace
    assert torch.equal(loaded(torch.ones(4)), torch.ones(4) * 2)
    for bad in (torch.ones(6), torch.ones(4, dtype=torch.float64)):
        with pytest.raises(pt.PlanCallError, match="no Python function here.*loaded from bytes"):
            loaded(bad)
    ptr_plan = loaded.send(alice)
    p = pt.send(torch.ones(6), alice)
    before = _calls(alice)
    with pytest.raises(pt.PlanCallError, match=r"shape \(6,\).*traced for \(4,\).*no Python"):
        ptr_plan(p)
    assert _calls(alice) == before  # refused before any message
    assert torch.equal(ptr_plan(pt.send(torch.ones(4), alice)).get(), torch.ones(4) * 2)
    # a pointer plan made from a stored graph, without its plan, is the same
    obj_id = alice.new_id()
    alice.post(StorePlan(obj_id, plan_to_wire(plan.graph)))
    bare = pt.PointerPlan(alice, obj_id, plan.graph)
    before = _calls(alice)
    with pytest.raises(pt.PlanCallError, match="no Python function here"):
        bare(p)
    assert _calls(alice) == before


def test_wrong_number_of_arguments(alice):
    plan = plan_sum_abs
    with pytest.raises(pt.PlanCallError, match="takes 2 arguments, got 1"):
        plan(torch.ones(1, 2))
    with pytest.raises(pt.PlanCallError, match="takes 2 arguments, got 3"):
        plan.send(alice)(*[pt.send(torch.ones(1, 2), alice)] * 3)
    with pytest.raises(pt.PlanBuildError, match="cannot be built with 2 example arguments"):
        pt.func2plan()(lambda x: x).build(torch.ones(1), torch.ones(1))
    with pytest.raises(pt.PlanCallError, match="must be a tensor"):
        plan(torch.ones(1, 2), 3.0)


def test_state_is_read_in_order_and_sent_once(alice):
    bias = torch.tensor([1])

    @pt.func2plan(args_shape=[(1,)], state=(bias,))
    def plan_abs(x, state):
        (b,) = state.read()
        return x.abs() + b

    assert torch.equal(plan_abs(torch.tensor([-3.0])), torch.tensor([4.0]))
    assert [t.tolist() for t in plan_abs.state.read()] == [[1]]
    big = torch.arange(1000.0)
    plan = pt.func2plan(args_shape=[(1000,)], state=(big, torch.tensor(2.0)))(
        lambda x, state: x * state.read()[1] + state.read()[0]
    )
    ptr_plan = plan.send(alice)
    x = pt.send(torch.ones(1000), alice)
    before = alice.stats.bytes_received
    out = ptr_plan(x)
    assert alice.stats.bytes_received - before < 1000  # the state does not travel again
    assert torch.equal(out.get(), torch.ones(1000) * 2 + big)


def test_module_plan_same_plan_on_two_workers(alice, bob):
    net = Net()
    x = torch.tensor([1.0, 2.0])
    expected = nn.Module.__call__(net, x).detach()
    net.build(x)
    assert torch.allclose(net(x), expected)
    assert len(net.state) == 4  # fc1/fc2 weights and biases travel as the plan's state
    r1 = net.send(alice)(pt.send(x, alice)).get()
    r2 = net.send(bob)(pt.send(x, bob)).get()
    assert torch.allclose(r1, expected) and torch.allclose(r2, expected)
    # a sent plan is a snapshot; the local plan follows the module's current parameters
    sent = net.send(alice)
    with torch.no_grad():
        net.fc2.bias += 1.0
    assert torch.allclose(sent(pt.send(x, alice)).get(), expected)
    assert torch.allclose(net(x), nn.Module.__call__(net, x))


def test_module_plan_with_dynamic_batch_and_autograd(alice):
    class Mlp(pt.Plan):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 3)

        def forward(self, x):
            return F.relu(self.fc(x.flatten(1)))

    mlp = Mlp().build(torch.ones(2, 2, 2), dynamic_dims=[(0,)])
    x = torch.randn(5, 2, 2)
    out = mlp(x)
    out.sum().backward()  # a local call runs aten ops on the real parameters
    assert mlp.fc.weight.grad is not None
    assert torch.allclose(mlp.send(alice)(pt.send(x, alice)).get(), out.detach())


def test_tuple_outputs(alice):
    plan = pt.func2plan(args_shape=[(-1, 3)])(lambda x: (x.max(1).values, x.t(), x.sum()))
    x = torch.randn(4, 3)
    outs = plan.send(alice)(pt.send(x, alice))
    assert isinstance(outs, tuple) and len(outs) == 3
    assert [o.shape for o in outs] == [(4,), (3, 4), ()]
    assert torch.equal(outs[0].get(), x.max(1).values)
    assert torch.equal(outs[1].get(), x.t())
    assert torch.allclose(outs[2].get(), x.sum())


def test_pointers_on_two_workers_refused(alice, bob):
    ptr_plan = plan_sum_abs.send(alice)
    with pytest.raises(pt.LocationMismatchError, match="alice.*bob"):
        ptr_plan(pt.send(torch.ones(1, 2), alice), pt.send(torch.ones(2, 2), bob))


def test_dropping_a_pointer_plan_deletes_it(alice):
    ptr_plan = plan_sum_abs.send(alice)
    obj_id = ptr_plan.id_at_location
    assert obj_id in alice.objects
    del ptr_plan
    gc.collect()
    assert obj_id not in alice.objects


# -- what tracing captures -------------------------------------------------------------------


def test_python_side_effects_happen_at_trace_time_only():
    calls = []

    def f(x):
        calls.append(1)
        return x * 2

    plan = pt.func2plan(args_shape=[(2,)])(f)
    assert calls == [1]
    plan(torch.ones(2))
    plan(torch.ones(2))
    assert calls == [1]


def test_data_dependent_control_flow_is_refused_at_build():
    def f(x):
        if x.sum() > 0:
            return x
        return -x

    with pytest.raises(pt.PlanBuildError, match=r"reads a tensor's value.*torch.where"):
        pt.func2plan(args_shape=[(2,)])(f)
    with pytest.raises(pt.PlanBuildError, match="reads a tensor's value"):
        pt.func2plan(args_shape=[(-1,)])(f)
    plan = pt.func2plan(args_shape=[(2,)])(lambda x: torch.where(x.sum() > 0, x, -x))
    assert torch.equal(plan(torch.tensor([-1.0, -2.0])), torch.tensor([1.0, 2.0]))


def test_branch_on_a_dynamic_size_is_checked(alice):
    def f(x):
        return x * 2 if x.shape[0] > 3 else x

    plan = pt.func2plan(args_shape=[(-1,)])(f)  # traced at size 4: the `> 3` branch
    assert plan.graph.has_checks
    assert torch.equal(plan(torch.ones(5)), torch.ones(5) * 2)
    # the other branch: the plan has its function, so it is traced again for that size
    assert torch.equal(plan(torch.ones(2)), torch.ones(2))
    ptr_plan = plan.send(alice)
    assert torch.equal(ptr_plan(pt.send(torch.ones(2), alice)).get(), torch.ones(2))
    assert torch.equal(ptr_plan(pt.send(torch.ones(6), alice)).get(), torch.ones(6) * 2)
    # without its function, a call that breaks the check is refused before any message
    loaded = pt.Plan.from_bytes(plan.to_bytes())
    with pytest.raises(pt.PlanCallError, match=r"x.shape\[0\] > 3"):
        loaded(torch.ones(2))
    ptr_loaded = loaded.send(alice)
    p = pt.send(torch.ones(2), alice)
    before = _calls(alice)
    with pytest.raises(pt.PlanCallError, match="traced again for such sizes"):
        ptr_loaded(p)
    assert _calls(alice) == before


def test_op_outside_the_allow_list_is_refused_at_build():
    lib = torch.library.Library("plantest", "FRAGMENT")  # noqa: TOR901 - a test op
    lib.define("twice(Tensor x) -> Tensor")
    lib.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
    with pytest.raises(pt.PlanBuildError, match="plantest::twice.*not an allowed aten op"):
        pt.func2plan(args_shape=[(2,)])(lambda x: torch.ops.plantest.twice(x))

    def uses_set(x):
        y = torch.empty(0)
        y.set_(x)
        return y + 1

    with pytest.raises(pt.PlanBuildError, match="aten::set_.*refused"):
        pt.func2plan(args_shape=[(2,)])(uses_set)


def test_non_tensor_output_is_refused():
    with pytest.raises(pt.PlanBuildError, match="returns a value of type int"):
        pt.func2plan(args_shape=[(2,)])(lambda x: x.shape[0])


# -- serialisation -----------------------------------------------------------------------------


def test_bytes_round_trip_without_pickle(alice):
    net = Net().build(torch.tensor([1.0, 2.0]))
    data = net.to_bytes()
    assert b"pickle" not in data and not data.startswith(b"\x80")  # not a pickle stream
    loaded = pt.Plan.from_bytes(data)
    x = torch.tensor([0.5, -1.0])
    assert loaded.is_built and torch.allclose(loaded(x), net(x))
    assert torch.allclose(loaded.send(alice)(pt.send(x, alice)).get(), net(x).detach())
    with pytest.raises(pt.PlanBuildError, match="loaded from bytes"):
        loaded.build(x)
    assert pt.Plan.from_bytes(plan_reshape.to_bytes())(torch.ones(3, 4)).shape == (18,)


def _wire(plan):
    return plan_to_wire(plan.graph)


def _repack(wire):
    from pointers.wire import serde

    header, buffers = serde.encode(wire)
    raw = [b.reshape(-1).view(torch.uint8).numpy().tobytes() for b in buffers]
    return msgpack.packb(["pointers.plans.plan.bytes", header, raw], use_bin_type=True)


@pytest.mark.parametrize(
    "op, message",
    [
        ("builtins::eval", "unknown op 'builtins::eval'"),
        ("aten::from_file.default", "refused by the worker's allow-list"),
        ("aten::no_such_op.default", "unknown op"),
        ("os.system", "unknown op"),
    ],
)
def test_malicious_ops_are_rejected(alice, op, message):
    wire = _wire(plan_sum_abs)
    wire[6][0][0] = op
    with pytest.raises(pt.PlanDecodeError, match=message):
        plan_from_wire(wire)
    with pytest.raises(pt.PlanDecodeError, match=message):
        pt.Plan.from_bytes(_repack(wire))
    with pytest.raises(pt.RemoteError, match="PlanDecodeError"):  # the worker refuses it too
        alice.request(StorePlan(alice.new_id(), wire))


def test_forward_reference_is_rejected():
    wire = _wire(plan_double_abs.build(torch.ones(2)))
    wire[6][0][1][0] = Ref(5)  # the first node uses a value that does not exist yet
    with pytest.raises(pt.PlanDecodeError, match="refers to value 5, which does not exist yet"):
        plan_from_wire(wire)
    wire = _wire(plan_double_abs)
    wire[7] = [Ref(99)]
    with pytest.raises(pt.PlanDecodeError, match="does not exist yet"):
        plan_from_wire(wire)


@pytest.mark.parametrize(
    "field, value, message",
    [
        (0, "other", "not a plan"),
        (1, 99, "unsupported plan format version"),
        (3, [[[1, 2], "float128"]], "input spec 0"),
        (4, 5, "state count"),
        (5, ["not a tensor"], "tensor table"),
        (6, [["aten::add.Tensor", [torch.ones(2)], {}]], "tensors belong in the plan's tensor"),
        (6, [["aten::add.Tensor", [[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]], {}]], "too deeply"),
        (6, [["aten::add.Tensor", [], {1: 2}]], "keyword names"),
        (7, [], "at least one output"),
        (8, "yes", "output form"),
    ],
)
def test_malformed_wire_fields(field, value, message):
    wire = _wire(plan_sum_abs)
    wire[field] = value
    with pytest.raises(pt.PlanDecodeError, match=message):
        plan_from_wire(wire)


def test_random_bytes_are_rejected():
    with pytest.raises(pt.PlanDecodeError, match="not a serialised plan"):
        pt.Plan.from_bytes(b"\x00\x01garbage")
    with pytest.raises(pt.PlanDecodeError):
        pt.Plan.from_bytes(msgpack.packb(["pointers.plans.plan.bytes", b"\xc1", []]))
    with pytest.raises(pt.PlanDecodeError, match="from bytes"):
        pt.Plan.from_bytes("a string")  # type: ignore[arg-type]


@FAST
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data):
    try:
        pt.Plan.from_bytes(data)
    except pt.PlanDecodeError:
        pass


_VALID = plan_reshape.to_bytes()


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_fuzz_mutated_plans(data):
    raw = mutated(data, _VALID)
    try:
        plan = pt.Plan.from_bytes(raw)
    except pt.PlanDecodeError:
        return
    try:  # a mutated plan that still decodes may fail when it runs, but only cleanly
        plan(torch.ones(2, 4))
    except pt.PlanError:
        pass


def test_worker_checks_calls_itself(alice):
    p = pt.send(torch.ones(2), alice)
    with pytest.raises(pt.RemoteError, match="is not a plan"):
        alice.request(RunPlan(p.id_at_location, [], [alice.new_id()], False))
    ptr_plan = plan_sum_abs.send(alice)  # a client that skips the local checks
    with pytest.raises(pt.RemoteError, match="PlanCallError.*takes 2 arguments, got 1"):
        alice.request(
            RunPlan(ptr_plan.id_at_location, [Ref(p.id_at_location)], [alice.new_id()], False)
        )
    with pytest.raises(pt.RemoteError, match=r"PlanCallError.*has shape \(2,\)"):
        alice.request(RunPlan(ptr_plan.id_at_location, [Ref(p.id_at_location)] * 2, [1, 2], False))


# -- registered functions inside a plan (the extension point higher layers use) ------------------


def test_registered_function_node_runs_at_the_worker(alice):
    alice.functions.register("twice", lambda ctx, x: x * 2)
    wire = _wire(plan_double_abs.build(torch.ones(2)))
    wire[6] = [["fn::twice", [Ref(0)], {}], ["aten::neg.default", [Ref(1)], {}]]
    wire[7] = [Ref(2)]
    graph = plan_from_wire(wire)
    with pytest.raises(pt.PlanRunError, match="registered function 'twice'"):
        graph.run([torch.ones(2)])  # locally there is no registry
    obj_id = alice.new_id()
    alice.post(StorePlan(obj_id, wire))
    ptr_plan = pt.PointerPlan(alice, obj_id, graph)
    p = pt.send(torch.tensor([1.0, 2.0]), alice)
    before = _calls(alice)
    out = ptr_plan(p)  # shapes cannot be inferred locally: the reply describes them
    assert _calls(alice) == before + 1
    assert out.shape == (2,) and torch.equal(out.get(), torch.tensor([-2.0, -4.0]))
    wire[6][0][0] = "fn::not_registered"
    with pytest.raises(pt.RemoteError, match="no function 'not_registered' is registered"):
        alice.request(StorePlan(alice.new_id(), wire))


# -- property: plan(x) == fn(x) == sent_plan(ptr).get() ----------------------------------------------

_FUNCTIONS = {
    "double_abs": lambda x: torch.abs(x + x),
    "softmax_mix": lambda x: F.softmax(x, dim=0) * x - x.mean(),
    "reshape": lambda x: x.view(-1, 1).expand(-1, 2).t().reshape(-1) * 3,
    "relu_cumsum": lambda x: F.relu(x).cumsum(0) + torch.ones_like(x),
    "clamp_pow": lambda x: x.clamp(-1.0, 1.0) ** 2 + x.new_zeros(x.shape[0]),
}
_PLANS = {name: pt.func2plan(args_shape=[(-1,)])(fn) for name, fn in _FUNCTIONS.items()}
_ALICE = pt.VirtualWorker("alice-prop")
_SENT = {name: plan.send(_ALICE) for name, plan in _PLANS.items()}


@FAST
@given(
    name=st.sampled_from(sorted(_FUNCTIONS)),
    values=st.lists(
        st.floats(-100, 100, allow_nan=False, allow_infinity=False, width=32),
        min_size=1,
        max_size=8,
    ),
)
def test_property_plan_matches_function(name, values):
    x = torch.tensor(values, dtype=torch.float32)
    expected = _FUNCTIONS[name](x)
    assert torch.equal(_PLANS[name](x), expected)
    assert torch.equal(_SENT[name](pt.send(x, _ALICE)).get(), expected)


# -- other shapes and dtypes: traced again per signature, as PySyft's plans accept them ----------


def test_issue_scenario_plan_abs_runs_on_another_shape_and_dtype(alice):
    device_1 = alice

    @pt.func2plan(args_shape=[(1,)], state=(torch.tensor([1]),))
    def plan_abs(x, state):
        (bias,) = state.read()
        return x.abs() + bias

    pointer_plan = plan_abs.send(device_1)
    result = pointer_plan(pt.send(torch.tensor([-1, 0]), device_1)).get()
    assert torch.equal(result, torch.tensor([2, 1]))  # (2,) int64, built for (1,) float32


def test_new_signature_costs_one_message_and_is_sent_once(alice):
    big = torch.randn(64, 64)  # 16 KiB of state: must not travel with a new signature
    plan = pt.func2plan(args_shape=[(1, 64)], state=(big,))(lambda x, state: x @ state.read()[0])
    ptr_plan = plan.send(alice)
    x = pt.send(torch.randn(5, 64), alice)
    xv = x.copy().get()
    keep = []  # outputs stay alive, so that no delete travels with a counted call
    before, bytes_before = _calls(alice), alice.stats.bytes_received
    keep.append(ptr_plan(x))  # a new signature: the graph travels with the call
    assert _calls(alice) == before + 1
    first_bytes = alice.stats.bytes_received - bytes_before
    assert first_bytes < big.numel() * 4  # the variant shares the stored state
    assert len(ptr_plan.variants) == 1 and len(plan.variants) == 1
    for _ in range(3):  # the same signature again: one plain RunPlan, no graph
        before, bytes_before = _calls(alice), alice.stats.bytes_received
        keep.append(ptr_plan(x))
        assert _calls(alice) == before + 1
        assert alice.stats.bytes_received - bytes_before < first_bytes / 2
    assert len(ptr_plan.variants) == 1 and len(plan.variants) == 1
    assert all(torch.allclose(k.get(), xv @ big) for k in keep)
    # the built signature still runs the built graph
    one = pt.send(torch.ones(1, 64), alice)
    before = _calls(alice)
    assert torch.allclose(ptr_plan(one).get(), torch.ones(1, 64) @ big)
    assert _calls(alice) == before + 2 and len(ptr_plan.variants) == 1  # the call, the get
    # a local call with that signature uses the variant the plan already traced
    assert torch.allclose(plan(torch.ones(5, 64)), torch.ones(5, 64) @ big)
    assert len(plan.variants) == 1


def test_dropping_a_pointer_plan_deletes_its_variants(alice):
    plan = pt.func2plan(args_shape=[(1,)])(lambda x: x + 1)
    ptr_plan = plan.send(alice)
    assert torch.equal(ptr_plan(pt.send(torch.ones(3), alice)).get(), torch.ones(3) * 2)
    ids = [ptr_plan.id_at_location, next(iter(ptr_plan._variants.values()))[0].obj_id]
    assert all(i in alice.objects for i in ids)
    del ptr_plan
    gc.collect()
    assert not any(i in alice.objects for i in ids)


def test_module_plan_runs_other_batch_sizes_without_resending_weights(alice):
    class Mlp(pt.Plan):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(128, 64)

        def forward(self, x):
            return F.relu(self.fc(x))

    mlp = Mlp().build(torch.ones(1, 128))
    ptr_plan = mlp.send(alice)
    weights = sum(p.numel() * 4 for p in mlp.parameters())
    for n in (3, 7, 3):
        x = torch.randn(n, 128)
        before = alice.stats.bytes_received
        out = ptr_plan(pt.send(x, alice))
        assert alice.stats.bytes_received - before < weights / 4
        assert torch.allclose(out.get(), nn.Module.__call__(mlp, x).detach())
    assert len(ptr_plan.variants) == 2  # batch 3 and 7, each traced and sent once


def test_strides_are_part_of_the_signature(alice):
    # traced on a contiguous input, `reshape` is a view; a transposed input needs a copy
    plan = pt.func2plan(args_shape=[(3, 2)])(lambda x: x.reshape(-1) * 2)
    x = torch.arange(6.0).view(2, 3).t()
    assert torch.equal(plan(x), x.reshape(-1) * 2)
    p = pt.send(torch.arange(6.0).view(2, 3), alice).t()  # a transposed pointer
    assert tuple(p.stride()) == (1, 3)
    assert torch.equal(plan.send(alice)(p).get(), x.reshape(-1) * 2)


def test_function_error_on_a_new_shape_is_the_functions_own(alice):
    plan = pt.func2plan(args_shape=[(2,)])(lambda x: x + torch.ones(2))
    with pytest.raises(RuntimeError) as eager:
        torch.ones(3) + torch.ones(2)
    with pytest.raises(RuntimeError) as local:
        plan(torch.ones(3))
    assert type(local.value) is type(eager.value) and str(local.value) == str(eager.value)
    ptr_plan = plan.send(alice)
    p = pt.send(torch.ones(3), alice)
    before = _calls(alice)
    with pytest.raises(RuntimeError) as remote:
        ptr_plan(p)
    assert type(remote.value) is type(eager.value) and str(remote.value) == str(eager.value)
    assert not isinstance(remote.value, pt.PlanError)
    assert _calls(alice) == before  # no message for a call that cannot run
    softmax = pt.func2plan(args_shape=[(2,)])(lambda x: F.softmax(x, dim=0))
    with pytest.raises(RuntimeError) as eager:
        F.softmax(torch.ones(2, dtype=torch.int64), dim=0)
    with pytest.raises(RuntimeError) as remote:
        softmax.send(alice)(pt.send(torch.ones(2, dtype=torch.int64), alice))
    assert str(remote.value) == str(eager.value)  # a dtype the function does not take


def test_wrong_argument_count_is_still_a_plan_call_error(alice):
    plan = pt.func2plan(args_shape=[(1,)])(lambda x: x)
    with pytest.raises(pt.PlanCallError, match="takes 1 argument, got 2"):
        plan.send(alice)(pt.send(torch.ones(3), alice), pt.send(torch.ones(3), alice))


def test_worker_refuses_a_malformed_variant(alice):
    from pointers.plans.wire import variant_to_wire
    from pointers.wire.messages import StoreRunPlan

    plan = pt.func2plan(args_shape=[(1,)], state=(torch.ones(1),))(
        lambda x, state: x + state.read()[0]
    )
    ptr_plan = plan.send(alice)
    p = pt.send(torch.ones(3), alice)
    good = variant_to_wire(plan._variant_for([torch.ones(3)]))
    assert good[5] == []  # the state does not travel with a variant
    cases = [
        (["pointers.plans.plan", *good[1:]], "not a plan variant"),
        ([*good[:4], 0, *good[5:]], "must use its 1 state tensors"),
        ([*good[:6], [["builtins::eval", [], {}]], *good[7:]], "unknown op"),
    ]
    plan_id, arg = ptr_plan.id_at_location, [Ref(p.id_at_location)]
    for wire, message in cases:
        with pytest.raises(pt.RemoteError, match=message):
            alice.request(StoreRunPlan(plan_id, alice.new_id(), wire, arg, [alice.new_id()], False))
    with pytest.raises(pt.RemoteError, match="is not a plan"):
        alice.request(StoreRunPlan(p.id_at_location, alice.new_id(), good, arg, [1], False))
    out_id = alice.new_id()  # the well-formed variant runs, with the plan's stored state
    alice.request(StoreRunPlan(plan_id, alice.new_id(), good, arg, [out_id], False))
    assert torch.equal(alice.request(Fetch(out_id, True)), torch.ones(3) * 2)


# -- property: a plan traced on one signature, called on others, matches the function --------------

_ANY_SHAPE = {
    "abs_plus": lambda x: x.abs() + 1,
    "sum_last": lambda x: (x * 2).sum(-1),
    "flat_cumsum": lambda x: x.flatten().cumsum(0),
    "where": lambda x: torch.where(x > 0, x, -x) * 3,
    "outer": lambda x: x.reshape(-1, 1) * x.reshape(1, -1),
    "softmax": lambda x: F.softmax(x, dim=-1),  # floats only: ints fail as eagerly
    "mean_keep": lambda x: x - x.mean(0, keepdim=True),  # floats only too
}
_ANY_PLANS = {k: pt.func2plan(args_shape=[(2, 3)])(fn) for k, fn in _ANY_SHAPE.items()}
_DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32]


def _eager(fn, x):
    try:
        return fn(x), None
    except Exception as e:  # the function's own failure on this input
        return None, e


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    name=st.sampled_from(sorted(_ANY_SHAPE)),
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    dtype=st.sampled_from(_DTYPES),
    transpose=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_property_any_signature_matches_the_function(alice, name, shape, dtype, transpose, seed):
    fn, plan = _ANY_SHAPE[name], _ANY_PLANS[name]  # the plan was traced on (2, 3) float32
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 10).to(dtype)
    p = pt.send(x, alice)
    if transpose and x.dim() >= 2:  # strides are part of the signature too
        x, p = x.transpose(0, -1), p.transpose(0, -1)
    expected, error = _eager(fn, x)
    if error is not None:  # the plan fails where the function fails, with its error
        for call in (lambda: plan(x), lambda: plan(p)):
            with pytest.raises(type(error)) as got:
                call()
            assert str(got.value) == str(error)
        return
    local = plan(x)
    remote = plan(p)  # sent to alice on first use, then one message per call
    assert remote.shape == expected.shape and remote.dtype == expected.dtype
    for out in (local, remote.get()):
        assert out.dtype == expected.dtype and out.shape == expected.shape
        assert torch.equal(out, expected)


# -- protocols -------------------------------------------------------------------------------------


def _inc_mul():
    inc = pt.func2plan(args_shape=[(-1,)])(lambda x: x + 1)
    mul = pt.func2plan(args_shape=[(-1,)])(lambda x: x * 2)
    return inc, mul


def test_protocol_chains_plans_party_to_party(alice, bob):
    inc_plan, mul_plan = _inc_mul()
    protocol = pt.Protocol([("worker1", inc_plan), ("worker2", mul_plan)])
    assert protocol.roles == ["worker1", "worker2"] and not protocol.is_deployed
    with pytest.raises(pt.ProtocolError, match="deploy the protocol"):
        protocol.run(torch.ones(1))
    assert protocol.deploy(alice, bob) is protocol
    assert protocol.workers == {"worker1": alice, "worker2": bob}
    a0, b0 = _calls(alice), _calls(bob)
    out = protocol.run(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert out.location is bob
    assert _calls(alice) - a0 == 2  # the plan call, and the move of its output to bob
    assert _calls(bob) - b0 == 2  # the delivery from alice, and the plan call
    assert alice.stats.peer_messages_sent == 1  # alice sent her output to bob directly
    assert torch.equal(out.get(), torch.tensor([4.0, 6.0, 8.0, 10.0]))
    p = pt.send(torch.tensor([0.0]), bob)  # a pointer elsewhere is copied to the first role
    assert torch.equal(protocol.run(p).get(), torch.tensor([2.0]))
    assert torch.equal(p.get(), torch.tensor([0.0]))


def test_issue_scenario_protocol_of_plans_built_for_one_element(alice, bob):
    inc_plan = pt.func2plan(args_shape=[(1,)])(lambda x: x + 1)
    mul_plan = pt.func2plan(args_shape=[(1,)])(lambda x: x * 2)
    protocol = pt.Protocol([("worker1", inc_plan), ("worker2", mul_plan)])  # both built for (1,)
    protocol.deploy(alice, bob)
    for _ in range(2):  # a new signature, then the same again: one message per role each
        a0, b0 = _calls(alice), _calls(bob)
        out = protocol.run(torch.tensor([1.0, 2.0, 3.0, 4.0]))
        assert _calls(alice) - a0 == 2  # the plan call, and the move of its output to bob
        assert _calls(bob) - b0 == 2  # the delivery from alice, and the plan call
        assert torch.equal(out.get(), torch.tensor([4.0, 6.0, 8.0, 10.0]))
    assert torch.equal(protocol.run(torch.tensor([5])).get(), torch.tensor([12]))  # int64
    with pytest.raises(RuntimeError, match="size of tensor a"):  # the function's own error
        pt.Protocol([("a", pt.func2plan(args_shape=[(1,)])(lambda x: x + torch.ones(2)))]).deploy(
            alice
        ).run(torch.ones(3))


def test_protocol_deploy_errors(alice, bob):
    inc_plan, mul_plan = _inc_mul()
    protocol = pt.Protocol([("worker1", inc_plan), ("worker2", mul_plan)])
    with pytest.raises(pt.ProtocolError, match=r"2 roles \(worker1, worker2\) but 1 worker was"):
        protocol.deploy(alice)
    with pytest.raises(pt.ProtocolError, match="but 3 workers were given"):
        protocol.deploy(alice, bob, pt.VirtualWorker("carol"))
    unbuilt = pt.Protocol([("a", pt.func2plan()(lambda x: x))])
    with pytest.raises(pt.PlanNotBuiltError, match="role 'a'"):
        unbuilt.deploy(alice)
    two_out = pt.func2plan(args_shape=[(2,)])(lambda x: (x, x))
    with pytest.raises(pt.ProtocolError, match="returns 2 tensors but role 'b' takes 1"):
        pt.Protocol([("a", two_out), ("b", inc_plan)]).deploy(alice, bob)
    with pytest.raises(pt.ProtocolError, match="unique"):
        pt.Protocol([("a", inc_plan), ("a", mul_plan)])
    with pytest.raises(pt.ProtocolError, match="pair"):
        pt.Protocol([("a", lambda x: x)])
