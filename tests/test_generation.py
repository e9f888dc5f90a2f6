"""Private generation (mpc.generate): greedy decoding of GPT-2 and Llama models as one
recorded program per party for the prefill and one for every token, on a model the
client shared and on one its owner shares from its worker. The tokens must be the
plaintext model's greedy tokens, every one; the attacks are sent as a client that does
not follow the protocol would send them (mpc.generation, pointers.worker.holding)."""

from __future__ import annotations

import contextlib
import copy
import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import mpc
import mpc.hf
import pointers as pt
from mpc.errors import UnsupportedOpError
from mpc.generation import HeldPrograms
from mpc.generation.decoding import one_hot_rows
from pointers.errors import NotAllowedError, PointerError, RemoteError
from pointers.pointer_tensor import PointerTensor, RemoteRef
from pointers.worker import holding
from pointers.worker.sealing import Label

transformers = pytest.importorskip("transformers")
transformers.utils.logging.set_verbosity_error()

PARTIES = ["alice", "bob"]
REFUSED = (RemoteError, NotAllowedError, PointerError)
VOCAB = 48
PROMPT = 5
MAX_LENGTH = 12


def tiny(kind: str, seed: int = 0) -> Any:
    """A tiny random GPT-2 or Llama whose greedy tokens vary (weights scaled up)."""
    torch.manual_seed(seed)
    if kind == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32,
            bos_token_id=0, eos_token_id=0,
        )  # fmt: skip
        model = transformers.GPT2LMHeadModel(cfg).eval()
    else:
        cfg = transformers.LlamaConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(4.0 if kind == "gpt2" else 3.0)
    return model


def plaintext(model: Any, prompt: torch.Tensor, n: int) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=n, do_sample=False, pad_token_id=0)
    return out[:, prompt.shape[1] :]


def prompt_of(seed: int, length: int = PROMPT) -> torch.Tensor:
    return torch.randint(0, VOCAB, (1, length), generator=torch.Generator().manual_seed(seed))


def workers() -> tuple[list[pt.VirtualWorker], pt.VirtualWorker]:
    return [pt.VirtualWorker(p) for p in PARTIES], pt.VirtualWorker("carol")


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_model_the_client_shared_generates_its_greedy_tokens(kind: str) -> None:
    model = tiny(kind)
    prompt = prompt_of(1)
    expected = plaintext(model, prompt, 6)
    assert len(set(expected[0].tolist())) > 1  # (a test of several tokens, not one)
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    assert torch.equal(mpc.generate(model, prompt, 6), expected)


def test_generations_of_other_lengths_on_one_model_each_give_their_tokens() -> None:
    """Each length records its own programs (another capacity): the second recording makes
    its own weight instances instead of referring to the first's (it failed with a
    KeyError), and going back to the first length reuses the first's programs."""
    model = tiny("gpt2")
    runs = [(prompt_of(18), 5), (prompt_of(20), 3), (prompt_of(18), 5)]
    expected = [plaintext(model, p, n) for p, n in runs]
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    for (prompt, n), want in zip(runs, expected):
        assert torch.equal(mpc.generate(model, prompt, n), want)


def test_a_token_is_one_program_per_worker() -> None:
    """After the first step (recorded as it runs), each token costs the client a few
    messages: the token's shared row, one run per worker, the argmax's fetch."""
    model = tiny("gpt2")
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    progs = mpc.generation.programs(model, PROMPT, MAX_LENGTH)
    session = mpc.hf.session_of(model)
    token = progs.prefill(one_hot_rows(prompt_of(2), VOCAB, session)).get()
    token = progs.step(one_hot_rows(token, VOCAB, session)).get()  # (recorded)
    assert isinstance(progs, mpc.generation.PlainPrograms) and progs.later is not None
    ids = dict(progs.later.program_ids)
    counts = []
    for _ in range(3):
        with mpc.stats() as s:
            token = progs.step(one_hot_rows(token, VOCAB, session)).get()
        counts.append(s.client_messages)
    assert progs.later.program_ids == ids  # the same stored program every token
    assert max(counts) <= 3 * 3  # three workers: a row, a run, a fetch each at most
    assert sum(progs.later.commands.values()) > 50 * max(counts)


def test_model_generate_on_a_shared_model_points_to_mpc_generate() -> None:
    model = tiny("gpt2")
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    with pytest.raises(UnsupportedOpError, match="mpc.generate"):
        model.generate(mpc.share(prompt_of(3), *parties, crypto_provider=carol), max_new_tokens=2)


def test_bad_requests_are_refused_before_anything_runs() -> None:
    model = tiny("gpt2")
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    with pytest.raises(mpc.MPCError, match="maximum length"):
        mpc.generate(model, prompt_of(4), 8, max_length=10)
    with pytest.raises(mpc.MPCError, match=r"\[0, 48\)"):
        mpc.generate(model, torch.tensor([[1, 99]]), 2)
    with pytest.raises(mpc.MPCError, match="batch, length"):
        mpc.generate(model, torch.tensor([1, 2]), 2)
    with pytest.raises(ValueError, match="at least 1"):
        mpc.generate(model, prompt_of(4), 0)
    with pytest.raises(mpc.MPCError, match="not shared"):
        mpc.generate(tiny("gpt2"), prompt_of(4), 2)


# -- a model its owner shares from its worker --------------------------------------------


class Deployment:
    def __init__(self, kind: str = "gpt2") -> None:
        self.model = tiny(kind)
        self.plain = copy.deepcopy(self.model)
        self.approval = mpc.approve_generation(
            self.model, prompt_length=PROMPT, max_length=MAX_LENGTH, parties=PARTIES,
            crypto_provider="carol",
        )  # fmt: skip
        self.owner = pt.VirtualWorker("owner")
        model_ptr = mpc.offer(self.model, self.owner, self.approval)
        self.parties, self.carol = workers()
        for w in (*self.parties, self.carol):
            w.store.wait_seconds = 3.0  # (a refused party's peers stop waiting soon)
        self.held = mpc.share(model_ptr, *self.parties, crypto_provider=self.carol)
        self.session = mpc.hf.session_of(self.held)

    def programs(self) -> HeldPrograms:
        progs = mpc.generation.programs(self.held, PROMPT, MAX_LENGTH)
        assert isinstance(progs, HeldPrograms)
        return progs

    def rows(self, ids: torch.Tensor) -> mpc.SharedTensor:
        return one_hot_rows(ids, VOCAB, self.session)


@pytest.fixture(scope="module")
def dep() -> Deployment:
    return Deployment()


@pytest.mark.parametrize("kind", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_a_model_its_owner_shares_generates_its_greedy_tokens(kind: str) -> None:
    d = Deployment(kind)
    assert {p: len(ds) for p, ds in d.approval.items()} == {"alice": 2, "bob": 2}
    prompt = prompt_of(5)
    expected = plaintext(d.plain, prompt, 6)
    with pytest.raises(mpc.MPCError, match="max_length"):
        mpc.generate(d.held, prompt, 6)
    assert torch.equal(mpc.generate(d.held, prompt, 6, max_length=MAX_LENGTH), expected)
    # a second prompt: a new prefill (new cache and position), the same approvals
    prompt = prompt_of(6)
    assert torch.equal(
        mpc.generate(d.held, prompt, 3, max_length=MAX_LENGTH), plaintext(d.plain, prompt, 3)
    )


def kept(worker: Any) -> dict[str, int]:
    """What the runs kept at ``worker``: role -> id (the latest run's, by maker)."""
    out: dict[str, int] = {}
    for obj_id in list(worker.store.view()):
        label = Label.of(worker.store.entry(obj_id).sealed)
        if label is not None and label.kind == holding.HELD_INSTANCE:
            out[f"{label.extra[1]}@{label.extra[2]}"] = obj_id
    return out


def held_made(worker: Any) -> list[int]:
    return [
        i
        for i in list(worker.store.view())
        if (lab := Label.of(worker.store.entry(i).sealed)) is not None and lab.kind == holding.HELD
    ]


def _ptr(worker: Any, obj_id: int) -> PointerTensor:
    value = worker.store.entry(obj_id).value
    ref = RemoteRef(worker, obj_id, owned=False)  # (the attacker's pointer deletes nothing)
    return PointerTensor(ref, tuple(value.shape), value.stride(), value.dtype)


def test_the_cache_the_position_and_every_logit_stay_sealed(dep: Deployment) -> None:
    progs = dep.programs()
    progs.prefill(dep.rows(prompt_of(7))).get()
    alice = dep.parties[0]
    kept_ids = list(kept(alice).values())
    # the caches (2 layers x keys and values), the position, the weights' instances
    assert len(kept_ids) >= 5
    for obj_id in kept_ids + held_made(alice):
        ptr = _ptr(alice, obj_id)
        with pytest.raises(REFUSED, match="sealed"):
            ptr.get()
        with pytest.raises(REFUSED):
            (ptr + 0).get()
        with pytest.raises(REFUSED):
            ptr.move(dep.parties[1])


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


def _carried_slots(progs: HeldPrograms, party: str) -> list[int]:
    plan = progs.plan
    return sorted(k2 for k2 in plan.carried if k2 in plan.uses[party])


def test_a_step_takes_only_what_one_prefill_kept(dep: Deployment) -> None:
    """Carried objects of two generations mixed in one step are refused: a step reads
    one prefill's cache and position."""
    progs = dep.programs()
    progs.prefill(dep.rows(prompt_of(8))).get()
    first = list(progs.plan.later.carry)
    # (this client keeps the first generation: an honest one deletes what its prefill
    # kept when the next prefill starts)
    progs.plan.later.carry = None
    progs.prefill(dep.rows(prompt_of(9))).get()
    slot = _carried_slots(progs, "alice")[0]
    k1 = progs.plan.carried[slot]

    def mix(variant: Any, b: list[int]) -> None:
        if variant is progs.plan.later:
            b[slot] = first[k1]

    with bindings_changed(progs.plan, mix), pytest.raises(REFUSED, match="different runs"):
        progs.step(dep.rows(torch.tensor([[1]]))).get()


@pytest.mark.slow
def test_a_new_generation_frees_what_the_last_one_kept() -> None:
    """Each prefill's run keeps the cache, the position and the weights' instances for
    its steps at the parties (and the instances' masks at the dealer); the next prefill
    starts a new generation and deletes them, and a step leaves nothing of its own: the
    workers hold one generation's worth, however many prompts and tokens."""
    d = Deployment()
    everyone = [*d.parties, d.carol]

    def generation(seed: int, n: int) -> dict[str, int]:
        prompt = prompt_of(seed)
        out = mpc.generate(d.held, prompt, n, max_length=MAX_LENGTH)
        assert torch.equal(out, plaintext(d.plain, prompt, n))
        gc.collect()
        for w in everyone:
            w.flush_deletes()
        return {w.id: len(w.store) for w in everyone}

    first = generation(12, 2)
    assert len(kept(d.parties[0])) > 0
    assert generation(13, 2) == first
    assert generation(14, 5) == first


def test_swapped_caches_and_a_client_position_are_not_approved(dep: Deployment) -> None:
    progs = dep.programs()
    progs.prefill(dep.rows(prompt_of(10))).get()
    slots = _carried_slots(progs, "alice")
    a, b_ = slots[0], slots[1]

    def swap(variant: Any, b: list[int]) -> None:
        if variant is progs.plan.later:
            b[a], b[b_] = b[b_], b[a]

    with bindings_changed(progs.plan, swap), pytest.raises(REFUSED, match="approved"):
        progs.step(dep.rows(torch.tensor([[1]]))).get()
    # the client's own position (or cache) in a carried slot: an ordinary object there
    # takes no role, so the program's digest is not the approved one
    mine = pt.send(torch.tensor([0]), dep.parties[0]).id_at_location

    def own(variant: Any, b: list[int]) -> None:
        if variant is progs.plan.later:
            b[a] = mine

    with bindings_changed(progs.plan, own), pytest.raises(REFUSED):
        progs.step(dep.rows(torch.tensor([[1]]))).get()


def test_a_replayed_step_is_refused(dep: Deployment) -> None:
    progs = dep.programs()
    progs.prefill(dep.rows(prompt_of(11))).get()
    progs.step(dep.rows(torch.tensor([[2]]))).get()
    last = list(progs.plan.last_bindings)

    def replay(variant: Any, b: list[int]) -> None:
        b[:] = last

    with bindings_changed(progs.plan, replay), pytest.raises(REFUSED):
        progs.step(dep.rows(torch.tensor([[2]]))).get()


def test_no_step_past_the_approved_length(dep: Deployment) -> None:
    """The parties hold the position: a step past the maximum length fails there (the
    client's own check is bypassed here), and its output never opens."""
    progs = dep.programs()
    token = progs.prefill(dep.rows(prompt_of(12))).get()
    for _ in range(MAX_LENGTH - PROMPT):
        token = progs.step(dep.rows(token)).get()
    with pytest.raises(REFUSED, match="index|range"):
        progs.step(dep.rows(token)).get()


def test_an_unapproved_generation_is_refused(dep: Deployment) -> None:
    """Another maximum length (another program), and a step before any prefill."""
    progs = HeldPrograms(dep.held, dep.session, PROMPT, MAX_LENGTH + 4)
    with pytest.raises(REFUSED, match="approved"):
        progs.prefill(dep.rows(prompt_of(13))).get()
    with pytest.raises(mpc.MPCError, match="after"):
        HeldPrograms(dep.held, dep.session, PROMPT, MAX_LENGTH).step(dep.rows(torch.tensor([[1]])))
    with pytest.raises(mpc.MPCError, match="prompts of 5 tokens"):
        dep.programs().prefill(dep.rows(prompt_of(13, length=PROMPT + 1)))


@pytest.mark.network
@pytest.mark.slow
def test_held_generation_on_served_workers(tmp_path: Any) -> None:
    """The owner serves its worker with its offer file; the client holds the architecture
    only; the parties check every run against the owner's approvals (recorded in process
    by the owner, on network workers by the client: the same programs)."""
    from network_fixtures import Cluster

    model = tiny("gpt2", seed=1)
    plain = copy.deepcopy(model)
    approval = mpc.approve_generation(
        model, prompt_length=PROMPT, max_length=MAX_LENGTH, parties=PARTIES,
        crypto_provider="carol",
    )  # fmt: skip
    path = tmp_path / "offer.bin"
    mpc.save_offer(model, approval, path)
    workers = ["owner", *PARTIES, "carol"]
    cluster = Cluster(tmp_path, workers, worker_args={"owner": ["--offer", str(path)]})
    cluster.start()
    try:
        owner, alice, bob, carol = (cluster.connect(w) for w in ("owner", *PARTIES, "carol"))
        skeleton = tiny("gpt2", seed=2)  # the client's copy: other values, never used
        held = mpc.share(mpc.offered(skeleton, owner), alice, bob, crypto_provider=carol)
        prompt = prompt_of(14)
        with mpc.stats() as s:
            out = mpc.generate(held, prompt, 4, max_length=MAX_LENGTH)
        assert torch.equal(out, plaintext(plain, prompt, 4))
        assert s.rounds > 0
    finally:
        cluster.stop()


# -- several tokens a pass: the client's drafts verified on shares ------------------------


@pytest.mark.parametrize("k", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_speculation_gives_the_greedy_tokens_and_opens_nothing_past_the_correction(
    k: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tiny("gpt2", seed=2)
    prompt = prompt_of(15)
    expected = plaintext(model, prompt, 10)
    parties, carol = workers()
    mpc.share(model, *parties, crypto_provider=carol)
    opened: list[list[int]] = []
    get = mpc.SharedTensor.get

    def spy(self: mpc.SharedTensor) -> torch.Tensor:
        value = get(self)
        opened.append(value.reshape(-1).tolist())
        return value

    monkeypatch.setattr(mpc.SharedTensor, "get", spy)
    truth = expected[0].tolist()
    calls: list[int] = []

    def oracle_then_wrong(tokens: list[int], n: int) -> list[int]:
        """Right drafts on even passes (all accepted), wrong ones on odd passes."""
        calls.append(1)
        done = len(tokens) - prompt.shape[1]
        right = (truth + [0] * n)[done : done + n]
        return right if len(calls) % 2 else [(t + 1) % VOCAB for t in right]

    passes: list[int] = []
    out = mpc.generate(model, prompt, 10, drafts=k, draft=oracle_then_wrong, passes=passes)
    assert torch.equal(out, expected)
    assert passes[0] < 10  # fewer passes than tokens
    for values in opened[1:]:  # each pass: accepted tokens and a correction, then -1 only
        assert len(values) == k + 1
        shown = [v for v in values if v >= 0]
        assert values == shown + [-1] * (k + 1 - len(shown)) and shown
    # a wrong first draft reveals one token (the correction), a right run k + 1
    assert {len([v for v in values if v >= 0]) for values in opened[1:-1]} <= {1, k + 1}


@pytest.mark.slow  # (24 s; speculation on a held model: test_speculation_gives_the_greedy_tokens)
def test_speculation_with_prompt_lookup_on_a_held_model(dep: Deployment) -> None:
    """The owner approves the drafts' pass too; the parties advance their rows by k + 1
    a pass whatever is accepted (the count accepted stays shared)."""
    k = 2
    owner_model = tiny("gpt2")
    approval = mpc.approve_generation(
        owner_model, prompt_length=PROMPT, max_length=MAX_LENGTH + 12, parties=PARTIES,
        crypto_provider="carol", drafts=k,
    )  # fmt: skip
    plain = copy.deepcopy(owner_model)
    model_ptr = mpc.offer(owner_model, pt.VirtualWorker("owner-spec"), approval)
    held = mpc.share(model_ptr, *dep.parties, crypto_provider=dep.carol)
    prompt = prompt_of(16)
    passes: list[int] = []
    out = mpc.generate(held, prompt, 6, max_length=MAX_LENGTH + 12, drafts=k, passes=passes)
    assert torch.equal(out, plaintext(plain, prompt, 6))
    progs = mpc.generation.programs(held, PROMPT, MAX_LENGTH + 12, drafts=k)
    t = [e for e in kept(dep.parties[0]).items()]
    assert t  # (the prefill kept its state; every value of it stays sealed, as above)
    assert isinstance(progs, HeldPrograms) and progs.ready
    with pytest.raises(mpc.MPCError, match="used up"):  # (the client's own bound)
        zeros = lambda tokens, n: [0] * n  # noqa: E731  (mostly wrong: a token or two a pass)
        mpc.generate(held, prompt, 15, max_length=MAX_LENGTH + 12, drafts=k, draft=zeros)


def test_prompt_lookup_proposes_what_followed_the_last_ngram() -> None:
    from mpc.generation.speculative import prompt_lookup

    assert prompt_lookup([5, 6, 7, 8, 5, 6], 3) == [7, 8, 5]
    assert prompt_lookup([1, 2, 3, 1, 2, 3, 1], 2) == [2, 3]
    assert prompt_lookup([9, 8, 7], 2) == [7, 7]  # no earlier n-gram: the last token
    assert prompt_lookup([4, 4], 3) == [4, 4, 4]


@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_a_steps_scores_ride_in_the_round_that_truncates_its_key(kind: str) -> None:
    """A step's q K^T over the cache forms in the round that truncates q and the step's new
    key and value (mpc.generation.attention.scores_with_writes), and the same greedy
    tokens: GPT-2 one round fewer a layer (its q, k and v, views of one projection, took
    one truncation round, then the Beaver product); Llama three (its rotated key, its
    value and its rotated query took a truncation round each, then the product; its
    grouped key heads serve their query heads by broadcasting)."""
    from mpc.generation import attention as gen_attention

    model = tiny(kind)
    prompt = prompt_of(1)
    expected = plaintext(model, prompt, 3)
    rounds = {}
    for fused in (True, False):
        parties, carol = workers()
        shared = copy.deepcopy(model)
        mpc.share(shared, *parties, crypto_provider=carol)
        progs = mpc.generation.programs(shared, PROMPT, MAX_LENGTH)
        session = mpc.hf.session_of(shared)
        with pytest.MonkeyPatch.context() as mp:
            if not fused:
                mp.setattr(gen_attention, "FUSED_SCORES_UP_TO", 0)
            tokens = [progs.prefill(one_hot_rows(prompt, VOCAB, session)).get()]
            for _ in range(2):
                with mpc.stats() as s:
                    tokens.append(progs.step(one_hot_rows(tokens[-1], VOCAB, session)).get())
        rounds[fused] = s.rounds
        assert torch.equal(torch.cat([t.reshape(1, 1) for t in tokens], 1), expected)
    saved = 1 if kind == "gpt2" else 3
    assert rounds[True] == rounds[False] - saved * model.config.num_hidden_layers
