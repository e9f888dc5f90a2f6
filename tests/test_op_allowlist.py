"""The op allow-list (pointers/wire/ops.py) is the single source of truth for what a worker runs.

Every aten overload resolves exactly when it is listed; internals, sparse, quantized, file
or raw-memory ops and the empty family are refused with a NotAllowedError naming the op and
the rule (issue 10, point 3); the regressions of issue 12 (a sparse tensor built from
unchecked indices, uninitialised memory from ``empty``) stay closed on the message path.
"""

import gc

import pytest
import torch
from torch import nn

import pointers as pt
from pointers.errors import NotAllowedError
from pointers.wire import ops
from pointers.wire.messages import ErrorReply, ExecuteOp, Fetch, decode_message, encode_message
from pointers.wire.serde import Ref

BOTH = ["virtual", pytest.param("network", marks=pytest.mark.network)]


def _all_aten_overloads() -> set[str]:
    """Wire names of every aten overload: the dispatcher's ops and every packet's overloads."""
    names = set()
    bases = set(dir(torch.ops.aten))
    for full in torch._C._dispatch_get_all_op_names():
        if full.startswith("aten::"):
            base, _, overload = full[len("aten::") :].partition(".")
            names.add(f"aten::{base}.{overload or 'default'}")
            bases.add(base)
    for base in bases:
        packet = getattr(torch.ops.aten, base, None)
        if isinstance(packet, torch._ops.OpOverloadPacket):
            names.update(f"aten::{base}.{ov}" for ov in packet.overloads())
    return names


ALL_OVERLOADS = _all_aten_overloads()


def _base(name: str) -> str:
    return name[len("aten::") :].partition(".")[0]


def _entries() -> list[str]:
    return [e for group in ops.ALLOW_GROUPS.values() for e in group]


# -- the list resolves exactly ------------------------------------------------------------------


def test_exactly_the_listed_overloads_resolve():
    assert len(ALL_OVERLOADS) > 2000  # the walk saw the whole aten namespace
    assert ops.ALLOWED_OPS <= ALL_OVERLOADS
    resolved, refused = set(), set()
    for name in sorted(ALL_OVERLOADS):
        try:
            op = ops.resolve_op(name)
        except NotAllowedError as e:
            assert repr(name) in str(e)  # the message names the op ...
            assert "refused by the worker's allow-list" in str(e) or "unknown op" in str(e)
            refused.add(name)
        else:
            assert callable(op)
            target = op.op if isinstance(op, ops.ZeroFilled) else op
            assert ops.op_name(target) == name
            resolved.add(name)
    assert resolved == ops.ALLOWED_OPS
    assert refused == ALL_OVERLOADS - ops.ALLOWED_OPS
    assert len(refused) > 4 * len(resolved)


def test_every_entry_names_something_that_exists():
    """An entry that does not resolve to an overload is a typo or a torch upgrade to review."""
    for entry in _entries():
        base, _, overload = entry.partition(".")
        packet = getattr(torch.ops.aten, base, None)
        assert isinstance(packet, torch._ops.OpOverloadPacket), entry
        if overload:
            assert overload in packet.overloads(), entry
        else:
            assert any(_base(n) == base for n in ops.ALLOWED_OPS), entry
    assert len(_entries()) == len(set(_entries())), "an entry is listed twice"


def test_internals_are_allowed_only_with_a_documented_reason():
    listed = {e.partition(".")[0] for e in _entries() if e.startswith("_")}
    assert listed == set(ops.INTERNALS_ALLOWED)
    assert all(reason.strip() for reason in ops.INTERNALS_ALLOWED.values())
    for name in ops.ALLOWED_OPS:
        if _base(name).startswith("_"):
            assert _base(name) in ops.INTERNALS_ALLOWED, name


def test_no_sparse_quantized_raw_memory_or_uninitialised_op_is_allowed():
    empty_family = {
        "empty",
        "empty_like",
        "new_empty",
        "empty_strided",
        "new_empty_strided",
        "empty_permuted",
        "resize_",
        "resize_as_",
    }
    for name in ops.ALLOWED_OPS:
        base = _base(name)
        assert "sparse" not in name and base not in ("coalesce", "indices", "values"), name
        assert "quantiz" not in name and not base.startswith(("q_", "fake_quant")), name
        assert base not in ("from_file", "set_", "record_stream", "_local_scalar_dense"), name
        assert not base.startswith("as_strided"), name
        assert "cuda" not in base and "cudnn" not in base and "mkldnn" not in base, name
        if base in empty_family:
            assert name in ops.ZERO_FILLED, name
    assert ops.ZERO_FILLED <= ops.ALLOWED_OPS
    for name in ops.ZERO_FILLED:
        assert isinstance(ops.resolve_op(name), ops.ZeroFilled)


def test_out_variants_are_allowed_only_where_listed():
    explicit = {f"aten::{e}" for e in _entries() if "." in e}
    for name in ops.ALLOWED_OPS:
        op = ops.resolve_op(name)
        if ops.is_out_variant(op.op if isinstance(op, ops.ZeroFilled) else op):
            assert name in explicit, name


@pytest.mark.parametrize(
    "name, rule",
    [
        ("aten::_sparse_coo_tensor_unsafe.default", "sparse ops are refused"),
        ("aten::sparse_coo_tensor.indices", "sparse ops are refused"),
        ("aten::to_sparse.default", "sparse ops are refused"),
        ("aten::quantize_per_tensor.default", "quantized ops are refused"),
        ("aten::from_file.default", "files, devices or raw memory"),
        ("aten::set_.source_Tensor", "files, devices or raw memory"),
        ("aten::record_stream.default", "files, devices or raw memory"),
        ("aten::_local_scalar_dense.default", "files, devices or raw memory"),
        ("aten::as_strided.default", "files, devices or raw memory"),
        ("aten::empty_strided.default", "uninitialised memory"),
        ("aten::new_empty_strided.default", "uninitialised memory"),
        ("aten::empty.out", "uninitialised memory"),
        ("aten::resize_.default", "uninitialised memory"),
        ("aten::resize_as_.default", "uninitialised memory"),
        ("aten::_foreach_add.List", "underscore-prefixed aten internals"),
        ("aten::add.out", "out= variants are refused unless listed"),
        ("aten::nonzero.default", "not on the list"),
    ],
)
def test_refusals_name_the_op_and_the_rule(name, rule):
    with pytest.raises(NotAllowedError, match="refused by the worker's allow-list") as e:
        ops.resolve_op(name)
    assert repr(name) in str(e.value) and rule in str(e.value)


@pytest.mark.parametrize(
    "name, message",
    [
        ("aten::no_such_op.default", "unknown op"),
        ("aten::add.no_such_overload", "unknown op"),
        ("aten::__class__.default", "unknown op"),
        ("aten::add", "not an allowed aten op"),
        ("prims::add.default", "not an allowed aten op"),
        ("builtins::eval.default", "not an allowed aten op"),
    ],
)
def test_unknown_and_malformed_names(name, message):
    with pytest.raises(NotAllowedError, match=message):
        ops.resolve_op(name)


# -- issue 12 regressions, on the message path ----------------------------------------------


def _error_reply(worker, msg) -> ErrorReply:
    header, buffers = worker.handle_frames(*encode_message(msg))
    reply = decode_message(header, buffers)
    assert isinstance(reply, ErrorReply), reply
    return reply


def test_sparse_out_of_bounds_write_is_refused_in_the_handler():
    w = pt.VirtualWorker("w")
    dense = pt.send(torch.zeros(2), w)
    idx = pt.send(torch.tensor([[1 << 40]]), w)
    val = pt.send(torch.tensor([1.0]), w)
    sparse_id = w.new_id()
    make = ExecuteOp(
        "aten::_sparse_coo_tensor_unsafe.default",
        [Ref(idx.id_at_location), Ref(val.id_at_location), [2]],
        {},
        [sparse_id],
        False,
    )
    reply = _error_reply(w, make)
    assert reply.kind == "NotAllowedError" and "sparse ops are refused" in reply.message
    assert sparse_id not in w.objects
    add = ExecuteOp("aten::add.Tensor", [Ref(dense.id_at_location), Ref(sparse_id)], {}, [], False)
    assert _error_reply(w, add).kind == "UnknownObjectError"
    reply = _error_reply(
        w, ExecuteOp("aten::to_sparse.default", [Ref(idx.id_at_location)], {}, [w.new_id()], False)
    )
    assert reply.kind == "NotAllowedError"
    # the worker goes on working
    assert torch.equal((dense + 1).get(), torch.ones(2))


def test_refused_uninitialised_ops_get_an_error_reply_in_the_handler():
    w = pt.VirtualWorker("w")
    src = pt.send(torch.ones(4), w)
    for op, args in [
        ("aten::empty_strided.default", [[1 << 20], [1]]),
        ("aten::new_empty_strided.default", [Ref(src.id_at_location), [1 << 20], [1]]),
        ("aten::resize_.default", [Ref(src.id_at_location), [1 << 20]]),
        ("aten::empty.out", [[1 << 20]]),
    ]:
        out_id = w.new_id()
        reply = _error_reply(w, ExecuteOp(op, args, {}, [out_id], False))
        assert reply.kind == "NotAllowedError" and op in reply.message
        assert "uninitialised memory" in reply.message
        assert out_id not in w.objects
    assert torch.equal(src.get(), torch.ones(4))  # resize_ touched nothing


@pytest.mark.parametrize("worker_kind", BOTH)
def test_empty_family_returns_zeros_not_freed_memory(alice, worker_kind):
    """A client's freed tensor cannot be read back through empty / empty_like / new_empty.

    (Before the fix, an in-process worker handed back ~99% of the freed values at this size.)"""
    n = 1024
    ref = pt.send(torch.full((n,), 7.0), alice)
    for op, args in [
        ("aten::empty.memory_format", [[n]]),
        ("aten::empty_like.default", [Ref(ref.id_at_location)]),
        ("aten::new_empty.default", [Ref(ref.id_at_location), [n]]),
    ]:
        for _ in range(3):  # free private data of the size the next allocation asks for
            pt.send(torch.full((n,), 123.0), alice).get()
        out_id = alice.new_id()
        alice.request(ExecuteOp(op, args, {}, [out_id], False))
        value = alice.request(Fetch(out_id, True))
        assert value.shape == (n,) and not value.any(), op
    # through the public pointer API too
    assert not torch.empty_like(ref).get().any()
    assert not ref.new_empty((5, 3)).get().any()
    assert torch.equal(ref.get(), torch.full((n,), 7.0))


@pytest.mark.parametrize("worker_kind", BOTH)
def test_refused_ops_through_the_worker_api_leave_it_working(alice, worker_kind):
    x = pt.send(torch.tensor([1.0, -2.0]), alice)
    for op, args in [
        (
            "aten::_sparse_coo_tensor_unsafe.default",
            [Ref(x.id_at_location), Ref(x.id_at_location), [2]],
        ),
        ("aten::empty_strided.default", [[4], [1]]),
        ("aten::_local_scalar_dense.default", [Ref(x.id_at_location)]),
    ]:
        with pytest.raises((pt.RemoteError, NotAllowedError), match="NotAllowedError|refused"):
            alice.request(ExecuteOp(op, args, {}, [alice.new_id()], False))
    assert torch.equal(x.abs().get(), torch.tensor([1.0, 2.0]))


def test_a_plan_holding_a_refused_op_is_refused_and_one_holding_empty_runs_zero_filled(alice):
    def uses_empty(x):
        return torch.empty(3) + x

    plan = pt.func2plan(args_shape=[(3,)])(uses_empty)
    assert "aten::empty.memory_format" in plan.graph.op_names()
    assert torch.equal(plan.send(alice)(pt.send(torch.ones(3), alice)).get(), torch.ones(3))

    def uses_empty_strided(x):
        return torch.empty_strided((3,), (1,)) + x

    with pytest.raises(pt.PlanBuildError, match="aten::empty_strided.*uninitialised memory"):
        pt.func2plan(args_shape=[(3,)])(uses_empty_strided)


def test_remote_dropout_runs_on_a_zero_filled_empty_like(alice):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Dropout(0.5), nn.Linear(8, 1))
    pt.send(model, alice)
    x = pt.send(torch.randn(16, 4), alice)
    loss = model(x).pow(2).mean()
    loss.backward()
    pt.get(model)
    assert torch.isfinite(loss.get())
    assert all(p.grad is not None for p in model.parameters())
    del x, loss
    gc.collect()
