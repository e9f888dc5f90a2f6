"""max with indices and argmax by levels of ranked groups whose entries carry their
index (mpc.ops.max_tree.indexed_max): no packing of the index into the values, so no
truncation round for a pending product and no round for the packed max's low bits;
against plaintext torch for 2 and 3 parties (hypothesis, ties included), a decoding
step's argmax over GPT-2's vocabulary as a user reaches it, and its rounds and bytes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.ops import max_tree, nonlinear


def _parties(make_worker: Callable[[str], Any], n: int) -> tuple[list[Any], Any]:
    return [make_worker(f"p{i}") for i in range(n)], make_worker("dealer")


@settings(max_examples=12, deadline=None)
@given(
    # (rows, k) where the ranked levels take the fewest rounds
    shape=st.sampled_from([(1, 1000), (1, 2000), (1, 3000), (2, 600), (2, 2000)]),
    n=st.sampled_from([2, 3]),
    spread=st.sampled_from([3, 40, 4000]),
    seed=st.integers(0, 2**31),
)
def test_the_carried_index_is_torchs_first_argmax(
    shape: tuple[int, int], n: int, spread: int, seed: int
) -> None:
    """argmax, and max's values and indices, of rows whose levels carry the index: the
    same index as torch (the first of tied maxima: few distinct values make many ties, in
    padded groups too) and the max within fixed point."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("dealer")
    gen = torch.Generator().manual_seed(seed)
    v = torch.randint(-spread, spread, shape, generator=gen).float() / 8
    x = mpc.share(v, *parties, crypto_provider=dealer)
    assert nonlinear._indexed_sizes(x) is not None  # (the path under test)
    assert torch.equal(torch.argmax(x, -1).get(), torch.argmax(v, -1))
    best, idx = torch.max(x, -1)
    assert torch.equal(idx.get(), torch.max(v, -1).indices)
    assert float((best.get() - v.max(-1).values).abs().max()) < 1e-3


@pytest.mark.parametrize("n", [2, 3])
def test_the_last_entry_and_the_first_win_where_they_should(
    make_worker: Callable[[str], Any], n: int
) -> None:
    """The max at the last entry (the padded group's own entry) and tied at the first and
    the last (the padding copies the first: the first index wins)."""
    parties, dealer = _parties(make_worker, n)
    v = torch.linspace(-5, 5, 2001).flip(0).unsqueeze(0)
    v[0, -1] = 9.0
    x = mpc.share(v, *parties, crypto_provider=dealer)
    assert int(torch.argmax(x, -1).get()) == 2000
    v[0, 0] = 9.0
    x = mpc.share(v, *parties, crypto_provider=dealer)
    assert int(torch.argmax(x, -1).get()) == 0


@pytest.mark.parametrize("n", [2, 3])
def test_an_lm_heads_argmax_takes_only_the_levels_rounds(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """A decoding step's greedy token as a user computes it: the last layer norm and a
    head over GPT-2's 50,257 entries, then argmax. The logits (the layer norm's factor
    times the head's product, still to be truncated from 42 fractional bits) are compared
    at their full scale and each entry carries its index: the argmax takes the levels'
    rounds alone, where the packed index took a truncation round first (no room to pack
    at 42 bits) and the low bits' round after; the same token as torch."""
    parties, dealer = _parties(make_worker, n)
    torch.manual_seed(n)
    model = torch.nn.Sequential(torch.nn.LayerNorm(16), torch.nn.Linear(16, 50_257)).eval()
    h = torch.randn(1, 16) * 2
    want = torch.argmax(model(h), -1)
    mpc.share(model, *parties, crypto_provider=dealer)
    hs = mpc.share(h, *parties, crypto_provider=dealer)
    model(hs).materialize()  # (the weights' instances made: a decoding step finds them)
    with mpc.stats() as s:
        logits = model(hs)
        assert logits.pending and logits.frac_bits > 32  # (no room to pack at its scale)
        head = s.rounds
        token = torch.argmax(logits, -1).get()
    assert torch.equal(token, want)
    sizes = max_tree.indexed_sizes(hs.session, 1, 50_257)
    assert sizes is not None
    assert s.rounds - head == max_tree.ranked_rounds(hs.session, 1, 50_257, sizes)
    # the packed index, as before: a truncation round and the low bits' round more
    monkeypatch.setattr(nonlinear, "_indexed_sizes", lambda x: None)
    with mpc.stats() as packed:
        logits = model(hs)
        assert torch.equal(torch.argmax(logits, -1).get(), token)
    assert packed.rounds == s.rounds + 2
    # its bytes: the values compared once (the packed path compares the packed values
    # once too), the index a second selection (its masked ranks and values: 2 words an
    # entry of a level) and the index's public sharing
    party = parties[0].id
    print(
        s.bytes_per_party[party], packed.bytes_per_party[party], s.dealer_bytes, packed.dealer_bytes
    )
    assert s.bytes_per_party[party] <= 1.25 * packed.bytes_per_party[party]
