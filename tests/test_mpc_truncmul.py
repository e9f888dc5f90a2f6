"""Truncations whose results are multiplied in the same round (mpc/protocols/truncated_products/run.py,
mpc/protocols/truncated_products/steps.py; issue 25): against the exact ring arithmetic, for 2 and 3 parties,
with broadcasting, a square and public offsets, in one round that opens only the
truncations' c; and the steps bound to their batch, run once (as tests/test_sealing_attacks.py
does for the other steps)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_sealing_attacks import Recorder, _refused, step

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.approx import Fx
from mpc.protocols.truncated_products.run import truncate_and_multiply
from mpc.shared import SharedTensor, share_tensor

I64 = torch.int64


def _open(session: Any, shares: list[Any]) -> torch.Tensor:
    return SharedTensor(list(shares), session, 0, I64).get()


def _batch(parties: list[Any], dealer: Any) -> tuple[Any, list[torch.Tensor], list[Fx]]:
    session = mpc.share(torch.zeros(1), *parties, crypto_provider=dealer).session
    gen = torch.Generator().manual_seed(3)
    # z at 48 and 40 fractional bits, truncated by 24 and 20: |z| up to 2^61 and down to
    # 0, negative and positive, the second one per row (broadcast over the first)
    z0 = torch.randint(-(1 << 61), 1 << 61, (5, 7), generator=gen, dtype=I64)
    z0[0, :4] = torch.tensor([0, -1, 1 << 24, -(1 << 24)])
    z1 = torch.randint(-(1 << 50), 1 << 50, (5, 1), generator=gen, dtype=I64)
    zs = [z0, z1]
    fx = [Fx(session, share_tensor(z, session).shares, s) for z, s in zip(zs, (48, 40))]
    return session, zs, fx


@pytest.mark.parametrize("n", [2, 3])
def test_products_of_truncated_values_are_exact_in_one_round(n: int) -> None:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("dealer")
    session, zs, fx = _batch(parties, dealer)
    offsets = [-1.0, 0.25]
    pairs = [(0, 1), (1, 1), (0, 0), (1, 0)]
    with mpc.stats() as s:
        xs, prods = truncate_and_multiply(fx, [24, 20], offsets, pairs)
    assert s.rounds == 1
    # only the truncations' c travel (8 bytes an element to each peer; headers aside)
    payload = 8 * (35 + 5) * (n - 1)
    for sent in s.bytes_per_party.values():
        assert payload <= sent <= payload + 96 * (n - 1)
    got = [_open(session, x.shares) for x in xs]
    for z, bits, off, scale, x, g in zip(zs, [24, 20], offsets, [24, 20], xs, got):
        assert x.scale == scale
        want = (z >> bits) + int(off * 2**scale)
        assert set((g - want).unique().tolist()) <= {0, 1}  # floor, or one more
    for (i, j), p in zip(pairs, prods):
        assert p.scale == xs[i].scale + xs[j].scale
        assert torch.equal(_open(session, p.shares), got[i] * got[j])  # exact mod 2^64


@pytest.mark.parametrize(("comparison", "rounds"), [("default", 9), ("fss", 7)])
def test_softmax_division_takes_two_rounds_fewer(comparison: str, rounds: int) -> None:
    """softmax against torch: its division (mpc.protocols.inverse) has its products of
    truncated values ride in the truncations' rounds, 8 rounds with a 4-round comparison
    (5 with FSS comparisons) where it took 10 (7). Default: the max of 9 by ranks with
    the exponential's clamp bits from the same run (4: each pair against 0 and +-16,
    mpc.protocols.ranks.max_and_near), the series times the bits (1,
    mpc.protocols.series_product; its truncation in the division's), the division (6: 6
    rows take bins 1/64 octave wide and a line), each comparison run (648 and 1,926
    comparisons) within MPCConfig.three_round_up_to, 3 rounds with no d round; 13 while
    the clamp had its own comparison (3) after the max (16 with the d round); FSS: the
    max and the bits by ranks (2), 1 and 4 (8 with the clamp's own comparison, 2). 9 by
    default where both comparison runs take 2 rounds by digit look-ups (the bits alone of
    at most 2^13 compared values: mpc.protocols.digit_compare)."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    dealer = pt.VirtualWorker("dealer")
    x = torch.rand(6, 9) * 4
    config = MPCConfig(comparison=comparison)
    sx = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        out = torch.softmax(sx, -1)
        out.materialize()
    assert torch.allclose(out.get(), torch.softmax(x, -1), atol=2e-4)
    assert s.rounds == rounds


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def test_the_batch_steps_run_once_on_their_own_truncations(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parties' step again (its opened c, corrections and products are spent), the
    plain truncation's finish on a c the batch used, and the dealer's products again for
    a truncation already in a batch: all refused."""
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    session, zs, fx = _batch([alice, bob], carol)
    xs, prods = truncate_and_multiply(fx, [24, 20], [0.0, 0.0], [(0, 1)])
    got = [_open(session, x.shares) for x in xs]
    assert torch.equal(_open(session, prods[0].shares), got[0] * got[1])
    calls = [c for c in rec.of("mpc.trunc_products") if c[0] is alice]
    assert len(calls) == 1
    _, _, args, _ = calls[0]
    out = [((5, 7), I64), ((5, 1), I64), ((5, 7), I64)]
    _refused(alice, lambda: step(alice, "mpc.trunc_products", args, out), "spent|takes a")
    seed, cs, tn = args[0], args[5], args[6]
    _refused(
        alice,
        lambda: step(alice, "mpc.trunc_finish", [seed, tn[0], True, None, cs[0], 24], out[:1]),
        "spent|takes a",
    )
    (_, _, dargs, _) = rec.of("mpc.dealer_trunc_products")[0]
    again = [dargs[0], session.next_nonce(), *dargs[2:]]
    _refused(
        carol,
        lambda: step(carol, "mpc.dealer_trunc_products", again, [((1,), I64)]),
        "already used",
    )


# -- a plain operand: a shared value with nothing pending, multiplied in the same round ----


@settings(max_examples=12, deadline=None)
@given(
    n=st.sampled_from([2, 3]),
    rows=st.integers(1, 4),
    cols=st.integers(1, 6),
    seed=st.integers(0, 2**16),
    offset=st.sampled_from([0.0, -1.0, 0.5]),
)
def test_a_plain_operand_times_truncated_values_is_exact(
    n: int, rows: int, cols: int, seed: int, offset: float
) -> None:
    """x y for x = (z >> f) + offset truncated in the round and y shared (any scale,
    broadcast against x), exact in the ring, beside a pair's product, in one round that
    opens the truncations' c and y's masked e (8 bytes an element each)."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    session = mpc.share(torch.zeros(1), *parties, crypto_provider=pt.VirtualWorker("d")).session
    gen = torch.Generator().manual_seed(seed)
    z = torch.randint(-(1 << 45), 1 << 45, (rows, 1, 8), generator=gen, dtype=I64)
    y = torch.randint(-(1 << 30), 1 << 30, (1, cols, 8), generator=gen, dtype=I64)
    fx = Fx(session, share_tensor(z, session).shares, 40)
    yfx = Fx(session, share_tensor(y, session).shares, 16)
    with mpc.stats() as s:
        session.watch()
        xs, prods = truncate_and_multiply([fx], [16], [offset], [(0, 0)], yfx, [0])
    assert s.rounds == 1
    payload = 8 * (rows * 8 + cols * 8) * (n - 1)
    for sent in s.bytes_per_party.values():
        assert payload <= sent <= payload + 96 * (n - 1)
    x = _open(session, xs[0].shares)
    assert set((x - (z >> 24) - int(offset * 2**16)).unique().tolist()) <= {
        0,
        1,
    }  # floor, or one more
    assert torch.equal(_open(session, prods[0].shares), x * x)
    assert prods[1].scale == 32
    assert torch.equal(_open(session, prods[1].shares), x * y)  # exact, broadcast


def test_a_plain_operands_steps_take_their_own_opening(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The parties' step given another batch's opened e (or none, or its e without the
    products' pairs), and the mask step again: refused."""
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    session, zs, fx = _batch([alice, bob], carol)
    y = Fx(session, share_tensor(torch.ones(5, 7, dtype=I64), session).shares, 16)
    for _ in range(2):
        truncate_and_multiply(fx, [24, 20], [0.0, 0.0], [(0, 1)], y, [0, 1])
    first, second = (c for c in rec.of("mpc.trunc_products") if c[0] is alice)
    out = [((5, 7), I64), ((5, 1), I64), ((5, 7), I64), ((5, 7), I64), ((5, 7), I64)]
    args = list(second[2])
    args[10] = first[2][10]  # another batch's e (spent with it)
    _refused(alice, lambda: step(alice, "mpc.trunc_products", args, out), "spent|belongs|takes a")
    masks = [c for c in rec.of("mpc.plain_mask") if c[0] is alice]
    _refused(
        alice,
        lambda: step(alice, "mpc.plain_mask", masks[0][2], [((5, 7), I64), ((5, 7), I64)]),
        "already used",
    )
    # a batch without a plain operand, its step given the pairs of one
    rec2 = Recorder(monkeypatch)
    truncate_and_multiply(_batch([alice, bob], carol)[2], [24, 20], [0.0, 0.0], [(0, 1)])
    (call,) = [c for c in rec2.of("mpc.trunc_products") if c[0] is alice]
    assert call[2][10] is None and call[2][12] is None  # (e, b, the plain operand's pairs)
    args = list(call[2])
    args[12] = [0]
    _refused(alice, lambda: step(alice, "mpc.trunc_products", args, out), "spent|takes")
