"""pointers.concurrently: in-process workers running side by side, with serial semantics."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from pointers.worker import lanes as lane_module


def trio() -> list[pt.VirtualWorker]:
    ws = [pt.VirtualWorker(n) for n in ("alice", "bob", "carol")]
    for a in ws:
        for b in ws:
            if a is not b:
                a.introduce(b)
    return ws


# a program: steps over 3 workers holding one int64 vector each
step = st.one_of(
    st.tuples(st.just("mul"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(st.just("add"), st.integers(0, 2), st.integers(-3, 3)),
    st.tuples(st.just("copy_add"), st.integers(0, 2), st.integers(0, 2)),  # x[j] += copy of x[i]
    st.tuples(st.just("move_swap"), st.integers(0, 2), st.integers(0, 2)),  # x[i] moves to j
)


def run_program(ws: list[pt.VirtualWorker], steps: list[tuple[str, int, int]]) -> list[list[int]]:
    xs = [pt.send(torch.arange(8, dtype=torch.int64) * (k + 1), w) for k, w in enumerate(ws)]
    for kind, i, v in steps:
        if kind == "mul":
            xs[i].mul_(v)
        elif kind == "add":
            xs[i].add_(v)
        elif kind == "copy_add" and i != v:
            xs[v].add_(xs[i].copy_to(ws[v]))
        elif kind == "move_swap" and i != v:
            # the two values trade places: x[k] always lives at worker k
            xs[i], xs[v] = xs[v].move(ws[i]), xs[i].move(ws[v])
    return [x.get().tolist() for x in xs]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(step, max_size=25))
def test_concurrent_runs_give_the_serial_results(steps: list[tuple[str, int, int]]) -> None:
    serial = run_program(trio(), steps)
    ws = trio()
    with pt.concurrently(*ws):
        inside = run_program(ws, steps)  # get() inside the block waits for the lanes
    assert inside == serial


def test_mutual_deliveries_do_not_deadlock() -> None:
    a, b, _ = trio()
    x = pt.send(torch.ones(1 << 16, dtype=torch.int64), a)
    y = pt.send(torch.ones(1 << 16, dtype=torch.int64) * 2, b)
    with pt.concurrently(a, b):
        for _ in range(50):  # like opening shares: each sends to the other at once
            xc, yc = x.copy_to(b), y.copy_to(a)
            x.add_(yc)
            y.add_(xc)
    # closed form: (x, y) -> (x + y, y + x) each round
    xv, yv = 1, 2
    for _ in range(50):
        xv, yv = xv + yv, yv + xv
    assert int(x.get()[0]) == xv and int(y.get()[0]) == yv


def test_the_first_failure_is_raised_at_the_end_and_later_commands_are_skipped() -> None:
    a, b, _ = trio()

    def boom(ctx: object, t: torch.Tensor) -> torch.Tensor:
        raise ValueError("no luck today")

    a.functions.register_all({"test.boom": boom})
    x = pt.send(torch.ones(4), a)
    y = pt.send(torch.ones(4), b)
    start = time.monotonic()
    with pytest.raises(pt.RemoteError, match="no luck today") as info:
        with pt.concurrently(a, b):
            (w,) = pt.call_function(a, "test.boom", [x], out=[((4,), torch.float32)])
            z = w.copy_to(b)  # skipped: bob must not wait for it
            y.add_(z)
            y.mul_(100)
    assert time.monotonic() - start < 5
    assert "alice" in str(info.value)
    assert torch.equal(y.get(), torch.ones(4))  # bob ran nothing after the failure
    assert torch.equal((x + 1).get(), torch.full((4,), 2.0))  # both stay usable


def test_a_reply_inside_the_block_sees_everything_posted_before_it() -> None:
    a, b, _ = trio()
    x = pt.send(torch.zeros(3), a)
    with pt.concurrently(a, b):
        x.add_(1)
        c = x.copy_to(b)
        c.mul_(5)
        assert torch.equal(c.get(), torch.full((3,), 5.0))
        x.add_(1)
    assert torch.equal(x.get(), torch.full((3,), 2.0))


def test_the_caller_may_change_its_tensor_right_after_sending_it() -> None:
    a, _, _ = trio()
    t = torch.zeros(1000)
    with pt.concurrently(a):
        p = pt.send(t, a)
        t.add_(7)  # the worker keeps what was sent
    assert torch.equal(p.get(), torch.zeros(1000))


def test_blocks_nest_and_skip_other_workers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lane_module, "LANE_IDLE_SECONDS", 0.05)
    a, b, _ = trio()
    x = pt.send(torch.ones(2), a)
    with pt.concurrently(a, b) as outer:
        with pt.concurrently(a, "not a worker") as inner:
            x.add_(1)
        assert inner.workers == [] and [w.id for w in outer.workers] == ["alice", "bob"]
        assert a._block is outer
    assert a._block is None and b._block is None
    assert torch.equal(x.get(), torch.full((2,), 2.0))
    lanes = [a._lane, b._lane]
    assert all(lane.thread.is_alive() for lane in lanes)  # kept for the next block ...
    time.sleep(0.5)
    assert not any(lane.thread.is_alive() for lane in lanes)  # ... until idle too long


def test_idle_lanes_end_on_request_and_let_go_of_their_workers() -> None:
    import gc
    import weakref

    a, b, c = trio()
    x = pt.send(torch.ones(2), a)
    with pt.concurrently(a, b):
        x.add_(1)
    lanes = [a._lane, b._lane]
    with pt.concurrently(b) as busy:  # a lane a block holds is left running
        lane_module.release_idle_lanes()
        assert busy.lanes[id(b)].thread.is_alive()
        assert not lanes[0].thread.is_alive()
    lane_module.release_idle_lanes()
    assert not any(lane.thread.is_alive() for lane in lanes)
    with pt.concurrently(a):  # the next block starts a new lane
        x.add_(1)
    assert a._lane is not lanes[0] and torch.equal(x.get(), torch.full((2,), 3.0))
    lane_module.release_idle_lanes()
    refs = [weakref.ref(w) for w in (a, b, c)]
    del a, b, c, x, busy
    gc.collect()
    assert all(r() is None for r in refs)  # no lane thread holds the dropped workers


def test_a_large_secure_product_runs_concurrently_and_matches_the_serial_one() -> None:
    parties, dealer = trio()[:2], pt.VirtualWorker("dealer")
    x = torch.randn(1 << 16, dtype=torch.float64)
    y = torch.randn(1 << 16, dtype=torch.float64)
    seen: set[str] = set()
    original = pt.VirtualWorker.handle_frames

    def spy(self: pt.VirtualWorker, *args: object, **kwargs: object) -> object:
        seen.add(threading.current_thread().name)
        return original(self, *args, **kwargs)

    out = {}
    for mode, start in (("serial", None), ("concurrent", 1 << 15)):
        cfg = mpc.MPCConfig(concurrent_from=start)
        xs = mpc.share(x, *parties, crypto_provider=dealer, config=cfg)
        ys = mpc.share(y, *parties, crypto_provider=dealer, config=cfg)
        seen.clear()
        pt.VirtualWorker.handle_frames = spy  # type: ignore[method-assign]
        try:
            z = (xs * ys).materialize()
        finally:
            pt.VirtualWorker.handle_frames = original  # type: ignore[method-assign]
        out[mode] = (z.get(), set(seen))
    assert out["serial"][1] == {"MainThread"}
    assert {"pointers-lane-alice", "pointers-lane-bob", "pointers-lane-dealer"} <= out[
        "concurrent"
    ][1]
    for got, _ in out.values():
        assert torch.allclose(got, x * y, atol=2e-4)


def test_a_failing_secure_op_raises_once_and_the_parties_stay_usable() -> None:
    parties, dealer = trio()[:2], pt.VirtualWorker("dealer")
    cfg = mpc.MPCConfig(concurrent_from=0)  # every op through the lanes
    xs = mpc.share(torch.ones(64), *parties, crypto_provider=dealer, config=cfg)
    ys = mpc.share(torch.full((64,), 3.0), *parties, crypto_provider=dealer, config=cfg)
    # lose bob's share of x behind the client's back: his commands using it fail there
    bob = parties[1]
    del bob.store._entries[xs.shares[1].id_at_location]
    start = time.monotonic()
    with pytest.raises(pt.RemoteError, match="bob") as info:
        (xs * ys).materialize()
    assert "holds no object" in str(info.value)
    assert time.monotonic() - start < 5  # nobody waited for a delivery that never came
    assert all(w._block is None for w in [*parties, dealer])
    zs = mpc.share(torch.full((64,), 2.0), *parties, crypto_provider=dealer, config=cfg)
    assert torch.allclose((zs * ys).get(), torch.full((64,), 6.0), atol=1e-3)
