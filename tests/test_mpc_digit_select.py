"""Selections on the comparison by digit look-ups (mpc.protocols.digit_compare.run.
digit_select): msb(x - theta_k) v_s for values given after the first round, exact in the
ring, in the comparison's 2 rounds with a caller's openings riding in the second. Against
plaintext (hypothesis), what the dealer sends, the layer norm and attention that take
their factor from it, and a client that sends its steps with other picks, twice, or with
another instance's openings. Runs on both worker kinds (conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import refused
from tampering import tamper

import mpc
import pointers as pt
from mpc.math import digit_compare as dm
from mpc.protocols.approx import Fx
from mpc.protocols.digit_compare import run as digit_run
from mpc.protocols.digit_compare.steps import SELECT_WORDS, digit_finish, digit_select_mask
from mpc.protocols.inverse_product import BeaverProduct
from mpc.protocols.step import name_of

I64 = torch.int64
RING = (1 << 63) - 1
WIDE = st.integers(-RING, RING)


def _shared(values: torch.Tensor, parties: list[Any], dealer: Any) -> Any:
    """Ring values (not encoded) shared among the parties."""
    x = mpc.share(torch.zeros(values.shape), *parties, crypto_provider=dealer)
    x.shares[0] = x.shares[0] + pt.send(values, parties[0])
    return x


def _in_process(n: int) -> tuple[list[Any], Any]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("d")


def _open(shares: Any) -> torch.Tensor:
    return sum(s.get() for s in shares)  # type: ignore[return-value]


def _select(x: Any, thresholds: list[int], picks: list[int], groups: list[Any]) -> Any:
    return digit_run.digit_select(
        x.session, list(x.shares), thresholds, picks, lambda: ([list(g.shares) for g in groups], [])
    )


@settings(max_examples=20, deadline=None)
@given(
    values=st.lists(st.tuples(WIDE, WIDE, WIDE), min_size=1, max_size=20),
    thresholds=st.lists(st.integers(-(1 << 62), 1 << 62), min_size=1, max_size=6),
    n=st.sampled_from([2, 3]),
    data=st.data(),
)
def test_the_selections_against_plaintext(
    values: list[tuple[int, int, int]], thresholds: list[int], n: int, data: Any
) -> None:
    """msb(x - theta_k) v_s modulo 2^64 for any ring values (the products are exact), picks
    of any threshold in any order and repeated, values in two groups; the bits too; 2
    rounds."""
    parties, dealer = _in_process(n)
    x_t = torch.tensor([v[0] for v in values], dtype=I64)
    x_t[0] = thresholds[0]  # (a value at a threshold)
    picks = data.draw(st.lists(st.integers(0, len(thresholds) - 1), min_size=1, max_size=5))
    cut = data.draw(st.integers(0, len(picks) - 1))
    pairs = torch.tensor([[v[1], v[2]] for v in values], dtype=I64)
    vs = torch.stack([pairs[:, 0] + k * pairs[:, 1] for k in range(len(picks))])  # (mod 2^64)
    x = _shared(x_t, parties, dealer)
    groups = [_shared(vs[:cut], parties, dealer), _shared(vs[cut:], parties, dealer)]
    groups = [g for g in groups if g.shape[0]]
    with mpc.stats() as s:
        bits, got = _select(x, thresholds, picks, groups)
    assert s.rounds == 2
    msb = torch.stack([(x_t - t < 0).long() for t in thresholds])
    assert torch.equal(_open(bits), msb)
    assert torch.equal(_open(got), msb[picks] * vs)


@pytest.mark.parametrize("n", [2, 3])
def test_a_callers_product_opens_in_the_second_round(n: int) -> None:
    """The runs the values' callback gives open with the zero tests: a Beaver product of
    values known only after the first round, still 2 rounds in all."""
    parties, dealer = _in_process(n)
    x = _shared(torch.tensor([5, -5, 0], dtype=I64), parties, dealer)
    a = _shared(torch.tensor([3, 4, 5], dtype=I64), parties, dealer)
    runs: list[Any] = []

    def after() -> tuple[list[Any], list[Any]]:
        fa = Fx(a.session, list(a.shares), 0)
        runs.append(BeaverProduct(fa, fa, "mul", (3,)))
        return [[s.unsqueeze(0) for s in a.shares]], runs

    with mpc.stats() as s:
        bits, got = digit_run.digit_select(x.session, list(x.shares), [0], [0], after)
    assert s.rounds == 2
    assert torch.equal(_open(runs[0].finish().shares), torch.tensor([9, 16, 25]))
    assert torch.equal(_open(got), torch.tensor([[0, 4, 0]]))


def test_what_the_dealer_sends() -> None:
    """Per element the comparison's tables and h, per compared value its zero tests, per
    selected value and element SELECT_WORDS words."""
    parties, dealer = _in_process(2)
    x = _shared(torch.arange(-256, 256, dtype=I64), parties, dealer)
    v = _shared(torch.ones(3, 512, dtype=I64), parties, dealer)
    with mpc.stats() as s:
        x.session.watch()
        _select(x, [0, 7], [0, 1, 1], [v])
    dealt = 512 * 1024 + 8 * (512 + 2 * 512 * dm.TEST_ENTRIES + 3 * 512 * SELECT_WORDS)
    assert dealt <= s.dealer_bytes <= 1.05 * dealt


def test_a_decoding_steps_layer_norm_and_linear(make_worker: Callable[[str], Any]) -> None:
    """As a user writes it, on both worker kinds: LayerNorm then Linear on one row takes
    the factor from the comparison's selections (5 rounds in all, the materialize's
    included), within the layer norm's tolerance."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    torch.manual_seed(3)
    model = torch.nn.Sequential(torch.nn.LayerNorm(64), torch.nn.Linear(64, 16)).eval()
    x = torch.randn(1, 1, 64) * 3 + 1
    want = model(x).detach()
    mpc.share(model, alice, bob, crypto_provider=carol)
    xs = mpc.share(x, alice, bob, crypto_provider=carol)
    calls: list[Any] = []
    real = digit_run.digit_select

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    with pytest.MonkeyPatch.context() as mp, mpc.stats() as s:
        mp.setattr("mpc.protocols.inverse_product.digit_select", spy)
        y = model(xs)
        y.materialize()
    assert calls and s.rounds == 5
    assert float((y.get() - want).abs().max()) < 2e-3


# -- a client that sends the steps out of order --------------------------------------------


def _parties(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any, Any]:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol)
    v = mpc.share(torch.ones(2, 6), alice, bob, crypto_provider=carol)
    return alice, bob, x, v


@pytest.mark.parametrize("picks", [[1, 0], [0], [0, 0, 1]])
def test_the_last_party_finishes_the_picks_dealt_for(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, picks: list[int]
) -> None:
    """Its dealt tables times m are the picked compared values': other picks are refused."""
    _, bob, x, v = _parties(make_worker)
    tamper(
        monkeypatch, digit_run, digit_finish, lambda i, a: a[:7] + [picks] + a[8:] if i == 1 else a
    )
    refused(bob, lambda: _select(x, [0, 1], [0, 1], [v]), "selections")


def test_a_finish_with_picks_takes_the_openings(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Picks without the opened e (or without the kept mask m) are refused."""
    alice, _, x, v = _parties(make_worker)
    tamper(monkeypatch, digit_run, digit_finish, lambda i, a: a[:8] + [None, a[9]])
    refused(alice, lambda: _select(x, [0, 1], [0, 1], [v]), "opened masked values")


def test_the_values_mask_step_runs_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values' masking sent again (a second e for the same masks m) is refused."""
    alice, _, x, v = _parties(make_worker)
    sent: list[Any] = []
    tamper(monkeypatch, digit_run, digit_select_mask, lambda i, a: sent.append(a) or a)
    _select(x, [0, 1], [0, 1], [v])
    out = [((2, 6), I64), ((2, 6), I64)]
    refused(
        alice,
        lambda: pt.call_function(alice, name_of(digit_select_mask), sent[0], out=out),
        "already used",
    )


def test_the_finish_takes_its_own_opened_values(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finish given another instance's opened e is refused."""
    alice, _, x, v = _parties(make_worker)
    held: list[Any] = []
    real = digit_run.at_parties

    def keep(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is digit_finish and not held:
            held.extend(args(i) for i in range(session.n))
            raise _Stop
        return real(session, fn, args, out)

    monkeypatch.setattr(digit_run, "at_parties", keep)
    with pytest.raises(_Stop):
        _select(x, [0, 1], [0, 1], [v])
    monkeypatch.setattr(digit_run, "at_parties", real)
    tamper(monkeypatch, digit_run, digit_finish, lambda i, a: a[:8] + [held[i][8]] + a[9:])
    refused(alice, lambda: _select(x, [0, 1], [0, 1], [v]), "belongs to protocol instance")


class _Stop(Exception):
    pass


# -- the second round: bytes and words in one delivery ------------------------------------


def test_the_zero_tests_and_the_values_travel_in_one_delivery(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """u (bytes) and the values' e (words) open in one packed exchange (one latency at
    each peer, not one a dtype), each summed in its own width."""
    from mpc.protocols.opening import run as opening

    _, _, x, v = _parties(make_worker)
    calls: list[Any] = []
    real = opening.exchange

    def spy(session: Any, shares: Any, count: bool = True) -> Any:
        calls.append(shares[0].dtype)
        return real(session, shares, count)

    monkeypatch.setattr(opening, "exchange", spy)
    bits, got = _select(x, [0, 2 << 16], [0, 1], [v])
    assert calls == [I64, torch.uint8]  # round 1's c, round 2's u and e packed as bytes
    assert torch.equal(_open(bits), torch.tensor([[0] * 6, [1] * 6]))
    assert torch.equal(_open(got), torch.tensor([[0] * 6, [1 << 16] * 6]))


def test_packed_bytes_open_in_the_dtypes_they_were_packed_in(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An opening told other dtypes than the packed values' is refused."""
    from mpc.protocols.opening import run as opening
    from mpc.protocols.opening.steps import open_unpack

    alice, _, x, v = _parties(make_worker)
    real = opening.at_parties

    def at_parties(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is open_unpack:
            first = args(0)
            if len(first) == 4:  # (a packed round of two dtypes: read it all as words)
                return real(session, fn, lambda i: args(i)[:3] + [["int64"] * 2], out)
        return real(session, fn, args, out)

    monkeypatch.setattr(opening, "at_parties", at_parties)
    refused(alice, lambda: _select(x, [0, 1], [0, 1], [v]), "dtypes")
