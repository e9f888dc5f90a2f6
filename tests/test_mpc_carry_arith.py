"""The comparison's arithmetic last level (mpc/math/carry_arith.py,
mpc/protocols/comparison/arith.py, arith_select.py): a comparison ends in 3 rounds, the
last carry-tree level giving additive shares of msb(x), or of its selections, directly.
Against plaintext (the math on shares with the dealer in the clear; the protocol for 2
and 3 parties, edges included), its rounds and bytes, and a client that sends its steps
out of order."""

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
from mpc.math import carry_arith as A
from mpc.math import carry_tree as C
from mpc.protocols import compare
from mpc.protocols.comparison import run as carry_run
from mpc.protocols.comparison.arith import carry_arith
from mpc.protocols.comparison.arith_select import arith_mask, arith_select
from mpc.protocols.comparison.steps import carry_step, dealer_compare
from mpc.protocols.step import name_of

#: the carry tree, also where a run is small enough for digit look-ups (their own tests:
#: tests/test_mpc_digit_compare.py)
CARRY = MPCConfig(two_round_up_to=None)

I64 = torch.int64
EDGES = [0, 1, -1, 2, -2, 2**62, -(2**62), 2**63 - 1, -(2**63) + 1, 2**31, -(2**31)]
VALUES = st.one_of(st.integers(-(2**63) + 1, 2**63 - 1), st.sampled_from(EDGES))


def _random(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, shape, dtype=I64, generator=gen)


def _xor_shares(v: torch.Tensor, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    shares = [_random(gen, tuple(v.shape)) for _ in range(n - 1)]
    last = v.clone()
    for s in shares:
        last ^= s
    return [*shares, last]


def _add_shares(v: torch.Tensor, n: int, gen: torch.Generator) -> list[torch.Tensor]:
    shares = [_random(gen, tuple(v.shape)) for _ in range(n - 1)]
    return [*shares, v - sum(shares, torch.zeros_like(v))]


def _msb_on_shares(c: torch.Tensor, r: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """msb(c - r) by the protocol's math: the XOR tree's levels 0 and 1 on XOR shares,
    then the arithmetic last level, with the dealer's values in the clear here."""
    gen = torch.Generator().manual_seed(seed)
    count, n_pad = c.numel(), C.padded(c.numel())
    pad = torch.zeros(n_pad - count, dtype=I64)
    cw, y = torch.cat([c, pad]), torch.cat([~r, pad])
    ys = _xor_shares(y, n, gen)
    mono = [_xor_shares(m, n, gen) for m in C.bit_monomials(y)]
    state = [C.level0(cw, ys[i], [m[i] for m in mono], i == 0) for i in range(n)]
    level = 1
    w = C.words(n_pad, level)
    ops = [C.operands(g, p, level) for g, p in state]
    masks = [C.unpack(_random(gen, (2, w)), len(C.VARS), level) for _ in range(n)]
    total = [torch.zeros(w, dtype=I64) for _ in C.VARS]
    for m in masks:
        total = [t ^ a for t, a in zip(total, m)]
    prods = [_xor_shares(m, n, gen) for m in C.mask_monomials(total)]
    e = C.pack([x ^ a for x, a in zip(ops[0], masks[0])], level)
    for i in range(1, n):
        e ^= C.pack([x ^ a for x, a in zip(ops[i], masks[i])], level)
    opened = C.unpack(e, len(C.VARS), level)
    state = [
        C.combine(state[i][0], masks[i], opened, [p[i] for p in prods], level, i == 0)
        for i in range(n)
    ]
    # the last level: its operands and G3 masked, opened; the dealer's words
    level, w = 2, C.words(n_pad, 2)
    ops = [C.operands(g, p, level, A.VARS) for g, p in state]
    masks = [C.unpack(_random(gen, (2, w)), len(A.VARS), level) for _ in range(n)]
    full = masks[0]
    for m in masks[1:]:
        full = [t ^ a for t, a in zip(full, m)]
    e = C.pack([x ^ a for x, a in zip(ops[0], masks[0])], level)
    for i in range(1, n):
        e ^= C.pack([x ^ a for x, a in zip(ops[i], masks[i])], level)
    bits = A.opened_index(C.unpack(e, len(A.VARS), level), count)
    h = ((~r) >> 63) & 1
    words = A.dealt(A.opened_index(full, count), h)
    h_shares, w_shares = _add_shares(h, n, gen), _add_shares(words, n, gen)
    top = (c >> 63) & 1
    out = [A.msb_shares(i == 0, bits, h_shares[i], w_shares[i], top) for i in range(n)]
    return sum(out, torch.zeros(count, dtype=I64))


@settings(max_examples=40, deadline=None)
@given(
    pairs=st.lists(st.tuples(VALUES, VALUES), min_size=1, max_size=70),
    n=st.sampled_from([2, 3]),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_last_level_gives_the_bit_as_additive_shares(pairs, n, seed):
    c = torch.tensor([p[0] for p in pairs], dtype=I64)
    r = torch.tensor([p[1] for p in pairs], dtype=I64)
    assert torch.equal(_msb_on_shares(c, r, n, seed), ((c - r) >> 63) & 1)


def test_the_carry_is_the_sum_of_exclusive_terms():
    """Every assignment of the eight operands with the groups' G and P exclusive (groups
    1-3): the polynomial's value at the masks equals the carry, for every mask."""
    names = A.VARS
    rows = []
    for v in range(1 << len(names)):
        bit = {k: (v >> j) & 1 for j, k in enumerate(names)}
        if any(bit[f"G{j}"] and bit[f"P{j}"] for j in (1, 2, 3)):
            continue
        rows.append(v)
    assert len(rows) == 2 * 3**3 * 2  # G0, P0 free; groups 1-3: (0,0), (1,0), (0,1)
    x = torch.tensor(rows, dtype=I64).view(-1, 1)
    a = torch.arange(1 << len(names), dtype=I64).view(1, -1)
    xb = {k: ((x >> j) & 1).expand(-1, a.shape[1]) for j, k in enumerate(names)}
    ab = {k: ((a >> j) & 1).expand(x.shape[0], -1) for j, k in enumerate(names)}
    e = {k: xb[k] ^ ab[k] for k in names}
    coefs = A.coefficients(e)
    value = coefs.pop(frozenset())
    for t, coef in coefs.items():
        mono = torch.ones_like(value)
        for k in t:
            mono = mono * ab[k]
        value = value + coef * mono
    g = xb["G3"] | (xb["P3"] & xb["G2"]) | (xb["P3"] & xb["P2"] & xb["G1"])
    g = g | (xb["P3"] & xb["P2"] & xb["P1"] & xb["G0"])
    assert torch.equal(value, g)


# -- the protocol ---------------------------------------------------------------------------


def _shared(values: torch.Tensor, n: int, make: Callable[[str], Any] = pt.VirtualWorker) -> Any:
    parties = [make(f"p{i}") for i in range(n)]
    x = mpc.share(torch.zeros(values.shape), *parties, crypto_provider=make("d"), config=CARRY)
    x.shares[0] = x.shares[0] + pt.send(values, parties[0])  # (ring values, not encoded)
    return x


@settings(max_examples=20, deadline=None)
@given(values=st.lists(VALUES, min_size=1, max_size=60), n=st.sampled_from([2, 3]))
def test_msb_in_three_rounds_against_plaintext(values, n):
    v = torch.tensor(values, dtype=I64)
    x = _shared(v, n)
    with mpc.stats() as s:
        x.session.watch()
        bit = compare.msb(x.session, list(x.shares))
    assert s.rounds == 3
    got = sum(b.get() for b in bit)
    assert torch.equal(got, (v < 0).long())


def test_a_comparison_and_relu_as_a_user_writes_them():
    """x < y gives its bits in 3 rounds, and ReLU (a selection) its values."""
    a, b, c = (pt.VirtualWorker(w) for w in ("a", "b", "c"))
    xv, yv = torch.randn(3000) * 50, torch.randn(3000)
    x = mpc.share(xv, a, b, crypto_provider=c, config=CARRY)
    y = mpc.share(yv, a, b, crypto_provider=c, config=CARRY)
    with mpc.stats() as s:
        lt = (x < y).get()
    assert s.rounds == 3
    assert torch.equal(lt.bool(), xv < yv)
    with mpc.stats() as s:
        got = x.relu().get()
    assert s.rounds == 3
    assert torch.allclose(got, xv.relu(), atol=1e-4)


@settings(max_examples=20, deadline=None)
@given(
    values=st.lists(VALUES, min_size=1, max_size=50),
    n=st.sampled_from([2, 3]),
    complement=st.booleans(),
    seed=st.integers(0, 2**31),
)
def test_selections_against_plaintext(values, n, complement, seed):
    """[v msb(x)] for two values at once (ring values, edges included), 3 rounds."""
    x = torch.tensor(values, dtype=I64)
    gen = torch.Generator().manual_seed(seed)
    vs = [torch.randint(-(2**62), 2**62, x.shape, dtype=I64, generator=gen) for _ in range(2)]
    sx = _shared(x, n)
    shared = []
    for v in vs:
        sv = [s.copy() for s in sx.shares]
        sv[0] = sv[0] - pt.send(x, sx.shares[0].location) + pt.send(v, sx.shares[0].location)
        shared.append(sv)
    with mpc.stats() as s:
        sx.session.watch()
        got = compare.select_by_msb(sx.session, list(sx.shares), shared, complement)
    assert s.rounds == 3
    bit = (x < 0).long()
    for v, g in zip(vs, got):
        want = v * (1 - bit) if complement else v * bit
        assert torch.equal(sum(p.get() for p in g), want)


@pytest.mark.parametrize("n", [2, 3])
def test_relu_of_a_product_and_its_mask(n):
    """ReLU of a product not yet truncated (the truncation's result selected: its
    opening rides in round 2) and ReLU with its backward mask: 3 rounds each."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("d")
    av, bv = torch.randn(64, 8), torch.randn(8, 16)
    a = mpc.share(av, *parties, crypto_provider=dealer)
    b = mpc.share(bv, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        got = torch.relu(a @ b).get()
    assert s.rounds == 4  # the product's opening, then the comparison
    assert torch.allclose(got, torch.relu(av @ bv), atol=1e-3)
    x = mpc.share(av, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        out, mask = compare.relu_with_mask(x.session, list(x.shares))
        out_v, mask_v = sum(o.get() for o in out), sum(m.get() for m in mask)
    assert s.rounds == 3
    assert torch.equal(mask_v, (av >= 0).long())
    assert torch.allclose(out_v.double() / 2**16, av.relu().double(), atol=1e-4)


def test_its_bytes_a_party():
    """Each party sends c (8 bytes an element) and the two levels' masked operands (two
    packed words a word of four elements at level 1, of sixteen at level 2): no d."""
    n = 4096
    x = _shared(torch.arange(-n // 2, n // 2, dtype=I64), 2)
    with mpc.stats() as s:
        x.session.watch()
        compare.msb(x.session, list(x.shares))
    tree = 2 * 8 * (n // 4) + 2 * 8 * (n // 16)
    for sent in s.bytes_per_party.values():
        assert 8 * n + tree <= sent <= 8 * n + tree + 1024


# -- as a client that sends the steps -----------------------------------------------------


def _tamper(
    monkeypatch: pytest.MonkeyPatch, fn: Any, change: Callable[[int, list[Any]], list[Any]]
) -> None:
    tamper(monkeypatch, carry_run, fn, change)


@pytest.mark.parametrize(
    ("party", "match"),
    [
        (1, "not the ones the dealer's h is shared by"),  # the last party: its h says T
        (0, "of a comparison of another count of thresholds"),  # the others: msb(c)'s T
    ],
)
def test_the_last_level_takes_its_comparisons_thresholds(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, party: int, match: str
) -> None:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    _tamper(monkeypatch, carry_arith, lambda i, a: a[:-1] + [1] if i == party else a)
    refused((alice, bob)[party], lambda: compare.msb(x.session, list(x.shares)), match)


def test_the_last_xor_level_does_not_mask_for_an_arithmetic_one(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A max pool's comparison (groups of four: the XOR tree to its end, then d) whose
    last level is asked to mask operands for an arithmetic level after it: refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(1, 1, 4, 4), alice, bob, crypto_provider=carol, config=CARRY)
    _tamper(monkeypatch, carry_step, lambda i, a: a[:-1] + [True] if a[8] == 2 else a)
    refused(
        alice,
        lambda: torch.nn.functional.max_pool2d(x, 2).get(),
        "true only before the last level",
    )


def _selection_args(monkeypatch: pytest.MonkeyPatch, step: Any) -> list[list[Any]]:
    return args_of(monkeypatch, carry_run, step)


def test_a_selection_takes_the_value_it_masked(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A selection's v is the share its opening masked: another share is refused."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    other = mpc.share(torch.full((6,), 5.0), alice, bob, crypto_provider=carol, config=CARRY)
    _tamper(monkeypatch, arith_select, lambda i, a: a[:5] + [other.shares[i]] + a[6:])
    refused(
        alice,
        lambda: compare.select_by_msb(x.session, list(x.shares), [list(x.shares)]),
        "must be the share that instance",
    )


def test_relus_mask_is_taken_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    calls = _selection_args(monkeypatch, arith_mask)
    compare.relu_with_mask(x.session, list(x.shares))
    args = calls[0][0]
    refused(
        alice,
        lambda: pt.call_function(alice, name_of(arith_mask), args, out=[((6,), I64)]),
        "mask was selected",
    )


def test_a_selection_runs_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its opened e and its products are used up by the first call."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    calls = _selection_args(monkeypatch, arith_select)
    compare.select_by_msb(x.session, list(x.shares), [list(x.shares)])
    args = calls[0][0]
    refused(
        alice,
        lambda: pt.call_function(alice, name_of(arith_select), args, out=[((6,), I64)]),
        "not a spent",
    )


def test_the_last_level_runs_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its nonce's level waits for one step: a second call is refused (its streams and
    the dealer's words serve one comparison)."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    real = carry_run.at_parties
    calls: list[Any] = []

    def at_parties(session: Any, step: Any, args: Any, out: Any) -> Any:
        got = real(session, step, args, out)
        if step is carry_arith:
            calls.append(args(0))
        return got

    monkeypatch.setattr(carry_run, "at_parties", at_parties)
    compare.msb(x.session, list(x.shares))
    args = calls[0]
    refused(
        alice,
        lambda: pt.call_function(alice, name_of(carry_arith), args, out=[((6,), I64)]),
        "no carry-tree level waits for nonce",
    )


def test_the_dealer_deals_no_arithmetic_level_for_groups_of_four(
    make_worker: Callable[[str], Any],
) -> None:
    """Groups of four select on the daBit (their own material): never arithmetic."""
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(6), alice, bob, crypto_provider=carol, config=CARRY)
    s = x.session
    args = [s.dealer_seeds, s.next_nonce(), [2, 6], [s.next_nonce(), s.next_nonce()]]
    args += [[], s.next_nonce(), 0, True]
    refused(
        carol,
        lambda: pt.call_function(carol, name_of(dealer_compare), args, out=[((1,), I64)]),
        "selects no groups of four",
    )
