"""A product with a model's weight whose operand is still to be truncated
(mpc.protocols.weights.steps.trunc_weight_product): the truncation's opening is the product's only one.
Against plaintext (hypothesis), GPT-2's Conv1D after a product as a user writes it, what
the dealer sends, and a client that sends the finish with other material, twice, or with
another instance's F. Runs on both worker kinds (conftest.py)."""

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
from mpc.protocols.step import name_of
from mpc.protocols.weights import run as weights_run
from mpc.protocols.weights.steps import trunc_material_words, trunc_weight_product

I64 = torch.int64


@settings(max_examples=12, deadline=None)
@given(
    n=st.sampled_from([2, 3]),
    rows=st.integers(1, 4),
    k=st.integers(1, 24),
    m=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_a_truncated_operand_times_a_weight_against_plaintext(
    n: int, rows: int, k: int, m: int, seed: int
) -> None:
    """(a @ b) @ W for a model's weight W: the product's truncation and W's product in
    one round (W's F in it too the first time), within the truncations' units of
    float64, twice on one instance."""
    parties = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("d")
    gen = torch.Generator().manual_seed(seed)
    lin = torch.nn.Linear(k, m, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(m, k, generator=gen))
    a, b = torch.randn(rows, 8, generator=gen), torch.randn(8, k, generator=gen) / 2
    want = (a.double() @ b.double()) @ lin.weight.detach().double().t()
    bound = (k * float(lin.weight.detach().abs().max()) + 1) * 2**-15
    mpc.share(lin, *parties, crypto_provider=dealer)
    for _ in range(2):
        sa = mpc.share(a, *parties, crypto_provider=dealer)
        sb = mpc.share(b, *parties, crypto_provider=dealer)
        z = sa @ sb
        z.materialize()  # (the Beaver round; its truncation stays pending)
        with mpc.stats() as s:
            y = lin(z)
        assert s.rounds == 1
        got = y.get().double()
        assert float((got - want).abs().max()) <= bound


def test_gpt2s_conv1d_after_a_product(make_worker: Callable[[str], Any]) -> None:
    """As a user writes it, on both worker kinds: transformers' Conv1D (a view, then addmm
    with its bias) of a product not yet truncated takes 1 round where the truncation and
    the product took 2; within float32's tolerance."""
    from transformers.pytorch_utils import Conv1D

    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    torch.manual_seed(4)
    layer = Conv1D(48, 32)
    with torch.no_grad():
        layer.bias.uniform_(-1, 1)
    a, b = torch.randn(1, 3, 32), torch.randn(32, 32) / 4
    want = layer(a @ b).detach()
    mpc.share(layer, alice, bob, crypto_provider=carol)
    sa = mpc.share(a, alice, bob, crypto_provider=carol)
    sb = mpc.share(b, alice, bob, crypto_provider=carol)
    with mpc.stats() as s:
        y = layer(sa @ sb)
        y.materialize()
    assert s.rounds == 1 + 1 + 1  # the product's, the fused one, the materialize
    assert float((y.get() - want).abs().max()) < 1e-3


def test_what_the_dealer_sends() -> None:
    """The truncation's correction, U @ B (a word an output element) and the D_k B_kj (a
    word per row, k and j), to the last party."""
    parties, dealer = [pt.VirtualWorker(f"p{i}") for i in range(2)], pt.VirtualWorker("d")
    lin = torch.nn.Linear(64, 32, bias=False)
    mpc.share(lin, *parties, crypto_provider=dealer)
    z = mpc.share(torch.randn(2, 8), *parties, crypto_provider=dealer) @ mpc.share(
        torch.randn(8, 64), *parties, crypto_provider=dealer
    )
    lin(z)  # (the instance made)
    z = mpc.share(torch.randn(2, 8), *parties, crypto_provider=dealer) @ mpc.share(
        torch.randn(8, 64), *parties, crypto_provider=dealer
    )
    with mpc.stats() as s:
        z.session.watch()
        lin(z)
    words = trunc_material_words([2, 64], [64, 32], 16)  # (s and the D_k B_kj: 16 bits each)
    assert words == 2 * 64 + 2 * 64 * 2 // 8 + 2 * 32 + 2 * 64 * 32 * 2 // 8
    assert 8 * words <= s.dealer_bytes <= 8 * words + 2048


# -- a client that sends the steps out of order --------------------------------------------


def _case(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any, Callable[[], Any]]:
    alice, bob, carol = (make_worker(w) for w in ("alice", "bob", "carol"))
    lins = [torch.nn.Linear(16, 8, bias=False) for _ in range(2)]
    for lin in lins:
        mpc.share(lin, alice, bob, crypto_provider=carol)

    def run(lin: Any = lins[0]) -> Any:
        z = mpc.share(torch.randn(1, 4), alice, bob, crypto_provider=carol) @ mpc.share(
            torch.randn(4, 16), alice, bob, crypto_provider=carol
        )
        return lin(z).get()

    run(lins[1])  # (both instances made)
    run(lins[0])
    return alice, bob, lins, run


def test_the_finish_runs_once(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finish sent again with its first arguments (its opened c, the dealer's
    material) is refused."""
    alice, _, _, run = _case(make_worker)
    calls = args_of(monkeypatch, weights_run, trunc_weight_product)
    run()
    args = calls[0][0]
    out = [((1, 8), I64)]
    refused(alice, lambda: pt.call_function(alice, name_of(trunc_weight_product), args, out=out),
            "not a spent|spent|already used")  # fmt: skip


@pytest.mark.parametrize("what", ["weight", "f", "bits"])
def test_the_finish_takes_its_own_instance(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    """A finish told another instance (its weight nonce, or its F), or other bits than
    the dealer's material is for, is refused."""
    alice, bob, lins, run = _case(make_worker)
    other = args_of(monkeypatch, weights_run, trunc_weight_product)
    run(lins[1])
    theirs = other[0]
    monkeypatch.undo()

    def change(i: int, a: list[Any]) -> list[Any]:
        if what == "weight":  # the other instance's nonce and share (its rule binds them)
            return a[:2] + [theirs[i][2]] + a[3:4] + [theirs[i][4]] + a[5:]
        if what == "f":
            return a[:5] + [theirs[i][5]] + a[6:]
        return a[:7] + [a[7] + 1] if i == 1 else a

    who, match = {
        "weight": (alice, "instance|not for weight"),
        "f": (alice, "belongs to protocol instance|instance"),
        "bits": (bob, "not for weight instance"),
    }[what]
    tamper(monkeypatch, weights_run, trunc_weight_product, change)
    refused(who, run, match)
