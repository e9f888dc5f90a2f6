"""Weight instances of a model its owner shares from its own worker (issue 23): the first
approved query makes an instance of each weight it multiplies (F = W - B opened once, B
at the dealer) and its run keeps them; every later approved query takes them through
carried slots and opens only its activations. The attacks are sent as a client that does
not follow the protocol would send them (mpc.held, pointers.worker.holding)."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
from torch import nn

import mpc
import pointers as pt
from mpc.plan import slots_of
from mpc.protocols.opening.run import Round
from mpc.protocols.weights.run import WeightInstance, WeightRun
from mpc.shared import SharedTensor, share_tensor
from pointers.errors import NotAllowedError, PointerError, RemoteError
from pointers.pointer_tensor import PointerTensor, RemoteRef
from pointers.worker import holding
from pointers.worker.sealing import Label, seal

PARTIES = ["alice", "bob"]
REFUSED = (RemoteError, NotAllowedError, PointerError)


class Deployment:
    """Two weights of the same shape (so that swapping them is the attack to refuse)."""

    def __init__(self) -> None:
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))
        self.plain = copy.deepcopy(self.model)
        self.x = torch.randn(2, 16)
        approval = mpc.approve(self.model, self.x, parties=PARTIES, crypto_provider="carol")
        self.approval = approval
        model_ptr = mpc.offer(self.model, pt.VirtualWorker("owner"), approval)
        self.parties = [pt.VirtualWorker(p) for p in PARTIES]
        self.carol = pt.VirtualWorker("carol")
        for w in (*self.parties, self.carol):
            w.store.wait_seconds = 2.0  # (a refused party's peers stop waiting soon)
        self.held = mpc.share(model_ptr, *self.parties, crypto_provider=self.carol)
        self.query = mpc.plan(self.held, self.share(self.x))

    def share(self, x: torch.Tensor) -> SharedTensor:
        return mpc.share(x, *self.parties, crypto_provider=self.carol)

    def check(self, out: SharedTensor, x: torch.Tensor) -> None:
        with torch.no_grad():
            expected = self.plain(x)
        assert (out.get() - expected).abs().max() < 1e-2

    def kept(self) -> dict[str, dict[int, dict[str, int]]]:
        """Per worker, per instance (its weight nonce), the ids of what the first run kept:
        'w' (the weight's copy) and 'f' (the opened F) at the parties, 'b' at the dealer."""
        out: dict[str, dict[int, dict[str, int]]] = {}
        for p in self.parties:
            records = p.function_state.get("mpc.weight_instances", {})
            by_tensor = {id(ref()): weight for weight, (ref, _) in records.items()}
            mine: dict[int, dict[str, int]] = {}
            for obj_id in list(p.store.view()):
                entry = p.store.entry(obj_id)
                label = Label.of(entry.sealed)
                if label is None:
                    continue
                if label.kind == holding.HELD_INSTANCE and id(entry.value) in by_tensor:
                    mine.setdefault(by_tensor[id(entry.value)], {})["w"] = obj_id
                elif label.kind == "open:weight.f":
                    mine.setdefault(label.nonce, {})["f"] = obj_id
            out[p.id] = {k: v for k, v in mine.items() if len(v) == 2}
        dealer: dict[int, dict[str, int]] = {}
        for obj_id in list(self.carol.store.view()):
            label = Label.of(self.carol.store.entry(obj_id).sealed)
            if label is not None and label.kind == "dealer.weight":
                dealer[label.nonce] = {"b": obj_id}
        out[self.carol.id] = {n: v for n, v in dealer.items() if n in out["alice"]}
        return out


@pytest.fixture(scope="module")
def dep() -> Deployment:
    d = Deployment()
    with mpc.stats() as s:  # the first query: it makes and keeps the instances
        d.check(d.query(d.share(d.x)), d.x)
    d.first_bytes = s.max_bytes_per_party  # type: ignore[attr-defined]
    return d


def _ptr(worker: Any, obj_id: int, like: torch.Tensor) -> PointerTensor:
    ref = RemoteRef(worker, obj_id, owned=False)  # (the attacker's pointer deletes nothing)
    return PointerTensor(ref, tuple(like.shape), like.stride(), torch.int64)


@contextlib.contextmanager
def bindings_changed(plan: Any, change: Callable[[Any, list[int]], None]) -> Iterator[None]:
    """The client sends its runs with ``change(variant, bindings)`` applied."""
    honest = plan._bindings

    def changed(variant: Any, input_ids: Any) -> Any:
        bindings, promised = honest(variant, input_ids)
        change(variant, bindings)
        return bindings, promised

    plan._bindings = changed
    try:
        yield
    finally:
        del plan._bindings


def test_later_queries_open_only_the_activations(dep: Deployment) -> None:
    x = torch.randn(2, 16)
    with mpc.stats() as s:
        out = dep.query(dep.share(x))
    dep.check(out, x)
    # the first query opened F = W - B of both 16 x 16 weights (2 KiB each, per party)
    assert dep.first_bytes - s.max_bytes_per_party >= 2 * 16 * 16 * 8  # type: ignore[attr-defined]
    for _ in range(2):  # the kept instances serve every later query (F is not spent)
        x = torch.randn(2, 16)
        dep.check(dep.query(dep.share(x)), x)


def test_kept_objects_are_sealed(dep: Deployment) -> None:
    alice, bob = dep.parties
    kept = dep.kept()
    assert len(kept["alice"]) == 2 and len(kept["carol"]) == 2
    for inst in kept["alice"].values():
        for obj_id in inst.values():
            ptr = _ptr(alice, obj_id, torch.empty(16, 16))
            with pytest.raises(REFUSED, match="sealed"):
                ptr.get()
            with pytest.raises(REFUSED, match="sealed"):
                (ptr + 0).get()
            with pytest.raises(REFUSED):
                ptr.copy().move(bob)


def _instance(dep: Deployment, weight: int, w: list[PointerTensor]) -> WeightInstance:
    kept = dep.kept()
    inst = WeightInstance.__new__(WeightInstance)
    inst.weight, inst.w, inst.frac_bits, inst.epoch = weight, w, 16, 0
    inst.f = [_ptr(p, kept[p.id][weight]["f"], w[0]) for p in dep.parties]
    inst.b = _ptr(dep.carol, kept["carol"][weight]["b"], w[0])
    inst.base_shares = []
    return inst


def _attack_product(dep: Deployment, inst: WeightInstance) -> None:
    """A product x @ W of the attacker's x with a kept instance, outside any run."""
    session = dep.query.session
    x = share_tensor(torch.randn(2, 16), session)  # the attacker's operand
    run = WeightRun(session, inst, None, list(x.shares), False, "matmul", {}, (2, 16))
    one = Round(session)
    run.open_in(one)
    one.open()
    z = run.finish()
    SharedTensor(z, session, 16, torch.float32, 1).get()


def test_a_kept_instance_outside_a_run_is_refused(dep: Deployment) -> None:
    """F (and the dealer's B) with operands of the client's choosing: refused, with the
    kept weight (sealed: it is the owner's) or with a weight of the client's own (not the
    share the instance masked)."""
    kept = dep.kept()
    weight = next(iter(kept["alice"]))
    w = [_ptr(p, kept[p.id][weight]["w"], torch.empty(16, 16)) for p in dep.parties]
    with pytest.raises(REFUSED, match="takes a share"):
        _attack_product(dep, _instance(dep, weight, w))
    own = share_tensor(torch.randn(16, 16), dep.query.session)
    with pytest.raises(REFUSED, match="must be the share that weight instance"):
        _attack_product(dep, _instance(dep, weight, list(own.shares)))


def _carried_at(dep: Deployment, worker: str, kind: str) -> list[int]:
    """The later program's carried slots at ``worker`` of one kind: 'w' (kept weights),
    'f' (kept F), 'nonce' (an instance's weight nonce) or, at the dealer, 'b' (its B)."""
    q, kept = dep.query, dep.kept()
    values: dict[int, str] = {}
    for weight, inst in kept[worker].items():
        values[weight] = "nonce"
        for k, v in inst.items():
            values[v] = k
    assert q.later.carry is not None
    mine = slots_of(q.later.programs[worker])
    carry = q.later.carry
    return [k2 for k2, k1 in q.carried.items() if k2 in mine and values.get(carry[k1]) == kind]


def _swap(later: Any, slots: list[int]) -> Callable[[Any, list[int]], None]:
    def change(variant: Any, b: list[int]) -> None:
        if variant is later:
            b[slots[0]], b[slots[1]] = b[slots[1]], b[slots[0]]

    return change


def test_carried_weights_swapped_are_refused(dep: Deployment) -> None:
    """The two 16 x 16 weights' kept copies swapped between their slots: the key of each
    (which kept slot of which approved program made it) is in the digest."""
    slots = _carried_at(dep, "alice", "w")
    assert len(slots) == 2
    swap = _swap(dep.query.later, slots)
    with bindings_changed(dep.query, swap), pytest.raises(REFUSED, match="approved"):
        dep.query(dep.share(dep.x)).get()


def test_a_carried_slot_bound_to_the_clients_own_share_is_refused(dep: Deployment) -> None:
    own = share_tensor(torch.randn(16, 16), dep.query.session)
    (slot, _) = _carried_at(dep, "alice", "w")

    def change(variant: Any, b: list[int]) -> None:
        if variant is dep.query.later:
            b[slot] = own.shares[0].id_at_location

    with bindings_changed(dep.query, change), pytest.raises(REFUSED, match="approved"):
        dep.query(dep.share(dep.x)).get()


def test_carried_material_swapped_is_refused(dep: Deployment) -> None:
    """F, the weight nonce and the dealer's B of the two instances swapped, the weights'
    copies left in place (the digest holds): the product step refuses F with a weight
    that its instance did not mask, at every party; the output never opens."""
    swaps = []
    for party in ("alice", "bob"):
        for kind in ("f", "nonce"):
            swaps.append(_carried_at(dep, party, kind))
    swaps.append(_carried_at(dep, "carol", "b"))

    def change(variant: Any, b: list[int]) -> None:
        if variant is not dep.query.later:
            return
        for pair in {tuple(pair) for pair in swaps}:  # (a nonce slot is both parties')
            b[pair[0]], b[pair[1]] = b[pair[1]], b[pair[0]]

    assert all(len(pair) == 2 for pair in swaps), swaps
    with (
        bindings_changed(dep.query, change),
        pytest.raises(REFUSED, match="must be the share that weight instance"),
    ):
        dep.query(dep.share(dep.x)).get()
    x = torch.randn(2, 16)  # the honest client's next query still works
    dep.check(dep.query(dep.share(x)), x)


def test_an_activation_mask_is_never_reused(dep: Deployment) -> None:
    """A later query whose product nonces are an earlier query's: the masks A (and the
    dealer's C) are never derived twice, so the run fails and nothing opens."""
    dep.check(dep.query(dep.share(dep.x)), dep.x)
    earlier = list(dep.query.last_bindings)
    extras = [k for k, (kind, _) in enumerate(dep.query.later.slots.kind) if kind == "extra"]
    assert extras

    def change(variant: Any, b: list[int]) -> None:
        if variant is dep.query.later:
            for k in extras:
                b[k] = earlier[k]

    with bindings_changed(dep.query, change), pytest.raises(REFUSED, match="never used twice"):
        dep.query(dep.share(dep.x)).get()


def test_a_kept_slot_takes_a_new_id(dep: Deployment) -> None:
    """The first program's kept slot bound to an object that exists (the kept weight):
    refused before anything runs (the run would relabel or keep that object)."""
    q = dep.query
    kept = dep.kept()
    existing = next(iter(kept["alice"].values()))["w"]
    keep_slot = q.keeps["alice"][0]

    def change(variant: Any, b: list[int]) -> None:
        if variant is q._first:
            b[keep_slot] = existing

    q.made = False  # (the client runs the first program again)
    try:
        with bindings_changed(q, change), pytest.raises(REFUSED, match="kept slot"):
            q(dep.share(dep.x)).get()
    finally:
        q.made = True


def test_kept_objects_are_their_owners_only() -> None:
    """A carried slot bound to what an approved run of another owner kept is refused; a
    kept object is never sent."""
    w = pt.VirtualWorker("alice-unit")
    approvals = [["alice-unit", "0" * 64]]
    share = Label(holding.HELD_SHARE, 0, 0, "o1", 0, ("o1", "p", "d" * 64, approvals)).wire()
    w.store.put(1, torch.zeros(2), None, "", share)
    w.store.put(2, torch.zeros(2), None, "", seal(holding.HELD_INSTANCE, deliveries=0,
                                                  extra=("o2", "k", "t")))  # fmt: skip
    with pytest.raises(NotAllowedError, match="another owner"):
        holding.begin("alice-unit", w.store, {}, [], [1, 2], [[0, "p"], [1, holding.CARRIED]], [])
    with pytest.raises(NotAllowedError, match="refused"):
        holding.check_send(seal(holding.HELD_INSTANCE, deliveries=0, extra=("o1", "k")))


def test_material_dealt_ahead_of_the_first_query() -> None:
    """preprocess before the first query deals the first program's set (its instances'
    ids and nonces are then fixed) and the later queries' sets after it."""
    d = Deployment()
    d.query.preprocess(3)
    assert d.query.prepared() == 3
    sent = []
    for _ in range(3):
        x = torch.randn(2, 16)
        with mpc.stats() as s:
            d.check(d.query(d.share(x)), x)
        sent.append(s.max_bytes_per_party)
    assert d.query.prepared() == 0
    assert sent[1] == sent[2] < sent[0]


def test_after_a_failed_first_query_the_instances_are_made_again() -> None:
    """A first query whose run failed at the parties (here: the client bound one nonce
    to all its nonce slots): nothing is kept, the later program is refused;
    forget_instances makes the next query a first query again."""
    d = Deployment()
    q = d.query
    extras = [k for k, (kind, _) in enumerate(q._first.slots.kind) if kind == "extra"]
    assert len(extras) > 1

    def change(variant: Any, b: list[int]) -> None:
        if variant is q._first:
            for k in extras:
                b[k] = b[extras[0]]

    with bindings_changed(q, change), pytest.raises(REFUSED, match="before|used twice"):
        q(d.share(d.x)).get()
    assert not d.kept()["alice"]
    with pytest.raises(REFUSED, match="approved"):  # (its carried slots: nothing kept)
        q(d.share(d.x)).get()
    q.forget_instances()
    for _ in range(2):
        x = torch.randn(2, 16)
        d.check(q(d.share(x)), x)
    assert len(d.kept()["alice"]) == 2
