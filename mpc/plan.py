"""Plans over secret-shared values: one program per party (and the dealer).

``mpc.plan(fn, *example_inputs)`` runs ``fn`` once on SharedTensors while recording the
commands the client sends to every party and to the crypto provider; each worker stores
its own command list once. A call then costs the client one message per worker instead
of one per op: the parties run their programs concurrently, waiting for each other's
deliveries, and every call binds fresh object ids and fresh nonces (so no triple or mask
is ever reused, whichever operand's session a step drew its nonce from).

Like PySyft's plans, the examples only serve to record: a call on inputs of another
shape, dtype or scale records (once) a program set for that signature, running ``fn``
op by op that one time; later calls with that signature cost one message per worker.

>>> import torch, pointers as pt, mpc
>>> alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
>>> x = mpc.share(torch.tensor([1.0, -2.0]), alice, bob, crypto_provider=carol)
>>> relu_plan = mpc.plan(torch.relu, x)
>>> relu_plan(x).get()
tensor([1., 0.])
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

import torch

from mpc import accounting
from mpc.authenticated.tensor import AuthenticatedTensor
from mpc.errors import MPCError
from mpc.session import Session, recording_nonces
from mpc.shared import SharedTensor
from pointers.pointer_tensor import PointerTensor, RemoteRef
from pointers.wire.messages import SendToPeer, StoreProgram
from pointers.wire.serde import Slot, SlotRef
from pointers.worker.program import Recording, Slots, build_programs, run_programs

Signature = tuple[tuple[tuple[int, ...], torch.dtype, int], ...]


def signature(inputs: tuple[SharedTensor, ...]) -> Signature:
    return tuple((tuple(x.shape), x.dtype, x.frac_bits) for x in inputs)


class Programs:
    """The program set recorded for one input signature."""

    def __init__(
        self,
        fn: Callable[..., Any],
        workers: list[Any],
        inputs: tuple[SharedTensor, ...],
        carried_from: Programs | None = None,
        runs: bool = True,
    ) -> None:
        # (inference: no autograd graph, whose saved values no program would delete)
        # ``runs`` False: recorded without running at the workers (on stand-in values:
        # ``output`` is then a result no worker holds)
        with recording_nonces() as nonces, accounting.stats() as counted, torch.no_grad():
            with Recording(workers, runs) as rec:
                out = fn(*inputs)
                if not isinstance(out, SharedTensor):
                    raise MPCError("a plan must return one SharedTensor")
                out.resolve()  # (a deferred ReLU runs in the recording)
        self.rounds = counted.rounds
        self.output = out  # the recording run's own result
        input_ids = [s.id_at_location for x in inputs for s in x.shares]
        # ``carried_from``: an earlier recording whose objects and nonces this one refers
        # to (a held plan's weight instances): each such reference is a carried slot,
        # bound at each call to what a run of that program bound (``carry``)
        carried: dict[int, int] = {}
        if carried_from is not None:
            earlier: Slots = carried_from.slots
            carried = {
                v: k for v, k in earlier.index.items() if earlier.kind[k][0] in ("new", "extra")
            }
        programs, slots = build_programs(rec, input_ids, carried)
        self.slots: Slots = slots
        self.carry: list[int] | None = None  # the bindings of the run carried from
        # each nonce slot is bound, at every call, to a fresh nonce of the session it
        # was drawn from during the recording
        self.nonce_sessions: list[Session] = [nonces.sessions[v] for v in self.slots.extras]
        self.out_slots = [self.slots.index[s.id_at_location] for s in out.shares]
        self.out_meta = (out.dtype, out.frac_bits, out.pending)
        self.out_share_meta = [(tuple(s.shape), s.stride(), s.dtype) for s in out.shares]
        self.programs = programs  # per worker id, the commands in wire form with slots
        self.commands = {wid: len(p) for wid, p in programs.items()}
        # material dealt ahead (SharedPlan.preprocess): per prepared call, its bindings
        # (input slots still 0); and which slots the dealer delivers to which party
        self.prepared: deque[list[int]] = deque()
        self.dealt: list[tuple[str, int]] = []  # (party id, slot) of each dealer delivery
        dealer = inputs[0].session.dealer
        self.dealer_id: str | None = None if dealer is None else dealer.id
        if self.dealer_id is not None:
            for raw in programs[self.dealer_id]:
                if raw and raw[0] == SendToPeer.KIND and isinstance(raw[3], Slot):
                    self.dealt.append((raw[2], raw[3].index))
        # every party-to-party delivery of the programs, (sender, receiver, slot): each
        # receiver is told its sender before the call, so it takes that id from no one else
        self.deliveries: list[tuple[str, str, int]] = [
            (wid, raw[2], raw[3].index)
            for wid, cmds in programs.items()
            if wid != self.dealer_id
            for raw in cmds
            if raw and raw[0] == SendToPeer.KIND and isinstance(raw[3], Slot)
        ]
        self.program_ids: dict[str, int] = {}
        for w in workers:
            pid = w.new_id()
            w.post(StoreProgram(pid, programs[w.id]))
            self.program_ids[w.id] = pid


class SharedPlan:
    """A function of SharedTensors recorded into one program per worker (per input
    signature: shapes, dtypes and fixed-point scales)."""

    def __init__(self, fn: Callable[..., Any], *examples: SharedTensor, runs: bool = True) -> None:
        if any(isinstance(e, AuthenticatedTensor) for e in examples):
            raise MPCError(
                "mpc.plan does not record the authenticated mode (security='malicious') "
                "yet: call the function itself (each call's openings are checked before "
                "its output is revealed), or plan it in a semi-honest session"
            )
        if not examples or not all(isinstance(e, SharedTensor) for e in examples):
            raise TypeError("mpc.plan needs example SharedTensor inputs")
        session = examples[0].session
        for e in examples[1:]:
            session.check_compatible(e.session)
        for e in examples:
            e.materialize()
        self.fn = fn
        self.session = session
        self.workers = list(session.parties) + (
            [session.dealer] if session.dealer is not None else []
        )
        self.n_inputs = len(examples)
        first = Programs(fn, self.workers, examples, runs=runs)
        self._variants: dict[Signature, Programs] = {signature(examples): first}
        self.example_output = first.output
        first.output = None  # type: ignore[assignment]

    # the figures of the program set recorded for the examples
    @property
    def _first(self) -> Programs:
        return next(iter(self._variants.values()))

    @property
    def rounds(self) -> int:
        return self._first.rounds

    @property
    def commands(self) -> dict[str, int]:
        return self._first.commands

    @property
    def slots(self) -> Slots:
        return self._first.slots

    @property
    def program_ids(self) -> dict[str, int]:
        return self._first.program_ids

    @property
    def signatures(self) -> list[Signature]:
        """The input signatures a program set was recorded for."""
        return list(self._variants)

    def __call__(self, *inputs: SharedTensor) -> SharedTensor:
        if len(inputs) != self.n_inputs:
            raise TypeError(f"this plan takes {self.n_inputs} inputs, got {len(inputs)}")
        for x in inputs:
            if not isinstance(x, SharedTensor):
                raise TypeError(f"plan inputs must be SharedTensors, got {type(x).__name__}")
            self.session.check_compatible(x.session)
            x.materialize()
        sig = signature(inputs)
        variant = self._variants.get(sig)
        if variant is None:  # a new signature: record it, running fn op by op this once
            variant = Programs(self.fn, self.workers, inputs)
            self._variants[sig] = variant
            out, variant.output = variant.output, None  # type: ignore[assignment]
            return out
        return self._run(variant, inputs)

    def _bindings(
        self, variant: Programs, input_ids: list[int] | None
    ) -> tuple[list[int], dict[str, list[int]]]:
        """Fresh bindings for one call (``input_ids`` None: input slots 0, bound later)
        and, per worker, the ids its program will produce."""
        by_id = {w.id: w for w in self.workers}
        nonces = [s.next_nonce() for s in variant.nonce_sessions]
        bindings: list[int] = []
        promised: dict[str, list[int]] = {w.id: [] for w in self.workers}
        for kind, arg in variant.slots.kind:
            if kind == "new":
                v = by_id[arg].new_id()
                promised[arg].append(v)
            elif kind == "input":
                v = 0 if input_ids is None else input_ids[arg]
            elif kind == "carried":
                if variant.carry is None:
                    raise MPCError(
                        "this program refers to what an earlier run makes: run that first"
                    )
                v = variant.carry[arg]
            else:
                v = nonces[arg]
            bindings.append(v)
        return bindings, promised

    def preprocess(self, calls: int = 1, *examples: SharedTensor) -> None:
        """Deal the crypto provider's material for the next ``calls`` calls now (the
        offline phase): the dealer runs its program for each of them at once, with the
        nonces and ids those calls will use, and its corrections wait at the parties.
        A call that finds prepared material then runs the parties' programs only, so the
        dealer's work and its latency leave the call (the online phase). ``examples``:
        inputs of the signature to prepare for (default: the signature the plan was
        recorded with). Prepared material is used in order, one set per call, and only
        once; an unused set stays at the parties until the session ends."""
        if calls < 0:
            raise ValueError(f"calls must be at least 0, got {calls}")
        variant = self._variants.get(signature(examples)) if examples else self._first
        if variant is None:
            raise MPCError("no program set was recorded for that signature: call the plan once")
        self._preprocess(variant, calls)

    def _preprocess(self, variant: Programs, calls: int) -> None:
        dealer = self.session.dealer
        if dealer is None or variant.dealer_id is None:
            raise MPCError("this plan has no crypto provider: there is nothing to deal ahead")
        inputs_used = any(
            variant.slots.kind[i][0] == "input" for i in slots_of(variant.programs[dealer.id])
        )
        if inputs_used:  # (the dealer never sees inputs; a program that did is not dealt)
            raise MPCError("the crypto provider's program reads the plan's inputs")
        self.session.watch()
        by_id = {w.id: w for w in self.workers}
        # a network dealer queues a bounded number of programs per session (serve
        # --max-queued-programs, told in its hello): the sets are dealt in batches of at
        # most half of that, each run there before the next leaves, and a set counts as
        # prepared only once the dealer took its program
        batch = PREPROCESS_BATCH
        queued = getattr(dealer, "max_queued_programs", None)
        if type(queued) is int and queued > 0:
            batch = max(1, min(batch, queued // 2))
        sync = getattr(dealer, "sync", None)
        done = 0
        while done < calls:
            chunk: list[list[int]] = []
            for _ in range(min(batch, calls - done)):
                bindings, promised = self._bindings(variant, None)
                for party, slot in variant.dealt:  # the parties accept these before their call
                    expect = getattr(by_id[party], "expect_delivery", None)
                    if expect is not None:
                        expect(dealer.id, bindings[slot])
                run_programs(variant.program_ids, [dealer], bindings, promised)
                chunk.append(bindings)
            if sync is not None:
                last = done + len(chunk) >= calls
                try:  # (a refused program raises here; the next batch waits for this one)
                    sync() if last else sync(wait_programs=PREPROCESS_WAIT)
                except Exception as e:
                    raise MPCError(
                        f"preprocess: the crypto provider {dealer.id!r} took {done} of the "
                        f"{calls} calls' material (prepared now: {len(variant.prepared)}); "
                        f"the next batch of {len(chunk)} failed: {e}"
                    ) from e
            else:  # in process the dealer's programs run in threads: dealt means done
                wait = getattr(dealer, "wait_programs", None)
                if wait is not None:
                    wait(PREPROCESS_WAIT)
            variant.prepared.extend(chunk)
            done += len(chunk)
        for party in {p for p, _ in variant.dealt}:
            flush = getattr(by_id[party], "sync", None)
            if flush is not None:  # (the announcements leave now, not with the next call)
                flush()

    def _announce(
        self, dealer_id: str | None, deliveries: list[tuple[Any, str, int]], bindings: list[int]
    ) -> None:
        """Tell each receiving worker who delivers which of its ids (network workers then
        take each from that peer only: a party cannot fill another's slot)."""
        by_id = {w.id: w for w in self.workers}
        for src, dest, slot in deliveries:
            expect = getattr(by_id.get(dest), "expect_delivery", None)
            if expect is not None and src is not None:
                expect(src, bindings[slot])

    def prepared(self, *examples: SharedTensor) -> int:
        """How many calls (of the examples' signature; default the recorded one) have
        their material dealt ahead."""
        variant = self._variants.get(signature(examples)) if examples else self._first
        return 0 if variant is None else len(variant.prepared)

    def _run(
        self,
        variant: Programs,
        inputs: tuple[SharedTensor, ...],
        held: dict[str, tuple[list[Any], list[int]]] | None = None,
    ) -> SharedTensor:
        self.session.watch()
        input_ids = [s.id_at_location for x in inputs for s in x.shares]
        workers = self.workers
        if variant.prepared:  # the dealer ran already: the parties only, with its ids
            bindings = variant.prepared.popleft()
            for i, (kind, arg) in enumerate(variant.slots.kind):
                if kind == "input":
                    bindings[i] = input_ids[arg]
            # (the dealt ids too: a delivery still on its way is waited for, not refused)
            promised: dict[str, list[int]] = {w.id: [] for w in workers}
            for i, (kind, arg) in enumerate(variant.slots.kind):
                if kind == "new" and arg != variant.dealer_id:
                    promised[arg].append(bindings[i])
            workers = [w for w in workers if w.id != variant.dealer_id]
        else:
            bindings, promised = self._bindings(variant, input_ids)
            self._announce(
                variant.dealer_id, [(variant.dealer_id, p, k) for p, k in variant.dealt], bindings
            )
        self._announce(variant.dealer_id, variant.deliveries, bindings)
        run_programs(variant.program_ids, workers, bindings, promised, held)
        self.last_bindings = bindings
        accounting.count_round(variant.rounds)
        shares = []
        for party, slot, (shape, stride, dtype) in zip(
            self.session.parties, variant.out_slots, variant.out_share_meta
        ):
            shares.append(PointerTensor(RemoteRef(party, bindings[slot]), shape, stride, dtype))
        dtype, frac, pending = variant.out_meta
        out = SharedTensor(shares, self.session, frac, dtype, pending)
        # the programs read the inputs after this call returns: a caller that drops them
        # at once must not have their deletes overtake the programs, so the output keeps
        # them until it is dropped itself
        out.keep_alive = inputs
        return out

    def __repr__(self) -> str:
        return (
            f"SharedPlan(parties={[p.id for p in self.session.parties]}, "
            f"commands={self.commands}, rounds={self.rounds}, "
            f"signatures={len(self._variants)})"
        )


PREPROCESS_BATCH = 128  # calls' material a network dealer is sent at once, at most
PREPROCESS_WAIT = 60.0  # seconds preprocess waits for a dealer to run one batch


def slots_of(raw: Any) -> set[int]:
    """The slot numbers a program's commands use."""
    if isinstance(raw, Slot | SlotRef):
        return {raw.index}
    if isinstance(raw, list | tuple):
        return set().union(*(slots_of(x) for x in raw)) if raw else set()
    if isinstance(raw, dict):
        return set().union(*(slots_of(x) for x in raw.values())) if raw else set()
    return set()


def preprocess(plan: SharedPlan, calls: int = 1, *examples: SharedTensor) -> None:
    """``plan.preprocess(calls, *examples)``: deal the crypto provider's material for the
    plan's next ``calls`` calls ahead of them (see :meth:`SharedPlan.preprocess`)."""
    plan.preprocess(calls, *examples)


def plan(fn: Callable[..., Any], *examples: SharedTensor) -> SharedPlan:
    """Record ``fn`` (e.g. a model) on example SharedTensors into per-worker programs;
    a call with inputs of another signature records a program set for it once."""
    return SharedPlan(fn, *examples)
