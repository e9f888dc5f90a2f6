"""CrypTen's ``crypten.communicator``: ``comm.get().get_rank()`` and friends.

There are no rank processes talking to each other here: the parties exchange what the
protocols need among themselves, and a client (this process) orchestrates them (see
:mod:`mpc.crypten._world`). So the rank queries, the barrier and the communication
statistics exist; point-to-point messages between ranks do not.
"""

from __future__ import annotations

import builtins
from typing import Any, NoReturn

from mpc.crypten import _world
from mpc.crypten._errors import unavailable

_MESSAGES = (
    "ranks here are threads of one client, not processes with a channel between them: the "
    "parties exchange protocol messages among themselves inside each crypten call, and the "
    "client moves plain values with pointers (pointers.send(x, worker), ptr.move(worker), "
    ".get()); to give every rank a value, compute it before run_multiprocess or pass it as "
    "an argument"
)


class Communicator:
    """The current rank's view (CrypTen's ``comm.get()``)."""

    def get_rank(self) -> int:
        return _world.rank()

    def get_world_size(self) -> int:
        return _world.world_size()

    def get_name(self) -> str:
        """The party worker's id of this rank (e.g. ``party0``)."""
        s = _world.setup()
        return s.party_ids(_world.world_size())[_world.rank()]

    def barrier(self) -> None:
        """Wait until every rank gets here (a collective that computes nothing)."""
        _world.collective("barrier", lambda _: None)

    def get_communication_stats(self) -> dict[str, Any]:
        """Since ``crypten.init()`` or the last reset: ``rounds`` (sequential openings among
        the parties), ``bytes`` (what this rank's party sent to its peers, as CrypTen counts
        per party), ``bytes_per_party``, ``dealer_bytes`` (the crypto provider's),
        ``client_messages`` (commands the client sent the workers) and ``time`` (seconds
        spent in crypten calls, computation included)."""
        s = _world.setup()
        st = s.stats
        me = self.get_name()
        return {
            "rounds": st.rounds,
            "bytes": st.bytes_per_party.get(me, 0),
            "bytes_per_party": dict(st.bytes_per_party),
            "dealer_bytes": st.dealer_bytes,
            "client_messages": st.client_messages,
            "time": st.time,
        }

    def print_communication_stats(self) -> None:
        """Print the statistics (rank 0 prints; CrypTen logs them at level INFO)."""
        if _world.rank():
            return
        st = self.get_communication_stats()
        builtins.print("====Communication Stats====")
        builtins.print(f"Rounds: {st['rounds']}")
        builtins.print(f"Bytes: {st['bytes']} (party {self.get_name()})")
        builtins.print(f"Bytes per party: {st['bytes_per_party']}")
        builtins.print(f"Dealer bytes: {st['dealer_bytes']}")
        builtins.print(f"Time: {st['time']:.4f} s")

    def reset_communication_stats(self) -> None:
        _world.collective("reset_communication_stats", lambda _: _reset())

    def __getattr__(self, name: str) -> NoReturn:
        if name in {
            "send",
            "recv",
            "isend",
            "irecv",
            "scatter",
            "reduce",
            "all_reduce",
            "gather",
            "all_gather",
            "broadcast",
            "send_obj",
            "recv_obj",
            "broadcast_obj",
        }:
            unavailable(f"comm.get().{name}", _MESSAGES)
        raise AttributeError(f"'Communicator' object has no attribute {name!r}")


def _reset() -> None:
    from mpc.crypten._setup import Stats

    _world.setup().stats = Stats()


_COMM = Communicator()


def get() -> Communicator:
    """The communicator of the current rank (CrypTen's ``crypten.communicator.get()``)."""
    _world.setup()  # (raises if crypten.init() was not called, as CrypTen's)
    return _COMM


def is_initialized() -> bool:
    return bool(_world._SETUP)


__all__ = ["Communicator", "get", "is_initialized"]
