"""0/1 values opened one bit an element (mpc/math/bits.py, the opening step open_bits):
the comparison's d = msb(x) ^ t travels packed 64 to a word, where it travelled as one ring
word an element (8 bytes: 38% of a comparison's bytes). Property tests of the packing,
the step on plain tensors, and the step at a worker as a client that orchestrates the
parties sends it (raw steps). Runs on both worker kinds (conftest.py)."""

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
from mpc.math.bits import pack_bits, unpack_bits, words_for
from mpc.protocols.beaver.steps import beaver_mask
from mpc.protocols.comparison import run as comparison_run
from mpc.protocols.opening.run import Round, exchange
from mpc.protocols.opening.steps import open_bits, open_unpack, pack
from mpc.protocols.step import name_of

I64 = torch.int64

shapes = st.lists(st.integers(0, 9), min_size=1, max_size=3).filter(
    lambda s: torch.Size(s).numel() <= 300
)


@settings(max_examples=60, deadline=None)
@given(shape=shapes, seed=st.integers(0, 2**31))
def test_packed_bits_round_trip_and_xor_like_the_bits(shape: list[int], seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randint(0, 2, shape, generator=gen, dtype=I64)
    b = torch.randint(0, 2, shape, generator=gen, dtype=I64)
    n = a.numel()
    pa = pack_bits(a)
    assert list(pa.shape) == [words_for(n)] and words_for(n) == -(-n // 64)
    assert torch.equal(unpack_bits(pa, shape), a)
    # XOR shares of bits pack to XOR shares of the packed words
    assert torch.equal(pack_bits(a ^ b), pa ^ pack_bits(b))
    # only the low bit of each element is packed; the last word's spare bits are 0
    assert torch.equal(pack_bits(a + 2 * b), pa)
    if n % 64:
        assert int(pa[-1]) >> (n % 64) == 0


def test_packing_refuses_what_it_cannot_hold() -> None:
    with pytest.raises(TypeError, match="int64"):
        pack_bits(torch.ones(3))
    with pytest.raises(ValueError, match="2 packed int64 words hold 65 bits"):
        unpack_bits(torch.zeros(1, dtype=I64), [65])
    with pytest.raises(ValueError, match="int64"):
        unpack_bits(torch.zeros(1, dtype=torch.int32), [3])
    for bad in ([-1], [2.0], (3,)):
        with pytest.raises(ValueError, match="list of sizes"):
            unpack_bits(torch.zeros(1, dtype=I64), bad)  # type: ignore[arg-type]


def test_open_bits_xors_the_pieces_and_unpacks_the_value() -> None:
    gen = torch.Generator().manual_seed(1)
    v = torch.randint(0, 2, (5, 20), dtype=I64, generator=gen)
    masks = [torch.randint(0, 2, (5, 20), dtype=I64, generator=gen) for _ in range(2)]
    pieces = [pack_bits(v ^ masks[0] ^ masks[1]), pack_bits(masks[0]), pack_bits(masks[1])]
    before = pieces[0].clone()
    assert torch.equal(open_bits(None, pieces, [5, 20]), v)
    assert torch.equal(pieces[0], before)  # the pieces are not modified
    for args, match in (
        ([pieces, [5, 30]], r"3 packed int64 words hold 150 bits, got \[2\]"),
        ([pieces[:1], [5, 20]], "two or more"),
        ([[pieces[0], "x"], [5, 20]], "tensors"),
    ):
        with pytest.raises(ValueError, match=match):
            open_bits(None, *args)


# -- at the workers -----------------------------------------------------------------------


class _Stop(Exception):
    pass


def _captured_d(x: Any, y: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], list[int]]:
    """The parties' packed shares of a comparison's d (x < y), captured when its round
    would open them (the comparison stops there)."""
    got: list[Any] = []

    class Capture(Round):
        def open(self, count: bool = True) -> None:
            if self.bits:
                got.extend([self._values[0], self._shapes[0]])
                raise _Stop
            super().open(count)

    monkeypatch.setattr(comparison_run, "Round", Capture)
    with pytest.raises(_Stop):
        x < y  # noqa: B015
    monkeypatch.undo()
    return got[0], got[1]


_refused = refused  # (tests/refusals.py)
#: comparisons that open d at every size
FOUR_ROUNDS = MPCConfig(three_round_up_to=None, two_round_up_to=None)


@pytest.mark.parametrize("n", [2, 3])
def test_the_comparison_opens_d_one_bit_an_element(
    make_worker: Callable[[str], Any], n: int
) -> None:
    """d travels as 16 words for 1,000 elements; x < y is right (against torch). (d is
    opened by comparisons past ``three_round_up_to`` elements: here, of every size.)"""
    workers = [make_worker(f"p{i}") for i in range(n)]
    dealer = make_worker("dealer")
    gen = torch.Generator().manual_seed(n)
    a, b = torch.randn(1000, generator=gen), torch.randn(1000, generator=gen)
    x = mpc.share(a, *workers, crypto_provider=dealer, config=FOUR_ROUNDS)
    y = mpc.share(b, *workers, crypto_provider=dealer, config=FOUR_ROUNDS)
    sizes: list[int] = []
    real = Round.add

    def add(self: Round, shares: Any, shape: Any = None) -> Any:
        if self.bits:
            sizes.append(shares[0].numel())
        return real(self, shares, shape)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(Round, "add", add)
        assert torch.equal((x < y).get(), (a < b).float())
    assert sizes == [16]


def test_bits_open_only_with_open_bits_and_only_bits_do(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that opens a comparison's packed d with the sum/XOR opening, opens a
    Beaver product's masked operands as bits, packs two d's into one delivery, or opens
    d to another shape, is refused by the party; the honest opening then works, once."""
    alice, bob, carol = (make_worker(n) for n in ("alice", "bob", "carol"))
    gen = torch.Generator().manual_seed(0)
    x = mpc.share(torch.randn(70, generator=gen), alice, bob, crypto_provider=carol,
                  config=FOUR_ROUNDS)  # fmt: skip
    y = mpc.share(torch.randn(70, generator=gen), alice, bob, crypto_provider=carol,
                  config=FOUR_ROUNDS)  # fmt: skip
    s = x.session
    d1, shape1 = _captured_d(x, y, monkeypatch)
    d2, shape2 = _captured_d(y, x, monkeypatch)
    assert shape1 == shape2 == [70] and d1[0].shape == (2,)
    meta = [((2,), I64)]

    pieces = exchange(s, d1)
    _refused(
        alice,
        lambda: pt.call_function(alice, name_of(open_unpack), [pieces[0], [[2]], True], out=meta),
        "open with open_bits",
    )
    # a value that opens by sum (a Beaver product's e and f) is not bits
    nonce = s.next_nonce()
    out = [((140,), I64), ((70,), I64)]
    efs = [
        pt.call_function(
            p, name_of(beaver_mask), [s.party_seeds[i], nonce, x.shares[i], y.shares[i]], out=out
        )[0]  # fmt: skip
        for i, p in enumerate(s.parties)
    ]
    ef_pieces = exchange(s, efs)
    _refused(
        alice,
        lambda: pt.call_function(alice, name_of(open_bits), [ef_pieces[0], [140 * 64]], out=meta),
        "opens one value declared as bits",
    )
    # bits do not pack with other values (nor with bits: each value its own delivery)
    _refused(
        alice,
        lambda: pt.call_function(alice, name_of(pack), [[d1[0], d2[0]]], out=[((4,), I64)]),
        "one value at a time",
    )
    # the shape is the one the masking step sealed: not [70, 1] (which would broadcast
    # against the selected values), nor another count in the same words
    for bad in ([70, 1], [1, 70], [100], [64]):
        _refused(
            alice,
            lambda bad=bad: pt.call_function(
                alice, name_of(open_bits), [pieces[0], bad], out=[(tuple(bad), I64)]
            ),
            "the bits are of shape",
        )
    # the honest opening: 0/1 values of the right shape, at the party, sealed; once only
    (opened,) = pt.call_function(alice, name_of(open_bits), [pieces[0], [70]], out=[((70,), I64)])
    assert list(opened.shape) == [70]
    with pytest.raises(pt.PointerError, match="protocol material"):
        opened.get()
    _refused(
        alice,
        lambda: pt.call_function(alice, name_of(open_bits), [pieces[0], [70]], out=[((70,), I64)]),
        "again|used|protocol material",
    )


def test_a_round_of_bits_names_each_value_shape(make_worker: Callable[[str], Any]) -> None:
    alice, bob, carol = (make_worker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    with pytest.raises(ValueError, match="round of bits takes each value's shape"):
        Round(x.session, bits=True).add(x.shares)
    with pytest.raises(ValueError, match="round of bits takes each value's shape"):
        Round(x.session).add(x.shares, [3])
