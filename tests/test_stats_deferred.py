"""What ``mpc.stats`` and the demo's table report is the work done: a ReLU that runs at its
first read (deferred) is counted in the block that called it, read or not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import mpc
import pointers as pt
from mpc.examples.demo import quick_benchmarks


@pytest.fixture()
def trio():
    return tuple(pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))


def _share(t, trio):
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


def _forced(op, inputs, trio):
    """rounds and bytes of ``op`` with its result read inside the block."""
    shared = [_share(t, trio) for t in inputs]
    op(*shared)  # (the demo warms up the same way)
    with mpc.stats() as s:
        out = op(*shared)
        out.materialize()  # the deferred ReLU and any pending truncation run here
    return s.rounds, s.max_bytes_per_party


def test_a_relu_read_after_the_block_is_counted_in_it(trio):
    x = _share(torch.randn(500), trio)
    with mpc.stats() as s:
        y = torch.relu(x)
    # (a ReLU of 500 elements: 3 rounds, within MPCConfig.three_round_up_to; 4 with d's)
    assert s.rounds == 3 and s.max_bytes_per_party > 0
    with mpc.stats() as later:
        got = y.get()
    assert later.rounds == 0  # (ran already: the read costs no round)
    assert torch.equal(got > 0, x.get() > 0)


def test_a_dropped_relu_costs_nothing_and_nested_blocks_both_count(trio):
    x = _share(torch.randn(100), trio)
    with mpc.stats() as s:
        torch.relu(x)  # dropped at once: never runs
    assert s.rounds == 0
    with mpc.stats() as outer:
        with mpc.stats() as inner:
            y = torch.relu(x)
        assert inner.rounds == 3  # (the ReLU's comparison: no d round at 100 elements)
    assert outer.rounds == 3
    del y


def test_the_demo_rows_agree_with_a_forced_measurement(trio, capsys):
    n, m = 3000, 24
    rows = {r["name"]: r for r in quick_benchmarks(n=n, matmul=m)}
    assert "relu" in capsys.readouterr().out
    gen = torch.Generator().manual_seed(1)

    def randn(*shape):
        return torch.empty(shape).normal_(generator=gen)

    cases = {
        "mul": (lambda a, b: a * b, (randn(n), randn(n))),
        "matmul": (lambda a, b: a @ b, (randn(m, m), randn(m, m))),
        "compare": (torch.lt, (randn(n), randn(n))),
        "relu": (torch.relu, (randn(n),)),
    }
    for name, (op, inputs) in cases.items():
        rounds, nbytes = _forced(op, inputs, trio)
        assert (rows[name]["rounds"], rows[name]["bytes_per_party"]) == (rounds, nbytes), name
    # (3,000 elements, within MPCConfig.three_round_up_to: 3 rounds, 4 while d was opened)
    assert rows["relu"]["rounds"] == 3 and rows["relu"]["bytes_per_party"] > 8 * n


def test_a_forward_pass_with_get_outside_the_block(trio):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 4), nn.ReLU())
    x = torch.randn(3, 6)
    want = model(x).detach()
    alice, bob, carol = trio
    mpc.share(model, alice, bob, crypto_provider=carol)
    model(_share(x, trio)).get()  # (the first pass makes the weights' instances)
    with mpc.stats() as s, torch.no_grad():  # (inference: the last ReLU is deferred)
        y = model(_share(x, trio))
    got = y.get()
    with mpc.stats() as forced, torch.no_grad():
        model(_share(x, trio)).get()
    assert s.rounds == forced.rounds > 0
    assert s.max_bytes_per_party == forced.max_bytes_per_party
    assert torch.allclose(got, want, atol=1e-2)
