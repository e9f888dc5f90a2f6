"""A pipelined call waits for the calls before it however long they run (issue 23).

A client's calls overlap (``Connection.PIPELINE``): a call of commands leaves while the
calls before it are still running at the worker, which runs them in the order they left
(``ServedWorker.wait_turn``). The worker used to wait for its turn at most ``--deadline``
seconds, also for a call that had come and was still running, and then ran the later call
anyway: BERT-base at 128 tokens on network workers (W14), whose one-hot embedding products
run 10 to 40 s, had its next call's commands run before the product they used, and failed
with ``UnknownObjectError`` ("holds no object with id ...") at one worker. Only a call that
never came is now waited for at most the deadline; one that came is waited for until it
ends. Here a registered function that waits past the deadline, with the namespace's lock
set aside as a command waiting for a peer's delivery sets it aside (the product waited for
the crypto provider's share of C, which took as long to make), stands for the product.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_network_deliveries import _raw_exec as _raw

import pointers as pt
from pointers.network import ServerConfig, WorkerServer, create_certs
from pointers.network.connection import Connection
from pointers.network.transport import SYNC
from pointers.wire.messages import CallFunction, ExecuteOp, Fetch, decode_message
from pointers.wire.serde import Ref

pytestmark = pytest.mark.network

DEADLINE = 1.0  # the worker's --deadline (seconds)
SLOW = 2.5  # how long the slow call runs: past the deadline


def slow_ones(ctx, seconds: float, n: int) -> torch.Tensor:
    """A registered function that takes ``seconds``, the namespace's lock set aside
    meanwhile (as ``WaitingStore`` does while a command waits for a peer's delivery)."""
    depth = ctx.lock.suspend()
    try:
        time.sleep(seconds)
    finally:
        ctx.lock.resume(depth)
    return torch.ones(n)


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    create_certs(d, ["alice"], clients=["client"])
    return d


@pytest.fixture
def server(certs):
    config = ServerConfig(
        "alice", certs=str(certs), threads=8, deadline=DEADLINE, max_stored_bytes=None
    )
    s = WorkerServer(config, {"test.slow_ones": slow_ones})
    s.start()
    yield s
    s.stop(grace=None)


def test_a_pipelined_call_waits_for_a_running_call_past_the_deadline(certs, server):
    channel, send = _raw(certs, server)
    try:
        first = threading.Thread(
            target=send,
            args=(["conn", 1, 0], CallFunction("test.slow_ones", [SLOW, 3], {}, [7], False)),
        )
        start = time.monotonic()
        first.start()
        time.sleep(0.2)  # call 1 runs; call 2 left while it was in flight
        info, replies = send(
            ["conn", 2, 1], ExecuteOp("aten::add.Tensor", [Ref(7), Ref(7)], {}, [8], False)
        )
        took = time.monotonic() - start
        first.join(10)
        assert "error" not in info
        # (before: call 2 ran at the deadline, before call 1 made object 7, and failed
        # with "worker 'alice' holds no object with id 7")
        assert [decode_message(h, b) for _, h, b in replies] == []
        assert took >= SLOW - 0.1, took  # it ran after call 1
        _, replies = send(["conn", 3, 0], Fetch(8, False), flags=SYNC)
        assert torch.equal(
            decode_message(replies[0][1], replies[0][2]).value, torch.full((3,), 2.0)
        )
    finally:
        channel.close()


def test_a_call_that_never_came_is_waited_for_at_most_the_deadline_after_the_last(certs, server):
    """Call 2 never comes: call 3 waits for call 1 as long as it runs, then for call 2 at
    most the deadline, and runs."""
    channel, send = _raw(certs, server)
    try:
        first = threading.Thread(
            target=send,
            args=(["gap", 1, 0], CallFunction("test.slow_ones", [SLOW, 3], {}, [7], False)),
        )
        start = time.monotonic()
        first.start()
        time.sleep(0.2)
        info, replies = send(
            ["gap", 3, 1], ExecuteOp("aten::mul.Tensor", [Ref(7), 3], {}, [9], False)
        )
        took = time.monotonic() - start
        first.join(10)
        assert "error" not in info and [decode_message(h, b) for _, h, b in replies] == []
        assert SLOW + DEADLINE - 0.2 <= took < SLOW + DEADLINE + 5, took
        _, replies = send(["gap", 4, 0], Fetch(9, False), flags=SYNC)
        value = decode_message(replies[0][1], replies[0][2]).value
        assert torch.equal(value, torch.full((3,), 3.0))
        # call 2 is refused if it comes now: its place is gone
        info, _ = send(["gap", 2, 1], Fetch(9, False))
        assert "came after call" in info["error"][1]
    finally:
        channel.close()


def test_a_client_keeps_its_order_behind_a_call_longer_than_the_deadline(
    certs, server, monkeypatch
):
    """The same through ``pt.connect``: the client pipelines (as it does once it measures
    a network time of 2 ms or more per call, here always), and its commands after a long
    call run after it."""
    monkeypatch.setattr(Connection, "PIPELINE_MIN_TRANSIT", 0.0)
    alice = pt.connect("alice", server.address, certs=certs, identity="client")
    try:
        warm = pt.send(torch.zeros(3), alice)
        warm = warm * 2 + 1  # (the client's first op of a kind is slow: not in the test)
        alice.sync()
        (x,) = pt.call_function(alice, "test.slow_ones", [SLOW, 3], out=[((3,), torch.float32)])
        time.sleep(0.05)  # (past Connection.PIPELINE_AFTER: the next call leaves on its own)
        y = x * 2  # left while the slow call ran, so it waits for it at alice
        del warm, x  # and a delete of x rides behind them
        z = y + 1
        alice.sync()
        assert torch.equal(z.get(), torch.full((3,), 3.0))
        assert alice._conn.calls >= 3
    finally:
        alice.close()


def test_a_pipelined_calls_timeout_counts_from_the_end_of_the_calls_before_it(
    certs, server, monkeypatch
):
    """A call that waits for the calls before it at the worker gets its own ``timeout``
    after theirs: two calls of 2 s each under a 3 s timeout both succeed (the second
    one's gRPC deadline used to end 3 s after it left, while it still waited)."""
    monkeypatch.setattr(Connection, "PIPELINE_MIN_TRANSIT", 0.0)
    alice = pt.connect("alice", server.address, certs=certs, identity="client", timeout=3.0)
    try:
        pt.send(torch.zeros(1), alice)
        alice.sync()
        out = [((3,), torch.float32)]
        (x,) = pt.call_function(alice, "test.slow_ones", [2.0, 3], out=out)
        time.sleep(0.05)  # (past Connection.PIPELINE_AFTER: the next call leaves on its own)
        (y,) = pt.call_function(alice, "test.slow_ones", [2.0, 3], out=out)
        time.sleep(0.05)  # (the same: the sync below does not ride with it)
        alice.sync()
        assert alice._conn.calls >= 4
        assert torch.equal(x.get() + y.get(), torch.full((3,), 2.0))
    finally:
        alice.close()
