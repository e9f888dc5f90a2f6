"""A model owner's weights, shared from its own worker, used only by the plans it approved.

The querying client never holds the weights. The owner, at its side:

1. records the computation it approves, with :func:`approve` (an in-process recording on
   stand-in weights, under the deployment's worker names): a digest per party;
2. puts the model and its approvals at its worker with :func:`offer`.

The client then shares the model from there, ``mpc.share(model_ptr, alice, bob,
crypto_provider=carol)``: the owner's worker splits each parameter with its own CSPRNG
(``mpc.held_share``) and moves each share to its party, sealed as the owner's *held share*
(:mod:`pointers.worker.holding`). On the client, the model's parameters are
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
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

import pointers as pt
from mpc.api import buffer_is_secret, register_remote_models
from mpc.config import MPCConfig
from mpc.errors import MPCError
from mpc.material.held import FUNCTIONS as HELD_FUNCTIONS
from mpc.plan import SharedPlan, _Programs, _signature, _slots_of
from mpc.plan import plan as plain_plan
from mpc.protocols import weights
from mpc.session import Session
from mpc.shared import SharedTensor, share_tensor
from pointers.module import _module_location
from pointers.pointer_tensor import PointerTensor
from pointers.pointer_tensor import call_function as pt_call_function
from pointers.worker import holding

HELD_SHARE_FUNCTION = "mpc.held_share"
RUN_WAIT = 600.0  # seconds a held plan's call waits for the parties' runs, at most
Call = Callable[..., Any]


class HeldError(MPCError):
    """Using an owner's held weights outside a computation it approved."""


class HeldShared(SharedTensor):
    """A parameter its owner shared from its worker: usable only inside an approved plan
    (``mpc.plan(model, x)``), never opened."""

    owner: str
    param_name: str

    def get(self) -> torch.Tensor:  # type: ignore[override]
        raise HeldError(
            f"parameter {self.param_name!r} is {self.owner!r}'s, shared from its worker: it never "
            "opens; run the model as the plan its owner approved (mpc.plan(model, x)) and "
            "open that plan's output"
        )

    def __repr__(self, *, tensor_contents: Any = None) -> str:  # type: ignore[override]
        return (
            f"HeldShared({self.param_name!r}, shape={tuple(self.shape)}, owner={self.owner!r}, "
            f"parties={[p.id for p in self.session.parties]})"
        )

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        names = [a.param_name for a in args if isinstance(a, HeldShared)]
        raise HeldError(
            f"{func} on {names or 'a held parameter'}: a model its owner shared from its "
            "worker runs only as the plan the owner approved: record it with "
            "mpc.plan(model, x) and call the plan (the workers refuse anything else)"
        )


def _held(
    shares: list[PointerTensor], session: Session, frac_bits: int, dtype: Any, owner: str, name: str
) -> HeldShared:
    s0 = shares[0]
    t = torch.Tensor._make_wrapper_subclass(
        HeldShared, s0.shape, strides=s0.stride(), dtype=dtype, device=torch.device("cpu")
    )
    t.shares, t.session, t.frac_bits, t.pending = shares, session, frac_bits, 0
    t.views_of_pending, t.keep_alive, t.fixed, t.weight_epoch = False, None, None, 0
    t.owner, t.param_name = owner, name
    return t  # type: ignore[no-any-return]


# -- which tensors of a model are the owner's ------------------------------------------------


def _secret_slots(model: nn.Module) -> list[tuple[nn.Module, str, bool, str]]:
    """(module, attribute, is_parameter, qualified name) of every parameter and secret
    buffer, each tensor once (tied weights under their first name), in a fixed order."""
    out: list[tuple[nn.Module, str, bool, str]] = []
    seen: set[int] = set()
    for prefix, m in model.named_modules(remove_duplicate=False):
        for attr, p in m._parameters.items():
            if p is not None:
                out.append((m, attr, True, f"{prefix}.{attr}" if prefix else attr))
    for prefix, m in model.named_modules(remove_duplicate=False):
        for attr, b in m._buffers.items():
            if b is None or not _floating(b) or not buffer_is_secret(m, attr, b):
                continue
            out.append((m, attr, False, f"{prefix}.{attr}" if prefix else attr))
    first: list[tuple[nn.Module, str, bool, str]] = []
    names: dict[int, str] = {}
    for m, attr, is_param, name in out:
        t = (m._parameters if is_param else m._buffers)[attr]
        if id(t) in seen:
            continue
        seen.add(id(t))
        names[id(t)] = name
        first.append((m, attr, is_param, name))
    return first


def _floating(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype.is_floating_point


def _tensor_at(m: nn.Module, attr: str, is_param: bool) -> Any:
    return (m._parameters if is_param else m._buffers)[attr]


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


def approve(
    model: nn.Module,
    *examples: torch.Tensor,
    parties: Sequence[str],
    crypto_provider: str,
    config: MPCConfig | None = None,
    call: Call | None = None,
) -> dict[str, list[str]]:
    """The owner records ``call(model, *inputs)`` (default ``model(*inputs)``) on inputs
    shaped as ``examples`` (plain tensors; shared in the recording) with stand-in weights,
    on in-process workers named as the deployment's ``parties`` and ``crypto_provider``,
    and returns, per party, the digest of the program it approves there. Pass the result
    to :func:`offer`. The client's plan must be recorded with the same ``call``, config
    and input shapes; its outputs open, nothing else does."""
    workers = [pt.VirtualWorker(p) for p in parties]
    dealer = pt.VirtualWorker(crypto_provider)
    session = Session(workers, dealer, config or MPCConfig())
    shared = [share_tensor(e, session) for e in examples]
    plan = HeldPlan(model, *shared, call=call, owner_session=session)
    digests = {p.id: plan.digests(p) for p in workers}
    del plan, shared, session, workers, dealer
    gc.collect()  # (the recording's workers and what they hold go now, not at a later gc)
    return digests


def offer(model: nn.Module, worker: Any, approvals: dict[str, Sequence[str]]) -> nn.Module:
    """The owner's side: put ``model`` at its own ``worker`` (its parameters move there)
    with the approvals of :func:`approve` as the worker's policy, and register the step
    that splits its parameters there. Returns the model, whose parameters now point there
    (the pointer the client shares: ``mpc.share(model_ptr, ...)``)."""
    functions = getattr(worker, "functions", None)
    if functions is not None:
        functions.register_all(HELD_FUNCTIONS)
    holding.set_policy(worker, dict(approvals))
    return pt.send(model, worker)  # type: ignore[no-any-return]


# -- the client's side -----------------------------------------------------------------------


def share_held_model(model: nn.Module, session: Session, frac_bits: int | None) -> nn.Module:
    """``mpc.share(model_ptr, ...)`` for a model at its owner's worker: each parameter and
    secret buffer split there and moved to the parties as the owner's held shares; integer
    buffers (structure: position ids, masks) come back public. In place."""
    owner = _module_location(model)
    if owner is None:
        raise MPCError("the model's parameters do not live at a worker")
    f = session.config.frac_bits if frac_bits is None else frac_bits
    session.watch()
    functions = getattr(owner, "functions", None)
    if functions is not None and HELD_SHARE_FUNCTION not in functions:
        functions.register_all(HELD_FUNCTIONS)
    done: dict[int, HeldShared] = {}
    for m, attr, is_param, name in _secret_slots(model):
        ptr = _tensor_at(m, attr, is_param)
        if not isinstance(ptr, PointerTensor) or not ptr.is_floating_point():
            raise MPCError(f"{name!r} is not a floating tensor at worker {owner.id!r}")
        shape = tuple(ptr.shape)
        shares = pt_call_function(
            owner,
            HELD_SHARE_FUNCTION,
            [ptr, name, f, session.n],
            out=[(shape, torch.int64)] * session.n,
        )
        moved = [s.move(p) for s, p in zip(shares, session.parties)]  # type: ignore[union-attr]
        done[id(ptr)] = _held(moved, session, f, ptr.dtype, owner.id, name)
    sync = getattr(owner, "sync", None)
    if sync is not None:  # (a network owner's refusal is told now, not at a later call)
        sync()
    for m in model.modules():
        dicts: tuple[dict[str, Any], ...] = (m._parameters, m._buffers)
        for d in dicts:
            for attr, t in list(d.items()):
                if t is None:
                    continue
                if id(t) in done:
                    d[attr] = done[id(t)]
                elif isinstance(t, PointerTensor):  # an integer buffer: public structure
                    d[attr] = t.get()
    return model


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
    ) -> None:
        self.model = model
        self.call = call or (lambda m, *xs: m(*xs))
        self.slots_of = _secret_slots(model)
        session = examples[0].session if examples else owner_session
        if session is None:
            raise TypeError("mpc.plan needs example SharedTensor inputs")
        self.names = [name for _, _, _, name in self.slots_of]
        self.k_inputs = len(examples)
        stand_ins, originals = [], []
        for m, attr, is_param, _ in self.slots_of:
            t = _tensor_at(m, attr, is_param)
            originals.append(t)
            # a public pattern (not secret, not a share): the values never enter the program
            value = torch.linspace(-0.05, 0.05, t.numel()).reshape(tuple(t.shape))
            stand_in = share_tensor(value, session)
            weights.mark_fixed(stand_in)  # (its products make, then use, an instance)
            stand_ins.append(stand_in)
        swap = {id(t): s for t, s in zip(originals, stand_ins)}
        model, call_fn = self.model, self.call

        def recorded(*inputs: SharedTensor) -> Any:
            with _Swapped(model, swap):
                return call_fn(model, *inputs[: self.k_inputs])

        with torch.no_grad(), weights.held_instances():
            super().__init__(recorded, *examples, *stand_ins)  # the first query
            first = self._first
            self.later = _Programs(recorded, self.workers, (*examples, *stand_ins), first)
        self.later.output = None  # type: ignore[assignment]
        self.made = False  # whether the first query ran (or has its material dealt)
        self.example_output = None  # type: ignore[assignment]  # (stand-ins' output)
        # the later program's carried slots (slot there -> slot of the first program), and
        # per party, the first program's slots whose objects it keeps (made at that party)
        # and which of those are the weights' copies (held: read as the owner's)
        self.carried = {
            k2: arg for k2, (kind, arg) in enumerate(self.later.slots.kind) if kind == "carried"
        }
        inst_w: set[tuple[str, int]] = set()
        inst_f: set[tuple[str, int]] = set()
        for st in stand_ins:
            for inst in weights.instances_of(st):
                inst_w |= {(p.location.id, p.id_at_location) for p in inst.w}
                inst_f |= {(p.location.id, p.id_at_location) for p in inst.f}
        recorded_value = {k: v for v, k in first.slots.index.items()}
        self.keeps: dict[str, list[int]] = {}
        self.uses: dict[str, dict[int, int]] = {}
        for party in self.session.parties:
            mine = _slots_of(self.later.programs[party.id])
            keeps, uses = set(), {}
            for k2, k1 in self.carried.items():
                if first.slots.kind[k1] != ("new", party.id):
                    continue
                keeps.add(k1)
                made = (party.id, recorded_value[k1])
                if made not in inst_w and made not in inst_f:  # (the digests assume so)
                    raise MPCError(
                        f"internal: the later queries' program at {party.id!r} refers to an "
                        "object the first query made that is no weight instance's"
                    )
                if k2 in mine and made in inst_w:
                    uses[k2] = k1
            self.keeps[party.id] = sorted(keeps)
            self.uses[party.id] = uses
        # recorded: the stand-ins and their instances are not needed again (a held plan
        # records no other signature), and their objects at the workers go with them
        for st in stand_ins:
            weights.drop_instances(st)
        swap.clear()
        del stand_ins, st
        gc.collect()

    def _held_fields(self, variant: _Programs) -> dict[str, tuple[list[Any], list[int]]]:
        """Per party: its [slot, name] pairs of the inputs, the weights and the kept or
        carried slots, and its output slot."""
        out = {}
        n = self.session.n
        for i, party in enumerate(self.session.parties):
            pairs: list[list[Any]] = []
            for j in range(self.k_inputs):  # the client's inputs (name None)
                pairs.append([variant.slots.kind.index(("input", j * n + i)), None])
            for j, name in enumerate(self.names):
                k = (self.k_inputs + j) * n + i  # the flattened inputs' index of that share
                slot = variant.slots.kind.index(("input", k))
                pairs.append([slot, name])
            if variant is self.later:
                mine = _slots_of(variant.programs[party.id])
                pairs += [[k2, holding.CARRIED] for k2 in sorted(self.carried) if k2 in mine]
            else:
                pairs += [[k1, holding.KEEP] for k1 in self.keeps[party.id]]
            out[party.id] = (pairs, [variant.out_slots[i]])
        return out

    def digests(self, party: Any) -> list[str]:
        """The digests of ``party``'s two programs, the first query's and the later
        queries' (as :func:`pointers.worker.holding.begin` computes them there; ``party``:
        an in-process worker of this plan's session)."""
        first = self._first
        held, outputs = self._held_fields(first)[party.id]
        program = party.store.get(first.program_ids[party.id])
        d1 = holding.program_digest(program.raw, held, outputs, party.id, party.store)
        held, outputs = self._held_fields(self.later)[party.id]
        program = party.store.get(self.later.program_ids[party.id])
        uses = {k2: holding.instance_key(d1, k1) for k2, k1 in self.uses[party.id].items()}
        d2 = holding.program_digest(program.raw, held, outputs, party.id, party.store, uses)
        return [d1, d2]

    def digest(self, party: Any) -> str:
        """The digest of ``party``'s first-query program (see :meth:`digests`)."""
        return self.digests(party)[0]

    def preprocess(self, calls: int = 1, *examples: SharedTensor) -> None:
        """Deal the crypto provider's material for the next ``calls`` queries (see
        :meth:`SharedPlan.preprocess`). Before the first query, the first set is the first
        program's (it makes the weights' instances, whose ids and nonces the later sets
        refer to: they are fixed once its set is dealt)."""
        if calls < 0:
            raise ValueError(f"calls must be at least 0, got {calls}")
        if examples and _signature(examples) not in self._variants:
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
        if len(inputs) != self.k_inputs:
            raise TypeError(f"this plan takes {self.k_inputs} inputs, got {len(inputs)}")
        weights_ = [_tensor_at(m, a, p) for m, a, p, _ in self.slots_of]
        if not all(isinstance(w, HeldShared) for w in weights_):
            raise HeldError("this plan runs on the owner's held weights (mpc.share(model_ptr))")
        for x in inputs:
            if not isinstance(x, SharedTensor) or isinstance(x, HeldShared):
                raise TypeError("plan inputs must be the client's SharedTensors")
            self.session.check_compatible(x.session)
            x.materialize()
        all_inputs = (*inputs, *weights_)
        if _signature(all_inputs) not in self._variants:
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
        # each party releases the output when its run ends (until then it is held, and
        # the client's reads of it are refused): wait for that before handing it back
        for party in self.session.parties:
            wait = getattr(party, "wait_programs", None)
            if wait is not None:
                wait(RUN_WAIT)
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


register_remote_models(share_held_model)

__all__ = ["HeldError", "HeldPlan", "HeldShared", "approve", "offer", "plan", "share_held_model"]
