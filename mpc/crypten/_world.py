"""Ranks without processes: how ``run_multiprocess`` runs CrypTen's SPMD programs here.

CrypTen runs one process per party, each running the same program; every crypten call is
a collective that all processes make together. Here the parties are workers driven by one
client, so ``run_multiprocess(world_size=k)`` runs the function once per rank, in ``k``
threads of this process (rank 0 in the calling thread), in lockstep:

* every crypten call (creating, computing on, decrypting an encrypted tensor, a model's
  forward, ``encrypt``, an optimizer step...) is a *collective*: each rank arrives with its
  own arguments (its *payload*), and when all have arrived rank 0 makes the call once, for
  everyone, with rank ``src``'s data where the call takes one (``cryptensor(x, src=1)``),
  and every rank gets the same result object;
* everything else (plain torch, printing, the rank's own control flow) runs in the rank's
  own thread, as it would in its own process;
* only rank 0's thread talks to the workers: a rank's own request (the repr of its share)
  is run by rank 0's thread while it waits.

Outside ``run_multiprocess`` the client is rank 0 of the default world and a call is just
made. Either way each outermost call is counted (rounds, bytes, time) for
``crypten.print_communication_stats()``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from mpc.accounting import stats
from mpc.crypten._errors import (
    CollectiveMismatchError,
    NotInitializedError,
    WorldAbortedError,
)
from mpc.crypten._setup import Setup

_SETUP: list[Setup] = []  # the current crypten.init()'s setup (one at most)
_local = threading.local()  # .world, .rank (inside run_multiprocess), .depth (nested calls)


def setup() -> Setup:
    if not _SETUP:
        raise NotInitializedError()
    return _SETUP[0]


def install(s: Setup | None) -> None:
    old = _SETUP[:]
    _SETUP.clear()
    if s is not None:
        _SETUP.append(s)
    for o in old:
        o.close()


class World:
    """The ranks of one ``run_multiprocess`` call and their rendezvous."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.main = threading.current_thread()
        self._cond = threading.Condition()
        self._arrived: dict[int, tuple[str, Any]] = {}
        self._generation = 0
        self._outcome: tuple[Any, BaseException | None] = (None, None)
        self._requests: list[tuple[Callable[[], Any], list[Any]]] = []
        self._finished: set[int] = set()
        self._failure: tuple[int, BaseException] | None = None

    # -- every rank ---------------------------------------------------------------------
    def _check(self, rank: int) -> None:
        if self._failure is not None and self._failure[0] != rank:
            r, e = self._failure
            raise WorldAbortedError(f"rank {r} failed ({type(e).__name__}: {e}); rank {rank} stops")

    def finish(self, rank: int, error: BaseException | None) -> None:
        with self._cond:
            self._finished.add(rank)
            if error is not None and not isinstance(error, WorldAbortedError):
                if self._failure is None:
                    self._failure = (rank, error)
            self._cond.notify_all()

    # -- ranks 1..k-1 --------------------------------------------------------------------
    def arrive(self, rank: int, label: str, payload: Any) -> Any:
        with self._cond:
            generation = self._generation
            self._arrived[rank] = (label, payload)
            self._cond.notify_all()
            while self._generation == generation:
                self._check(rank)
                if 0 in self._finished:
                    raise CollectiveMismatchError(
                        f"rank {rank} called {label} after rank 0 had returned: every rank "
                        "must make the same crypten calls"
                    )
                self._cond.wait()
            result, error = self._outcome
        if error is not None:
            raise error
        return result

    def ask(self, rank: int, fn: Callable[[], Any]) -> Any:
        """Have rank 0's thread run ``fn`` (a request of this rank alone)."""
        slot: list[Any] = []
        with self._cond:
            self._requests.append((fn, slot))
            self._cond.notify_all()
            while not slot:
                self._check(rank)
                self._cond.wait()
        ok, value = slot[0]
        if not ok:
            raise value
        return value

    # -- rank 0 --------------------------------------------------------------------------
    def _serve(self) -> None:
        """Run the waiting requests (called holding the lock; releases it meanwhile)."""
        while self._requests:
            fn, slot = self._requests.pop(0)
            self._cond.release()
            try:
                out: tuple[bool, Any] = (True, fn())
            except Exception as e:
                out = (False, e)
            finally:
                self._cond.acquire()
            slot.append(out)
            self._cond.notify_all()

    def gather(self, label: str, payload: Any, compute: Callable[[list[Any]], Any]) -> Any:
        with self._cond:
            while True:
                self._serve()
                self._check(0)
                if len(self._arrived) == self.size - 1:
                    break
                gone = [r for r in self._finished if r and r not in self._arrived]
                if gone:
                    raise CollectiveMismatchError(
                        f"rank 0 called {label} but rank {gone[0]} had returned: every rank "
                        "must make the same crypten calls"
                    )
                self._cond.wait()
            arrived, self._arrived = self._arrived, {}
        others = [arrived[r] for r in range(1, self.size)]
        error: BaseException | None = None
        result = None
        odd = [(r, lab) for r, (lab, _) in enumerate(others, 1) if lab != label]
        if odd:
            r, lab = odd[0]
            error = CollectiveMismatchError(
                f"rank 0 called {label} where rank {r} called {lab}: every rank must make the "
                "same crypten calls in the same order"
            )
        else:
            try:
                result = compute([payload] + [p for _, p in others])
            except Exception as e:
                error = e
        with self._cond:
            self._outcome = (result, error)
            self._generation += 1
            self._cond.notify_all()
        if error is not None:
            raise error
        return result

    def wait_all(self) -> None:
        """Rank 0 returned: serve the others until every rank has returned."""
        with self._cond:
            while len(self._finished) < self.size:
                self._serve()
                self._cond.wait(0.5)

    def failure(self) -> BaseException | None:
        return None if self._failure is None else self._failure[1]


def current_world() -> World | None:
    return getattr(_local, "world", None)


def rank() -> int:
    return getattr(_local, "rank", 0)


def world_size() -> int:
    w = current_world()
    return w.size if w is not None else setup().default_size


def _depth() -> int:
    return int(getattr(_local, "depth", 0))


def check_src(src: Any, what: str = "src") -> int:
    size = world_size()
    if isinstance(src, bool) or not isinstance(src, int) or not 0 <= src < size:
        raise ValueError(f"{what} must be a rank in [0, {size}), got {src!r}")
    return src


def _counted(fn: Callable[[], Any]) -> Any:
    """Run an outermost call, adding its rounds, bytes and time to the setup's counters."""
    s = setup()
    _local.depth = 1
    start = time.perf_counter()
    try:
        with stats() as rec:
            out = fn()
    finally:
        _local.depth = 0
    s.stats.add(rec, time.perf_counter() - start)
    return out


def collective(label: str, compute: Callable[[list[Any]], Any], payload: Any = None) -> Any:
    """Make the crypten call ``label`` once for every rank: ``compute`` gets the payloads of
    all ranks (rank order) and returns the result every rank gets (see the module
    docstring). Nested in another call, or outside ``run_multiprocess``, it just runs
    (each rank's payload is then the caller's)."""
    w = current_world()
    if _depth():
        return compute([payload] * (w.size if w is not None else world_size()))
    if w is None:
        return _counted(lambda: compute([payload] * world_size()))
    r = rank()
    if r:
        return w.arrive(r, label, payload)
    return w.gather(label, payload, lambda payloads: _counted(lambda: compute(payloads)))


def on_main(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` (a rank's own request to the workers) in the thread that talks to them."""
    w = current_world()
    if w is None or threading.current_thread() is w.main or _depth():
        return fn()
    return w.ask(rank(), fn)


def run_world(size: int, fn: Callable[..., Any], args: Any, kwargs: Any) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as ranks 0..size-1 (rank 0 in this thread)."""
    if current_world() is not None:
        raise CollectiveMismatchError("run_multiprocess cannot run inside run_multiprocess")
    setup().session(size)  # (the workers of this world size exist before any rank runs)
    world = World(size)
    results: list[Any] = [None] * size
    errors: list[BaseException | None] = [None] * size

    def run(r: int) -> None:
        _local.world, _local.rank, _local.depth = world, r, 0
        try:
            results[r] = fn(*args, **kwargs)
        except BaseException as e:
            errors[r] = e
        finally:
            world.finish(r, errors[r])
            _local.world, _local.rank = None, 0

    threads = [
        threading.Thread(target=run, args=(r,), name=f"crypten-rank{r}", daemon=True)
        for r in range(1, size)
    ]
    for t in threads:
        t.start()
    try:
        run(0)
        world.wait_all()
    finally:
        for t in threads:
            t.join()
    first = world.failure()
    if first is not None:
        raise first
    for e in errors:
        if e is not None:
            raise e
    return results
