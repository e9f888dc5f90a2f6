"""The comparison by function secret sharing (``MPCConfig(comparison="fss")``, issue 25):
agreement with plaintext torch (at the documented range edges too), the session option
and its 2-party rule, plans and material dealt ahead, keys used once, keys sealed.

The byte and round counts are pinned in tests/test_mpc_fss_costs.py.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_mpc_nonces import NonceObserver

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.errors import ComparisonModeError
from pointers.wire.messages import Describe

FSS = MPCConfig(comparison="fss")


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _share(t: torch.Tensor, trio: Any, config: MPCConfig = FSS) -> Any:
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol, config=config)


# -- the session option ------------------------------------------------------------------


def test_three_parties_are_refused_with_a_clear_error(trio: Any) -> None:
    alice, bob, carol = trio
    dave = pt.VirtualWorker("dave")
    with pytest.raises(ComparisonModeError, match="2 parties"):
        mpc.Session([alice, bob, dave], carol, comparison="fss")
    with pytest.raises(ComparisonModeError, match="2 parties"):
        mpc.share(torch.ones(2), alice, bob, dave, crypto_provider=carol, config=FSS)
    with pytest.raises(ValueError, match="comparison must be one of"):
        MPCConfig(comparison="garbled")
    with pytest.raises(ValueError, match="fss_bits"):
        MPCConfig(comparison="fss", fss_bits=1)


def test_the_session_keyword_is_the_config_field(trio: Any) -> None:
    alice, bob, carol = trio
    s = mpc.Session([alice, bob], carol, comparison="fss")
    assert s.config.comparison == "fss"
    x = mpc.share(torch.tensor([1.0, -1.0]), session=s)
    with mpc.stats() as st_:
        assert (x > 0).get().tolist() == [True, False]
    assert st_.rounds == 1


# -- agreement with plaintext --------------------------------------------------------------

FLOATS = st.floats(-1000.0, 1000.0, allow_nan=False, width=32)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(a=st.lists(FLOATS, min_size=1, max_size=12), b=st.data())
def test_comparisons_agree_with_torch(trio: Any, a: list[float], b: st.DataObject) -> None:
    """lt, gt, relu, max, abs in FSS mode against float torch; the fixed-point rounding
    band (one unit, 2^-16) is left out of the comparisons, as in the default mode."""
    x0 = torch.tensor(a)
    y0 = torch.tensor(b.draw(st.lists(FLOATS, min_size=len(a), max_size=len(a))))
    x, y = _share(x0, trio), _share(y0, trio)
    clear = (x0 - y0).abs() > 2**-15
    assert torch.equal((x < y).get()[clear], (x0 < y0)[clear])
    assert torch.equal((x > y).get()[clear], (x0 > y0)[clear])
    assert torch.allclose(F.relu(x).get(), F.relu(x0), atol=1e-4)
    assert torch.allclose(x.max().get(), x0.max(), atol=1e-4)
    assert torch.allclose(torch.abs(x).get(), x0.abs(), atol=1e-4)


def test_relu_of_a_product_max_pool_and_argmax(trio: Any) -> None:
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(2, 3, 8, 8, generator=gen), torch.randn(2, 3, 8, 8, generator=gen)
    x, y = _share(a, trio), _share(b, trio)
    assert torch.allclose(F.relu(x * y).get(), F.relu(a * b), atol=1e-3)
    assert torch.allclose(F.max_pool2d(x, 2).get(), F.max_pool2d(a, 2), atol=1e-4)
    rows = torch.randn(5, 9, generator=gen)
    r = _share(rows, trio)
    assert torch.equal(r.argmax(dim=1).get(), rows.argmax(dim=1))
    assert torch.allclose(r.softmax(dim=1).get(), rows.softmax(dim=1), atol=2e-2)


EDGES_64 = [-(2**63), -(2**63) + 1, -(2**62), -1, 0, 1, 2**62, 2**63 - 2, 2**63 - 1]


def test_exact_on_the_whole_ring(trio: Any) -> None:
    """At the default 64 bits the comparison reads every bit: x < 0 is exact for every
    int64, the extremes included (the default protocol is exact on (-2^63, 2^63))."""
    x0 = torch.tensor(EDGES_64, dtype=torch.int64)
    x = _share(x0, trio)
    assert torch.equal((x < 0).get(), x0 < 0)
    assert torch.equal(F.relu(x).get(), F.relu(x0))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    bits=st.integers(2, 64),
    values=st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=8),
)
def test_the_range_edges_of_a_narrower_domain(trio: Any, bits: int, values: list[int]) -> None:
    """With ``fss_bits`` = k the comparison is exact on [-2^(k-1), 2^(k-1)): both ends,
    their neighbours inside, 0 and -1, and random values folded into the range."""
    lo, hi = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    inside = [lo, lo + 1, hi - 1, hi, 0, -1] + [lo + v % (hi - lo + 1) for v in values]
    x0 = torch.tensor([min(max(v, lo), hi) for v in inside], dtype=torch.int64)
    x = _share(x0, trio, MPCConfig(comparison="fss", fss_bits=bits))
    assert torch.equal((x < 0).get(), x0 < 0)
    assert torch.equal(F.relu(x).get(), F.relu(x0))


def test_integer_comparisons_and_where(trio: Any) -> None:
    a = torch.tensor([5, -3, 0, 7, -(2**40)], dtype=torch.int64)
    b = torch.tensor([5, 2, -1, 8, 2**40], dtype=torch.int64)
    x, y = _share(a, trio), _share(b, trio)
    assert torch.equal((x <= y).get(), a <= b)
    assert torch.equal((x >= y).get(), a >= b)
    both = torch.stack([x, y]).max(dim=0).values
    assert torch.equal(both.get(), torch.maximum(a, b))


# -- plans, preprocessing, single use ------------------------------------------------------


def test_plans_and_keys_dealt_ahead(trio: Any) -> None:
    """A recorded ReLU network runs from keys dealt ahead (preprocess): the call runs the
    parties' programs only, in the protocol's rounds, and every call uses fresh keys."""
    gen = torch.Generator().manual_seed(1)
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.ReLU(), torch.nn.Linear(5, 3))
    alice, bob, carol = trio
    shared_model = mpc.share(copy.deepcopy(model), alice, bob, crypto_provider=carol, config=FSS)

    def fn(v: Any) -> Any:
        return F.relu(shared_model(v)).max(dim=1).values

    x = _share(torch.randn(4, 6, generator=gen), trio)
    plan = mpc.plan(fn, x)
    assert plan.rounds <= 2 + 2 + 2 + 4  # two products, two ReLUs, the max of 3
    mpc.preprocess(plan, 2)
    assert plan.prepared() == 2
    for _ in range(3):
        plain = torch.randn(4, 6, generator=gen)
        with torch.no_grad():
            want = F.relu(model(plain)).max(dim=1).values
        assert torch.allclose(plan(_share(plain, trio)).get(), want, atol=2e-3)
    assert plan.prepared() == 0


def test_no_key_is_used_twice(trio: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Op by op and in plan runs, no (seed, nonce) pair of any step repeats, the FSS
    dealer's and evaluation's included (the observer of tests/test_mpc_nonces.py)."""
    observer = NonceObserver(monkeypatch, list(trio))
    gen = torch.Generator().manual_seed(2)
    a, b = torch.randn(6, generator=gen), torch.randn(6, generator=gen)

    def fn(x: Any, y: Any) -> Any:
        return F.relu(x * y) + (x < y) * 1.0 + torch.max(x)

    x, y = _share(a, trio), _share(b, trio)
    assert torch.allclose(fn(x, y).get(), fn(a, b), atol=2e-3)
    plan = mpc.plan(fn, x, y)
    mpc.preprocess(plan, 1)
    for _ in range(2):
        assert torch.allclose(plan(_share(a, trio), _share(b, trio)).get(), fn(a, b), atol=2e-3)
    names = {name for _, name, _, _ in observer.uses}
    assert {"mpc.dealer_fss", "mpc.fss_eval", "mpc.fss_unpack"} <= names
    observer.assert_no_reuse()


def _keys(trio: Any, n: int = 3, select: bool = False) -> tuple[Any, list[Any], Any, Any]:
    """A dealt key pair at the parties, as the protocol deals it, and its session."""
    alice, bob, carol = trio
    x = _share(torch.ones(n), trio)
    s = x.session
    nonce = s.next_nonce()
    words = 190 * n
    cw, k1 = pt.call_function(
        carol,
        "mpc.dealer_fss",
        [s.dealer_seeds, nonce, [n], [], None, select, 64],
        out=[((words,), torch.int64), ((n + (n if select else 0),), torch.int64)],
    )
    return s, [cw, k1], nonce, x


def test_a_client_cannot_read_or_misuse_a_key(trio: Any) -> None:
    """The dealer's keys are sealed: no client fetches one at the dealer or at a party;
    the last party's part of the key goes to the last party only; the correction words (one object, common to both keys) go to each
    party once and no further; a key is evaluated once, on the opened value of its own
    instance only."""
    alice, bob, carol = trio
    s, (cw, k1), nonce, x = _keys(trio)
    for k in (cw, k1):
        with pytest.raises(pt.RemoteError, match="sealed"):
            k.get()
    with pytest.raises(pt.RemoteError, match="goes only to 'bob'"):
        k1.move(alice)  # the last party's part sent to party 0: its dealer refuses
        carol.request(Describe([]))
    cw0, cw1 = cw.copy_to(alice, lend=True), cw.copy_to(bob, lend=True)
    seed = s.party_seeds
    with pytest.raises(pt.RemoteError, match="again"):  # a third delivery
        cw.copy_to(bob)
        bob.request(Describe([]))
        carol.request(Describe([]))
    with pytest.raises(pt.RemoteError, match="again"):  # nor on from a party
        cw0.copy_to(bob)
        alice.request(Describe([]))
    for k in (cw0, cw1):
        with pytest.raises(pt.RemoteError, match="sealed"):
            k.get()
    # a key is evaluated only at the opened c of its own instance, not on a share
    with pytest.raises(pt.RemoteError, match="protocol material|takes a"):
        pt.call_function(
            alice,
            "mpc.fss_eval",
            [seed[0], nonce, True, cw0, None, x.shares[0], 64, False],
            out=[((3,), torch.int64)],
        )
        alice.request(Describe([]))
    assert torch.equal(x.get(), torch.ones(3))


def test_a_key_is_evaluated_once(trio: Any) -> None:
    """Replaying a comparison's evaluation step is refused (the key is consumed, and its
    root stream too)."""
    alice, bob, carol = trio
    x = _share(torch.tensor([1.0, -1.0, 2.0]), trio)
    calls: list[tuple[Any, list[Any]]] = []
    original = pt.call_function

    def spy(worker: Any, name: str, args: list[Any], out: Any = None) -> Any:
        if name == "mpc.fss_eval":
            calls.append((worker, list(args)))
        return original(worker, name, args, out=out)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pt, "call_function", spy)
        assert (x < 0).get().tolist() == [False, True, False]
    worker, args = calls[0]
    with pytest.raises(pt.RemoteError, match="protocol material|already used|spent"):
        original(worker, "mpc.fss_eval", args, out=[((3,), torch.int64)])
        worker.request(Describe([]))


@pytest.mark.parametrize("worker_kind", [pytest.param("network", marks=pytest.mark.network)])
def test_on_network_workers(trio: Any, worker_kind: str) -> None:
    """The same protocol on served workers (mutual TLS, peer deliveries): op by op and as
    a plan with its keys dealt ahead."""
    gen = torch.Generator().manual_seed(4)
    a, b = torch.randn(2, 1, 6, 6, generator=gen), torch.randn(2, 1, 6, 6, generator=gen)
    x, y = _share(a, trio), _share(b, trio)
    with mpc.stats() as s:
        below = (x < y).get()
    assert s.rounds == 1
    clear = (a - b).abs() > 2**-15
    assert torch.equal(below[clear], (a < b)[clear])

    def fn(u: Any, v: Any) -> Any:
        return F.max_pool2d(F.relu(u * v), 2)

    plan = mpc.plan(fn, x, y)
    mpc.preprocess(plan, 1)
    assert torch.allclose(plan(x, y).get(), fn(a, b), atol=1e-3)
