"""The serving side of a network worker: one :class:`ServedWorker` per client namespace.

A served process holds one namespace per client session (an identity and a session token,
see :mod:`pointers.network.lease`): its own object store, counters and peer links, so one
client's ids and objects are invisible to another, and the server frees a namespace whose
lease ran out (:meth:`ServedWorker.close`). Each namespace
is an ordinary :class:`pointers.worker.base.Worker` (same message handler as in process) with:

* a :class:`~pointers.network.waiting.WaitingStore`: a lookup of an id a peer will deliver
  (announced by the client) or a program will produce (promised) waits for it, bounded by
  the deadline;
* a :class:`~pointers.network.waiting.NamespaceLock`: commands of the client and of the
  programs it started run one at a time, and a command waiting for an object sets the
  lock aside until it arrives, so the command (or program) that produces it can run
  meanwhile;
* limits on what the client stores (:mod:`pointers.network.limits`): bytes
  (``max_stored_bytes``; a program or plan by its Python objects, and tags by their
  characters) and objects (``max_objects``); an op or a plan's outputs are sized on the
  ``meta`` device and refused before they run;
* a :class:`~pointers.network.quotas.ProgramQueue` in the worker's
  :class:`~pointers.network.quotas.ProgramPool`: programs run on a bounded number of
  threads, per session and per worker;
* the network control messages: ``ConnectPeer`` (a link to a peer) and ``AcceptPeer``
  (deliveries from that peer may land in this namespace).
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from pointers.errors import (
    LimitExceeded,
    NotAllowedError,
    PartyUnavailable,
    PointerError,
)
from pointers.network.framing import is_error_header
from pointers.network.limits import held_size, op_bytes
from pointers.network.quotas import ProgramPool, ProgramQueue
from pointers.network.waiting import NamespaceLock, WaitingStore
from pointers.plans.graph import PlanGraph
from pointers.wire import serde
from pointers.wire.messages import (
    AcceptPeer,
    ConnectPeer,
    ExecuteOp,
    Fetch,
    RunPlan,
    RunProgram,
    SendToPeer,
    Store,
    Tag,
    encode_message,
)
from pointers.worker.base import Frames, Worker
from pointers.worker.client import WorkerStats
from pointers.worker.execution import handles
from pointers.worker.functions import bind_arguments, function_size
from pointers.worker.program import Program, held_run
from pointers.worker.program import run_program as run_program_steps

MAX_PEER_LINKS = 64  # peers one session may deliver to (ConnectPeer)
# (peer, address, client, session; replacing=: the address of the link it replaces)
PeerLinkFactory = Callable[..., Any]


class ServedWorker(Worker):
    """One client's namespace at a served worker."""

    def __init__(
        self,
        id: str,
        client: str,
        *,
        functions: Mapping[str, Callable[..., Any]],
        link_factory: PeerLinkFactory,
        deadline: float,
        max_stored_bytes: int | None,
        session: str = "",
        max_objects: int | None = None,
        programs: ProgramPool | None = None,
        max_held_bytes: int | None = None,
    ) -> None:
        super().__init__(id)
        self.client = client
        self.session = session
        lock = NamespaceLock()
        self._lock = lock
        self.store: WaitingStore = WaitingStore(
            id,
            deadline=deadline,
            max_bytes=max_stored_bytes,
            lock=lock,
            max_objects=max_objects,
            max_held=max_held_bytes,
        )
        self.programs = ProgramQueue(programs or ProgramPool(64, 8, 1024), id)
        self.calls = 0  # calls of the client running now (the lease does not run out)
        self.seen = time.monotonic()  # when the client's last call ended (or began)
        self.functions.register_all(dict(functions))
        self.accepted: set[str] = set()
        self._link_factory = link_factory
        self._pop_after_reply: int | None = None
        # fetch replies built and not yet sent (released when their tensors are freed),
        # bounded by the message limit and the storage limit; the reservation of the
        # fetch running now (handed to its reply's buffers by handle_frames)
        server_config = getattr(getattr(link_factory, "__self__", None), "config", None)
        self.max_reply_bytes: int | None = getattr(server_config, "max_message_bytes", None)
        self._replying = 0
        self._reply_lock = threading.Lock()
        self._reserved = 0
        self._control = False
        self._lost_lock = threading.Lock()
        # set while a client's SendToPeer runs (a program's deliveries are not reported
        # here: the peers waiting for them fail, and so does the program's output)
        self._commanded = threading.local()
        self.store.on_wait_failed = self._forget_unreachable
        self._order_cond = threading.Condition()
        self._order_next: dict[str, int] = {}  # connection token -> the next call's number
        # connection token -> the numbers of its calls here (waiting for their turn, running)
        self._order_here: dict[str, set[int]] = {}
        self._turn_waiters = 0
        # queued deliveries that failed, not reported yet: (peer unreachable, message)
        self._lost_deliveries: list[tuple[bool, str]] = []

    def handle_frames(
        self,
        header: bytes,
        buffers: list[Any],
        donated: bool = False,
        from_peer: str | None = None,
    ) -> Frames:
        with self._lock:
            self._control = False
            self._reserved = 0
            out = super().handle_frames(header, buffers, donated, from_peer)
            reserved, self._reserved = self._reserved, 0
            if reserved:  # a fetch's reply: its bytes count until its buffers are freed
                if out[1]:
                    alias = out[1][0].detach()
                    weakref.finalize(alias, self._replied, reserved)
                    out = (out[0], [alias, *out[1][1:]])
                else:
                    self._replied(reserved)
            # (reset after reading: a command that waited let other commands run meanwhile)
            control, self._control = self._control, False
            if control:  # introductions are control traffic: uncounted, as in process
                stats = self.stats
                stats.messages_received -= 1
                stats.bytes_received -= serde.nbytes(header, buffers)
                stats.messages_sent -= 1
                stats.bytes_sent -= serde.nbytes(*out)
            obj_id = self._pop_after_reply
            if obj_id is not None:  # a fetch-and-delete: delete once the reply is encoded
                self._pop_after_reply = None
                if not is_error_header(out[0]):
                    self.store.discard(obj_id)
            return out

    @handles(Fetch)
    def _fetch(self, msg: Fetch) -> Any:
        if not msg.delete:
            value = super()._fetch(msg)
        else:
            value = self._readable(msg.obj_id, "fetching it").value
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"object {msg.obj_id} is not a tensor")
        self._reserve_reply(msg.obj_id, value.numel() * value.element_size())
        if msg.delete:
            self._pop_after_reply = msg.obj_id
        return value

    def _reserve_reply(self, obj_id: int, size: int) -> None:
        """Count a fetch's reply (``size`` bytes of tensor data) before it is built: the
        replies built and not yet sent to this client may take at most the message
        limit (``serve --max-message-mb``, what one reply can carry) and the storage
        limit (``--max-stored-mb``), whichever is smaller."""
        limits = [x for x in (self.max_reply_bytes, self.store.max_bytes) if x]
        with self._reply_lock:
            total = self._replying + size
            if limits and size and total > min(limits):
                raise LimitExceeded(
                    f"worker {self.id!r}: the reply to a fetch of object {obj_id} ({size} "
                    f"bytes) would take the replies being built for this client to {total} "
                    f"bytes, over {min(limits)} bytes (the smaller of serve --max-message-mb "
                    "and --max-stored-mb); fetch fewer objects per call"
                )
            self._replying = total
        self._reserved += size

    def _replied(self, size: int) -> None:
        with self._reply_lock:
            self._replying -= size

    # -- deliveries that do not wait for the peer ----------------------------------------
    def deliver(
        self,
        peer: str,
        obj_id: int,
        value: Any,
        donate: bool = False,
        lend: bool = False,
        sealed: Any = False,
        on_lost: Callable[[str], None] | None = None,
    ) -> None:
        """Send ``value`` without waiting for the peer (see
        :class:`~pointers.network.peers.PeerLink`); a link that cannot post delivers and
        waits, as in process. A failure is reported at the client's next call here
        (:meth:`take_lost`; a client's command only), to the peer, and to ``on_lost``
        (a move puts its object back)."""
        link = self.peer_link(peer)
        post = getattr(link, "post_frames", None)
        if post is None:
            return super().deliver(peer, obj_id, value, donate, lend, sealed)
        lock = self.store.lock
        if getattr(link, "paused", False) and lock is not None:  # flow control (PeerLink)
            depth = lock.suspend()  # (this namespace counts as stalled meanwhile)
            try:
                link.wait_room(obj_id, held_size(value))  # type: ignore[union-attr]
            finally:
                lock.resume(depth)
        self._room_in_flight(peer, obj_id, held_size(value) + 1024)
        header, buffers = encode_message(Store(obj_id, value, [], "", sealed))
        self.stats.peer_messages_sent += 1
        self.stats.peer_bytes_sent += serde.nbytes(header, buffers)
        report = getattr(self._commanded, "on", False)

        def failed(why: str) -> None:
            if report:
                self._lost(peer, obj_id, why)
            if on_lost is not None:
                on_lost(why)

        post(header, buffers, obj_id, failed if report or on_lost is not None else None)

    def in_flight(self) -> int:
        """Bytes of this session's deliveries posted to its peers and not yet answered."""
        return sum(
            getattr(link, "queued_bytes", getattr(link, "_queued_bytes", 0))
            for link in list(self._peer_links.values())
        )

    def _room_in_flight(self, peer: str, obj_id: int, size: int) -> None:
        """Wait (up to the deadline) until a delivery of ``size`` bytes fits: what the
        session stores plus its deliveries in flight (encoded copies, all its peers
        together) may take its byte limit at most; then ``LimitExceeded``."""
        store = self.store
        if store.max_bytes is None:
            return
        end = time.monotonic() + store.deadline
        while True:
            flying = self.in_flight()
            total = store.used() + flying + size
            if total <= store.max_bytes:
                return
            left = end - time.monotonic()
            if not flying or left <= 0:
                raise LimitExceeded(
                    f"worker {self.id!r}: delivering object {obj_id} ({size} bytes) to "
                    f"{peer!r} would take this client's stored bytes and its deliveries in "
                    f"flight ({flying} bytes) to {total} bytes, over its limit of "
                    f"{store.max_bytes} bytes (serve --max-stored-mb)"
                )
            for link in list(self._peer_links.values()):
                flush = getattr(link, "flush", None)
                if flush is not None:
                    flush(min(left, 0.5))

    def _lost(self, peer: str, obj_id: int, why: str) -> None:
        """A delivery did not arrive (called on a gRPC thread): reported to
        the client by :meth:`take_lost`."""
        with self._lost_lock:
            if len(self._lost_deliveries) < 16:
                self._lost_deliveries.append(
                    (
                        why.startswith("PartyUnavailable"),
                        f"worker {self.id!r} could not deliver object {obj_id} to its peer "
                        f"{peer!r}: {why}",
                    )
                )

    # -- the order of a connection's calls ---------------------------------------------
    MAX_CONNECTIONS_ORDERED = 64  # connection tokens remembered per namespace
    MAX_CALLS_AHEAD = 16  # how far ahead of the next call a pipelined one may be numbered
    MAX_TURN_WAITERS = 16  # calls of a session waiting for their turn at once (threads)

    def wait_turn(self, token: str, number: int, pipelined: bool) -> None:
        """Wait until the calls a pipelined call left after have run here. A call before
        it that came (it runs, or waits for its own turn) is waited for as long as it
        runs, however long that is: running this one first would run its commands before
        those posted earlier (an op on an object that call makes, a delete before a use).
        Only a call that did not come is waited for at most the deadline (counted from the
        last call of the connection that ended here), then this one runs anyway. A call
        older than one that already ran is refused: its place is gone."""
        with self._order_cond:
            here = self._order_here.setdefault(token, set())
            here.add(number)  # (until end_turn, which the caller always calls)
            if not pipelined:
                return
            nxt = self._order_next.get(token)
            if nxt is not None and number > nxt + self.MAX_CALLS_AHEAD:
                raise PointerError(
                    f"worker {self.id!r}: call {number} of this connection cannot wait for "
                    f"call {nxt}: at most {self.MAX_CALLS_AHEAD} calls may be in flight"
                )
            if self._turn_waiters >= self.MAX_TURN_WAITERS and (nxt is None or number > nxt):
                raise LimitExceeded(
                    f"worker {self.id!r}: {self._turn_waiters} calls of this session already "
                    "wait for the calls before them; send fewer at once"
                )
            deadline = self.store.deadline
            end = time.monotonic() + deadline
            self._turn_waiters += 1
            try:
                while number > (nxt or 0):  # (None: none of its calls ran here yet)
                    if any(n < number for n in here):  # an earlier call is here: it ends
                        end = time.monotonic() + deadline
                    left = end - time.monotonic()
                    if left <= 0:
                        return  # the calls before it did not come: run it anyway
                    self._order_cond.wait(left)
                    ran = self._order_next.get(token)
                    if ran != nxt:  # a call ended: the wait for the next one starts now
                        end = time.monotonic() + deadline
                    nxt = ran
            finally:
                self._turn_waiters -= 1
            nxt = nxt or 0
            if number < nxt:
                raise PointerError(
                    f"worker {self.id!r}: call {number} of this connection came after call "
                    f"{nxt - 1} had run (it arrived too late to keep its place)"
                )

    def end_turn(self, token: str, number: int) -> None:
        with self._order_cond:
            here = self._order_here.get(token)
            if here is not None:
                here.discard(number)
                if not here:
                    del self._order_here[token]
            order = self._order_next
            if token not in order and len(order) >= self.MAX_CONNECTIONS_ORDERED:
                del order[next(iter(order))]  # the oldest connection's
            order[token] = max(order.get(token, 0), number + 1)
            self._order_cond.notify_all()

    def _forget_unreachable(self) -> None:
        """A wait here failed for want of a peer: the client learns of it from that
        failure, so the deliveries lost to unreachable peers so far are not reported
        again at the next sync."""
        with self._lost_lock:
            self._lost_deliveries = [(u, m) for u, m in self._lost_deliveries if not u]

    def take_lost(self, unreachable: bool = True) -> str | None:
        """The deliveries that failed and were not reported yet (one message), and forget
        them. ``unreachable=False`` (a call's commands): only those a peer refused; those
        to an unreachable peer wait for the next sync (whoever waits for that peer learns
        it anyway, from the deadline there), so a call after a failed protocol step does
        not fail again for the same dead peer; nor are they once a wait here failed (see
        :meth:`_forget_unreachable`)."""
        with self._lost_lock:
            take = [m for u, m in self._lost_deliveries if unreachable or not u]
            self._lost_deliveries = [
                (u, m) for u, m in self._lost_deliveries if not (unreachable or not u)
            ]
        # deliveries into this namespace that it refused: reported at the next sync
        refused = self.store.take_refused() if unreachable else None
        if refused is not None:
            take.append(refused)
        return "; ".join(take) if take else None

    def flush_deliveries(self, timeout: float | None = None) -> bool:
        """Wait until every delivery of this namespace in flight was answered (False: timed out)."""
        ok = True
        for link in list(self._peer_links.values()):
            flush = getattr(link, "flush", None)
            if flush is not None:
                ok = flush(timeout) and ok
        return ok

    @handles(SendToPeer)
    def _send_to_peer(self, msg: SendToPeer) -> None:
        self._commanded.on = True  # a client's command: a lost delivery is reported to it
        try:
            return super()._send_to_peer(msg)
        except PartyUnavailable:
            raise  # the peer itself is unreachable: nobody to tell
        except Exception as e:
            link = self.peer_link(msg.peer)
            notify = getattr(link, "delivery_failed", None)
            if notify is not None:
                try:  # best effort: let the peer fail its waiting command at once
                    notify(msg.new_id, f"{type(e).__name__}: {e}")
                except Exception:  # noqa: S110 - the original error is what matters
                    pass
            raise
        finally:
            self._commanded.on = False

    @handles(ConnectPeer)
    def _connect_peer(self, msg: ConnectPeer) -> None:
        self._control = True
        if msg.peer == self.id:
            raise ValueError(f"worker {self.id!r} cannot be its own peer")
        old = self.peer_link(msg.peer)
        if old is None and len(self._peer_links) >= MAX_PEER_LINKS:
            raise LimitExceeded(
                f"worker {self.id!r}: this session may deliver to at most {MAX_PEER_LINKS} peers"
            )
        replacing = None if old is None else getattr(old, "address", None)
        link = self._link_factory(
            msg.peer, msg.address, self.client, self.session, replacing=replacing
        )
        self.add_peer_link(msg.peer, link)
        close = getattr(old, "close", None)
        if close is not None:  # (its channel is closed once no session's link uses it)
            close()

    @handles(AcceptPeer)
    def _accept_peer(self, msg: AcceptPeer) -> None:
        self._control = True
        peer = msg.peer
        if peer == self.client:
            raise ValueError(f"the client {peer!r} cannot also be a delivering peer")
        self.accepted.add(peer)
        self.store.peer_available(peer)

    def wait_programs(self, timeout: float | None = None) -> None:
        """Wait until this client's programs ended, ``timeout`` seconds at most in all."""
        self.programs.wait(timeout)

    @handles(RunProgram)
    def run_program(self, msg: RunProgram) -> None:
        """Queue the program in this session's :class:`ProgramQueue` (bounded threads)."""
        program = self.store.get(msg.program_id)
        if not isinstance(program, Program):
            raise TypeError(f"object {msg.program_id} is not a program")
        if len(msg.bindings) < program.n_slots:
            raise PointerError(
                f"the program needs {program.n_slots} bindings, got {len(msg.bindings)}"
            )
        run = held_run(self, program, msg)
        bindings, promised = list(msg.bindings), list(msg.promised)
        self.store.promise(promised)
        try:
            self.programs.submit(lambda: run_program_steps(self, program, bindings, promised, run))
        except BaseException:
            self.store.release_promises(promised)
            raise

    @handles(RunPlan)
    def _run_plan(self, msg: RunPlan) -> Any:
        """Size a plan's outputs on the ``meta`` device before it runs (as an op's)."""
        store = self.store
        if store.max_bytes is not None:
            plan = store.get(msg.plan_id)
            if isinstance(plan, PlanGraph):
                try:
                    args = self._resolve(msg.args)
                    metas = (
                        plan.infer(args) if all(isinstance(a, torch.Tensor) for a in args) else None
                    )
                except Exception:  # the run itself reports bad arguments
                    metas = None
                if metas:
                    size = sum(math.prod(shape) * dtype.itemsize for shape, _, dtype in metas)
                    store.charge_check(None, size, f"plan {plan.name!r}")
        return super()._run_plan(msg)

    @handles(Tag)
    def _tag(self, msg: Tag) -> None:
        self._readable(msg.obj_id, "tagging it")
        self.store.retag(msg.obj_id, list(msg.tags), msg.description)

    def check_op(self, msg: ExecuteOp, op: Any, args: list[Any], kwargs: dict[str, Any]) -> None:
        """Refuse an op whose outputs would take the client past its byte limit, before
        it runs (their size from the op run on the ``meta`` device)."""
        store = self.store
        if store.max_bytes is None:
            return
        size = op_bytes(msg.op, op, args, kwargs)
        if size:
            ids = msg.out_ids
            store.charge_check(ids[0] if len(ids) == 1 else None, size, f"{msg.op}")

    def check_function(
        self, name: str, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]
    ) -> None:
        """Refuse a registered function whose declared size (its peak and what it keeps,
        :func:`pointers.worker.functions.sized`) would take the client past its byte
        limit, before it runs, and count what it keeps. With a limit, a function that
        declares no size is refused."""
        self._check_function(name, fn, args, kwargs, 0, name)

    def _check_function(
        self,
        name: str,
        fn: Callable[..., Any],
        args: list[Any],
        kwargs: dict[str, Any],
        live: int,
        what: str,
    ) -> None:
        store = self.store
        if store.max_bytes is None:
            return
        spec = function_size(fn)
        if spec is None:
            raise NotAllowedError(
                f"worker {self.id!r}: function {name!r} declares no size "
                "(pointers.worker.functions.sized), and a worker with a storage limit runs "
                "only functions it can size before they run (serve --max-stored-mb)"
            )
        try:
            params = bind_arguments(fn, args, kwargs)
        except TypeError as e:
            raise TypeError(f"{name}: {e}") from None
        peak, kept = spec.bytes(params)
        store.charge_check(None, live + peak + kept, what)
        store.keep(kept, what)

    def check_node(
        self,
        kind: str,
        target: str,
        fn: Any,
        args: list[Any],
        kwargs: dict[str, Any],
        live: int,
        where: str,
    ) -> None:
        """Refuse a plan's node (an aten op, or a registered function: ``kind``) whose
        outputs, with the intermediates the plan holds now (``live`` bytes), would take
        the client past its byte limit, before it runs (called by
        :meth:`pointers.plans.graph.PlanGraph.run`)."""
        store = self.store
        if store.max_bytes is None:
            return
        if kind == "fn":
            self._check_function(target, fn, args, kwargs, live, where)
            return
        size = op_bytes(target, fn, args, kwargs)
        store.charge_check(None, live + size, where)

    def close(self, reason: str) -> tuple[int, int]:
        """End this namespace (its lease expired): free its objects and queued programs;
        the objects and bytes it held."""
        self.programs.close()
        held = self.store.close(reason)
        self.function_state.clear()
        for link in self._peer_links.values():
            close = getattr(link, "close", None)
            if close is not None:
                close()
        self._peer_links.clear()
        self.accepted.clear()
        return held

    def clear(self) -> None:
        """Forget every object and zero the counters (the client asked for a fresh start)."""
        with self._lock:
            self.store.clear()
            self.function_state.clear()
            self.stats = WorkerStats()
            policy = getattr(self, "data_policy", None)
            if policy is not None:  # the owner's data stays (its sharing record too)
                policy.place(self, self.client)
        with self._lost_lock:
            self._lost_deliveries = []
