"""A model owner's weights, shared from its own worker, used only by the plans it approved.

The querying client never holds the weights. The owner, at its side:

1. records the computation it approves, with :func:`approve` (an in-process recording on
   stand-in weights, under the deployment's worker names): a digest per party, each
   naming the digest of every parameter's value and scale;
2. registers the model's values and its approvals at its worker: :func:`offer` in
   process, :func:`save_offer` and ``python -m pointers serve --offer FILE`` on a served
   worker.

The client holds the architecture only (``mpc.offered(model, owner)``: placeholders for
the owner's values) and shares the model from there, ``mpc.share(model_ptr, alice, bob,
crypto_provider=carol)``: the owner's worker splits each *registered* value, at the
owner's scale, with its own CSPRNG (``mpc.held_share``, by name: never a tensor the client
names) and moves each share to its party, sealed as the owner's *held share*
(:mod:`pointers.worker.holding`), with the digest of the value it is a share of. On the client, the model's parameters are
:class:`HeldShared`: no op runs on one (each would be a computation the owner did not
approve) and none opens. ``mpc.plan(model, x)`` records the same computation the owner
recorded (on stand-in weights, in the client's own session) and runs it with the owner's
shares bound to their slots; each party checks that the program's digest is one the owner
approved for it, holds everything the run makes for the owner, and releases only the
run's output, which the client opens with ``.get()``.

Who learns what: the client learns the outputs of the approved computation on the inputs
it chooses (as a plaintext query would tell it), the parties their shares and masked
openings, the owner's worker nothing about the queries. The first query makes a weight
instance of each weight it multiplies (F = W - B opened once, B kept at the dealer) and
its run keeps them for the owner's later runs; each later query opens only its
activations (e = x - A, fresh A), so its traffic scales with the activations.

>>> import torch, pointers as pt, mpc
>>> from torch import nn
>>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
>>> x = torch.tensor([[0.5, -1.0, 0.25, 2.0]])
>>> expected = model(x).detach()
>>> owner = pt.VirtualWorker("owner")
>>> approval = mpc.approve(model, x, parties=["alice", "bob"], crypto_provider="carol")
>>> model_ptr = mpc.offer(model, owner, approval)          # the owner's side
>>> alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
>>> held = mpc.share(model_ptr, alice, bob, crypto_provider=carol)   # the client's side
>>> query = mpc.plan(held, mpc.share(x, alice, bob, crypto_provider=carol))
>>> out = query(mpc.share(x, alice, bob, crypto_provider=carol)).get()  # makes the instances
>>> out = query(mpc.share(x, alice, bob, crypto_provider=carol)).get()  # opens activations only
>>> bool((out - expected).abs().max() < 1e-2)
True
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

import pointers as pt
from mpc.config import MPCConfig
from mpc.debugging import refuse as refuse_in_debug
from mpc.errors import MPCError
from mpc.material.held import FUNCTIONS as HELD_FUNCTIONS
from mpc.offered import (
    HeldError,
    HeldShared,
    offered,
    secret_slots,
    tensor_at,
)
from mpc.plan import Programs, SharedPlan, signature, slots_of
from mpc.plan import plan as plain_plan
from mpc.protocols.weights import run as weights
from mpc.session import Session
from mpc.shared import SharedTensor, share_tensor
from pointers.worker import holding
from pointers.worker import policy as owner_policy
from pointers.worker.lanes import release_idle_lanes
from pointers.worker.program import Recording

RUN_WAIT = 600.0  # seconds a held plan's call waits for the parties' runs, at most


def wait_for_runs(parties: list[Any]) -> None:
    """Wait for the parties' program runs (in-process workers run them in threads): each
    party releases a held run's output when its run ends (until then the client's reads
    of it are refused), so a call waits for that before it hands the output back."""
    for party in parties:
        wait = getattr(party, "wait_programs", None)
        if wait is not None:
            wait(RUN_WAIT)


Call = Callable[..., Any]


class _Swapped:
    """``with _Swapped(model, values):`` every place of the model that holds a tensor
    keyed (by ``id``) in ``values`` (tied aliases included) reads its value; restored on
    exit."""

    def __init__(self, model: nn.Module, values: dict[int, Any]) -> None:
        self.model, self.values = model, values
        self.saved: list[tuple[dict[str, Any], str, Any]] = []

    def __enter__(self) -> None:
        for m in self.model.modules():
            for d in (m._parameters, m._buffers):
                for attr, t in list(d.items()):
                    if t is not None and id(t) in self.values:
                        self.saved.append((d, attr, t))
                        d[attr] = self.values[id(t)]

    def __exit__(self, *exc: Any) -> None:
        for d, attr, t in reversed(self.saved):
            d[attr] = t


# -- the owner's side ------------------------------------------------------------------------


class Approval(dict[str, list[str]]):
    """What :func:`approve` returns: per party id, the digests of the programs the owner
    approves there (a plain ``{party: [digest, ...]}`` as JSON), with the scale and the
    digests of the values they were approved for (``frac_bits``, ``params``: per
    parameter name, :func:`pointers.worker.policy.param_digest`)."""

    frac_bits: int = 16
    params: dict[str, str]


def _registered(model: nn.Module, frac_bits: int) -> dict[str, tuple[torch.Tensor, int]]:
    """The owner's values of ``model`` by parameter name, each at ``frac_bits``."""
    out = {}
    for m, attr, is_param, name in secret_slots(model):
        t = tensor_at(m, attr, is_param)
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.is_meta:
            raise MPCError(f"{name!r}: the owner offers its own values (a floating tensor here)")
        out[name] = (t.detach(), frac_bits)
    return out


def registered_values(model: nn.Module, frac_bits: int) -> dict[str, str]:
    """Per parameter name, the digest of ``model``'s value at ``frac_bits`` (what an
    approval names: :func:`pointers.worker.policy.param_digest`)."""
    return {
        n: v.digest
        for n, v in owner_policy.make_policy({}, _registered(model, frac_bits)).params.items()
    }


def approve(
    model: nn.Module,
    *examples: torch.Tensor,
    parties: Sequence[str],
    crypto_provider: str,
    config: MPCConfig | None = None,
    call: Call | None = None,
) -> Approval:
    """The owner records ``call(model, *inputs)`` (default ``model(*inputs)``) on inputs
    shaped as ``examples`` (plain tensors; shared in the recording) with stand-in weights,
    on in-process workers named as the deployment's ``parties`` and ``crypto_provider``,
    and returns, per party, the digest of the program it approves there, for the model's
    own values at ``config``'s scale (each program digest names the digest of every
    parameter's value and scale). Pass the result to :func:`offer` (or
    :func:`save_offer`). The client's plan must be recorded with the same ``call``, config
    and input shapes; its outputs open, nothing else does."""
    cfg = config or MPCConfig()
    digests = registered_values(model, cfg.frac_bits)
    workers = [pt.VirtualWorker(p) for p in parties]
    dealer = pt.VirtualWorker(crypto_provider)
    session = Session(workers, dealer, cfg)
    shared = [share_tensor(e, session) for e in examples]
    plan = HeldPlan(model, *shared, call=call, owner_session=session)
    approval = Approval({p.id: plan.digests(p, digests) for p in workers})
    approval.frac_bits, approval.params = cfg.frac_bits, digests
    del plan, shared, session, workers, dealer
    recording_dropped()
    return approval


def recording_dropped() -> None:
    """After an owner's recording on its own in-process workers, once the caller dropped
    them: they and what they hold go now, not at a later collection, nor when their lane
    threads end by themselves (:func:`pointers.worker.lanes.release_idle_lanes`)."""
    gc.collect()
    release_idle_lanes()


def _policy(
    model: nn.Module, approvals: Mapping[str, Sequence[str]], frac_bits: int | None
) -> owner_policy.Policy:
    f = frac_bits if frac_bits is not None else getattr(approvals, "frac_bits", None)
    f = MPCConfig().frac_bits if f is None else f
    policy = owner_policy.make_policy(dict(approvals), _registered(model, f))
    expected = getattr(approvals, "params", None)
    if expected is not None:
        changed = sorted(n for n, d in expected.items() if policy.params[n].digest != d)
        if changed or set(expected) != set(policy.params):
            raise MPCError(
                f"the model's values {changed or sorted(set(expected) ^ set(policy.params))} "
                "are not the ones approved (or not at the approved scale): approve the model "
                "as it is offered (mpc.approve)"
            )
    return policy


def offer(
    model: nn.Module,
    worker: Any,
    approvals: Mapping[str, Sequence[str]],
    frac_bits: int | None = None,
) -> nn.Module:
    """The owner's side, in process: register ``model``'s values (each parameter and
    secret buffer, by name, at ``frac_bits``: default the scale :func:`approve` used) at
    its own in-process ``worker``, with the approvals of :func:`approve` as the worker's
    policy, and register the step that splits them there. Returns the model, its values
    replaced in place by placeholders (:func:`mpc.offered`): the pointer the client shares
    (``mpc.share(model_ptr, ...)``). A served owner's worker takes the same policy from a
    file instead (:func:`save_offer`, ``serve --offer``)."""
    functions = getattr(worker, "functions", None)
    if functions is None:
        raise MPCError(
            "mpc.offer registers the values at an in-process worker; a served worker takes "
            "them from its owner's file (mpc.save_offer, then python -m pointers serve --offer)"
        )
    policy = _policy(model, approvals, frac_bits)
    functions.register_all(HELD_FUNCTIONS)
    owner_policy.set_policy(worker, policy)
    return offered(model, worker)


def save_offer(
    model: nn.Module,
    approvals: Mapping[str, Sequence[str]],
    path: Any,
    frac_bits: int | None = None,
) -> None:
    """The owner's side, for a served worker: write ``model``'s values (by parameter name,
    at ``frac_bits``: default the scale :func:`approve` used) and the approvals of
    :func:`approve` to ``path``, which ``python -m pointers serve --offer PATH`` takes as
    that worker's policy. The client then shares ``mpc.offered(model, owner)``."""
    owner_policy.save_offer(path, _policy(model, approvals, frac_bits))


# -- the client's side -----------------------------------------------------------------------


class HeldPlan(SharedPlan):
    """``mpc.plan(model, *examples)`` for a model with held parameters: recorded on
    stand-in weights (ordinary shares of a public pattern, in the same session), each run
    binds the owner's shares to the weights' input slots and asks each party to release
    the output (``RunProgram.held`` / ``outputs``).

    Two programs per party, both approved by the owner: the *first* query makes a weight
    instance of every weight it multiplies (F = W - B opened once, B kept at the dealer;
    :mod:`mpc.protocols.weights`) and keeps them (its ``KEEP`` slots); every *later* query
    takes those instances through ``CARRIED`` slots, bound to what the first run kept, so
    it opens only the activations' e = x - A (:mod:`pointers.worker.holding` checks that
    each carried slot takes the kept object the owner approved for it)."""

    def __init__(
        self,
        model: nn.Module,
        *examples: SharedTensor,
        call: Call | None = None,
        owner_session: Session | None = None,
        later_call: Call | None = None,
        later_examples: tuple[SharedTensor, ...] | None = None,
    ) -> None:
        self.model = model
        self.call = call or (lambda m, *xs: m(*xs))
        # the later program: the same call on inputs of the same shapes by default (a
        # generation's later program is its step, on one token: mpc.generation)
        self.later_call = later_call or self.call
        later_inputs = examples if later_examples is None else later_examples
        self.slots_of = secret_slots(model)
        session = examples[0].session if examples else owner_session
        if session is None:
            raise TypeError("mpc.plan needs example SharedTensor inputs")
        self.names = [name for _, _, _, name in self.slots_of]
        self.k_inputs, self.k_later = len(examples), len(later_inputs)
        stand_ins, originals = [], []
        # the stand-ins and both recordings run nothing at the workers: no run reads
        # their results (each real run binds the owner's shares), and they would be a
        # second model's shares, weight instances and activations beside the owner's
        workers = [*session.parties, *([session.dealer] if session.dealer is not None else [])]
        with Recording(workers, runs=False):
            for m, attr, is_param, _ in self.slots_of:
                t = tensor_at(m, attr, is_param)
                originals.append(t)
                # a public pattern (not secret, not a share): the values never enter the
                # program
                value = torch.linspace(-0.05, 0.05, t.numel()).reshape(tuple(t.shape))
                stand_in = share_tensor(value, session)
                weights.mark_fixed(stand_in)  # (its products make, then use, an instance)
                stand_ins.append(stand_in)
        swap = {id(t): s for t, s in zip(originals, stand_ins)}

        def swapped(fn: Call, k: int) -> Call:
            def recorded(*inputs: SharedTensor) -> Any:
                with _Swapped(model, swap):
                    return fn(model, *inputs[:k])

            return recorded

        with torch.no_grad(), weights.held_instances():
            # the first query
            super().__init__(swapped(self.call, self.k_inputs), *examples, *stand_ins, runs=False)
            first = self._first
            self.later = Programs(
                swapped(self.later_call, self.k_later),
                self.workers,
                (*later_inputs, *stand_ins),
                first,
                runs=False,
            )
        self.later.output = None  # type: ignore[assignment]
        self.made = False  # whether the first query ran (or has its material dealt)
        self.example_output = None  # type: ignore[assignment]  # (stand-ins' output)
        # the later program's carried slots (slot there -> slot of the first program), and
        # per party, the first program's slots whose objects it keeps (made at that party,
        # each under the role of the later slot that carries it), and which of those are
        # held objects (read as the owner's: the weights' copies, a generation's caches and
        # position) rather than protocol material (a weight instance's opened F)
        self.carried = {
            k2: arg for k2, (kind, arg) in enumerate(self.later.slots.kind) if kind == "carried"
        }
        self.role = {k1: f"c{k2}" for k2, k1 in self.carried.items()}
        inst_f: set[tuple[str, int]] = set()
        for st in stand_ins:
            for inst in weights.instances_of(st):
                inst_f |= {(p.location.id, p.id_at_location) for p in inst.f}
        recorded_value = {k: v for v, k in first.slots.index.items()}
        self.keeps: dict[str, list[int]] = {}
        self.uses: dict[str, set[int]] = {}
        for party in self.session.parties:
            mine = slots_of(self.later.programs[party.id])
            keeps, uses = set(), set()
            for k2, k1 in self.carried.items():
                if first.slots.kind[k1] != ("new", party.id):
                    continue
                keeps.add(k1)
                if k2 in mine and (party.id, recorded_value[k1]) not in inst_f:
                    uses.add(k2)
            self.keeps[party.id] = sorted(keeps)
            self.uses[party.id] = uses
        # recorded: the stand-ins and their instances are not needed again (a held plan
        # records no other signature), and their objects at the workers go with them
        for st in stand_ins:
            weights.drop_instances(st)
        swap.clear()
        del stand_ins, st
        gc.collect()
        # and now: their deletes wait at the client for its next message to each worker,
        # and the dealer's (the stand-ins' masks B) for the next run that uses the
        # dealer; the real run's weight instances would be made beside them
        for w in self.workers:
            w.flush_deletes()

    def _held_fields(self, variant: Programs) -> dict[str, tuple[list[Any], list[int]]]:
        """Per party: its [slot, name] pairs of the inputs, the weights and the kept or
        carried slots, and its output slot (the same at every run)."""
        done = self.__dict__.setdefault("_fields", {})
        if id(variant) not in done:
            done[id(variant)] = self._fields_of(variant)
        return done[id(variant)]  # type: ignore[no-any-return]

    def _fields_of(self, variant: Programs) -> dict[str, tuple[list[Any], list[int]]]:
        out = {}
        n = self.session.n
        k_inputs = self.k_later if variant is self.later else self.k_inputs
        for i, party in enumerate(self.session.parties):
            pairs: list[list[Any]] = []
            for j in range(k_inputs):  # the client's inputs (name None)
                pairs.append([variant.slots.kind.index(("input", j * n + i)), None])
            for j, name in enumerate(self.names):
                k = (k_inputs + j) * n + i  # the flattened inputs' index of that share
                slot = variant.slots.kind.index(("input", k))
                pairs.append([slot, name])
            if variant is self.later:
                mine = slots_of(variant.programs[party.id])
                pairs += [[k2, holding.CARRIED] for k2 in sorted(self.carried) if k2 in mine]
            else:
                pairs += [[k1, holding.keep(self.role[k1])] for k1 in self.keeps[party.id]]
            out[party.id] = (pairs, [variant.out_slots[i]])
        return out

    def digests(self, party: Any, params: dict[str, str]) -> list[str]:
        """The digests of ``party``'s two programs, the first query's and the later
        queries' (as :func:`pointers.worker.holding.begin` computes them there; ``party``:
        an in-process worker of this plan's session), for the values whose digests
        ``params`` gives by parameter name."""
        first = self._first
        held, outputs = self._held_fields(first)[party.id]
        program = party.store.get(first.program_ids[party.id])
        store = party.store
        d1 = holding.program_digest(program.raw, held, outputs, party.id, store, None, params)
        held, outputs = self._held_fields(self.later)[party.id]
        program = party.store.get(self.later.program_ids[party.id])
        uses = {k2: f"c{k2}" for k2 in self.uses[party.id]}
        d2 = holding.program_digest(program.raw, held, outputs, party.id, store, uses, params)
        return [d1, d2]

    def preprocess(self, calls: int = 1, *examples: SharedTensor) -> None:
        """Deal the crypto provider's material for the next ``calls`` queries (see
        :meth:`SharedPlan.preprocess`). Before the first query, the first set is the first
        program's (it makes the weights' instances, whose ids and nonces the later sets
        refer to: they are fixed once its set is dealt)."""
        if calls < 0:
            raise ValueError(f"calls must be at least 0, got {calls}")
        if examples and signature(examples) not in self._variants:
            raise MPCError("no program set was recorded for that signature")
        if calls and not self.made:
            self._preprocess(self._first, 1)
            self.later.carry = self._first.prepared[0]  # (what the first run will bind)
            self.made, calls = True, calls - 1
        if calls:
            self._preprocess(self.later, calls)

    def prepared(self, *examples: SharedTensor) -> int:
        return len(self._first.prepared) + len(self.later.prepared)

    def forget_instances(self) -> None:
        """The next query is a first query again: its run makes (and keeps) new weight
        instances, with fresh masks B. For a first query whose run failed (its output did
        not open: the later queries would be refused), or to renew the masks. Material
        dealt ahead is dropped (it refers to the old instances)."""
        self.made, self.later.carry = False, None
        self._first.prepared.clear()
        self.later.prepared.clear()

    def __call__(self, *inputs: SharedTensor) -> SharedTensor:
        refuse_in_debug("a plan of a model its owner shared from its worker")
        if len(inputs) != self.k_inputs:
            raise TypeError(f"this plan takes {self.k_inputs} inputs, got {len(inputs)}")
        weights_ = [tensor_at(m, a, p) for m, a, p, _ in self.slots_of]
        if not all(isinstance(w, HeldShared) for w in weights_):
            raise HeldError("this plan runs on the owner's held weights (mpc.share(model_ptr))")
        for x in inputs:
            if not isinstance(x, SharedTensor) or isinstance(x, HeldShared):
                raise TypeError("plan inputs must be the client's SharedTensors")
            self.session.check_compatible(x.session)
            x.materialize()
        all_inputs = (*inputs, *weights_)
        if signature(all_inputs) not in self._variants:
            raise MPCError(
                "this held plan was recorded for inputs of another shape, dtype or scale: "
                "record (and have its owner approve) one for these"
            )
        first = not self.made or bool(self._first.prepared)
        variant = self._first if first else self.later
        out = self._run(variant, all_inputs, self._held_fields(variant))
        if first and self.later.carry is None:  # later queries take what this run keeps
            self.later.carry = self.last_bindings
        self.made = True
        wait_for_runs(self.session.parties)
        return out


def plan(fn: Callable[..., Any], *examples: SharedTensor, call: Call | None = None) -> SharedPlan:
    """Record ``fn`` (e.g. a model) on example SharedTensors into per-worker programs (see
    :mod:`mpc.plan`). A model whose parameters its owner shared from its worker is
    recorded as a :class:`HeldPlan` (``call(model, *inputs)``, default ``model(*inputs)``:
    the call its owner approved)."""
    if isinstance(fn, nn.Module) and any(isinstance(p, HeldShared) for p in fn.parameters()):
        return HeldPlan(fn, *examples, call=call)
    if call is not None:
        raise TypeError("call= is for a model with held parameters")
    return plain_plan(fn, *examples)


__all__ = [
    "Approval",
    "HeldError",
    "HeldPlan",
    "HeldShared",
    "approve",
    "offer",
    "plan",
    "recording_dropped",
    "registered_values",
    "save_offer",
]
