"""Threads and program slots of a served worker, shared fairly among its clients.

* :class:`ProgramPool` and :class:`ProgramQueue`: the bounded threads that run programs
  (``RunProgram``), per worker and per session; :class:`FairProgramPool` shares the
  worker's slots among client identities;
* :class:`CallShares`: a gRPC handler pool's threads, shared among client identities.

Imports only :mod:`pointers.errors`.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable

from pointers.errors import LimitExceeded, PartyUnavailable


class ProgramPool:
    """The threads that run a served worker's programs (``RunProgram``), bounded.

    At most ``per_worker`` programs run at once in the whole worker and ``per_client`` per
    client session; the others wait in their session's queue, in the order they came (the
    order a client posted them, the same at every worker, so the earliest program still
    running at one worker runs at the others too), and a session may queue
    ``max_queued`` at most: beyond, ``RunProgram`` is refused with
    :class:`~pointers.errors.LimitExceeded`. Threads are started when programs come and
    end when their queue is empty."""

    def __init__(self, per_worker: int, per_client: int, max_queued: int) -> None:
        if per_worker < 1 or per_client < 1 or max_queued < 1:
            raise ValueError("program limits must be at least 1")
        self.per_worker, self.per_client, self.max_queued = per_worker, per_client, max_queued
        self.cond = threading.Condition()
        self.running = 0
        self._ready: deque[ProgramQueue] = deque()  # queues waiting for a worker-wide slot

    def _schedule(self, q: ProgramQueue) -> None:
        """Start threads for ``q`` as the limits allow (with :attr:`cond` held)."""
        while q.jobs and q.running < self.per_client and self.running < self.per_worker:
            q.running += 1
            self.running += 1
            threading.Thread(
                target=self._drain, args=(q,), name=f"program-{q.name}", daemon=True
            ).start()
        if q.jobs and q.running < self.per_client and q not in self._ready:
            self._ready.append(q)

    def _drain(self, q: ProgramQueue) -> None:
        while True:
            with self.cond:
                if not q.jobs:
                    q.running -= 1
                    self.running -= 1
                    while self._ready and self.running < self.per_worker:
                        self._schedule(self._ready.popleft())
                    self.cond.notify_all()
                    return
                job = q.jobs.popleft()
            try:
                job()
            except Exception:  # noqa: S110 - a program reports its own failures
                pass


class ProgramQueue:
    """One session's programs waiting for, or running in, a :class:`ProgramPool`."""

    def __init__(self, pool: ProgramPool, name: str) -> None:
        self.pool, self.name = pool, name
        self.jobs: deque[Callable[[], None]] = deque()
        self.running = 0
        self.closed = False

    def submit(self, job: Callable[[], None]) -> None:
        pool = self.pool
        with pool.cond:
            if self.closed:
                raise PartyUnavailable("this client's session at the worker has ended", None)
            if len(self.jobs) >= pool.max_queued:
                raise LimitExceeded(
                    f"worker {self.name!r}: this client already has {len(self.jobs)} programs "
                    f"waiting to run ({self.running} running; at most {pool.per_client} run "
                    f"at once per client, {pool.per_worker} per worker, and "
                    f"{pool.max_queued} wait): wait for its programs (wait_programs) first"
                )
            self.jobs.append(job)
            pool._schedule(self)

    def wait(self, timeout: float | None) -> bool:
        """Wait until no program of this session runs or waits; False on timeout."""
        with self.pool.cond:
            return self.pool.cond.wait_for(lambda: not self.jobs and not self.running, timeout)

    def close(self) -> None:
        with self.pool.cond:
            self.closed = True
            self.jobs.clear()
            self.pool.cond.notify_all()


class CallShares:
    """The threads of one handler pool (commands, or inspections), shared fairly among
    client identities.

    gRPC runs a call on a pool thread until it returns, and some calls wait (for a peer's
    delivery, for the calls of the connection before them, for the session's programs:
    up to an hour). So that one identity's waiting calls never hold the threads another
    client's calls need, a call that waits for the session's programs is taken only while
    its identity holds fewer than its *share* (a quarter of the pool), or while fewer than
    half the pool's threads run calls at all; any other such call is refused at once with
    :class:`~pointers.errors.LimitExceeded`, holding a thread for no more than that. One
    identity (all its sessions together) thus holds at most half of a pool, and every
    other identity always finds its share free."""

    def __init__(self, worker: str, pool: str, size: int) -> None:
        self.worker, self.pool, self.size = worker, pool, size
        self.share = max(1, size // 4)
        self.open = max(1, size // 2)
        self._lock = threading.Lock()
        self.running = 0
        self._held: dict[str, int] = {}

    def enter(self, who: str, what: str, waits: bool = True) -> None:
        """Take a thread for a call of ``who``; ``waits``: the call may wait long (for the
        session's programs), so it counts against the identity's share. Other calls (their
        commands run, or wait for their turn and their peers, within the deadline) are
        always taken: refusing them would fail a busy honest client's pipelined calls."""
        with self._lock:
            mine = self._held.get(who, 0)
            if waits and mine >= self.share and self.running >= self.open:
                raise LimitExceeded(
                    f"worker {self.worker!r} is busy: client {who!r} already has {mine} "
                    f"calls running or waiting here, its share of the {self.size} "
                    f"{self.pool} threads (serve --threads: a client identity holds at "
                    f"most {self.share} of them once {self.open} are in use); this call "
                    f"({what}) was not run: wait for the earlier ones (their programs, "
                    "their peers), then call again"
                )
            self._held[who] = mine + 1
            self.running += 1

    def leave(self, who: str) -> None:
        with self._lock:
            left = self._held.get(who, 1) - 1
            if left > 0:
                self._held[who] = left
            else:
                self._held.pop(who, None)
            self.running -= 1


class FairProgramPool(ProgramPool):
    """The worker's program slots (``--programs-per-worker``), shared fairly: a client
    identity holds at most half of them (all its sessions together; at least
    ``--programs-per-client``), and a program
    thread that finishes a program gives its slot to a session waiting for one before it
    runs the next program of its own (sessions take turns, one program each, instead of
    one session's queue keeping its slots for as long as it has programs)."""

    def __init__(self, per_worker: int, per_client: int, max_queued: int) -> None:
        super().__init__(per_worker, per_client, max_queued)
        self.per_owner = max(per_client, per_worker // 2)
        self._owner_of: weakref.WeakKeyDictionary[ProgramQueue, str] = weakref.WeakKeyDictionary()
        self._owned: dict[str, int] = {}  # program slots held per identity

    def own(self, q: ProgramQueue, owner: str) -> None:
        """``q`` is a session of client identity ``owner``."""
        with self.cond:
            self._owner_of[q] = owner

    def _schedule(self, q: ProgramQueue) -> None:
        owner = self._owner_of.get(q, "")
        while (
            q.jobs
            and q.running < self.per_client
            and self.running < self.per_worker
            and self._owned.get(owner, 0) < self.per_owner
        ):
            q.running += 1
            self.running += 1
            self._owned[owner] = self._owned.get(owner, 0) + 1
            threading.Thread(
                target=self._drain, args=(q,), name=f"program-{q.name}", daemon=True
            ).start()
        if q.jobs and q.running < self.per_client and q not in self._ready:
            self._ready.append(q)

    def _release(self, q: ProgramQueue) -> None:
        """A thread of ``q`` gives its slot back (with :attr:`cond` held); the sessions
        waiting for a slot are tried in turn."""
        owner = self._owner_of.get(q, "")
        q.running -= 1
        self.running -= 1
        left = self._owned.get(owner, 1) - 1
        if left > 0:
            self._owned[owner] = left
        else:
            self._owned.pop(owner, None)
        for _ in range(len(self._ready)):
            if self.running >= self.per_worker:
                break
            self._schedule(self._ready.popleft())
        self.cond.notify_all()

    def _another_waits(self, q: ProgramQueue) -> bool:
        """Whether a session other than ``q`` waits for a slot that ``q``'s would give it
        (with :attr:`cond` held)."""
        mine = self._owner_of.get(q, "")
        for r in self._ready:
            if r is q or not r.jobs or r.running >= self.per_client:
                continue
            owner = self._owner_of.get(r, "")
            if owner == mine or self._owned.get(owner, 0) < self.per_owner:
                return True
        return False

    def _drain(self, q: ProgramQueue) -> None:
        ran = False  # (a thread runs one program at least before it gives its slot away)
        while True:
            with self.cond:
                if not q.jobs:
                    self._release(q)
                    return
                if ran and self._ready and self._another_waits(q):
                    # another session waits for a slot: it goes first, this one queues
                    if q not in self._ready:
                        self._ready.append(q)
                    self._release(q)
                    return
                job = q.jobs.popleft()
            ran = True
            try:
                job()
            except Exception:  # noqa: S110 - a program reports its own failures
                pass
