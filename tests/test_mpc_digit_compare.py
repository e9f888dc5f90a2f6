"""The comparison by digit look-ups (mpc.protocols.digit_compare): msb(x) and the bits of x
against public thresholds in 2 rounds, for any number of parties. Against plaintext
(hypothesis, edge values included), its arithmetic on digits that tie, what it sends, the
sizes the default mode takes it for, a user's layer norm, and a client that sends its
steps out of order or with another instance's openings. Runs on both worker kinds
(conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from refusals import refused
from tampering import args_of, tamper

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.math import digit_compare as dm
from mpc.protocols import compare
from mpc.protocols.digit_compare import run as digit_run
from mpc.protocols.digit_compare.steps import digit_finish, digit_test
from mpc.protocols.step import name_of

I64 = torch.int64
RING = (1 << 63) - 1
EDGES = [0, 1, -1, 2, -2, 255, 256, -256, 1 << 62, -(1 << 62), RING, -RING, 1 << 56, -(1 << 56)]


def _shared(values: torch.Tensor, n: int, config: MPCConfig | None = None) -> Any:
    """Ring values (not encoded) shared among n in-process parties."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    x = mpc.share(torch.zeros(values.shape), *parties, crypto_provider=pt.VirtualWorker("d"),
                  config=config)  # fmt: skip
    x.shares[0] = x.shares[0] + pt.send(values, parties[0])
    return x


def _open(bits: Any) -> torch.Tensor:
    return sum(b.get() for b in bits)  # type: ignore[return-value]


def _msb(v: torch.Tensor) -> torch.Tensor:
    return (v < 0).long()


@settings(max_examples=25, deadline=None)
@given(
    values=st.lists(st.integers(-RING, RING), min_size=1, max_size=30),
    thresholds=st.lists(st.integers(-(1 << 62), 1 << 62), min_size=1, max_size=10),
    n=st.sampled_from([2, 3]),
    data=st.data(),
)
def test_the_bits_against_plaintext(
    values: list[int], thresholds: list[int], n: int, data: Any
) -> None:
    """msb(x - theta) for every threshold, in 2 rounds; values at a threshold and its
    neighbours, and the ring's edges, included (x - theta stays in the signed range)."""
    picks = data.draw(st.lists(st.sampled_from(thresholds), max_size=5))
    near = [p + d for p in picks for d in (-1, 0, 1)]
    values = [v for v in values + near + EDGES if all(abs(v - t) <= RING for t in thresholds)]
    v = torch.tensor(values or [0], dtype=I64)
    x = _shared(v, n)
    with mpc.stats() as s:
        bits = compare.msb_thresholds(x.session, list(x.shares), thresholds)
    assert s.rounds == 2
    assert torch.equal(_open(bits), torch.stack([_msb(v - t) for t in thresholds]))


@settings(max_examples=20, deadline=None)
@given(values=st.lists(st.sampled_from(EDGES) | st.integers(-RING, RING), min_size=1, max_size=40))
@pytest.mark.parametrize("n", [2, 3])
def test_the_sign_against_plaintext(n: int, values: list[int]) -> None:
    v = torch.tensor(values, dtype=I64)
    x = _shared(v, n)
    with mpc.stats() as s:
        bits = compare.msb(x.session, list(x.shares))
    assert s.rounds == 2
    assert torch.equal(_open(bits), _msb(v))


@st.composite
def _r_and_c(draw: Any) -> tuple[int, int]:
    """A mask r and an opened c whose digits tie with R's from the top down to a drawn
    digit, then differ by a drawn amount (0, +-1, or anything)."""
    r = draw(st.integers(-(1 << 63), RING))
    big_r = ~r & dm.LOW63
    tie = draw(st.integers(0, dm.DIGITS))  # digits below this one are drawn freely
    low_bits = 8 * tie
    low = draw(st.integers(0, (1 << low_bits) - 1)) if tie else 0
    big_c = (
        (big_r >> low_bits << low_bits) | low if tie < dm.DIGITS else draw(st.integers(0, dm.LOW63))
    )
    big_c = min(max(big_c + draw(st.sampled_from([0, 0, 1, -1])), 0), dm.LOW63)
    c = dm.LOW63 - big_c + draw(st.sampled_from([0, 1 << 63]))  # (c's top bit is b's)
    return r, (c + (1 << 63)) % (1 << 64) - (1 << 63)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(_r_and_c(), min_size=1, max_size=20), n=st.sampled_from([2, 3]))
def test_the_carry_from_digit_tables_shared_modulo_16(pairs: list[tuple[int, int]], n: int) -> None:
    """The arithmetic the parties run on their shares of R's digit tables (prefix sums,
    packed): sum_i [w_i = 0] is [R >= C] for digits that tie anywhere (every party's w,
    modulo 16)."""
    r = torch.tensor([p[0] for p in pairs], dtype=I64)
    c = torch.tensor([p[1] for p in pairs], dtype=I64).unsqueeze(0)
    tables = dm.prefix_tables(dm.secret_digits(r))
    gen = torch.Generator().manual_seed(len(pairs))
    shares = [
        dm.pack(torch.randint(0, 16, tables.shape, dtype=torch.uint8, generator=gen))
        for _ in range(n - 1)
    ]
    last = dm.packed_prefix_tables(dm.secret_digits(r))
    assert torch.equal(last, dm.pack(tables))
    for s in shares:
        dm.sub_packed_(last, s.clone())
    shares.append(last)
    cd = dm.public_digits(c)
    w = sum(dm.zero_test_operands(s, cd, i == 0) for i, s in enumerate(shares))
    got = ((w & 15) == 0).sum(-1)  # type: ignore[operator]
    assert torch.equal(got, dm.carry(r.unsqueeze(0), c))


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 2**31), n=st.integers(1, 40))
def test_packed_entries_subtract_modulo_16_lane_by_lane(seed: int, n: int) -> None:
    """sub_packed_ on packed words is the entries' difference modulo 16, every lane (the
    dealer's last share without unpacking), borrows included (0 - 15, 15 - 0)."""
    gen = torch.Generator().manual_seed(seed)
    shape = [n, dm.DIGITS, dm.RADIX]
    a = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen)
    b = torch.randint(0, 16, shape, dtype=torch.uint8, generator=gen)
    a[0, 0, :4], b[0, 0, :4] = torch.tensor([0, 15, 0, 15]), torch.tensor([15, 0, 0, 15])
    got = dm.unpack(dm.sub_packed_(dm.pack(a), dm.pack(b)))
    assert torch.equal(got, (a.to(torch.int64) - b.to(torch.int64)).remainder(16).to(torch.uint8))


@pytest.mark.parametrize("n", [2, 3])
def test_what_it_sends(n: int) -> None:
    """512 values and 8 thresholds: c is a word a value, u 8 bytes a compared value."""
    gen = torch.Generator().manual_seed(n)
    x = _shared(torch.randint(-(1 << 40), 1 << 40, (512,), generator=gen), n)
    with mpc.stats() as s:
        x.session.watch()
        compare.msb_thresholds(x.session, list(x.shares), list(range(0, 1 << 20, 1 << 17)))
    assert s.rounds == 2
    payload = (8 * 512 + 8 * 8 * 512) * (n - 1)
    for sent in s.bytes_per_party.values():
        assert payload <= sent <= payload + 80 * 4 * (n - 1)
    dealt = 512 * 1024 + 8 * (512 + 8 * 512 * 86)  # tables, h, the zero tests' tables
    assert dealt <= s.dealer_bytes <= 1.05 * dealt


def test_where_the_default_mode_takes_it() -> None:
    """Up to ``two_round_up_to`` compared values, the bit alone: 2 rounds; past it, or
    with the option off, the carry tree's 3; with FSS, 1; a selection keeps the tree."""
    v = torch.arange(-50, 50, dtype=I64)
    cases = [
        (MPCConfig(), 100, [0], 2),
        (MPCConfig(two_round_up_to=99), 100, [0], 3),
        (MPCConfig(two_round_up_to=300), 100, [0, 1, 2], 2),
        (MPCConfig(two_round_up_to=299), 100, [0, 1, 2], 3),
        (MPCConfig(two_round_up_to=None), 100, [0], 3),
        (MPCConfig(comparison="fss"), 100, [0], 1),
    ]
    for config, _, thresholds, rounds in cases:
        x = _shared(v, 2, config)
        with mpc.stats() as s:
            bits = compare.msb_thresholds(x.session, list(x.shares), thresholds)
        assert s.rounds == rounds, (config, thresholds)
        assert torch.equal(_open(bits), torch.stack([_msb(v - t) for t in thresholds]))
        assert compare.comparison_rounds(x.session, 100 * len(thresholds)) == rounds
    x = _shared(v, 2)
    assert compare.comparison_rounds(x.session, 100, selected=True) == 3
    with mpc.stats() as s:
        compare.select_by_msb(x.session, list(x.shares), [list(x.shares)])
    assert s.rounds == 3


@pytest.mark.parametrize("bad", [-1, 1.5, "8192", True])
def test_the_option_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match="two_round_up_to"):
        MPCConfig(two_round_up_to=bad)


def test_a_layer_norm_as_a_user_writes_it(make_worker: Callable[[str], Any]) -> None:
    """On both worker kinds: a layer norm's bins compare by digits (with the truncations
    riding in the first round), within the float32 result's tolerance."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    norm = torch.nn.LayerNorm(64)
    x = torch.randn(3, 64) * 4 + 1
    xs = mpc.share(x, alice, bob, crypto_provider=carol)
    calls: list[Any] = []
    real = digit_run.digit_msb

    def spy(*args: Any) -> Any:
        calls.append(1)
        return real(*args)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(compare, "digit_msb", spy)
        with torch.no_grad():
            got = torch.nn.functional.layer_norm(xs, (64,), norm.weight, norm.bias).get()
    assert calls
    assert float((got - norm(x).detach()).abs().max()) < 5e-3


# -- a client that sends the steps out of order --------------------------------------------


def _parties(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any, Any]:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    return alice, bob, carol, mpc.share(torch.ones(6), alice, bob, crypto_provider=carol)


@pytest.mark.parametrize(
    ("step_fn", "out", "match"),
    [
        # the opened c and u, and the dealer's tables, are used up by the first finish
        (digit_finish, [((6,), I64)], "not a spent"),
        # a second zero test of one instance (a second rho, or the tables twice)
        (digit_test, [((1, 6, dm.DIGITS), torch.uint8)], "already used|spent"),
    ],
)
def test_each_step_runs_once(
    make_worker: Callable[[str], Any],
    monkeypatch: pytest.MonkeyPatch,
    step_fn: Any,
    out: Any,
    match: str,
) -> None:
    """A step sent again with the arguments of its first run is refused."""
    alice, _, _, x = _parties(make_worker)
    calls = args_of(monkeypatch, digit_run, step_fn)
    compare.msb(x.session, list(x.shares))
    args = calls[0][0]
    refused(alice, lambda: pt.call_function(alice, name_of(step_fn), args, out=out), match)


def test_the_finish_takes_its_own_openings(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finish given another instance's opened u (so that its tables read another
    mask's test) is refused."""
    alice, _, _, x = _parties(make_worker)
    opened: list[Any] = []
    real = digit_run.at_parties

    def keep(session: Any, fn: Any, args: Any, out: Any) -> Any:
        if fn is digit_finish:
            opened.append([args(i) for i in range(session.n)])
            if len(opened) == 1:  # the first instance's finish: hold it back
                raise _Stop
        return real(session, fn, args, out)

    monkeypatch.setattr(digit_run, "at_parties", keep)
    with pytest.raises(_Stop):
        compare.msb(x.session, list(x.shares))
    held = opened[0]
    tamper(monkeypatch, digit_run, digit_finish, lambda i, a: a[:5] + [held[i][5]] + a[6:])
    refused(alice, lambda: compare.msb(x.session, list(x.shares)), "belongs to protocol instance")


class _Stop(Exception):
    pass


@pytest.mark.parametrize("thresholds", [[5], None, [1, 2, 3]])
def test_the_last_party_finishes_the_thresholds_dealt_for(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, thresholds: Any
) -> None:
    alice, bob, _, x = _parties(make_worker)
    tamper(monkeypatch, digit_run, digit_finish, lambda i, a: a[:6] + [thresholds] if i == 1 else a)
    refused(bob, lambda: compare.msb_thresholds(x.session, list(x.shares), [0, 1]), "thresholds")
