"""Comparisons of a shared x with many public thresholds (the bins of the non-linear
functions: mpc.protocols.approx.step_bits) share one mask r an element: the parties open
c = x + r once an element, not once a threshold, and compare c - theta_k in the carry
tree, or with FSS evaluate the element's one key at each c - theta_k
(mpc.protocols.compare.msb_thresholds). Against plaintext (hypothesis), what it
sends, and a client that sends the steps with other thresholds than the dealer shared r
for. Runs on both worker kinds (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import refused

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols import compare
from mpc.protocols.comparison import run as carry_run
from mpc.protocols.comparison.steps import cmp_init, dealer_compare
from mpc.protocols.comparison.thresholds import MAX_THRESHOLDS
from mpc.protocols.fss import run as fss_run
from mpc.protocols.fss.steps import fss_eval
from mpc.protocols.step import name_of

I64 = torch.int64
RING = 1 << 62  # the comparison is exact for |x - theta| < 2^63
#: the carry tree, also where a run is small enough for digit look-ups (their own tests:
#: tests/test_mpc_digit_compare.py)
CARRY = MPCConfig(two_round_up_to=None)


def _msb(x: Any, thresholds: list[int]) -> torch.Tensor:
    bits = compare.msb_thresholds(x.session, list(x.shares), thresholds)
    return sum(b.get() for b in bits)  # type: ignore[return-value]


def _shared(values: torch.Tensor, n: int, config: MPCConfig | None = None) -> Any:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    x = mpc.share(torch.zeros(values.shape), *parties, crypto_provider=pt.VirtualWorker("d"),
                  config=config)  # fmt: skip
    x.shares[0] = x.shares[0] + pt.send(values, parties[0])  # (ring values, not encoded)
    return x


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.integers(-RING, RING), min_size=1, max_size=40),
    thresholds=st.lists(st.integers(-RING, RING), min_size=1, max_size=12),
    setting=st.sampled_from([(2, "default"), (3, "default"), (2, "fss")]),
    data=st.data(),
)
def test_every_threshold_against_plaintext(
    values: list[int], thresholds: list[int], setting: tuple[int, str], data: Any
) -> None:
    n, mode = setting
    # values equal to a threshold, and its neighbours, are drawn too
    picks = data.draw(st.lists(st.sampled_from(thresholds), max_size=6))
    values = values + picks + [p + 1 for p in picks] + [p - 1 for p in picks]
    v = torch.tensor(values, dtype=I64)
    x = _shared(v, n, MPCConfig(comparison=mode, two_round_up_to=None))
    got = _msb(x, thresholds)
    want = torch.stack([(v - t < 0).long() for t in thresholds])
    assert torch.equal(got, want)


@pytest.mark.parametrize("mode", ["default", "fss"])
def test_many_thresholds_and_the_stacked_path(mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """FSS evaluates a key at its points in groups (EVAL_GROUP): 300 thresholds of 40
    values take three; where one run would not fit a piece, the stacked differences."""
    gen = torch.Generator().manual_seed(3)
    v = torch.randint(-(1 << 40), 1 << 40, (4, 10), generator=gen)
    thresholds = sorted(torch.randint(-(1 << 41), 1 << 41, (300,), generator=gen).tolist())
    want = torch.stack([(v - t < 0).long() for t in thresholds])
    assert torch.equal(
        _msb(_shared(v, 2, MPCConfig(comparison=mode, two_round_up_to=None)), thresholds), want
    )
    real, calls = compare.in_pieces, []

    def in_pieces(*args: Any, **kwargs: Any) -> int:  # msb_thresholds' own check: 2 pieces
        calls.append(1)
        return 2 if len(calls) == 1 else real(*args, **kwargs)

    monkeypatch.setattr(compare, "in_pieces", in_pieces)
    assert torch.equal(
        _msb(_shared(v, 2, MPCConfig(comparison=mode, two_round_up_to=None)), thresholds), want
    )


@pytest.mark.parametrize("n", [2, 3])
def test_c_opens_once_an_element(n: int) -> None:
    """1,024 values and 16 thresholds: c is 8 bytes a value, the tree's 5 a comparison
    (13 1/8 bytes each when the differences were stacked, d's bit with them), in 3 rounds:
    the last level's output is arithmetic (no d)."""
    gen = torch.Generator().manual_seed(n)
    x = _shared(torch.randint(-(1 << 40), 1 << 40, (1024,), generator=gen), n, CARRY)
    with mpc.stats() as s:
        x.session.watch()  # (the parties' counters, as an op does)
        compare.msb_thresholds(x.session, list(x.shares), list(range(0, 1 << 20, 1 << 16)))
    assert s.rounds == 3
    payload = (8 * 1024 + (5 * 16 * 1024)) * (n - 1)
    stacked = (13 * 16 * 1024 + 16 * 1024 // 8) * (n - 1)
    assert len(s.bytes_per_party) == n
    for sent in s.bytes_per_party.values():
        assert payload <= sent <= payload + 80 * 4 * (n - 1)
        assert sent < 0.7 * stacked


# -- as a client that sends the steps -----------------------------------------------------


_refused = refused  # (tests/refusals.py)


def _tamper(monkeypatch: pytest.MonkeyPatch, change: Callable[[list[Any]], list[Any]]) -> None:
    """The client sends cmp_init to the last party with ``change``d arguments."""
    real = carry_run.at_parties

    def at_parties(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is cmp_init:
            last = session.n - 1
            return real(session, fn, lambda i: change(args(i)) if i == last else args(i), out)
        return real(session, fn, args, out)

    monkeypatch.setattr(carry_run, "at_parties", at_parties)


@pytest.mark.parametrize(
    "change",
    [
        lambda a: a[:7] + [None] + a[8:],  # a comparison with thresholds, compared as a plain one
        lambda a: a[:7] + [[5, 6, 7]] + a[8:],  # other thresholds, fewer
        lambda a: a[:7] + [list(range(17))] + a[8:],  # more
    ],
)
def test_the_last_party_compares_the_thresholds_r_is_shared_by(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, change: Any
) -> None:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    _tamper(monkeypatch, change)
    _refused(
        bob,
        lambda: compare.msb_thresholds(x.session, list(x.shares), list(range(16))),
        "not the ones the dealer's r is shared by",
    )


def test_the_fss_key_is_evaluated_at_its_thresholds_only(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each party checks the thresholds against its key's count (both hold the key)."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol,
                  config=MPCConfig(comparison="fss"))  # fmt: skip
    real = fss_run.at_parties

    def at_parties(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is fss_eval:
            return real(session, fn, lambda i: args(i)[:8] + [[1, 2]], out)
        return real(session, fn, args, out)

    monkeypatch.setattr(fss_run, "at_parties", at_parties)
    _refused(
        alice,
        lambda: compare.msb_thresholds(x.session, list(x.shares), list(range(5))),
        "not the ones the dealer's key is for",
    )


def test_a_plain_comparison_takes_no_thresholds(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    y = mpc.share(torch.zeros(6), alice, bob, crypto_provider=carol, config=CARRY)
    _tamper(monkeypatch, lambda a: a[:7] + [[0, 1]] + a[8:])
    _refused(bob, lambda: (x < y).get(), "not the ones the dealer's r is shared by")


def test_bad_thresholds_are_refused_by_the_steps(make_worker: Callable[[str], Any]) -> None:
    """The dealer deals r for [T, *x] only, with no selections; cmp_init takes ints."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    s = x.session
    cases = (
        ([3, 6], 4, []),  # T is the leading dimension
        ([3, 6], 3, [s.next_nonce()]),  # and nothing is selected
        ([MAX_THRESHOLDS + 1, 1], MAX_THRESHOLDS + 1, []),
        ([3, 6], -1, []),
        ([3, 6], 2.0, []),
    )
    for shape, thresholds, products in cases:
        args = [s.dealer_seeds, s.next_nonce(), shape, [s.next_nonce(), s.next_nonce()]]
        args += [products, None, thresholds]
        _refused(
            carol,
            lambda args=args: pt.call_function(
                carol, name_of(dealer_compare), args, out=[((1,), I64)]
            ),
            "a comparison with thresholds compares",
        )
    for bad in (["1"], [1.5], "12", list(range(MAX_THRESHOLDS + 1)), [1 << 63]):
        with pytest.raises(ValueError, match="thresholds are 1 to"):
            cmp_init(None, None, 0, True, None, None, torch.zeros(2, dtype=I64), 0, bad)
