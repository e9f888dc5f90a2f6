"""Release rules (issue 27, finding 6): a value shared by its owner at the owner's worker
(secure aggregation, PySyft's ``x_ptr.share(...)``) opens only as an aggregate of at
least two owners' values. Before, ``SecureAggregator.share_update(ptr).get()`` and
``x_ptr.fix_precision().share(...).get()`` reconstructed one owner's value at the client;
now (issue 26) that ``get()`` gives the value still shared, as PySyft's did, and opening
it (``get()`` again) is refused.
Each attack is tried as the client would send it, through the API and as raw steps, and
checked by what reaches the client. Runs on both worker kinds (conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mpc
import pointers as pt
from mpc.release import OwnedShared, ReleaseRuleError
from pointers.wire.messages import Describe


@pytest.fixture
def five(make_worker: Callable[[str], Any]) -> tuple[Any, ...]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol", "dave", "erin"))


def _sync(worker: Any) -> None:
    worker.request(Describe([]))


def test_one_owners_update_never_opens(five: tuple[Any, ...]) -> None:
    alice, bob, carol, w1, w2 = five
    agg = mpc.SecureAggregator([alice, bob], crypto_provider=carol)
    u1, u2 = torch.tensor([1.0, -2.0, 0.5]), torch.tensor([0.25, 4.0, -1.0])
    a = agg.share_update(pt.send(u1, w1))
    b = agg.share_update(pt.send(u2, w2))
    assert isinstance(a, OwnedShared)
    fetched = a.get()  # PySyft's fetch: the value still shared, nothing opens
    assert isinstance(fetched, OwnedShared) and fetched.shares == a.shares
    with pytest.raises(ReleaseRuleError, match="at least 2 owners"):
        fetched.get()  # opening one owner's value
    # no op opens it either: not a product, not a sum with a value of the client's
    mine = mpc.share(torch.zeros(3), alice, bob, crypto_provider=carol)
    for attempt in (lambda: a * 1, lambda: a + mine, lambda: a - b, lambda: a + a):
        with pytest.raises(ReleaseRuleError):
            res = attempt()
            res.get()
    # the shares at the parties: sealed, refused to fetch or to run an op on
    for share in a.shares:
        for attempt in (lambda s=share: s.get(delete=False), lambda s=share: (s + 0).get()):
            with pytest.raises(pt.RemoteError, match="sealed"):
                attempt()
                _sync(share.location)
    # the aggregate opens, and only it
    assert torch.allclose((a + b).get(), (u1 + u2).double(), atol=2.0**-15)


def test_raw_release_steps_enforce_the_rule_at_every_party(five: tuple[Any, ...]) -> None:
    """As raw steps: the release of one owner's shares, of both shares of one owner at one
    party, or of the same shares twice (two aggregates subtracted) is refused."""
    alice, bob, carol, w1, w2 = five
    agg = mpc.SecureAggregator([alice, bob], crypto_provider=carol)
    a = agg.share_update(pt.send(torch.ones(4), w1))
    b = agg.share_update(pt.send(torch.ones(4) * 2, w2))
    out = [((4,), torch.int64)]
    with pytest.raises(pt.RemoteError, match="at least 2 owners"):
        pt.call_function(alice, "mpc.release_sum", [[a.shares[0]]], out=out)
        _sync(alice)
    # both shares of a at alice: the client copies bob's share to alice (it may not)
    with pytest.raises(pt.RemoteError, match="again"):
        a.shares[1].copy_to(alice)
        _sync(bob)
    (s0,) = pt.call_function(alice, "mpc.release_sum", [[a.shares[0], b.shares[0]]], out=out)
    with pytest.raises(pt.RemoteError, match="takes a owned|spent"):
        pt.call_function(alice, "mpc.release_sum", [[a.shares[0], b.shares[0]]], out=out)
        _sync(alice)
    (s1,) = pt.call_function(bob, "mpc.release_sum", [[a.shares[1], b.shares[1]]], out=out)
    total = s0.get() + s1.get()
    assert torch.equal(total, torch.full((4,), 3 * 2**16, dtype=torch.int64))


def test_an_owner_shares_a_value_once(five: tuple[Any, ...]) -> None:
    """Two sharings of one update would give two aggregates to subtract."""
    alice, bob, carol, w1, _ = five
    agg = mpc.SecureAggregator([alice, bob], crypto_provider=carol)
    p = pt.send(torch.ones(2), w1)
    agg.share_update(p)
    with pytest.raises(pt.RemoteError, match="shared before"):
        agg.share_update(p)
        _sync(w1)


def test_pysyft_remote_share_opens_only_the_aggregate(five: tuple[Any, ...]) -> None:
    """PySyft's Part 10: ``remote.fix_precision().share(...)`` then the sum of two workers'
    values. One worker's value never reaches the client in the clear."""
    pt.hook(torch)
    alice, bob, carol, w1, w2 = five
    x = torch.tensor([1.5, -2.0]).send(w1)
    y = torch.tensor([0.5, 4.0]).send(w2)
    ex = x.fix_precision().share(alice, bob, crypto_provider=carol)
    ey = y.fix_precision().share(alice, bob, crypto_provider=carol)
    ex, ey = ex.get(), ey.get()  # Part 10: brought over still shared
    with pytest.raises(ReleaseRuleError, match="opens only a sum"):
        ex.get()
    with pytest.raises(ReleaseRuleError, match="float_precision"):
        ex.float_precision()
    assert torch.allclose((ex + ey).get(), torch.tensor([2.0, 2.0]), atol=1e-3)
