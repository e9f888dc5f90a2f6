"""A worker process that restarts while the client is idle (issue 12).

Real ``python -m pointers serve`` processes: a party or the crypto provider is killed and
started again on the same port with the same certificate (an empty store, a new
incarnation). New work goes on transparently: the client notices the restart, introduces
the peers again and deals new seeds. Pointers to objects that died with the old process
fail with an error that says so.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from network_fixtures import Cluster

import mpc
import pointers as pt
from mpc.errors import MPCError
from pointers.network.replies import WorkerRestartedError

pytestmark = pytest.mark.network

U = 2.0**-16  # one unit of the fixed-point encoding


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("restart"), ["alice", "bob", "carol"])
    c.start()
    yield c
    c.stop()


@pytest.fixture
def trio(cluster):
    yield cluster.fresh("alice"), cluster.fresh("bob"), cluster.fresh("carol")
    cluster.close_connections()


def _compute(x: torch.Tensor, y: torch.Tensor, parties: list, dealer) -> None:
    """share, multiply, compare and reconstruct; checked against plaintext torch."""
    a = mpc.share(x, *parties, crypto_provider=dealer)
    b = mpc.share(y, *parties, crypto_provider=dealer)
    prod = (a * b).get()
    assert torch.allclose(prod, x * y, atol=(x.abs() + y.abs()).max().item() * 4 * U + 4 * U)
    assert torch.equal((a < b).get().bool(), x < y)
    assert torch.allclose((a + b).get(), x + y, atol=4 * U)


def _restart(cluster: Cluster, worker: str) -> None:
    server = cluster.servers[worker]
    old = server.address
    assert server.restart() == old  # same port, same certificate, an empty store


values = st.lists(
    st.floats(-1000, 1000, allow_nan=False, allow_infinity=False), min_size=1, max_size=6
)


@pytest.mark.parametrize("restarted", ["bob", "carol"])  # a party, the crypto provider
def test_new_work_goes_on_after_an_idle_restart(cluster, trio, restarted):
    alice, bob, carol = trio
    workers = {"alice": alice, "bob": bob, "carol": carol}
    x, y = torch.tensor([1.5, -2.0, 3.25]), torch.tensor([4.0, 5.5, -6.0])
    _compute(x, y, [alice, bob], carol)
    before = mpc.share(x, alice, bob, crypto_provider=carol)
    session = before.session
    kept = pt.send(torch.arange(3.0), workers[restarted])
    for w in trio:
        w.sync()  # idle: nothing in flight when the process goes
    _restart(cluster, restarted)

    # new work: no error, right answers (the restart is noticed before anything is sent)
    _compute(x, y, [alice, bob], carol)
    assert workers[restarted].restarts == 1
    assert all(w.restarts == 0 for name, w in workers.items() if name != restarted)
    after = mpc.share(y, alice, bob, crypto_provider=carol)
    assert after.session is not session  # new seeds for the group
    assert torch.allclose((after * after).get(), y * y, atol=1e-2)

    # objects that died with the old process: a plain error that says so
    with pytest.raises(WorkerRestartedError, match=f"worker '{restarted}' restarted") as info:
        kept.get()
    assert isinstance(info.value, pt.RemoteError)  # code that catches those keeps working
    assert info.value.kind == "UnknownObjectError"
    if restarted == "bob":
        with pytest.raises(WorkerRestartedError, match="objects of its earlier process are gone"):
            before.get()
    with pytest.raises(MPCError, match=rf"\['{restarted}'\].*restarted"):
        mpc.share(x, session=session)


def test_plain_pointers_after_a_restart(cluster, trio):
    _, bob, _ = trio
    old = pt.send(torch.ones(3), bob)
    bob.sync()
    _restart(cluster, "bob")
    new = pt.send(torch.full((3,), 2.0), bob)
    assert torch.equal((new * 3).get(), torch.full((3,), 6.0))
    with pytest.raises(WorkerRestartedError, match="restarted after object"):
        (old + 1).get()  # the op's error is about the dead operand
    assert bob.restarts == 1
    # a missing object made after the restart is not blamed on it
    fresh = pt.send(torch.ones(1), bob)
    fresh.get()
    with pytest.raises(pt.PointerError) as info:
        fresh.get()
    assert not isinstance(info.value, WorkerRestartedError)


@pytest.mark.slow
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(x=values, seed=st.integers(0, 2**31 - 1))
def test_results_stay_right_across_restarts(cluster, x, seed):
    """Values drawn by hypothesis; one restart of bob between two rounds of work."""
    alice, bob, carol = cluster.fresh("alice"), cluster.fresh("bob"), cluster.fresh("carol")
    try:
        t = torch.tensor(x)
        y = torch.randn(t.shape, generator=torch.Generator().manual_seed(seed)) * 10
        _compute(t, y, [alice, bob], carol)
        for w in (alice, bob, carol):
            w.sync()
        _restart(cluster, "bob")
        _compute(t, y, [alice, bob], carol)
    finally:
        cluster.close_connections()
