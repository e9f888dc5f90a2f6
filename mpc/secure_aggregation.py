"""Secure aggregation for federated averaging: only the weighted mean of the updates is revealed.

Data workers W_1..W_K hold flat updates u_k (weight deltas) and public example counts n_k;
aggregation parties P_1..P_m (2 to 5 workers; they may be data workers too) add them up::

    1. W_k:  ū_k = encode(u_k, f)                          (fixed point, at W_k)
             [ū_k]_1..[ū_k]_m with [ū_k]_i uniform for i < m and
             [ū_k]_m = ū_k - sum_{i<m} [ū_k]_i              (W_k's own CSPRNG)
    2. W_k -> P_i:  [ū_k]_i                                 (peer delivery; W_k keeps none)
    3. P_i:  [s]_i = sum_k n_k [ū_k]_i                      (local: public integer weights)
    4. server:  s = sum_i [s]_i,  mean = decode(s, f) / N,  N = sum_k n_k

Steps 1-2 run at the data worker (the registered function :data:`SHARE_FUNCTION`), so the
orchestrating server never sees an update and never generates a share. This is additive
secret sharing among non-colluding aggregators, the setting of Prio (Corrigan-Gibbs and
Boneh, NSDI 2017) and of the "secure aggregation" step of federated learning (Bonawitz et
al., CCS 2017), without the latter's pairwise masking and dropout recovery: every worker
must answer in every round.

Who learns what (semi-honest parties, no collusion among all m aggregators):

- the server: ``s`` (equivalently the weighted mean, as the counts are public) and nothing
  about an individual update;
- an aggregation party: one uniformly random share of each update and of ``s``; a data
  worker that is also an aggregator holds the same about the other workers' updates;
- all m aggregators together could reconstruct every update: that is the trust assumption.

An update is either a value the client computed or sent at the data worker (federated
training drives the data workers: the update is then the client's, and the parties may be
data workers too), or a data owner's own data at its worker (:func:`pointers.own`, ``serve
--data``), which the worker shares only at the owner's count as ``n_k``, once, into the
aggregator's round; the parties then add it only for the owners their deployment lists
(never themselves), with each ``n_k`` within the deployment's bound
(:mod:`mpc.material.owned`).

The per-worker mean training loss travels inside the update (see :func:`pointers.federated.fedavg`),
so only its weighted mean is revealed too.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

import pointers as pt
from mpc.config import MPCConfig
from mpc.errors import MPCError
from mpc.material.owned import MIN_OWNERS, ReleaseRuleError, share_rule
from mpc.material.sizes import declare
from mpc.math.encoding import encode
from mpc.math.prg import split_additive
from mpc.release import OwnedShared, OwnedSum, owned
from mpc.session import Session
from pointers.worker.sealing import protocol_function

if TYPE_CHECKING:  # (pointers loads its federated layer on first use)
    from pointers.federated.datasets import FederatedDataset
    from pointers.federated.fedavg import FedAvgHistory

__all__ = ["SHARE_FUNCTION", "SecureAggregator", "install", "secure_fedavg", "share_update"]

SHARE_FUNCTION = "mpc.secagg.share_update"
_SAFE_BITS = 62  # encoded magnitudes stay below 2^62 (see mpc.math.encoding)


@protocol_function(share_rule)
def share_update(
    ctx: Any,
    update: torch.Tensor,
    frac_bits: int,
    n_shares: int,
    bound: float,
    weight: int = 1,
    min_owners: int = MIN_OWNERS,
    round: str = "",
) -> list[torch.Tensor]:
    """Run at the data worker: encode ``weight * update`` and split it into ``n_shares``
    additive shares, sealed with this worker as their owner and the release rule "an
    aggregate of at least ``min_owners`` owners" (:mod:`mpc.release`): no client can open
    one owner's value. Each value is shared once. An owner's own data
    (:mod:`pointers.worker.owners`) is shared only at the owner's count as ``weight``,
    into round ``round``, once whatever the round (:mod:`mpc.material.owned`).

    ``bound`` is public: a value with ``|u| >= bound`` could overflow the weighted sum, so
    the worker refuses it (the only thing an error tells is that the bound was exceeded).
    ``weight``: the owner's public example count, applied here (the parties only add).
    """
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= 2**31:
        raise ValueError(f"weight must be a positive int, got {weight!r}")
    if not isinstance(update, torch.Tensor) or not update.is_floating_point():
        raise TypeError("the update to share must be a floating tensor")
    if isinstance(n_shares, bool) or not isinstance(n_shares, int) or not 2 <= n_shares <= 5:
        raise ValueError(f"n_shares must be an int in [2, 5], got {n_shares!r}")
    if update.numel() and not bool(torch.isfinite(update).all()):
        raise ValueError("the update holds NaN or infinity; lower the learning rate")
    if update.numel() and float(update.abs().max()) >= bound:
        raise ValueError(
            f"an update value is too large to aggregate securely (|u| >= {bound:g} at "
            f"{frac_bits} fractional bits); lower the learning rate or frac_bits"
        )
    rest = encode(update, frac_bits)
    if weight != 1:
        rest = rest * weight
    return split_additive(rest, n_shares)


FUNCTIONS = {SHARE_FUNCTION: share_update}
declare(FUNCTIONS)  # what it allocates (mpc.material.sizes)


def install(worker: Any) -> None:
    """Register the secure-aggregation function with an in-process data worker (idempotent).

    A network worker has no registry on the client side: its server loads
    :data:`FUNCTIONS` from the ``pointers.worker_functions`` entry points (``mpc_secagg``).
    """
    functions = getattr(worker, "functions", None)
    if functions is not None:
        functions.register_all(FUNCTIONS)


class SecureAggregator:
    """A :class:`pointers.federated.fedavg` aggregator that reveals only the weighted mean of the updates.

    ``parties`` (2 to 5 workers) hold the shares; each data worker shares its own update
    and sends the shares to them directly. ``crypto_provider`` is optional: the aggregation
    is linear, so it needs no dealer material. ``frac_bits`` (or ``config``) sets the
    fixed-point precision: the mean is exact up to ``2**-(frac_bits + 1)`` per coordinate.
    """

    def __init__(
        self,
        parties: Sequence[Any],
        crypto_provider: Any | None = None,
        *,
        frac_bits: int | None = None,
        config: MPCConfig | None = None,
    ) -> None:
        if isinstance(parties, str) or not isinstance(parties, Sequence):
            raise TypeError("parties must be a sequence of workers, e.g. (alice, bob)")
        if config is not None and frac_bits is not None:
            raise TypeError("pass either frac_bits or config, not both")
        if config is None:
            config = MPCConfig() if frac_bits is None else MPCConfig(frac_bits=frac_bits)
        self.session = Session(list(parties), crypto_provider, config)

    @property
    def parties(self) -> list[Any]:
        return self.session.parties

    @property
    def frac_bits(self) -> int:
        return self.session.config.frac_bits

    def next_round(self) -> str:
        """Start a new round (each :meth:`aggregate` starts one): the parties add values of
        one round only. Returns the round's id."""
        self.session.round = os.urandom(8).hex()
        return self.session.round

    def share_update(self, update: pt.PointerTensor, weight: int = 1) -> OwnedShared:
        """Have ``update``'s worker share ``weight * update`` among the parties (steps 1-2
        above), into the current round. For an owner's own data, ``weight`` must be the
        owner's count.

        The returned :class:`~mpc.release.OwnedShared` is encoded at ``frac_bits``; the
        worker keeps no share (unless it is itself a party). It opens only inside an
        aggregate of at least two owners' updates (``(a + b).get()``): the parties refuse
        anything else (:mod:`mpc.release`).
        """
        return self._share(update, update_bound(self.frac_bits, weight), weight)

    def _share(self, update: pt.PointerTensor, bound: float, weight: int = 1) -> OwnedShared:
        if not isinstance(update, pt.PointerTensor):
            raise MPCError(
                "secure aggregation shares an update from the worker that holds it: pass a "
                f"PointerTensor, got {type(update).__name__}"
            )
        worker = update.location
        install(worker)
        m, f = self.session.n, self.frac_bits
        shape = tuple(update.shape)
        shares = pt.call_function(
            worker,
            SHARE_FUNCTION,
            [update, f, m, bound, weight, MIN_OWNERS, self.session.round],
            out=[(shape, torch.int64)] * m,
        )
        moved = [s.move(p) for s, p in zip(shares, self.parties)]  # type: ignore[union-attr]
        return owned(moved, self.session, f, torch.float64, worker.id, MIN_OWNERS)

    def aggregate(self, updates: Sequence[tuple[pt.PointerTensor, int]]) -> torch.Tensor:
        """``sum_k n_k u_k / sum_k n_k``, reconstructing only the weighted sum."""
        from pointers.federated.fedavg import check_updates

        _, dtype, total = check_updates(updates)
        owners = {update.location.id for update, _ in updates}
        if len(owners) < MIN_OWNERS:
            raise ReleaseRuleError(
                f"secure aggregation opens only an aggregate of at least {MIN_OWNERS} data "
                f"workers' updates (their release rule), got updates from {sorted(owners)}"
            )
        bound = update_bound(self.frac_bits, total)
        self.next_round()
        # each owner weights its own update by its public count n_k; the parties add
        # the shares (the release of an aggregate of at least two owners)
        terms = [self._share(update, bound, n) for update, n in updates]
        weighted_sum = OwnedSum(terms).get()  # float64: the only value opened
        return (weighted_sum / total).to(dtype)

    def __repr__(self) -> str:
        return f"SecureAggregator({self.session!r}, frac_bits={self.frac_bits})"


def update_bound(frac_bits: int, total: int) -> float:
    """Largest |u| for which ``sum_k n_k * encode(u_k)`` stays below 2^62 when the counts
    add up to ``total`` (``total * |u| * 2^f < 2^62``)."""
    return 2.0 ** (_SAFE_BITS - frac_bits) / total


def secure_fedavg(
    model: nn.Module,
    federated_dataset: FederatedDataset,
    parties: Sequence[Any],
    crypto_provider: Any | None = None,
    *,
    frac_bits: int | None = None,
    **kwargs: Any,
) -> tuple[nn.Module, FedAvgHistory]:
    """:func:`pointers.federated.fedavg` with a :class:`SecureAggregator` among ``parties``."""
    if "aggregator" in kwargs:
        raise TypeError(
            "secure_fedavg() builds its own aggregator; use pointers.federated.fedavg instead"
        )
    aggregator = SecureAggregator(parties, crypto_provider, frac_bits=frac_bits)
    from pointers.federated.fedavg import fedavg

    return fedavg(model, federated_dataset, aggregator=aggregator, **kwargs)
