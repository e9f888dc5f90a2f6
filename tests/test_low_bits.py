"""The low bits of a shared value (mpc.protocols.low_bits): [z mod 2^m] exactly for any
ring element z, in one round, against plaintext for 2 and 3 parties (hypothesis, edge
values included); its bad inputs; and its steps as an attacker calls them, on both worker
kinds (conftest.py)."""

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
from mpc.protocols.low_bits.run import low_bits
from mpc.protocols.low_bits.steps import MAX_LOW_BITS

I64 = torch.int64
SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
EDGES = [-(2**63), -(2**63) + 1, -1, 0, 1, 2**16 - 1, 2**16, 2**20 + 5, 2**62, 2**63 - 1]


@pytest.fixture(scope="module")
def group() -> tuple[list[Any], Any]:
    return [pt.VirtualWorker(f"lb{i}") for i in range(3)], pt.VirtualWorker("lb_dealer")


@SETTINGS
@given(
    data=st.data(),
    n=st.sampled_from([2, 3]),
    bits=st.sampled_from([1, 2, 7, 8, 15, 16, 17, MAX_LOW_BITS]),
)
def test_low_bits_are_exact_for_every_ring_element(
    group: tuple[list[Any], Any], data: st.DataObject, n: int, bits: int
) -> None:
    parties, dealer = group
    shape = tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=3), label="shape"))
    count = 1
    for d in shape:
        count *= d
    word = st.one_of(st.integers(-(2**63), 2**63 - 1), st.sampled_from(EDGES))
    zs = data.draw(st.lists(word, min_size=count, max_size=count), label="z")
    z = torch.tensor(zs, dtype=I64).view(shape)
    shared = mpc.share(z, *parties[:n], crypto_provider=dealer)  # integers: exact
    with mpc.stats() as s:
        out = low_bits(shared.session, shared.shares, bits)
        got = sum(o.get() for o in out)
    assert s.rounds == 1
    assert isinstance(got, torch.Tensor) and got.dtype == I64
    assert torch.equal(got, z & ((1 << bits) - 1)), (zs, bits, got.tolist())


@pytest.mark.parametrize("bits", [0, -1, MAX_LOW_BITS + 1, 64])
def test_bits_out_of_range_are_refused(group: tuple[list[Any], Any], bits: int) -> None:
    parties, dealer = group
    shared = mpc.share(torch.tensor([5, 6]), *parties[:2], crypto_provider=dealer)
    with pytest.raises(ValueError, match=f"1 to {MAX_LOW_BITS} bits"):
        low_bits(shared.session, shared.shares, bits)


# -- as an attacker calls the steps ------------------------------------------------------


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


_refused = refused  # (tests/refusals.py)


def _step(worker: Any, name: str, args: list[Any], out: Any) -> Any:
    return pt.call_function(worker, name, args, out=out)


def test_a_client_cannot_misuse_the_low_bits_steps(trio: Any) -> None:
    """The finish takes only the opened c of its own instance; the mask's stream is used
    once; the dealer deals an instance's table once."""
    alice, bob, carol = trio
    z = torch.tensor([7, -9, 2**40 + 3])
    x = mpc.share(z, alice, bob, crypto_provider=carol)
    s, seeds = x.session, x.session.party_seeds
    n, bits = s.next_nonce(), 4
    out = [((3,), I64)]
    c0 = _step(alice, "mpc.low_mask", [seeds[0], n, x.shares[0]], out)
    # a finish on the masked share (not opened), or on a plain share, is refused
    for c in (c0, x.shares[0]):
        _refused(
            alice,
            lambda c=c: _step(alice, "mpc.low_finish", [seeds[0], n, None, c, bits], out),
            "opened|sealed|protocol",
        )
    # the mask's stream is used once
    _refused(
        alice,
        lambda: _step(alice, "mpc.low_mask", [seeds[0], n, x.shares[0]], out),
        "never used twice|sealed|protocol",
    )
    # the dealer deals an instance's table once
    m = s.next_nonce()
    (table,) = _step(carol, "mpc.dealer_low_bits", [s.dealer_seeds, m, [3], 5], [((96,), I64)])
    _refused(
        carol,
        lambda: _step(carol, "mpc.dealer_low_bits", [s.dealer_seeds, m, [3], 5], [((96,), I64)]),
        "never used twice|sealed|protocol",
    )
    del table
    # an honest run after all that still gives the low bits
    y = mpc.share(z, alice, bob, crypto_provider=carol)
    got = sum(o.get() for o in low_bits(y.session, y.shares, bits))
    assert torch.equal(got, z & 15)


class _Ctx:
    def __init__(self) -> None:
        self.function_state: dict[str, Any] = {}
        self.id = "dealer"


@pytest.mark.parametrize("n", [2, 3])
def test_the_dealt_table_is_a_share_of_the_table(n: int) -> None:
    """The parties' derived tables and the dealer's sum to T[v] = (v - r) mod 2^bits, and
    the last party's alone is spread over the ring (the others' words mask it)."""
    import types

    from mpc.protocols.low_bits.steps import dealer_low_bits
    from mpc.protocols.seeds.steps import new_seed
    from mpc.protocols.streams import TAG_R, TAG_TABLE, derive, sum_derived

    seeds = [new_seed(types.SimpleNamespace(), i, n) for i in range(n)]
    shape, nonce, bits = [5], 11, 6
    last = dealer_low_bits(_Ctx(), seeds, nonce, shape, bits).view(5, 64)
    table = last.clone()
    for s in seeds[:-1]:
        table += derive(s, nonce, TAG_TABLE, [5, 64])
    r = sum_derived(seeds, nonce, TAG_R, shape)
    want = (torch.arange(64) - r.unsqueeze(-1)) & 63
    assert torch.equal(table, want)
    # not the table (all in [0, 64)): uniform words, of which few are small (each is
    # below 2^40 in absolute value with probability 2^-23; three of 320 is about 1e-14)
    assert int((last.abs() < 2**40).sum()) <= 2


def test_a_vocabulary_argmax_takes_its_index_from_the_low_bits(trio: Any) -> None:
    """An argmax alone over 40,000 entries (the packed values' tree, then the low bits: a
    table of 2^16 words dealt to the last party) on both worker kinds, with the workers'
    default limits; ties go to the first index."""
    alice, bob, carol = trio
    gen = torch.Generator().manual_seed(5)
    v = torch.randint(-100, 100, (1, 40_000), generator=gen).float() / 8
    v[0, 777] = v[0, 30_000] = 20.0
    x = mpc.share(v, alice, bob, crypto_provider=carol)
    idx = torch.argmax(x, -1).get()
    assert int(idx) == 777
