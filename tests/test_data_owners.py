"""Data owners against a client that lies (issue 39, findings 2, 3, 4 and 7).

A deployment of served workers on loopback: parties alice and bob, the dealer carol, the
data owners dave, emma and frank (listed at the parties with ``--owner``) and gina (a
worker serving data too, but no listed owner). Each owner serves its data with ``--data``
(written by ``pointers.save_data``): updates with the owner's count, one item readable by
the client identity "client" (``allowed_users``), one that joins no aggregation. The
client drives every worker and lies as the red team did; each attack is sent as it sent
it. Before, a value at an owner's worker was anybody's: the client fetched it, and any
worker's sharing counted as an owner's.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from network_fixtures import Cluster, ServerProcess

import mpc
import pointers as pt
from pointers.network import ClientContext, ServerConfig
from pointers.wire.messages import Describe

served = pytest.mark.network  # (the tests on the served deployment; the last runs in process)

OWNERS = ("dave", "emma", "frank")
COUNTS = {"dave": 10, "emma": 20, "frank": 30, "gina": 5}
ROUNDS = 6  # updates per owner, one per test that aggregates
OUT = [((4,), torch.int64)]


def _update(owner: str, k: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{owner}/{k}".encode()))
    return torch.randn(4, generator=gen)


def _data(owner: str) -> list[pt.OwnedData]:
    items = [
        pt.OwnedData(_update(owner, k), (f"#u{k}",), f"{owner}'s update {k}", COUNTS[owner])
        for k in range(ROUNDS)
    ]
    items.append(pt.OwnedData(_update(owner, 99), ("#big",), count=1 << 20))  # over the bound
    items.append(pt.OwnedData(torch.arange(3.0), ("#private",)))  # joins no aggregation
    items.append(pt.OwnedData(torch.ones(2), ("#shared-with-client",), allowed_users=("client",)))
    return items


@pytest.fixture(scope="module")
def dep(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("owners")
    workers = ["alice", "bob", "carol", *OWNERS, "gina"]
    cluster = Cluster(root, workers, clients=("client", "mallory"))
    listed = [a for o in OWNERS for a in ("--owner", o)]
    for w in workers:
        args: list[str] = listed if w in ("alice", "bob") else []
        if w in (*OWNERS, "gina"):
            path = root / f"{w}.data"
            pt.save_data(path, _data(w))
            args = ["--data", str(path)]
        cluster.servers[w] = ServerProcess(w, cluster.certs, root / f"{w}.log", args)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def w(dep: Cluster) -> dict[str, Any]:
    ctx = ClientContext()  # a session of its own per test
    return {name: dep.connect(name, context=ctx) for name in dep.worker_ids}


def _found(worker: Any, tag: str) -> pt.PointerTensor:
    (p,) = worker.search(tag)
    return p


def _sync(worker: Any) -> None:
    worker.request(Describe([]))


def _agg(w: dict[str, Any]) -> mpc.SecureAggregator:
    return mpc.SecureAggregator([w["alice"], w["bob"]], crypto_provider=w["carol"])


def _exact(*terms: tuple[str, int]) -> torch.Tensor:
    return sum(COUNTS[o] * _update(o, k).double() for o, k in terms)  # type: ignore[return-value]


# -- finding 7: the owner's data is used only as the owner allows ------------------------------


@served
def test_the_owners_data_is_found_but_never_read(w: dict[str, Any]) -> None:
    dave = w["dave"]
    x = _found(dave, "#u0")
    assert x.shape == (4,) and x.dtype == torch.float32  # found and described
    assert [tuple(p.shape) for p in dave.search("#private")] == [(3,)]
    attempts = {
        "fetch": lambda x: x.get(delete=False),
        "fetch and delete": lambda x: x.get(),
        "an op": lambda x: (x + 0).get(),
        "a copy": lambda x: x.clone().get(),
        "an in-place op": lambda x: x.add_(0),
        "a view": lambda x: x[:2].get(),
        "a move": lambda x: x.move(w["alice"]).get(),
        "a copy to a peer": lambda x: x.copy_to(w["alice"]).get(),
        "a tag": lambda x: x.tag("#mine"),
    }
    for what, attempt in attempts.items():
        with pytest.raises(pt.RemoteError, match="owner's data|sealed") as e:
            attempt(_found(dave, "#u0"))
            _sync(dave)
        assert "dave" in str(e.value), what
    # no protocol step but the owner's sharing takes it
    with pytest.raises(pt.RemoteError, match="not a owners_data"):
        pt.call_function(dave, "mpc.pack", [[x, x]], out=[((8,), torch.float32)])
        _sync(dave)
    # still there, untouched, for what the owner allows
    assert [tuple(p.shape) for p in dave.search("#u0")] == [(4,)]


@served
def test_what_the_client_sent_stays_the_clients(w: dict[str, Any]) -> None:
    mine = pt.send(torch.tensor([1.0, 2.0]), w["dave"])
    assert torch.equal((mine * 2).get(), torch.tensor([2.0, 4.0]))


@served
def test_allowed_users_use_the_data_as_their_own(dep: Cluster, w: dict[str, Any]) -> None:
    assert torch.equal(_found(w["dave"], "#shared-with-client").get(delete=False), torch.ones(2))
    other = dep.connect("dave", identity="mallory", context=ClientContext())
    y = _found(other, "#shared-with-client")
    with pytest.raises(pt.RemoteError, match="owner's data"):
        y.get(delete=False)
    # a reset of the session keeps the owner's data (and its rule)
    w["dave"].reset()
    with pytest.raises(pt.RemoteError, match="owner's data"):
        _found(w["dave"], "#u0").get(delete=False)


@served
def test_an_owner_value_without_a_count_joins_no_aggregation(w: dict[str, Any]) -> None:
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#private"))
    with pytest.raises(pt.RemoteError, match="joins no aggregation"):
        _sync(w["dave"])
    del a


# -- the aggregation the owners joined opens ------------------------------------------------


@served
def test_the_owners_aggregate_opens(w: dict[str, Any]) -> None:
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#u0"), weight=COUNTS["dave"])
    b = agg.share_update(_found(w["emma"], "#u0"), weight=COUNTS["emma"])
    got = (a + b).get()
    assert torch.allclose(got, _exact(("dave", 0), ("emma", 0)), atol=2.0**-10)
    mean = agg.aggregate([(_found(w[o], "#u1"), COUNTS[o]) for o in OWNERS])
    total = sum(COUNTS[o] for o in OWNERS)
    expected = _exact(*((o, 1) for o in OWNERS)) / total
    assert torch.allclose(mean.double(), expected, atol=2.0**-12)


# -- finding 2: the weight is the owner's count, and bounded ----------------------------------


@served
def test_the_weight_is_the_owners_count(w: dict[str, Any]) -> None:
    """The red team: weights 1 and 2^31 open u + 2^31 v, which reads both updates."""
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#u2"), weight=1)
    b = agg.share_update(_found(w["emma"], "#u2"), weight=2**31)
    with pytest.raises(pt.PointerError, match="owner's count, 10; got 1|owner's count, 20"):
        (a + b).get()


@served
def test_every_party_bounds_the_weights(w: dict[str, Any]) -> None:
    """An owner's count over the deployment's bound (serve --max-weight, 2^16 here) is
    refused by the parties, whatever the owner's worker said."""
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#big"), weight=1 << 20)
    b = agg.share_update(_found(w["emma"], "#u3"), weight=COUNTS["emma"])
    with pytest.raises(pt.RemoteError, match="over this deployment's bound of 65536"):
        pt.call_function(w["alice"], "mpc.release_sum", [[a.shares[0], b.shares[0]]], out=OUT)
        _sync(w["alice"])


@served
def test_one_scale_per_sum(w: dict[str, Any]) -> None:
    """Two scales weight one value against the other (u + 2^16 v): refused by the parties
    (the client API refuses it too; here the raw step)."""
    parties = [w["alice"], w["bob"]]
    fine = mpc.SecureAggregator(parties, crypto_provider=w["carol"], frac_bits=24)
    coarse = mpc.SecureAggregator(parties, crypto_provider=w["carol"], frac_bits=8)
    coarse.session.round = fine.session.round  # (the client picks the same round for both)
    a = coarse.share_update(_found(w["dave"], "#u3"), weight=COUNTS["dave"])
    b = fine.share_update(_found(w["frank"], "#u3"), weight=COUNTS["frank"])
    with pytest.raises(pt.RemoteError, match="one fixed-point scale"):
        pt.call_function(w["alice"], "mpc.release_sum", [[a.shares[0], b.shares[0]]], out=OUT)
        _sync(w["alice"])


# -- finding 3: owners are a known set --------------------------------------------------------


@served
def test_zeros_at_the_dealer_are_no_owner(w: dict[str, Any]) -> None:
    """The red team: zeros stored at the dealer, shared there, opened with dave's update
    as two owners' values."""
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#u4"), weight=COUNTS["dave"])
    zeros = agg.share_update(pt.send(torch.zeros(4), w["carol"]))
    with pytest.raises(pt.RemoteError, match="never to a value the client sent"):
        (a + zeros).get()


@served
def test_zeros_at_a_listed_owner_are_the_clients(w: dict[str, Any]) -> None:
    agg = _agg(w)
    a = agg.share_update(_found(w["dave"], "#u5"), weight=COUNTS["dave"])
    zeros = agg.share_update(pt.send(torch.zeros(4), w["emma"]))
    with pytest.raises(pt.RemoteError, match="never to a value the client sent"):
        pt.call_function(w["bob"], "mpc.release_sum", [[a.shares[1], zeros.shares[1]]], out=OUT)
        _sync(w["bob"])


@served
def test_an_unlisted_worker_is_no_owner(w: dict[str, Any]) -> None:
    """gina serves data of its own, but the deployment does not list it."""
    agg = _agg(w)
    a = agg.share_update(_found(w["emma"], "#u5"), weight=COUNTS["emma"])
    g = agg.share_update(_found(w["gina"], "#u0"), weight=COUNTS["gina"])
    with pytest.raises(pt.RemoteError, match="'gina' is not one of this deployment's"):
        (a + g).get()


@served
def test_a_sum_spans_distinct_listed_owners(w: dict[str, Any]) -> None:
    agg = _agg(w)
    a = agg.share_update(_found(w["frank"], "#u4"), weight=COUNTS["frank"])
    b = agg.share_update(_found(w["frank"], "#u5"), weight=COUNTS["frank"])
    with pytest.raises(pt.RemoteError, match="at least 2 owners' values, got 1"):
        pt.call_function(w["alice"], "mpc.release_sum", [[a.shares[0], b.shares[0]]], out=OUT)
        _sync(w["alice"])


def test_a_party_or_the_dealer_is_never_listed(tmp_path: Path) -> None:
    from pointers.network.certs import create_certs

    create_certs(tmp_path, ["alice"], clients=[])
    peers = (("bob", "127.0.0.1:7002"), ("carol", "127.0.0.1:7003"))
    for listed in (["carol"], ["alice"]):
        with pytest.raises(ValueError, match="never a data owner"):
            ServerConfig(
                "alice", certs=str(tmp_path), peers=peers, data_owners=pt.DataPolicy(listed)
            )
    with pytest.raises(ValueError, match="never a data owner"):
        pt.VirtualWorker("alice", owners=("alice", "dave"))


# -- finding 4: an owner's value is shared once, bound to the value ---------------------------


@served
def test_an_owners_value_is_shared_once(dep: Cluster, w: dict[str, Any]) -> None:
    """The red team: after a no-op ``x.add_(0)`` or a clone, the update was shared again;
    with three owners, (s1 + s2 - s3) / 2 = u."""
    agg = _agg(w)
    x = _found(w["emma"], "#u4")
    s1 = agg.share_update(x, weight=COUNTS["emma"])
    for attempt in (lambda: x.add_(0), lambda: x.clone()):  # no op on the owner's data
        with pytest.raises(pt.RemoteError, match="owner's data|sealed"):
            attempt()
            _sync(w["emma"])
    for again in (
        lambda: agg.share_update(x, weight=COUNTS["emma"]),  # the same round
        lambda: (agg.next_round(), agg.share_update(x, weight=COUNTS["emma"])),  # the next
    ):
        with pytest.raises(pt.RemoteError, match="shared before"):
            again()
            _sync(w["emma"])
    # another session of the client: the record is the worker's, not the session's
    ctx = ClientContext()
    other = {n: dep.connect(n, context=ctx) for n in ("alice", "bob", "carol", "emma")}
    with pytest.raises(pt.RemoteError, match="shared before"):
        _agg(other).share_update(_found(other["emma"], "#u4"), weight=COUNTS["emma"])
        _sync(other["emma"])
    del s1


# -- in process: the same rules ----------------------------------------------------------------


def test_in_process_owners() -> None:
    alice = pt.VirtualWorker("alice", owners=OWNERS)
    bob = pt.VirtualWorker("bob", owners=OWNERS)
    carol = pt.VirtualWorker("carol")
    dave, emma = pt.VirtualWorker("dave"), pt.VirtualWorker("emma")
    u, v = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 4.0])
    pt.own(dave, u, "#update", count=3)
    pt.own(emma, v, "#update", count=1)
    pt.own(emma, torch.ones(2), "#mine", allowed_users=("me",))
    (x,) = dave.search("#update")
    with pytest.raises(
        pt.RemoteError, match="the owner's data at worker 'dave': fetching it is refused"
    ):
        x.get(delete=False)
    with pytest.raises(pt.RemoteError, match="sealed"):
        (x + 0).get()
    assert torch.equal(emma.search("#mine")[0].get(delete=False), torch.ones(2))
    # PySyft's data= is the script's own (in process, it is the worker's client)
    box = pt.VirtualWorker("box", data=[pt.tag(torch.ones(1), "#x")])
    assert torch.equal(box.search("#x")[0].get(delete=False), torch.ones(1))
    agg = mpc.SecureAggregator([alice, bob], crypto_provider=carol)
    a = agg.share_update(x, weight=3)
    b = agg.share_update(emma.search("#update")[0], weight=1)
    assert torch.allclose((a + b).get(), (3 * u + v).double(), atol=2.0**-14)
    with pytest.raises(pt.RemoteError, match="shared before"):
        agg.share_update(x, weight=3)
    # the parties list the owners: a worker they do not list is no owner
    gina = pt.VirtualWorker("gina")
    pt.own(gina, v, "#update", count=1)
    pt.own(dave, 2 * u, "#again", count=3)
    c = agg.share_update(dave.search("#again")[0], weight=3)
    g = agg.share_update(gina.search("#update")[0], weight=1)
    with pytest.raises(pt.RemoteError, match="'gina' is not one of this deployment's"):
        (c + g).get()
    # a deployment that asks for three distinct owners per aggregate
    strict = [pt.VirtualWorker(n, owners=pt.DataPolicy(OWNERS, min_owners=3)) for n in "xy"]
    agg3 = mpc.SecureAggregator(strict, crypto_provider=carol)
    pt.own(dave, 3 * u, "#third", count=3)
    pt.own(emma, 3 * v, "#third", count=1)
    a3 = agg3.share_update(dave.search("#third")[0], weight=3)
    b3 = agg3.share_update(emma.search("#third")[0], weight=1)
    with pytest.raises(pt.RemoteError, match="at least 3 owners' values, got 2"):
        (a3 + b3).get()
