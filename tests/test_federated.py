"""Federated data, the federated data loader, FedAvg and secure aggregation (issue 4).

Runs on both worker kinds (see conftest.py): workers come from the ``new_workers``
fixture, so a network run uses the cluster's worker processes, whose ids may differ from
the names asked for (``w1`` is ``alice`` there): tests compare against ``w.id``. The
audits of what each worker stores and sends wrap an in-process worker's store and message
handler, so they run on virtual workers only (``virtual_only``).
"""

from __future__ import annotations

import copy
import gc
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import mpc
import pointers as pt
from mpc.examples.digits import accuracy, load_digits_split
from mpc.math.encoding import encode
from pointers.federated.datasets import split_sizes
from pointers.wire.messages import Fetch, Reply, decode_message

# ---------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------


NewWorkers = Callable[..., list[Any]]


@pytest.fixture
def new_workers(make_worker: Callable[[str], Any]) -> NewWorkers:
    """names -> new workers of the test's kind."""

    def make(*names: str) -> list[Any]:
        return [make_worker(n) for n in names]

    return make


def _indexed(n: int) -> TensorDataset:
    """Example i is [i, -i] with target i % 7: a batch tells which examples it holds."""
    ids = torch.arange(n, dtype=torch.float32)
    return TensorDataset(torch.stack([ids, -ids], dim=1), torch.arange(n) % 7)


def _epoch(loader: pt.FederatedDataLoader) -> list[tuple[str, list[int], list[int]]]:
    """(location, example ids, targets) of every batch of one epoch."""
    out = []
    for data, target in loader:
        assert data.location is target.location
        out.append((data.location.id, data.get()[:, 0].long().tolist(), target.get().tolist()))
    return out


# ---------------------------------------------------------------------------------------
# FederatedDataset
# ---------------------------------------------------------------------------------------


def test_federate_splits_evenly_and_sends_each_worker_its_part(new_workers):
    bob, alice, carol = new_workers("bob", "alice", "carol")
    ds = _indexed(11)
    fed = pt.FederatedDataset.federate(ds, (bob, alice, carol))
    assert fed.workers == ["bob", "alice", "carol"]
    assert fed.locations == [bob, alice, carol]
    assert len(fed) == 11 and fed.num_examples == {"bob": 4, "alice": 4, "carol": 3}
    assert fed["alice"] is fed[alice] and "carol" in fed and "dave" not in fed
    assert [p.location for p in fed] == [bob, alice, carol]
    start = 0
    for w, part in zip((bob, alice, carol), fed):
        assert isinstance(part.data, pt.PointerTensor) and part.data.location is w
        assert part.targets.location is w and len(part) == fed.num_examples[w.id]
        held = list(w.objects.values())  # exactly its own data and targets, nothing else
        assert len(held) == 2
        assert torch.equal(held[0], ds.tensors[0][start : start + len(part)])
        assert torch.equal(held[1], ds.tensors[1][start : start + len(part)])
        start += len(part)
    assert "bob" in repr(fed) and "examples=4" in repr(fed["bob"])
    with pytest.raises(KeyError, match="dave"):
        fed["dave"]


def test_federate_by_fractions(new_workers):
    assert split_sizes(10, 3, (0.5, 0.3, 0.2)) == [5, 3, 2]
    assert split_sizes(7, 2, (0.5, 0.5)) == [4, 3]  # ties: the earlier worker
    assert split_sizes(10, 3, (0.55, 0.25, 0.2)) == [6, 2, 2]
    bob, alice = new_workers("bob", "alice")
    fed = pt.FederatedDataset.federate(_indexed(10), (bob, alice), fractions=[0.7, 0.3])
    assert fed.num_examples == {"bob": 7, "alice": 3}
    for bad, match in [((0.5, 0.6), "sum to 1"), ((1.0,), "one per worker"), ((1.5, -0.5), "non")]:
        with pytest.raises(ValueError, match=match):
            pt.FederatedDataset.federate(_indexed(10), (bob, alice), fractions=bad)
    with pytest.raises(ValueError, match="no example"):
        pt.FederatedDataset.federate(_indexed(10), (bob, alice), fractions=(0.99, 0.01))


def test_federate_errors_are_clear_and_send_nothing(new_workers):
    bob, alice = new_workers("bob", "alice")
    with pytest.raises(ValueError, match="zero workers"):
        pt.FederatedDataset.federate(_indexed(4), ())
    with pytest.raises(ValueError, match="same length"):
        pt.FederatedDataset.federate((torch.zeros(5, 2), torch.zeros(4)), (bob, alice))
    with pytest.raises(ValueError, match="empty"):
        pt.FederatedDataset.federate((torch.zeros(0, 2), torch.zeros(0)), (bob,))
    with pytest.raises(ValueError, match="no example"):
        pt.FederatedDataset.federate(_indexed(1), (bob, alice))
    with pytest.raises(ValueError, match="distinct"):
        pt.FederatedDataset.federate(_indexed(4), (bob, bob))
    with pytest.raises(TypeError, match="Dataset"):
        pt.FederatedDataset.federate([1, 2, 3], (bob, alice))
    with pytest.raises(TypeError, match="sequence of workers"):
        pt.FederatedDataset.federate(_indexed(4), bob)
    with pytest.raises(ValueError, match=r"\(data, targets\)"):
        pt.FederatedDataset.federate(
            TensorDataset(torch.zeros(3), torch.zeros(3), torch.zeros(3)), (bob,)
        )
    assert len(bob.objects) == 0 and len(alice.objects) == 0
    with pytest.raises(ValueError, match="same length"):
        pt.WorkerDataset(pt.send(torch.zeros(3, 2), bob), pt.send(torch.zeros(2), bob))
    with pytest.raises(ValueError, match="different workers"):
        pt.WorkerDataset(pt.send(torch.zeros(3, 2), bob), pt.send(torch.zeros(3), alice))
    with pytest.raises(TypeError, match="PointerTensor"):
        pt.WorkerDataset(torch.zeros(3, 2), torch.zeros(3))
    with pytest.raises(ValueError, match="at least one"):
        pt.FederatedDataset([])


def test_federate_a_map_style_dataset_and_prebuilt_parts(new_workers):
    class Squares(Dataset):
        def __len__(self) -> int:
            return 6

        def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
            return torch.tensor([float(i), float(i * i)]), i % 2

    bob, alice = new_workers("bob", "alice")
    fed = pt.FederatedDataset.federate(Squares(), [bob, alice])
    assert fed.num_examples == {"bob": 3, "alice": 3}
    assert torch.equal(fed["alice"].data.copy().get()[:, 1], torch.tensor([9.0, 16.0, 25.0]))
    assert torch.equal(fed["alice"].targets.copy().get(), torch.tensor([1, 0, 1]))
    again = pt.FederatedDataset([fed["alice"], fed["bob"]])
    assert again.workers == ["alice", "bob"] and len(again) == 6


def test_dataset_federate_after_hook(new_workers):
    added = pt.hook(torch)
    assert "Dataset.federate" in added or hasattr(Dataset, "federate")
    bob, alice = new_workers("bob", "alice")
    fed = _indexed(6).federate((bob, alice))
    assert isinstance(fed, pt.FederatedDataset) and fed.num_examples == {"bob": 3, "alice": 3}
    assert "Dataset.federate" not in pt.hook(torch)  # twice is harmless


# ---------------------------------------------------------------------------------------
# FederatedDataLoader
# ---------------------------------------------------------------------------------------


@pytest.fixture
def fed3(new_workers: NewWorkers) -> pt.FederatedDataset:
    """23 examples over three workers: 10, 8 and 5."""
    return pt.FederatedDataset.federate(
        _indexed(23), new_workers("bob", "alice", "carol"), fractions=(10 / 23, 8 / 23, 5 / 23)
    )


def test_loader_batch_counts_with_and_without_drop_last(fed3):
    assert fed3.num_examples == {"bob": 10, "alice": 8, "carol": 5}
    for drop_last, expected in [
        (False, {"bob": 3, "alice": 2, "carol": 2}),
        (True, {"bob": 2, "alice": 2, "carol": 1}),
    ]:
        loader = pt.FederatedDataLoader(fed3, batch_size=4, drop_last=drop_last)
        assert {w: loader.num_batches(w) for w in fed3.workers} == expected
        batches = _epoch(loader)
        assert len(loader) == len(batches) == sum(expected.values())
        sizes = [len(ids) for _, ids, _ in batches]
        assert all(s == 4 for s in sizes) if drop_last else sorted(sizes) == [1, 2, 4, 4, 4, 4, 4]
    loader = pt.FederatedDataLoader(fed3, batch_size=6, drop_last=True)  # carol has 5 < 6
    assert loader.num_batches("carol") == 0 and len(loader) == 2 == len(_epoch(loader))


def test_loader_round_robin_and_per_worker_order(fed3):
    rr = pt.FederatedDataLoader(fed3, batch_size=4)
    assert [loc for loc, _, _ in _epoch(rr)] == [
        "bob", "alice", "carol", "bob", "alice", "carol", "bob",
    ]  # fmt: skip
    per = pt.FederatedDataLoader(fed3, batch_size=4, iter_per_worker=True)
    batches = _epoch(per)
    assert [loc for loc, _, _ in batches] == ["bob"] * 3 + ["alice"] * 2 + ["carol"] * 2
    assert [ids for _, ids, _ in batches][:3] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # in order
    one = [(d.location.id, d.get()[:, 0].long().tolist()) for d, _ in rr.worker_batches("alice")]
    assert one == [("alice", [10, 11, 12, 13]), ("alice", [14, 15, 16, 17])]


def test_loader_shuffles_at_the_worker_every_example_once_per_epoch(fed3):
    loader = pt.FederatedDataLoader(fed3, batch_size=3, shuffle=True, seed=7)
    parts = {"bob": range(0, 10), "alice": range(10, 18), "carol": range(18, 23)}
    epochs = [_epoch(loader) for _ in range(2)]
    for batches in epochs:
        seen = sorted(i for _, ids, _ in batches for i in ids)
        assert seen == list(range(23))  # every example exactly once
        for loc, ids, targets in batches:
            assert all(i in parts[loc] for i in ids)  # a batch comes from its worker's part
            assert targets == [i % 7 for i in ids]  # data and targets stay aligned
    assert epochs[0] != epochs[1]  # a fresh permutation each epoch
    bob = fed3.locations[0]
    before = bob.stats.bytes_received
    assert sum(1 for _ in pt.FederatedDataLoader(fed3, batch_size=3, shuffle=True, seed=7)) == 9
    assert bob.stats.bytes_received - before < 4096  # index commands only: no data travels
    gc.collect()
    for w in fed3.locations:  # batch copies are released with their pointers
        assert len(w.objects) == 2  # (objects sends the deletes of dropped pointers first)


def test_loader_shuffle_is_reproducible_by_seed(fed3):
    def run(seed: int, **kw: Any) -> list[Any]:
        loader = pt.FederatedDataLoader(fed3, batch_size=4, shuffle=True, seed=seed, **kw)
        return [_epoch(loader), _epoch(loader)]

    assert run(1) == run(1)
    assert run(1) != run(2)
    # each worker's permutations depend on the seed only, not on the iteration order
    per = run(1, iter_per_worker=True)
    assert sorted(run(1)[0]) == sorted(per[0]) and sorted(run(1)[1]) == sorted(per[1])
    unshuffled = _epoch(pt.FederatedDataLoader(fed3, batch_size=4, seed=1))
    assert unshuffled[0][1] == [0, 1, 2, 3] and unshuffled == _epoch(
        pt.FederatedDataLoader(fed3, batch_size=4, seed=2)
    )  # without shuffle the seed plays no part


def test_loader_rejects_bad_arguments(fed3):
    for bad in (0, -1, 1.5, True, None):
        with pytest.raises(ValueError, match="batch_size"):
            pt.FederatedDataLoader(fed3, batch_size=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FederatedDataset"):
        pt.FederatedDataLoader(_indexed(4), batch_size=2)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seed"):
        pt.FederatedDataLoader(fed3, seed="x")  # type: ignore[arg-type]


def test_the_seed_scenario_loop_with_a_loader(new_workers):
    pt.hook(torch)
    bob, alice = new_workers("bob", "alice")
    torch.manual_seed(0)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    loader = pt.FederatedDataLoader(
        TensorDataset(x, y).federate((bob, alice)), batch_size=8, shuffle=True, seed=0
    )
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        for data, target in loader:
            model.send(data.location)
            opt.zero_grad()
            loss = ((model(data) - target) ** 2).mean()
            loss.backward()
            opt.step()
            model.get()
    assert float(loss.get()) < 0.05


# ---------------------------------------------------------------------------------------
# FedAvg
# ---------------------------------------------------------------------------------------

ROUNDS, EPOCHS, LR, BATCH = 3, 2, 1.0, 64
FRAC_BITS = 16


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    x_train, y_train, x_test, y_test = load_digits_split(seed=0)
    return x_train.reshape(-1, 64), y_train, x_test.reshape(-1, 64), y_test


def _parts(x: torch.Tensor, fed: pt.FederatedDataset) -> dict[str, torch.Tensor]:
    """Each worker's examples, from the client's copy (federate splits contiguously)."""
    out, start = {}, 0
    for w, n in fed.num_examples.items():
        out[w] = x[start : start + n]
        start += n
    return out


def _initial_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(64, 10)


def _train(
    new_workers: NewWorkers, digits: Any, aggregator_for: Any = None, audit: Any = None
) -> tuple[Any, ...]:
    x_train, y_train, x_test, y_test = digits
    workers = new_workers("w1", "w2", "w3")
    if audit is not None:
        audit.watch(workers)
    fed = pt.FederatedDataset.federate(TensorDataset(x_train, y_train), workers)
    aggregator = None if aggregator_for is None else aggregator_for(workers)
    if audit is not None:
        audit.data = _parts(x_train, fed)
        aggregator = audit.spy(aggregator or pt.PlainAggregator())
    model, history = pt.fedavg(
        _initial_model(), fed, rounds=ROUNDS, epochs=EPOCHS, lr=LR, batch_size=BATCH,
        drop_last=True, seed=0, aggregator=aggregator,
        eval_fn=lambda m: accuracy(m, x_test, y_test),
    )  # fmt: skip
    return model, history, workers


@pytest.fixture(scope="module")
def _runs() -> dict[tuple[str, str], tuple[Any, ...]]:
    """Training runs shared by the tests of this module, by (run, worker kind)."""
    return {}


@pytest.fixture
def plain_run(_runs, worker_kind, new_workers, digits) -> tuple[Any, ...]:
    """(model, history, workers) of plain FedAvg on digits: trained once per worker kind."""
    if ("plain", worker_kind) not in _runs:
        _runs["plain", worker_kind] = _train(new_workers, digits)
    return _runs["plain", worker_kind]


def test_fedavg_plain_reaches_90_percent_on_digits(plain_run, digits):
    model, history, workers = plain_run
    x_test, y_test = digits[2], digits[3]
    acc = accuracy(model, x_test, y_test)
    print(f"plain FedAvg: test accuracy {acc:.4f}, loss per round {history.loss}")
    assert acc >= 0.90
    assert history.rounds == ROUNDS and history.metrics[-1] == acc
    assert history.loss[0] > history.loss[1] > history.loss[2]
    assert history.num_examples == {w.id: 449 for w in workers}
    assert all(type(p) is nn.Parameter and not pt.is_pointer(p) for p in model.parameters())


def _reference_fedavg(
    model: nn.Module, parts: list[tuple[torch.Tensor, ...]], lr: float, bs: int
) -> tuple[nn.Module, list[torch.Tensor]]:
    """One round of FedAvg done locally, unshuffled: the definition, for comparison.
    Returns the new model and each worker's flat delta."""
    total = sum(len(y) for _, y in parts)
    deltas = []
    for x, y in parts:
        local = copy.deepcopy(model)
        opt = torch.optim.SGD(local.parameters(), lr=lr)
        for s in range(0, len(y), bs):
            opt.zero_grad()
            nn.functional.cross_entropy(local(x[s : s + bs]), y[s : s + bs]).backward()
            opt.step()
        deltas.append([(a - b).detach() for a, b in zip(local.parameters(), model.parameters())])
    out = copy.deepcopy(model)
    with torch.no_grad():
        for i, p in enumerate(out.parameters()):
            p += sum(len(y) * d[i] for (_, y), d in zip(parts, deltas)) / total
    return out, [torch.cat([t.reshape(-1) for t in d]) for d in deltas]


class _Recording:
    """An aggregator that records what it was given (values read at the workers, without
    deleting them: ``worker.objects`` of either kind)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, torch.Tensor, int]] = []

    def aggregate(self, updates: Any) -> torch.Tensor:
        for u, n in updates:
            value = u.location.objects[u.id_at_location].clone()
            self.seen.append((u.location.id, value, n))
        return pt.PlainAggregator().aggregate(updates)


def test_fedavg_weights_deltas_by_example_counts(new_workers, digits):
    x, y = digits[0][:200], digits[1][:200]
    workers = new_workers("w1", "w2", "w3")
    fed = pt.FederatedDataset.federate((x, y), workers, fractions=(0.5, 0.3, 0.2))
    model = _initial_model()
    initial = copy.deepcopy(model)
    spy = _Recording()
    pt.fedavg(model, fed, rounds=1, epochs=1, lr=0.5, batch_size=16, shuffle=False, aggregator=spy)
    parts = [(x[:100], y[:100]), (x[100:160], y[100:160]), (x[160:], y[160:])]
    expected, deltas = _reference_fedavg(initial, parts, 0.5, 16)
    for a, b in zip(model.parameters(), expected.parameters()):
        assert torch.allclose(a, b, atol=1e-6)
    # each update is (trained - initial) flattened, plus the mean loss: a delta, not weights
    assert [(w, n) for w, _, n in spy.seen] == [(w.id, n) for w, n in zip(workers, (100, 60, 40))]
    for (_, update, _), delta in zip(spy.seen, deltas):
        assert update.shape == (64 * 10 + 10 + 1,)
        assert torch.allclose(update[:-1], delta, atol=1e-6)
        assert 0.0 < float(update[-1]) < 3.0  # the mean loss
    gc.collect()
    for w in workers:  # the local copies and their deltas are released
        assert len(w.objects) == 2  # (objects sends the deletes of dropped pointers first)


def test_fedavg_rejects_bad_arguments(new_workers, digits):
    (w,) = new_workers("w1")
    fed = pt.FederatedDataset.federate((digits[0][:10], digits[1][:10]), (w,))
    for kw, match in [
        ({"rounds": 0}, "rounds"), ({"epochs": 0}, "epochs"), ({"lr": 0.0}, "lr"),
        ({"batch_size": 0}, "batch_size"), ({"server_lr": -1.0}, "server_lr"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=match):
            pt.fedavg(nn.Linear(64, 10), fed, **kw)
    with pytest.raises(TypeError, match="aggregate"):
        pt.fedavg(nn.Linear(64, 10), fed, aggregator=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="FederatedDataset"):
        pt.fedavg(nn.Linear(64, 10), (digits[0], digits[1]))  # type: ignore[arg-type]
    sent = pt.send(nn.Linear(64, 10), w)
    with pytest.raises(ValueError, match="get\\(\\) it back"):
        pt.fedavg(sent, fed)
    with pytest.raises(ValueError, match="no worker"):
        pt.PlainAggregator().aggregate([])


# ---------------------------------------------------------------------------------------
# Secure aggregation
# ---------------------------------------------------------------------------------------


class Audit:
    """Records every tensor each worker stores or receives, every tensor that leaves a
    worker in a reply to the client (Fetch), and the true updates (read at their workers,
    without messages), then checks who saw what."""

    def __init__(self) -> None:
        self.stored: dict[str, list[torch.Tensor]] = {}
        self.to_client: dict[str, list[torch.Tensor]] = {}
        self.updates: dict[str, list[torch.Tensor]] = {}
        self.data: dict[str, torch.Tensor] = {}

    def watch(self, workers: list[pt.VirtualWorker]) -> None:
        for w in workers:
            self.stored[w.id], self.to_client[w.id], self.updates[w.id] = [], [], []
            put, handle = w.store.put, w.handle_frames

            def recording_put(
                obj_id: int, value: Any, *a: Any, _put=put, _id=w.id, **k: Any
            ) -> None:
                if isinstance(value, torch.Tensor):
                    self.stored[_id].append(value)
                _put(obj_id, value, *a, **k)

            def recording_handle(
                header: bytes, buffers: list[Any], _h=handle, _id=w.id, **kw: Any
            ) -> Any:
                out = _h(header, buffers, **kw)
                if isinstance(decode_message(header, buffers), Fetch):
                    reply = decode_message(*out)
                    if isinstance(reply, Reply) and isinstance(reply.value, torch.Tensor):
                        self.to_client[_id].append(reply.value.clone())
                return out

            w.store.put = recording_put  # type: ignore[method-assign]
            w.handle_frames = recording_handle  # type: ignore[method-assign]

    def spy(self, inner: Any) -> Any:
        audit = self

        class Spy:
            def aggregate(self, updates: Any) -> torch.Tensor:
                for u, _ in updates:
                    value = u.location.store.get(u.id_at_location).clone()  # test-only peek
                    audit.updates[u.location.id].append(value)
                return inner.aggregate(updates)

        return Spy()

    def _forms(self, of: str) -> dict[int, list[torch.Tensor]]:
        """``of``'s updates in the clear, by size: flat, per-tensor pieces (weight, bias),
        in float64 and fixed-point encoded (computed once)."""
        cache = self.__dict__.setdefault("_form_cache", {})
        if of not in cache:
            forms: dict[int, list[torch.Tensor]] = {}
            for u in self.updates[of]:
                for piece in (u, u[:640], u[640:650]):
                    forms.setdefault(piece.numel(), []).extend(
                        [piece.double(), encode(piece, FRAC_BITS)]
                    )
            cache[of] = forms
        return cache[of]

    def _is_clear_form(self, t: torch.Tensor, of: str) -> bool:
        candidates = self._forms(of).get(t.numel())
        if not candidates:
            return False
        flat = t.detach().reshape(-1)
        for f in candidates:
            if f.dtype == torch.float64 and flat.is_floating_point():
                if torch.allclose(flat.double(), f, atol=1e-7, rtol=0):
                    return True
            elif f.dtype == torch.int64 and not flat.is_floating_point():
                if torch.equal(flat.long(), f):
                    return True
        return False

    def _rows(self, x: torch.Tensor) -> set[bytes]:
        return {r.numpy().tobytes() for r in x.detach().reshape(-1, 64)}

    def _foreign_rows(self, t: torch.Tensor, holder: str) -> bool:
        """Whether ``t`` holds an example of another worker's part (and not of its own)."""
        if not t.is_floating_point() or t.dim() == 0 or t.shape[-1] != 64:
            return False
        if not hasattr(self, "_row_sets"):
            self._row_sets = {w: self._rows(x) for w, x in self.data.items()}
        rows = self._rows(t) - self._row_sets.get(holder, set())
        return any(rows & r for w, r in self._row_sets.items() if w != holder)

    def violations(self) -> list[str]:
        found = []
        for holder, tensors in self.stored.items():
            for t in tensors:
                for other in self.updates:
                    if other != holder and self._is_clear_form(t, of=other):
                        found.append(f"{holder} holds {other}'s update in the clear")
                if self._foreign_rows(t, holder):
                    found.append(f"{holder} holds another worker's examples")
        for sender, tensors in self.to_client.items():
            for t in tensors:
                for of in self.updates:
                    if self._is_clear_form(t, of=of):
                        found.append(f"the client received {of}'s update from {sender}")
        return sorted(set(found))


@pytest.fixture
def secure_run(_runs, worker_kind, new_workers, digits) -> tuple[Any, ...]:
    """(model, history, workers, audit) of secure FedAvg on digits, the data workers being
    the aggregation parties: trained once per worker kind. The audit wraps in-process
    workers: it is None on network workers."""
    if ("secure", worker_kind) not in _runs:
        audit = Audit() if worker_kind == "virtual" else None
        model, history, workers = _train(
            new_workers, digits, lambda ws: mpc.SecureAggregator(ws, frac_bits=FRAC_BITS), audit
        )
        _runs["secure", worker_kind] = (model, history, workers, audit)
    return _runs["secure", worker_kind]


def test_secure_fedavg_reaches_90_percent_and_equals_plain(secure_run, plain_run, digits):
    model, history, _, _ = secure_run
    plain_model, plain_history, _ = plain_run
    acc = accuracy(model, digits[2], digits[3])
    print(f"secure FedAvg: test accuracy {acc:.4f}, loss per round {history.loss}")
    assert acc >= 0.90
    # Each round's mean is exact to 2^-(f+1) per coordinate (one rounding per update,
    # averaged); training carries the difference along. Allow 4x per round.
    tolerance = ROUNDS * 4 * 2.0**-FRAC_BITS
    for a, b in zip(model.parameters(), plain_model.parameters()):
        assert (a - b).abs().max() <= tolerance
    assert history.loss == pytest.approx(plain_history.loss, abs=tolerance)
    assert history.metrics == pytest.approx(plain_history.metrics, abs=2 / len(digits[3]))


@pytest.mark.virtual_only("the audit wraps an in-process worker's store and message handler")
def test_audit_no_worker_or_server_sees_an_individual_update_or_foreign_data(secure_run):
    _, _, workers, audit = secure_run
    assert all(len(audit.updates[w.id]) == ROUNDS for w in workers)
    assert all(len(audit.stored[w.id]) > 100 for w in workers)  # the audit saw the training
    assert audit.violations() == []
    # what left each worker towards the client: one share of the weighted sum per round
    d = 64 * 10 + 10 + 1
    for w in workers:
        replies = audit.to_client[w.id]
        assert len(replies) == ROUNDS
        assert all(r.dtype == torch.int64 and r.shape == (d,) for r in replies)


@pytest.mark.virtual_only("the audit wraps an in-process worker's store and message handler")
def test_audit_catches_plain_fedavg_and_moved_data(new_workers, digits):
    """The audit is not vacuous: plain FedAvg sends every delta to the server in the clear."""
    audit = Audit()
    x, y = digits[0][:120], digits[1][:120]
    workers = new_workers("w1", "w2", "w3")
    audit.watch(workers)
    fed = pt.FederatedDataset.federate((x, y), workers)
    audit.data = _parts(x, fed)
    pt.fedavg(
        _initial_model(), fed, rounds=1, batch_size=20, aggregator=audit.spy(pt.PlainAggregator())
    )
    found = audit.violations()
    assert [f"the client received {w}'s update from {w}" for w in ("w1", "w2", "w3")] == found
    fed["w1"].data[:3].move(workers[1])
    assert "w2 holds another worker's examples" in audit.violations()
    leaked = audit.updates["w1"][0]
    audit.stored["w3"].append(encode(leaked[640:650], FRAC_BITS))  # as if w3 got w1's bias delta
    assert "w3 holds w1's update in the clear" in audit.violations()


def test_secure_aggregator_matches_the_plain_mean_to_fixed_point_precision(new_workers):
    data_workers = new_workers("w1", "w2", "w3")
    parties = new_workers("agg1", "agg2")
    (dealer,) = new_workers("dealer")
    agg = mpc.SecureAggregator(parties, crypto_provider=dealer)
    gen = torch.Generator().manual_seed(3)
    values = [torch.randn(50, generator=gen) * 3 for _ in data_workers]
    counts = [5, 300, 17]

    def updates() -> list[tuple[pt.PointerTensor, int]]:
        return [(pt.send(v, w), n) for v, w, n in zip(values, data_workers, counts)]

    plain = pt.PlainAggregator().aggregate(updates())
    exact = sum(n * v.double() for v, n in zip(values, counts)) / sum(counts)
    before = [w.stats.snapshot() for w in data_workers]
    secure = agg.aggregate(updates())
    assert (secure.double() - exact).abs().max() <= 2.0 ** -(agg.frac_bits + 1) + 1e-6
    assert torch.allclose(secure, plain, atol=2.0**-agg.frac_bits)
    for w, b in zip(data_workers, before):
        assert w.stats.peer_messages_sent - b.peer_messages_sent == 2  # one share per party
        after = w.stats
        assert after.messages_sent - b.messages_sent <= 4  # store, share, two moves
        # no reply carries a value: each is an empty acknowledgement (a value: >= 400 B)
        assert after.bytes_sent - b.bytes_sent <= 16 * (after.messages_sent - b.messages_sent)
        assert len(w.objects) == 0  # the worker keeps no share
    assert dealer.stats.peer_messages_sent == 2  # only the session's seeds: no material
    shared = agg.share_update(pt.send(values[0], data_workers[0]))
    assert isinstance(shared, mpc.SharedTensor) and shared.parties == parties
    # one owner's update never opens (its release rule: an aggregate of two owners)
    fetched = shared.get()  # PySyft's fetch of the shared tensor: it stays shared
    assert isinstance(fetched, mpc.OwnedShared)
    with pytest.raises(mpc.ReleaseRuleError, match="at least 2 owners"):
        fetched.get()
    other = agg.share_update(pt.send(values[1], data_workers[1]))
    assert torch.allclose((shared + other).get(), (values[0] + values[1]).double(), atol=2.0**-15)


def test_secure_aggregation_refuses_updates_too_large(new_workers):
    """The data worker's own error reaches the caller. On network workers it is posted, so
    held on its connection, and the parties' get() fails first, with the follow-on error
    (the data worker could not deliver its shares): the root cause is raised instead."""
    w, w2 = new_workers("w1", "w2")
    parties = new_workers("agg1", "agg2")
    agg = mpc.SecureAggregator(parties)
    with pytest.raises(pt.RemoteError, match="too large") as caught:
        agg.aggregate(  # 1e11 * 1000 * 2^16 > 2^62
            [(pt.send(torch.tensor([1e11]), w), 1000), (pt.send(torch.tensor([1.0]), w2), 1)]
        )
    assert caught.value.worker == w.id
    # reported once: the workers stay usable and raise nothing more
    assert torch.equal(pt.send(torch.ones(2), parties[0]).get(), torch.ones(2))
    two = [(pt.send(torch.tensor([2.0]), w), 1), (pt.send(torch.tensor([4.0]), w2), 1)]
    assert agg.aggregate(two).item() == pytest.approx(3.0)
    # one worker's update alone is never opened: refused before anything is shared
    with pytest.raises(mpc.ReleaseRuleError, match="at least 2"):
        agg.aggregate([(pt.send(torch.tensor([2.0]), w), 1)])


def test_secure_aggregation_errors(new_workers):
    (w,) = new_workers("w1")
    parties = new_workers("agg1", "agg2")
    agg = mpc.SecureAggregator(parties)
    with pytest.raises(mpc.MPCError, match="PointerTensor"):
        agg.share_update(torch.ones(3))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="2 to"):
        mpc.SecureAggregator(parties[:1])
    with pytest.raises(TypeError, match="sequence"):
        mpc.SecureAggregator(parties[0])
    with pytest.raises(ValueError, match="same length|differ"):
        agg.aggregate([(pt.send(torch.ones(3), w), 1), (pt.send(torch.ones(4), parties[0]), 1)])
    fed = pt.FederatedDataset.federate((torch.zeros(4, 64), torch.zeros(4, dtype=torch.long)), (w,))
    with pytest.raises(TypeError, match="aggregator"):
        mpc.secure_fedavg(nn.Linear(64, 10), fed, parties, aggregator=agg)


def test_secure_fedavg_shortcut_with_a_dealer(new_workers, digits):
    workers = new_workers("w1", "w2")
    fed = pt.FederatedDataset.federate((digits[0][:100], digits[1][:100]), workers)
    aggs = new_workers("agg1", "agg2")
    (dealer,) = new_workers("dealer")
    model, history = mpc.secure_fedavg(_initial_model(), fed, aggs, dealer, rounds=1, batch_size=25)
    assert history.rounds == 1 and 0.0 < history.loss[0] < 3.0
    assert isinstance(model.weight, nn.Parameter) and not pt.is_pointer(model.weight)
