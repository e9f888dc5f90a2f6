"""Plans over secret-shared values: one program per party (and the dealer).

``mpc.plan(fn, *example_inputs)`` runs ``fn`` once on SharedTensors while recording the
commands the client sends to every party and to the crypto provider; each worker stores
its own command list once. A call then costs the client one message per worker instead
of one per op: the parties run their programs concurrently, waiting for each other's
deliveries, and every call binds fresh object ids and fresh nonces (so no triple or mask
is ever reused).

>>> import torch, pointers as pt, mpc
>>> alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
>>> x = mpc.share(torch.tensor([1.0, -2.0]), alice, bob, crypto_provider=carol)
>>> relu_plan = mpc.plan(torch.relu, x)
>>> relu_plan(x).get()
tensor([1., 0.])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pointers.messages import StoreProgram
from pointers.pointer_tensor import PointerTensor, RemoteRef
from pointers.program import Recording, build_programs, run_programs

from . import accounting
from .errors import MPCError
from .shared import SharedTensor


class SharedPlan:
    """A function of SharedTensors recorded into one program per worker."""

    def __init__(self, fn: Callable[..., Any], *examples: SharedTensor) -> None:
        if not examples or not all(isinstance(e, SharedTensor) for e in examples):
            raise TypeError("mpc.plan needs example SharedTensor inputs")
        session = examples[0].session
        for e in examples[1:]:
            session.check_compatible(e.session)
        for e in examples:
            e.materialize()
        self.session = session
        self.workers = list(session.parties) + (
            [session.dealer] if session.dealer is not None else []
        )
        self._input_meta = [(tuple(e.shape), e.dtype, e.frac_bits) for e in examples]
        nonces: list[int] = []
        next_nonce = session.next_nonce

        def recording_nonce() -> int:
            v = next_nonce()
            nonces.append(v)
            return v

        session.next_nonce = recording_nonce  # type: ignore[method-assign]
        try:
            with accounting.stats() as counted, Recording(self.workers) as rec:
                out = fn(*examples)
                if not isinstance(out, SharedTensor):
                    raise MPCError("a plan must return one SharedTensor")
        finally:
            del session.next_nonce
        self.rounds = counted.rounds
        self.example_output = out
        inputs = [s.id_at_location for e in examples for s in e.shares]
        programs, self.slots = build_programs(rec, inputs, nonces)
        self._n_extras = len(nonces)
        self._out_slots = [self.slots.index[s.id_at_location] for s in out.shares]
        self._out_meta = (tuple(out.shape), out.dtype, out.frac_bits, out.pending)
        self._out_share_meta = [(tuple(s.shape), s.stride(), s.dtype) for s in out.shares]
        self.program_ids: dict[str, int] = {}
        self.commands = {wid: len(p) for wid, p in programs.items()}
        for w in self.workers:
            pid = w.new_id()
            w.post(StoreProgram(pid, programs[w.id]))
            self.program_ids[w.id] = pid

    def __call__(self, *inputs: SharedTensor) -> SharedTensor:
        if len(inputs) != len(self._input_meta):
            raise TypeError(f"this plan takes {len(self._input_meta)} inputs, got {len(inputs)}")
        for x, (shape, _dtype, frac) in zip(inputs, self._input_meta):
            if not isinstance(x, SharedTensor):
                raise TypeError(f"plan inputs must be SharedTensors, got {type(x).__name__}")
            self.session.check_compatible(x.session)
            x.materialize()
            if tuple(x.shape) != shape or x.frac_bits != frac:
                raise MPCError(
                    f"plan input of shape {tuple(x.shape)} (frac_bits {x.frac_bits}) does not "
                    f"match the recorded {shape} (frac_bits {frac})"
                )
        self.session.watch()
        by_id = {w.id: w for w in self.workers}
        input_ids = [s.id_at_location for x in inputs for s in x.shares]
        extras = [self.session.next_nonce() for _ in range(self._n_extras)]
        bindings: list[int] = []
        promised: dict[str, list[int]] = {w.id: [] for w in self.workers}
        for kind, arg in self.slots.kind:
            if kind == "new":
                v = by_id[arg].new_id()
                promised[arg].append(v)
            elif kind == "input":
                v = input_ids[arg]
            else:
                v = extras[arg]
            bindings.append(v)
        run_programs(self.program_ids, self.workers, bindings, promised)
        accounting.count_round(self.rounds)
        shares = []
        for party, slot, (shape, stride, dtype) in zip(
            self.session.parties, self._out_slots, self._out_share_meta
        ):
            shares.append(PointerTensor(RemoteRef(party, bindings[slot]), shape, stride, dtype))
        shape, dtype, frac, pending = self._out_meta
        return SharedTensor(shares, self.session, frac, dtype, pending)

    def __repr__(self) -> str:
        return (
            f"SharedPlan(parties={[p.id for p in self.session.parties]}, "
            f"commands={self.commands}, rounds={self.rounds})"
        )


def plan(fn: Callable[..., Any], *examples: SharedTensor) -> SharedPlan:
    """Record ``fn`` (e.g. a model) on example SharedTensors into per-worker programs."""
    return SharedPlan(fn, *examples)
