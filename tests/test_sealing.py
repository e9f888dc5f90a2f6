"""Protocol material is sealed at the workers: a client cannot fetch, copy, describe, tag
or search the seeds, masks, openings, corrections and triples a protocol creates, while
they exist, op by op and inside a plan run (issue 10). The shares of outputs stay
fetchable. Runs on both worker kinds (conftest.py): on network workers this is the trust
boundary; in process it checks the same rules on the message path.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import mpc
import pointers as pt
from mpc.protocols import parties as party_calls
from mpc.protocols.beaver import run as beaver_run
from mpc.protocols.comparison import base as comparison_base
from mpc.protocols.comparison import run as comparison_run
from mpc.protocols.functions import MAKES_MATERIAL
from mpc.protocols.opening import run as opening_run
from mpc.protocols.truncation import run as truncation_run
from pointers.pointer_tensor import search_worker
from pointers.wire.messages import (
    CallFunction,
    Describe,
    ExecuteOp,
    RunProgram,
    SendToPeer,
    Store,
    Tag,
)
from pointers.wire.serde import Slot, SlotRef

mpc_plan = importlib.import_module("mpc.plan")  # (mpc.plan is also the function)


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _sync(worker: Any) -> None:
    worker.request(Describe([]))  # a network worker's earlier errors surface here


def assert_sealed(p: pt.PointerTensor) -> None:
    """Every way a client could read ``p``'s object is refused, naming the rule."""
    w, i = p.location, p.id_at_location
    attempts = {
        "fetch": lambda: p.get(delete=False),
        "copy then fetch": lambda: p.copy().get(),
        "describe": lambda: w.request(Describe([i])),
        "tag": lambda: w.request(Tag(i, ["mine"], "")),
        "an op on it": lambda: (p + 0).get(),
    }
    for what, attempt in attempts.items():
        with pytest.raises(pt.RemoteError, match="sealed") as err:
            attempt()
            _sync(w)
        assert "protocol material" in str(err.value), what
    assert i not in [q.id_at_location for q in search_worker(w, ("mine",))]


class MaterialSpy:
    """Collects pointers to the material the client makes the workers create (outputs of
    sealing protocol functions, the dealer's corrections, the values opened among the
    parties) and probes every one of them at each opening, mid-protocol."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.material: list[pt.PointerTensor] = []
        self.probes = 0
        self._seen = 0
        orig_call, orig_deal, orig_open = party_calls.call, party_calls.deal, opening_run.open_among

        def call(worker: Any, name: str, args: list[Any], out: Any) -> Any:
            got = orig_call(worker, name, args, out)
            if name in MAKES_MATERIAL:
                self.material += [g for g in got if g is not None]
            return got

        def deal(*args: Any, **kwargs: Any) -> Any:
            got = orig_deal(*args, **kwargs)
            self.material += got
            return got

        def open_among(session: Any, values: Any, *args: Any, **kwargs: Any) -> Any:
            got = orig_open(session, values, *args, **kwargs)
            self.material += [p for opened in got for p in opened]
            self.probe()
            return got

        for module in (
            party_calls,
            opening_run,
            beaver_run,
            truncation_run,
            comparison_base,
            comparison_run,
        ):  # where the protocols look these names up
            for name, spy in (("call", call), ("deal", deal), ("open_among", open_among)):
                if hasattr(module, name):
                    monkeypatch.setattr(module, name, spy)

    def probe(self, everything: bool = False) -> None:
        """Probe the material made since the last probe (``everything``: all of it that
        still exists)."""
        fresh = self.material if everything else self.material[self._seen :]
        self._seen = len(self.material)
        for p in fresh:
            if p._ref.gone:  # moved on (a dealer's correction, now at the last party)
                continue
            assert_sealed(p)
            self.probes += 1


def test_seeds_are_sealed(trio: Any) -> None:
    alice, bob, carol = trio
    x = mpc.share(torch.tensor([1.0, 2.0]), alice, bob, crypto_provider=carol)
    for seed in x.session.party_seeds + x.session.dealer_seeds:
        assert_sealed(seed)
    # a seed leaves its dealer once, to its party: no copy of it can be made again (the
    # nonce rule: a seed's used nonces are recorded wherever a copy of it exists)
    for seed in (x.session.party_seeds[0], x.session.dealer_seeds[0]):
        with pytest.raises(pt.RemoteError, match="again"):
            seed.copy_to(bob)
            _sync(seed.location)
    # the shares themselves are the caller's to reconstruct
    assert torch.allclose(x.get(), torch.tensor([1.0, 2.0]))


@pytest.mark.parametrize(
    "fn",
    [
        lambda a, b: a * b,
        lambda a, b: a @ b.t(),
        lambda a, b: (a < b) * 1.0,
        lambda a, b: F.relu(a * b),
        lambda a, b: (a + b).max(dim=1).values,
    ],
    ids=["mul", "matmul", "comparison", "relu", "max"],
)
def test_op_by_op_material_is_sealed_while_it_exists(
    trio: Any, monkeypatch: pytest.MonkeyPatch, fn: Callable[..., Any]
) -> None:
    alice, bob, carol = trio
    a, b = torch.randn(2, 3), torch.randn(2, 3)
    x = mpc.share(a, alice, bob, crypto_provider=carol)
    y = mpc.share(b, alice, bob, crypto_provider=carol)
    spy = MaterialSpy(monkeypatch)
    out = fn(x, y)
    assert spy.probes > 0
    spy.probe(everything=True)  # and at the end, while the client still holds the pointers
    assert torch.allclose(out.get(), fn(a, b), atol=2e-3)  # the output is revealed


def _material_slots(programs: dict[str, list[Any]]) -> dict[str, set[int]]:
    """Per worker, the slots of the objects a program creates there that are protocol
    material: sealing functions' outputs, ops on material, deliveries of material."""
    sealed_outputs = MAKES_MATERIAL
    material: dict[str, set[int]] = {w: set() for w in programs}

    def refs(o: Any) -> set[int]:
        if isinstance(o, SlotRef):
            return {o.index}
        if isinstance(o, list | tuple):
            return set().union(*(refs(x) for x in o)) if o else set()
        if isinstance(o, dict):
            return refs(list(o.values()))
        return set()

    changed = True
    while changed:
        changed = False
        for wid, cmds in programs.items():
            for raw in cmds:
                kind, new = raw[0], set()
                if kind == CallFunction.KIND and raw[1] in sealed_outputs:
                    new = {o.index for o in raw[4] if isinstance(o, Slot)}
                elif kind == ExecuteOp.KIND and refs(raw[2]) & material[wid]:
                    new = {o.index for o in raw[4] if isinstance(o, Slot)}
                elif kind == SendToPeer.KIND and isinstance(raw[1], Slot):
                    if raw[1].index in material[wid] and isinstance(raw[3], Slot):
                        dest = material.setdefault(raw[2], set())
                        if raw[3].index not in dest:
                            dest.add(raw[3].index)
                            changed = True
                if new - material[wid]:
                    material[wid] |= new
                    changed = True
    return material


def _present(worker: Any) -> set[int]:
    if isinstance(worker, pt.VirtualWorker):
        return set(worker.store.view())
    return set(worker.objects)


def test_material_inside_a_plan_run_is_sealed(trio: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The parties start their programs while the dealer's is held back: the last party
    waits for the dealer's corrections, and meanwhile every material object that exists
    at the parties is probed."""
    alice, bob, carol = trio
    a, b = torch.randn(6), torch.randn(6)
    x = mpc.share(a, alice, bob, crypto_provider=carol)
    y = mpc.share(b, alice, bob, crypto_provider=carol)
    p = mpc.plan(lambda u, v: F.relu(u * v), x, y)
    (variant,) = p._variants.values()
    material = _material_slots(variant.programs)
    assert material["alice"] and material["bob"] and material["carol"]
    probed: list[int] = []
    original = mpc_plan.run_programs

    def run_parties_first(
        program_ids: Any, workers: Any, bindings: Any, promised: Any, held: Any = None
    ) -> None:
        *parties, dealer = workers
        for w in parties:
            w.post(RunProgram(program_ids[w.id], bindings, promised[w.id]))
        for w in parties:
            _sync(w)
            ids = {bindings[k] for k in material[w.id]} & _present(w)
            for i in ids:
                probe = pt.PointerTensor.from_meta(w, i, (1,), (1,), torch.int64, owned=False)
                with pytest.raises(pt.RemoteError, match="sealed"):
                    probe.get(delete=False)
                probed.append(i)
        dealer.post(RunProgram(program_ids[dealer.id], bindings, promised[dealer.id]))

    monkeypatch.setattr(mpc_plan, "run_programs", run_parties_first)
    a2, b2 = torch.randn(6), torch.randn(6)
    out = p(
        mpc.share(a2, alice, bob, crypto_provider=carol),
        mpc.share(b2, alice, bob, crypto_provider=carol),
    )
    assert torch.allclose(out.get(), F.relu(a2 * b2), atol=2e-3)
    assert probed, "no material object existed while the last party waited"
    monkeypatch.setattr(mpc_plan, "run_programs", original)


def test_a_client_cannot_store_or_smuggle_material(trio: Any) -> None:
    alice, bob, carol = trio
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    session = x.session
    with pytest.raises(pt.RemoteError, match="sealed"):
        alice.request(Store(alice.new_id(), torch.zeros(3, dtype=torch.int64), [], "", True))
    nonce = session.next_nonce()
    fake_seed = pt.send(torch.zeros(16, dtype=torch.uint8), alice)
    out = [((3,), torch.int64)]
    with pytest.raises(pt.RemoteError, match="takes protocol material only"):
        pt.call_function(alice, "mpc.trunc_mask", [fake_seed, nonce, x.shares[0]], out=out)
        _sync(alice)
    # a seed passed where a share goes: refused, nothing computed from it
    with pytest.raises(pt.RemoteError, match="sealed"):
        pt.call_function(
            alice,
            "mpc.bilinear_public",
            [session.party_seeds[0], torch.ones(16, dtype=torch.int64), False, "mul", {}],
            out=[((16,), torch.int64)],
        )
        _sync(alice)
    # writing material into a client's own tensor
    own = pt.send(torch.zeros(16, dtype=torch.uint8), alice)
    with pytest.raises(pt.RemoteError, match="sealed"):
        own.add_(session.party_seeds[0])
        _sync(alice)
    assert torch.equal(x.get(), torch.ones(3))


def test_spent_material_lets_go_of_its_memory() -> None:
    """A step's consumed material keeps only its shape and dtype in the store (a BERT-base
    party held gigabytes of spent material until the client deleted the ids), while the
    values that are not material, and the result, are whole."""
    from pointers.worker.sealing import SPENT, Label

    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    a, b = torch.rand(4096) - 0.5, torch.rand(4096) - 0.5
    x = mpc.share(a, alice, bob, crypto_provider=carol)
    y = mpc.share(b, alice, bob, crypto_provider=carol)
    z = x * y
    spent = [
        e.value
        for w in (alice, bob)
        for e in w.store._entries.values()
        if (label := Label.of(e.sealed)) is not None and label.kind == SPENT
    ]
    tensors = [v for v in spent if isinstance(v, torch.Tensor) and v.dim() > 0]
    assert tensors, "a product consumes material at each party"
    for v in tensors:
        assert v.untyped_storage().nbytes() <= 8, (tuple(v.shape), v.untyped_storage().nbytes())
        assert v.shape[-1] >= 1 and v.dtype == torch.int64
        with pytest.raises(RuntimeError):  # one stand-in serves a shape: it takes no write
            v.add_(1)
    by_shape: dict[tuple[int, ...], set[int]] = {}
    for v in tensors:
        by_shape.setdefault(tuple(v.shape), set()).add(id(v))
    assert all(len(ids) == 1 for ids in by_shape.values()), by_shape  # (made once a shape)
    assert torch.allclose(z.get(), a * b, atol=1e-3)
    assert torch.allclose(x.get(), a, atol=1e-4)  # the operands are not material: whole
