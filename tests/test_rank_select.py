"""The selection of the entry of rank 0 (mpc.protocols.rank_select): [rank = 0] and
[rank = 0] x exactly, for any ranks in [0, 2^m) and any ring values, in one round, against
plaintext for 2 and 3 parties (hypothesis); its bad inputs; and its steps as an attacker
calls them, on both worker kinds (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refusals import refused

import mpc
import pointers as pt
from mpc.protocols.rank_select.run import select_rank_zero
from mpc.protocols.rank_select.steps import MAX_RANK_BITS

I64 = torch.int64
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def group() -> tuple[list[Any], Any]:
    return [pt.VirtualWorker(f"rs{i}") for i in range(3)], pt.VirtualWorker("rs_dealer")


@SETTINGS
@given(data=st.data(), n=st.sampled_from([2, 3]), bits=st.sampled_from([1, 2, 5, 6, 8]))
def test_the_rank_zero_entries_and_their_values_are_selected_exactly(
    group: tuple[list[Any], Any], data: st.DataObject, n: int, bits: int
) -> None:
    parties, dealer = group
    shape = tuple(data.draw(st.lists(st.integers(1, 5), min_size=1, max_size=3), label="shape"))
    count = 1
    for d in shape:
        count *= d
    rank = st.one_of(st.just(0), st.integers(0, (1 << bits) - 1))
    ranks = torch.tensor(data.draw(st.lists(rank, min_size=count, max_size=count)), dtype=I64)
    word = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from([0, 1, -1, -(2**63)]))
    xs = torch.tensor(data.draw(st.lists(word, min_size=count, max_size=count)), dtype=I64)
    r = mpc.share(ranks.view(shape), *parties[:n], crypto_provider=dealer)
    x = mpc.share(xs.view(shape), session=r.session)
    with mpc.stats() as s:
        delta, selected = select_rank_zero(r.session, r.shares, x.shares, bits)
        got_delta = sum(d.get() for d in delta)
        got = sum(v.get() for v in selected)
    assert s.rounds == 1
    want = (ranks == 0).to(I64).view(shape)
    assert torch.equal(got_delta, want)
    assert torch.equal(got, want * xs.view(shape))


@pytest.mark.parametrize("bits", [0, MAX_RANK_BITS + 1])
def test_ranks_too_wide_are_refused(group: tuple[list[Any], Any], bits: int) -> None:
    parties, dealer = group
    r = mpc.share(torch.tensor([0, 1]), *parties[:2], crypto_provider=dealer)
    with pytest.raises(ValueError, match=f"1 to {MAX_RANK_BITS} bits"):
        select_rank_zero(r.session, r.shares, r.shares, bits)


# -- as an attacker calls the steps ------------------------------------------------------


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


_refused = refused  # (tests/refusals.py)


def _step(worker: Any, name: str, args: list[Any], out: Any) -> Any:
    return pt.call_function(worker, name, args, out=out)


def test_a_client_cannot_misuse_the_rank_selection_steps(trio: Any) -> None:
    """The finish takes only the opened c and e of its own instance; the masks' streams
    are used once; the dealer deals an instance's tables once; an honest run after that
    still selects."""
    alice, bob, carol = trio
    ranks = torch.tensor([2, 0, 1])
    r = mpc.share(ranks, alice, bob, crypto_provider=carol)
    x = mpc.share(torch.tensor([5, -7, 9]), session=r.session)
    s, seeds = r.session, r.session.party_seeds
    n, bits = s.next_nonce(), 2
    out = [((3,), I64)] * 2
    c0, e0 = _step(alice, "mpc.rank_mask", [seeds[0], n, r.shares[0], x.shares[0]], out)
    # a finish on the masked shares (not opened), or on plain shares, is refused
    for c, e in ((c0, e0), (r.shares[0], x.shares[0])):
        _refused(
            alice,
            lambda c=c, e=e: _step(alice, "mpc.rank_finish", [seeds[0], n, None, c, e, bits], out),
            "opened|sealed|protocol",
        )
    _refused(
        alice,
        lambda: _step(alice, "mpc.rank_mask", [seeds[0], n, r.shares[0], x.shares[0]], out),
        "never used twice|sealed|protocol",
    )
    m = s.next_nonce()
    _step(carol, "mpc.dealer_rank_select", [s.dealer_seeds, m, [3], bits], [((24,), I64)])
    _refused(
        carol,
        lambda: _step(
            carol, "mpc.dealer_rank_select", [s.dealer_seeds, m, [3], bits], [((24,), I64)]
        ),
        "never used twice|sealed|protocol",
    )
    delta, selected = select_rank_zero(s, r.shares, x.shares, bits)
    assert torch.equal(sum(d.get() for d in delta), torch.tensor([0, 1, 0]))
    assert torch.equal(sum(v.get() for v in selected), torch.tensor([0, -7, 0]))
