"""A model owner's weights shared from its own worker (issue 23, point 3): the client runs
the plan the owner approved and opens its output, and nothing else (mpc.held,
pointers.worker.holding). Attacks are sent as a client that does not follow the protocol
would send them."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import mpc
import pointers as pt
from mpc.held import HeldError, HeldShared
from mpc.material.held import FUNCTIONS as HELD_FUNCTIONS
from pointers.errors import NotAllowedError, PointerError, RemoteError
from pointers.wire.messages import ExecuteOp, RunProgram
from pointers.wire.serde import Ref
from pointers.worker import holding
from pointers.worker import policy as owner_policy
from pointers.worker.sealing import Label

PARTIES = ["alice", "bob"]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def _model_shaped() -> nn.Module:
    """The client's copy of the architecture: other (random) values."""
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


class Deployment:
    def __init__(self, parties: list[str] = PARTIES) -> None:
        self.model = _model()
        self.plain = copy.deepcopy(self.model)  # (the model itself moves to its owner)
        self.x = torch.randn(8, 4)  # (the shape of the first weight: see the input attack)
        with torch.no_grad():
            self.expected = self.model(self.x)
        # the owner's side: approve, then offer at its own worker
        approval = mpc.approve(self.model, self.x, parties=parties, crypto_provider="carol")
        self.owner = pt.VirtualWorker("owner")
        model_ptr = mpc.offer(self.model, self.owner, approval)
        # the client's side
        self.parties = [pt.VirtualWorker(p) for p in parties]
        self.carol = pt.VirtualWorker("carol")
        self.held = mpc.share(model_ptr, *self.parties, crypto_provider=self.carol)
        self.query = mpc.plan(self.held, self.share(self.x))

    def share(self, x: torch.Tensor) -> mpc.SharedTensor:
        return mpc.share(x, *self.parties, crypto_provider=self.carol)

    @property
    def weight(self) -> HeldShared:
        w = self.held[0].weight
        assert isinstance(w, HeldShared)
        return w


@pytest.fixture(scope="module")
def dep() -> Deployment:
    return Deployment()


def test_the_approved_plan_opens_its_output(dep: Deployment) -> None:
    for _ in range(2):  # each query a fresh run
        x = torch.randn(8, 4)
        with torch.no_grad():
            expected = dep.plain(x)
        out = dep.query(dep.share(x)).get()
        assert (out - expected).abs().max() < 1e-2


def test_material_dealt_ahead(dep: Deployment) -> None:
    """mpc.preprocess works on a held plan: the dealer runs ahead, the parties' approved
    runs take its material later."""
    dep.query.preprocess(2)
    assert dep.query.prepared() == 2
    for _ in range(2):
        x = torch.randn(8, 4)
        with torch.no_grad():
            expected = dep.plain(x)
        assert (dep.query(dep.share(x)).get() - expected).abs().max() < 1e-2
    assert dep.query.prepared() == 0


def test_three_parties() -> None:
    d = Deployment(["alice", "bob", "dave"])
    out = d.query(d.share(d.x)).get()
    assert (out - d.expected).abs().max() < 1e-2


def test_the_client_never_holds_a_weight(dep: Deployment) -> None:
    w = dep.weight
    assert not any(isinstance(p, torch.nn.Parameter) and not isinstance(p, HeldShared)
                   for p in dep.held.parameters())  # fmt: skip
    with pytest.raises(HeldError, match="never opens"):
        w.get()
    with pytest.raises(HeldError, match="approved"):
        _ = w + 1
    with pytest.raises(HeldError):
        dep.held(dep.share(dep.x))  # op by op: refused on the client already


def test_a_held_share_is_sealed_at_its_party(dep: Deployment) -> None:
    share = dep.weight.shares[0]
    with pytest.raises((RemoteError, NotAllowedError), match="sealed"):
        share.get()
    with pytest.raises((RemoteError, NotAllowedError), match="sealed"):
        (share + 0).get()  # an op on it is refused at the worker
    with pytest.raises((RemoteError, NotAllowedError, PointerError)):
        share.copy().move(dep.parties[1])  # it left its owner once, to its party


def test_another_computation_is_not_approved(dep: Deployment) -> None:
    other = mpc.plan(dep.held, dep.share(dep.x), call=lambda m, x: m[0](x))  # W x + b alone
    with pytest.raises((RemoteError, NotAllowedError, PointerError), match="approved|sealed"):
        other(dep.share(dep.x)).get()


def _capture(dep: Deployment, party: pt.VirtualWorker) -> list[RunProgram]:
    sent: list[RunProgram] = []
    post = party.post

    def spy(msg: object) -> object:
        if isinstance(msg, RunProgram):
            sent.append(msg)
        return post(msg)  # type: ignore[arg-type]

    party.post = spy  # type: ignore[method-assign]
    try:
        dep.query(dep.share(dep.x)).get()
    finally:
        del party.post
    return sent


def test_a_run_is_approved_only_as_recorded(dep: Deployment) -> None:
    alice = dep.parties[0]
    (msg,) = _capture(dep, alice)
    assert msg.held and msg.outputs
    # the same bindings again: refused (a run's bindings are used once)
    with pytest.raises((RemoteError, NotAllowedError), match="used once"):
        alice.request(RunProgram(msg.program_id, msg.bindings, [], msg.held, msg.outputs))
    fresh = [b + 7 if k not in {s for s, _ in msg.held} else b for k, b in enumerate(msg.bindings)]
    # another output slot (an intermediate): not the digest the owner approved
    other_out = [msg.outputs[0] - 1]
    with pytest.raises((RemoteError, NotAllowedError), match="not a computation"):
        alice.request(RunProgram(msg.program_id, fresh, [], msg.held, other_out))
    # two parameters' names swapped: refused before anything runs
    others = [item for item in msg.held if type(item[1]) is not str]  # inputs, carried
    params = [item for item in msg.held if type(item[1]) is str]
    swapped = others + [[s, n] for (s, _), (_, n) in zip(params, params[1:] + params[:1])]
    with pytest.raises((RemoteError, NotAllowedError), match="declared"):
        alice.request(RunProgram(msg.program_id, fresh, [], swapped, msg.outputs))
    # the output's id bound to a second slot too (the run would write another value there)
    twice = list(fresh)
    other_slot = next(k for k in range(len(twice)) if k != msg.outputs[0] and k not in
                      {s for s, _ in msg.held})  # fmt: skip
    twice[other_slot] = twice[msg.outputs[0]]
    with pytest.raises((RemoteError, NotAllowedError), match="an id of its own"):
        alice.request(RunProgram(msg.program_id, twice, [], msg.held, msg.outputs))
    # outputs without held parameters: refused
    with pytest.raises((RemoteError, NotAllowedError), match="output slots"):
        alice.request(RunProgram(msg.program_id, fresh, [], [], msg.outputs))


def test_what_a_run_makes_stays_held_but_its_output(dep: Deployment) -> None:
    alice = dep.parties[0]
    x = dep.share(dep.x)
    before = set(alice.store.view())
    out = dep.query(x)
    made = set(alice.store.view()) - before
    output = out.shares[0].id_at_location
    assert output in made
    for obj_id in made - {output}:
        label = Label.of(alice.store.entry(obj_id).sealed)
        assert label is not None, f"object {obj_id} made by the run is not sealed"
    assert not alice.store.entry(output).sealed
    assert not alice.function_state.get("pointers.holding.bound")  # (dropped at its end)
    assert (out.get() - dep.expected).abs().max() < 1e-2


def test_an_input_bound_to_a_weight_is_refused(dep: Deployment) -> None:
    variant = dep.query._first
    w = dep.held[0].weight  # (8, 4): the input's shape
    weights = [t for m in dep.held for t in (getattr(m, "weight", None), getattr(m, "bias", None))
               if t is not None]  # fmt: skip
    with pytest.raises((RemoteError, NotAllowedError, PointerError), match="only the declared"):
        dep.query._run(variant, (w, *weights), dep.query._held_fields(variant))


def test_material_of_a_held_run_is_its_own() -> None:
    state = {"pointers.holding.bound": {12345: "token-a"}}
    holding.check_instances(state, [Label("beaver_mask", 7)])  # another instance: fine
    with pytest.raises(NotAllowedError, match="approved run"):
        holding.check_instances(state, [Label("beaver_mask", 12345)])
    run = holding.HeldRun("owner", "token-a", set(), [])
    with holding.running(run):
        holding.check_instances(state, [Label("beaver_mask", 12345)])  # its own run
    other = holding.HeldRun("owner", "token-b", set(), [])
    with holding.running(other), pytest.raises(NotAllowedError):
        holding.check_instances(state, [Label("beaver_mask", 12345)])


def test_a_run_reads_only_its_inputs_and_what_it_made() -> None:
    """An ordinary object the client put where the run expects a peer's delivery (or any
    other id the run did not declare as an input) is refused when the run reads it."""
    run = holding.HeldRun("owner", "t", set(), [], readable={11, 12})
    run.check_read(11)
    with pytest.raises(NotAllowedError, match="declared inputs"):
        run.check_read(13)
    w = pt.VirtualWorker("w")
    ptr = pt.send(torch.ones(3), w)
    step = ExecuteOp("aten::neg.default", [Ref(ptr.id_at_location)], {}, [w.new_id()], False)
    with holding.running(run), pytest.raises(NotAllowedError, match="declared inputs"):
        w.run_locked(step)  # as a run's step: the client's object is not its input
    w.run_locked(step)  # outside a run: an ordinary op


def test_an_owner_without_approvals_shares_nothing() -> None:
    owner = pt.VirtualWorker("owner2")
    owner.functions.register_all(HELD_FUNCTIONS)  # (as a served worker has them)
    model_ptr = mpc.offered(_model(), owner)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    with pytest.raises((RemoteError, NotAllowedError), match="approves no computation"):
        mpc.share(model_ptr, alice, bob, crypto_provider=carol)


def test_a_model_the_client_sent_is_not_an_owners() -> None:
    """A model the client put at a worker is the client's: it is not shared as held."""
    w = pt.VirtualWorker("somewhere")
    model_ptr = pt.send(_model(), w)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    with pytest.raises(mpc.MPCError, match="shared by its owner"):
        mpc.share(model_ptr, alice, bob, crypto_provider=carol)


def _held_share(owner: Any, args: list[Any], n: int = 2) -> list[Any]:
    shape = args[1] if len(args) > 1 and isinstance(args[1], list) else [1]
    return pt.call_function(  # type: ignore[no-any-return]
        owner, "mpc.held_share", args, out=[(tuple(shape), torch.int64)] * n
    )


def test_a_client_tensor_never_becomes_a_held_share(dep: Deployment) -> None:
    """The red team's swap: the client stores T at the owner's worker and asks for held
    shares of it under an approved parameter's name (and zeros as its bias), to put them
    in place of the model's last layer. The step takes a registered name, never a
    tensor: every form of the request is refused before anything is shared."""
    t = pt.send(torch.eye(3, 8), dep.owner)
    for args in (
        [t, "2.weight", 16, 2],  # the old form: a tensor, then the name
        ["2.weight", t, 16, 2],
        ["2.weight", [3, 8], t, 2],
    ):
        with pytest.raises((RemoteError, NotAllowedError, PointerError, TypeError)):
            _held_share(dep.owner, args)[0].move(dep.parties[0])
    with pytest.raises((RemoteError, NotAllowedError), match="no parameter its owner registered"):
        _held_share(dep.owner, ["my.weight", [3, 8], 16, 2])[0].move(dep.parties[0])
    with pytest.raises((RemoteError, NotAllowedError), match="shape"):
        _held_share(dep.owner, ["2.weight", [8, 3], 16, 2])[0].move(dep.parties[0])
    with pytest.raises((RemoteError, NotAllowedError), match="frac_bits=16"):
        _held_share(dep.owner, ["2.weight", [3, 8], 20, 2])[0].move(dep.parties[0])


def test_a_parameter_bound_to_another_value_is_refused(dep: Deployment) -> None:
    """Shares of an approved parameter made from another registered value (the owner
    offered a changed model after approving) carry another value digest: no party
    approves the run."""
    other = _model()
    with torch.no_grad():
        for p in other.parameters():
            p.add_(1.0)
    approval = mpc.approve(_model(), dep.x, parties=PARTIES, crypto_provider="carol")
    with pytest.raises(mpc.MPCError, match="not the ones approved"):
        mpc.offer(copy.deepcopy(other), pt.VirtualWorker("owner3"), approval)
    # the owner's worker registers the changed values under the old approvals anyway
    owner = pt.VirtualWorker("owner4")
    model_ptr = mpc.offer(other, owner, dict(approval), frac_bits=16)
    held = mpc.share(model_ptr, *dep.parties, crypto_provider=dep.carol)
    query = mpc.plan(held, dep.share(dep.x))
    with pytest.raises((RemoteError, NotAllowedError, PointerError), match="approved"):
        query(dep.share(dep.x)).get()


def test_the_scale_is_the_owners() -> None:
    model = _model()
    x = torch.randn(8, 4)
    approval = mpc.approve(model, x, parties=PARTIES, crypto_provider="carol")
    model_ptr = mpc.offer(model, pt.VirtualWorker("owner5"), approval)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    with pytest.raises((RemoteError, NotAllowedError), match="frac_bits=16"):
        mpc.share(model_ptr, alice, bob, crypto_provider=carol, frac_bits=20)


def test_policy_takes_digests_only() -> None:
    w = pt.VirtualWorker("o")
    with pytest.raises(ValueError, match="64 hex"):
        owner_policy.set_policy(w, {"alice": ["short"]})
    with pytest.raises(TypeError):
        owner_policy.set_policy(w, {1: ["a" * 64]})  # type: ignore[dict-item]


def test_a_tiny_bert_from_its_owner() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=37,
    )  # fmt: skip
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.randint(0, 50, (1, 5))
    onehot = torch.nn.functional.one_hot(ids, 50).float()

    def call(m: nn.Module, oh: torch.Tensor) -> torch.Tensor:
        embeds = oh @ m.embeddings.word_embeddings.weight  # private ids: a one-hot product
        return m(inputs_embeds=embeds).last_hidden_state

    with torch.no_grad():
        expected = call(model, onehot)
    out, _ = _from_its_owner(model, onehot, call)
    assert (out - expected).abs().max() < 5e-2


def _from_its_owner(model: nn.Module, x: torch.Tensor, call: Any) -> tuple[torch.Tensor, Any]:
    """The owner approves ``call`` and offers ``model``; the client shares it from the
    owner's worker and runs the plan on ``x``: the opened output and the held model."""
    approval = mpc.approve(model, x, parties=PARTIES, crypto_provider="carol", call=call)
    model_ptr = mpc.offer(model, pt.VirtualWorker("hf-owner"), approval)
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    held = mpc.share(model_ptr, alice, bob, crypto_provider=carol)
    xs = mpc.share(x, alice, bob, crypto_provider=carol)
    return mpc.plan(held, xs, call=call)(xs).get(), held


@pytest.mark.slow
def test_network_workers(tmp_path: Path) -> None:
    """The same deployment on served workers: the owner's worker holds its approvals
    from ``serve --offer``; the parties check every run; the client opens only the
    output."""
    from network_fixtures import Cluster

    model = _model()
    plain = copy.deepcopy(model)
    x = torch.randn(8, 4)
    approval = mpc.approve(model, x, parties=PARTIES, crypto_provider="carol")
    path = tmp_path / "offer.bin"
    mpc.save_offer(model, approval, path)  # the owner's side: its values and approvals
    workers = ["owner", "alice", "bob", "carol"]  # (only the owner holds its values)
    cluster = Cluster(tmp_path, workers, worker_args={"owner": ["--offer", str(path)]})
    cluster.start()
    try:
        owner, alice, bob, carol = (cluster.connect(w) for w in ("owner", "alice", "bob", "carol"))
        # the client's side: the architecture only (its own random values are not used)
        model_ptr = mpc.offered(_model_shaped(), owner)
        with pytest.raises((RemoteError, NotAllowedError), match="no parameter its owner"):
            pt.call_function(owner, "mpc.held_share", ["9.weight", [3], 16, 2],
                             out=[((3,), torch.int64)] * 2)  # fmt: skip
            owner.sync()
        held = mpc.share(model_ptr, alice, bob, crypto_provider=carol)
        xs = mpc.share(x, alice, bob, crypto_provider=carol)
        query = mpc.plan(held, xs)
        with torch.no_grad():
            expected = plain(x)
        with mpc.stats() as first:
            assert (query(xs).get() - expected).abs().max() < 1e-2
        # a later query takes the instances the first one kept (each served party reads
        # their keys from its own store) and opens only the activations
        x2 = torch.randn(8, 4)
        with torch.no_grad():
            expected = plain(x2)
        with mpc.stats() as later:
            out = query(mpc.share(x2, alice, bob, crypto_provider=carol))
            assert (out.get() - expected).abs().max() < 1e-2
        assert later.max_bytes_per_party < first.max_bytes_per_party
        with pytest.raises((RemoteError, NotAllowedError), match="sealed"):
            held[0].weight.shares[0].get()
        other = mpc.plan(held, xs, call=lambda m, v: m[0](v))
        with pytest.raises((RemoteError, NotAllowedError, PointerError), match="approved"):
            other(xs).get()
    finally:
        cluster.stop()


def test_a_tiny_gpt2_from_its_owner_keeps_its_tied_embeddings() -> None:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(
        vocab_size=60, n_embd=32, n_layer=1, n_head=2, n_positions=32, bos_token_id=0,
        eos_token_id=0,
    )  # fmt: skip
    model = transformers.GPT2LMHeadModel(cfg).eval()
    plain = copy.deepcopy(model)
    onehot = torch.nn.functional.one_hot(torch.randint(0, 60, (1, 5)), 60).float()

    def call(m: nn.Module, oh: torch.Tensor) -> torch.Tensor:
        return m(inputs_embeds=oh @ m.transformer.wte.weight).logits

    with torch.no_grad():
        expected = call(plain, onehot)
    out, held = _from_its_owner(model, onehot, call)
    assert held.lm_head.weight is held.transformer.wte.weight  # shared once, still tied
    assert (out - expected).abs().max() < 5e-2


def test_an_offer_file_is_read_back_and_a_bad_one_refused(tmp_path: Path) -> None:
    model = _model()
    approval = mpc.approve(model, torch.randn(8, 4), parties=PARTIES, crypto_provider="carol")
    path = tmp_path / "offer.bin"
    mpc.save_offer(model, approval, path)
    policy = owner_policy.load_offer(path)
    assert policy.approvals == {p: set(ds) for p, ds in approval.items()}
    assert policy.params["0.weight"].digest == approval.params["0.weight"]
    assert torch.equal(policy.params["0.weight"].value, model[0].weight.detach())
    data = path.read_bytes()
    for bad in (b"not an offer", data[:-3], data + b"x", data[:40]):
        path.write_bytes(bad)
        with pytest.raises(ValueError, match="offer file"):
            owner_policy.load_offer(path)


def test_recording_a_held_plan_makes_nothing_at_the_workers() -> None:
    """The client records a held plan on stand-in weights without running it: the
    workers receive its programs (and deletes), and nothing else: no stand-in share,
    weight instance, dealer mask or activation beside the owner's shares (a second
    model's worth of memory); the plan then runs as approved."""
    import gc

    d = Deployment()
    workers = [*d.parties, d.carol]
    x = d.share(d.x)
    gc.collect()
    for w in workers:
        w.flush_deletes()
    before = {w.id: (set(w.store.view()), w.stats.messages_received) for w in workers}
    query = mpc.plan(d.held, x)
    for w in workers:
        ids, messages = before[w.id]
        made = set(w.store.view()) - ids
        assert made == {query._first.program_ids[w.id], query.later.program_ids[w.id]}
        sent = w.stats.messages_received - messages
        # its two programs, and the deletes sent as each of the three recordings ends (the
        # stand-ins', the first query's, the later queries'); running them took hundreds
        assert sent <= 2 + 4, f"{w.id}: {sent} messages"
    out = query(d.share(d.x)).get()
    assert (out - d.expected).abs().max() < 1e-2
