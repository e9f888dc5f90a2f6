"""Values truncated in their selection on the FSS comparison's daBit
(mpc.protocols.fss.trunc_select: the dealer's U, D, t U and t D): [(v >> f) msb(x)] in the
comparison's 2 rounds, with no truncation round after them. Against plaintext
(hypothesis), GELU and SiLU as a user writes them, and a client that asks for another
truncation than the dealer's, or finishes a selection twice. Runs on both worker kinds
(conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import refused
from tampering import tamper
from test_mpc_truncated_selection import assert_selected, check_gelu_and_silu, shared_ring

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.fss import run as fss_run
from mpc.protocols.fss.steps import dealer_fss
from mpc.protocols.fss.trunc_select import fss_trunc_select
from mpc.protocols.step import name_of

I64 = torch.int64
RING = (1 << 63) - 1
FSS = MPCConfig(comparison="fss")


def _shared(values: torch.Tensor, parties: list[Any], dealer: Any) -> Any:
    return shared_ring(values, parties, dealer, FSS)


@settings(max_examples=20, deadline=None)
@given(
    data=st.lists(
        st.tuples(st.integers(-RING, RING), st.integers(-(1 << 61), 1 << 61)),
        min_size=1,
        max_size=40,
    ),
    bits=st.integers(1, 62),
    complement=st.booleans(),
)
def test_truncated_selections_against_plaintext(
    data: list[tuple[int, int]], bits: int, complement: bool
) -> None:
    """(v >> f) msb(x) (or its complement) within one unit of the plaintext, beside a
    value selected as it is (exact), in 2 rounds; |v| < 2^61, every x of the ring."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    dealer = pt.VirtualWorker("d")
    x = torch.tensor([d[0] for d in data], dtype=I64)
    v = torch.tensor([d[1] for d in data], dtype=I64)
    sx, sv = _shared(x, parties, dealer), _shared(v, parties, dealer)
    with mpc.stats() as s:
        run = fss_run.FssRun(sx.session, list(sx.shares), [list(sv.shares)] * 2, bits=[bits, 0])
        got = run.finish_select(complement)
    assert s.rounds == 2
    assert_selected(got, x, v, bits, complement)


def test_edges_of_the_truncation() -> None:
    """Values at the edges of |v| < 2^62 and of the masks' carries: each within one unit,
    at 1, 16 and 62 bits."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    dealer = pt.VirtualWorker("d")
    edge = (1 << 62) - 1
    v = torch.tensor([0, 1, -1, edge, -edge, 1 << 40, -(1 << 40), 65535, -65536], dtype=I64)
    x = torch.tensor([-1, 0, 5, -7, 1, -(1 << 62), 1 << 62, -RING, RING], dtype=I64)
    sx, sv = _shared(x, parties, dealer), _shared(v, parties, dealer)
    for bits in (1, 16, 62):
        run = fss_run.FssRun(sx.session, list(sx.shares), [list(sv.shares)], bits=[bits])
        assert_selected(run.finish_select(False), x, v, bits, False)


def test_gelu_and_silu_as_a_user_writes_them(make_worker: Callable[[str], Any]) -> None:
    """With FSS comparisons: the comparison's 2 rounds and no truncation after them (3
    took)."""
    parties = [make_worker(w) for w in ("alice", "bob")]
    check_gelu_and_silu(parties, make_worker("carol"), FSS, 2)


def test_an_mlp_as_a_user_writes_it() -> None:
    """A transformer's MLP (Linear, GELU in its tanh form, Linear) shared with FSS
    comparisons: the same output as torch within the fixed point's error, the GELU in the
    comparison's 2 rounds."""
    torch.manual_seed(3)
    mlp = torch.nn.Sequential(
        torch.nn.Linear(32, 128), torch.nn.GELU(approximate="tanh"), torch.nn.Linear(128, 32)
    ).eval()
    x = torch.randn(3, 32)
    with torch.no_grad():
        want = mlp(x)
    alice, bob, carol = (pt.VirtualWorker(w) for w in ("alice", "bob", "carol"))
    mpc.share(mlp, alice, bob, crypto_provider=carol, config=FSS)
    with torch.no_grad(), mpc.stats() as s:
        got = mlp(mpc.share(x, alice, bob, crypto_provider=carol, config=FSS)).get()
    assert float((got - want).abs().max()) < 5e-3
    assert s.rounds <= 6, s.rounds


# -- as a client that sends the steps -----------------------------------------------------


@pytest.mark.parametrize("change", ["other bits", "plain"])
def test_the_last_party_selects_with_the_truncation_dealt(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """A selection finished with another truncation than the dealer's words are for is
    refused at the last party; so is a value selected as it is from them."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = _shared(torch.ones(6, dtype=I64), [alice, bob], carol)
    if change == "other bits":
        tamper(
            monkeypatch,
            fss_run,
            fss_trunc_select,
            lambda i, a: a[:4] + [7] + a[5:] if i == 1 else a,
        )
        run = fss_run.FssRun(x.session, list(x.shares), [list(x.shares)], bits=[16])
        refused(bob, lambda: run.finish_select(False), "another comparison or truncation")
    else:  # (the plain selection's product step, given the truncated value's words)
        run = fss_run.FssRun(x.session, list(x.shares), [list(x.shares)], bits=[16])
        run.truncated.clear()
        refused(bob, lambda: run.finish_select(False), "dealer.cmp.tprod|takes a")


def test_a_selection_is_finished_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opened e and the dealer's words are consumed by the first finish: a second
    is refused at every party."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = _shared(torch.arange(6, dtype=I64) - 3, [alice, bob], carol)
    run = fss_run.FssRun(x.session, list(x.shares), [list(x.shares)], bits=[16])
    run.finish_select(False)
    refused(alice, lambda: run.finish_select(False), "not a spent")


def test_the_dealer_refuses_bad_truncations(make_worker: Callable[[str], Any]) -> None:
    """Truncations of more than 62 bits, or not one a product nonce: refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = _shared(torch.ones(6, dtype=I64), [alice, bob], carol)
    seeds = x.session.dealer_seeds
    for bits in ([63], [16, 16], ["16"]):
        args = [seeds, x.session.next_nonce(), [6], [1], None, True, 64, 0, bits]
        refused(
            carol,
            lambda args=args: pt.call_function(
                carol, name_of(dealer_fss), args, out=[((1,), I64), ((1,), I64)]
            ),
            "product_bits",
        )
