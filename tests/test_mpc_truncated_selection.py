"""Values truncated in their selection on the comparison's arithmetic last level
(mpc.protocols.comparison.arith_select: U's and D's products): [(v >> f) msb(x)] in the
comparison's 3 rounds, with no truncation round after them. Against plaintext
(hypothesis), GELU and SiLU as a user writes them, and a client that asks for another
truncation than the dealer's. Runs on both worker kinds (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import refused
from tampering import tamper

import mpc
import pointers as pt
from mpc.protocols.comparison import run as carry_run
from mpc.protocols.comparison.arith_select import arith_select
from mpc.protocols.comparison.steps import dealer_compare
from mpc.protocols.step import name_of

I64 = torch.int64
RING = (1 << 63) - 1


def shared_ring(values: torch.Tensor, parties: list[Any], dealer: Any, config: Any = None) -> Any:
    """Ring values (int64) shared as they are: party 0's share plus them."""
    x = mpc.share(torch.zeros(values.shape), *parties, crypto_provider=dealer, config=config)
    x.shares[0] = x.shares[0] + pt.send(values, parties[0])
    return x


def opened(shares: Any) -> torch.Tensor:
    return sum(s.get() for s in shares)  # type: ignore[return-value]


def assert_selected(
    got: list[Any], x: torch.Tensor, v: torch.Tensor, bits: int, complement: bool
) -> None:
    """got[0] = (v >> bits) msb(x) (or its complement) within one unit, got[1] = v msb(x)."""
    bit = (x < 0).long()
    if complement:
        bit = 1 - bit
    diff = opened(got[0]) - (v >> bits) * bit
    assert bool(((diff == 0) | (diff == bit)).all()), diff  # (one unit more at most)
    if len(got) > 1:
        assert torch.equal(opened(got[1]), v * bit)


@settings(max_examples=20, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(-RING, RING), st.integers(-(1 << 61), 1 << 61)),
        min_size=1,
        max_size=40,
    ),
    bits=st.integers(1, 40),
    n=st.sampled_from([2, 3]),
    complement=st.booleans(),
)
def test_truncated_selections_against_plaintext(
    data: list[tuple[int, int]], bits: int, n: int, complement: bool
) -> None:
    """(v >> f) msb(x) (or its complement) within one unit of the plaintext, beside a
    value selected as it is (exact), in 3 rounds; |v| < 2^61."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("d")
    x = torch.tensor([d[0] for d in data], dtype=I64)
    v = torch.tensor([d[1] for d in data], dtype=I64)
    sx, sv = shared_ring(x, parties, dealer), shared_ring(v, parties, dealer)
    with mpc.stats() as s:
        run = carry_run.CarryRun(sx.session, list(sx.shares), [list(sv.shares)] * 2, bits=[bits, 0])
        got = run.finish_select(complement)
    assert s.rounds == 3
    assert_selected(got, x, v, bits, complement)


def check_gelu_and_silu(parties: list[Any], dealer: Any, config: Any, rounds: int) -> None:
    """GELU and SiLU as a user writes them: ``rounds`` (the comparison's, no truncation
    after them), within the series' tolerance; a product's pending truncation is read at
    its full scale (the product's round, then ``rounds``)."""
    torch.manual_seed(len(parties))
    x = torch.randn(3, 200) * 4
    x[0, :6] = torch.tensor([-5.0, 5.0, 0.0, 40.0, -40.0, 4.999])
    for fn, tol in [(F.gelu, 5e-5), (F.silu, 2e-4)]:
        xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
        xs.materialize()
        with mpc.stats() as s:
            y = fn(xs)
            y.materialize()
        assert s.rounds == rounds
        assert float((y.get() - fn(x)).abs().max()) < tol
    w = torch.randn(200, 200) / 16
    a = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    b = mpc.share(w, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        y = F.gelu(a @ b)
        y.materialize()
    assert s.rounds == 1 + rounds
    assert float((y.get() - F.gelu(x @ w)).abs().max()) < 2e-3


@pytest.mark.parametrize("n", [2, 3])
def test_gelu_and_silu_as_a_user_writes_them(make_worker: Callable[[str], Any], n: int) -> None:
    """The comparison's 3 rounds and no truncation after them (4 took)."""
    names = ("alice", "bob", "dave")[:n]
    check_gelu_and_silu([make_worker(w) for w in names], make_worker("carol"), None, 3)


# -- as a client that sends the steps -----------------------------------------------------


@pytest.mark.parametrize("bits", [[], [7], [0]])
def test_the_last_party_selects_with_the_truncation_dealt(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, bits: list[int]
) -> None:
    """A selection finished with another truncation (or none) than the dealer's products
    are for is refused at the last party."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol)
    tamper(monkeypatch, carry_run, arith_select, lambda i, a: a[:8] + bits if i == 1 else a)
    run = carry_run.CarryRun(x.session, list(x.shares), [list(x.shares)], bits=[16])
    refused(bob, lambda: run.finish_select(False), "another comparison or truncation")


def test_the_dealer_truncates_on_the_arithmetic_level_only(
    make_worker: Callable[[str], Any],
) -> None:
    """Truncated selections asked of a comparison that ends on the daBit: refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol)
    seeds = x.session.dealer_seeds
    args = [seeds, x.session.next_nonce(), [6], [1, 2], [3], None, 0, False, [16]]
    refused(
        carol,
        lambda: pt.call_function(carol, name_of(dealer_compare), args, out=[((1,), I64)]),
        "arithmetic last level",
    )
