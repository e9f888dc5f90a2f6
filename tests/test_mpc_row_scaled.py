"""A layer norm's result kept as S v + b until it is read (mpc/ops/row_scaled.py): a
linear layer after it, as the user writes the model, against float64 torch; two rounds
fewer than forming the result first; the result read again by other ops (as BERT's
residual does) equal to torch; GPT-2's Conv1D (a view, then addmm); the fallbacks."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
import pointers as pt
from mpc.config import MPCConfig

MODES = [(2, "default"), (3, "default"), (2, "fss")]


def _workers(n: int) -> tuple[list[Any], Any]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("dealer")


def _model(n: int, m: int, seed: int) -> nn.Sequential:
    torch.manual_seed(seed)
    ln, lin = nn.LayerNorm(n), nn.Linear(n, m)
    with torch.no_grad():
        ln.weight.uniform_(0.5, 2.0)
        ln.bias.uniform_(-0.5, 0.5)
    return nn.Sequential(ln, lin).eval()


@settings(max_examples=9, deadline=None)
@given(
    st.sampled_from(MODES),
    st.integers(1, 3),
    st.floats(-1.5, 2.0),
    st.floats(-2.0, 2.0),
    st.integers(0, 10_000),
)
def test_layer_norm_then_linear(mode, rows, log_std, mean, seed) -> None:
    """(LayerNorm, Linear) shared with the model's owner's sharing, rows of std 0.03 to 100
    around a mean (variances inside the domain, 1e-3 to 1e4): within 2e-3 of float64 (the layer norm's own tolerance), in the
    comparison and three rounds with FSS (the squares', the factor's and the product's, S
    riding in the last), two by default (the factor from the digit comparison's
    selections)."""
    n_parties, comparison = mode
    parties, dealer = _workers(n_parties)
    config = MPCConfig(comparison=comparison)
    model = _model(48, 10, seed)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, rows, 48, generator=g) * 10.0**log_std + mean
    with torch.no_grad():
        want = model.double()(x.double())
    model.float()
    mpc.share(model, *parties, crypto_provider=dealer, config=config)
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        y = model(xs)
        y.materialize()
    got = y.get().double()
    assert (got - want).abs().max() < 2e-3 * max(1.0, float(want.abs().max()))
    # with FSS: the comparison (1 round) and three (the squares', the factor's and the
    # product's); by default the comparison by digit look-ups (2), whose selections give
    # the factor and whose second round opens the product, and two: the materialize's 1
    assert s.rounds == (1 + 3 if comparison == "fss" else 2 + 2) + 1


@pytest.mark.parametrize(("n", "comparison"), MODES)
def test_a_round_fewer_than_forming_the_result_first(n: int, comparison: str) -> None:
    """The factor after the product saves a round over forming the result first (two
    before a formed result's truncation rode in its product with the weight,
    mpc.protocols.weights.steps.trunc_weight_product)."""
    parties, dealer = _workers(n)
    config = MPCConfig(comparison=comparison)
    model = _model(64, 16, 1)
    x = torch.randn(1, 1, 64) * 2
    want = model(x).detach().double()
    mpc.share(model, *parties, crypto_provider=dealer, config=config)
    ln, lin = model[0], model[1]
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as fused:
        y = lin(ln(xs))
        y.materialize()
    xs = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as apart:
        z = ln(xs).resolve()  # formed first: then the linear layer reads it
        y2 = lin(z)
        y2.materialize()
    assert fused.rounds == apart.rounds - 1
    for out in (y, y2):
        assert (out.get().double() - want).abs().max() < 2e-3


def test_the_result_read_again_after_the_product() -> None:
    """BERT's pattern: the normalised value feeds two linear layers and a residual sum;
    each equals torch (the first product formed the value in its own rounds)."""
    parties, dealer = _workers(2)
    torch.manual_seed(4)
    ln, a, b = nn.LayerNorm(32), nn.Linear(32, 8), nn.Linear(32, 8)
    x = torch.randn(1, 2, 32) * 0.7
    with torch.no_grad():
        h = ln(x)
        want = [a(h), b(h), h + 1.0]
    for m in (ln, a, b):
        mpc.share(m, *parties, crypto_provider=dealer)
    hs = ln(mpc.share(x, *parties, crypto_provider=dealer))
    got = [a(hs), b(hs), hs + 1.0]
    for g, w in zip(got, want):
        assert (g.get().double() - w.double()).abs().max() < 2e-3


def test_gpt2_conv1d_after_a_layer_norm() -> None:
    """transformers' Conv1D (x.view(-1, n), then addmm with its bias) takes the fused
    product through the view."""
    from transformers.pytorch_utils import Conv1D

    parties, dealer = _workers(2)
    torch.manual_seed(5)
    model = nn.Sequential(nn.LayerNorm(32), Conv1D(24, 32)).eval()
    with torch.no_grad():
        model[1].bias.uniform_(-1, 1)
    x = torch.randn(1, 1, 32) + 0.5
    want = model(x).detach().double()
    mpc.share(model, *parties, crypto_provider=dealer)
    xs = mpc.share(x, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        y = model(xs)
        y.materialize()
    assert (y.get().double() - want).abs().max() < 2e-3
    # the comparison's 2 (by digit look-ups, its selections giving the factor and its
    # second round opening the product), the squares' and the truncation's, the materialize
    assert s.rounds == 2 + 2 + 1


def test_public_layer_norm_weight_forms_the_result() -> None:
    """A layer norm whose parameters are public (only the input is shared): the result
    is formed as before (no fusion), still as torch."""
    parties, dealer = _workers(2)
    model = _model(16, 4, 6)
    x = torch.randn(3, 16)
    want = model(x).detach().double()
    xs = mpc.share(x, *parties, crypto_provider=dealer)
    assert (model(xs).get().double() - want).abs().max() < 2e-3


def test_addmm_with_a_public_bias_and_a_shared_matrix() -> None:
    """torch.addmm(public bias, layer norm's result viewed 2-D, a shared matrix that is
    no model's weight: a Beaver product, no instance): as torch, in the fused rounds."""
    parties, dealer = _workers(3)
    torch.manual_seed(7)
    ln = nn.LayerNorm(24)
    with torch.no_grad():
        ln.bias.uniform_(-1, 1)
    x, w, b = torch.randn(1, 2, 24) * 2, torch.randn(24, 6), torch.randn(6)
    want = torch.addmm(b, ln(x).detach().view(-1, 24), w).double()
    mpc.share(ln, *parties, crypto_provider=dealer)
    ws = mpc.share(w, *parties, crypto_provider=dealer)
    xs = mpc.share(x, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        y = torch.addmm(b, ln(xs).view(-1, 24), ws)
        y.materialize()
    assert (y.get().double() - want).abs().max() < 2e-3
    # the comparison's 2 (by digit look-ups, its selections giving the factor and its
    # second round opening the product), the squares' and the truncation's, the materialize
    assert s.rounds == 2 + 2 + 1


def test_three_linear_layers_read_one_layer_norm() -> None:
    """q, k and v projections of one normalised value (Llama's and BERT's pattern): the
    first takes the factor after its product and forms the value, the second truncates it
    once for every later reader: 9 rounds where forming it first took 10 (7 with the bins'
    comparison by digit look-ups: 2 rounds, whose selections give the factor)."""
    parties, dealer = _workers(2)
    torch.manual_seed(8)
    ln, q, k, v = nn.LayerNorm(32), nn.Linear(32, 8), nn.Linear(32, 8), nn.Linear(32, 8)
    x = torch.randn(1, 1, 32)
    with torch.no_grad():
        h = ln(x)
        want = [m(h).double() for m in (q, k, v)]
    for m in (ln, q, k, v):
        mpc.share(m, *parties, crypto_provider=dealer)
    xs = mpc.share(x, *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        hs = ln(xs)
        outs = [m(hs) for m in (q, k, v)]  # (their truncations stay pending: get() reads them)
    assert s.rounds == 3 + 2 + 1 + 1
    for o, w in zip(outs, want):
        assert (o.get().double() - w).abs().max() < 2e-3


def test_an_unread_result_is_freed_with_its_tensor() -> None:
    """No reference cycle keeps a deferred result alive (a held generation's recording
    keeps at the workers what is still alive when it ends): dropping the tensor frees its
    state at once, without the cycle collector."""
    import gc
    import weakref

    parties, dealer = _workers(2)
    ln = nn.LayerNorm(16)
    mpc.share(ln, *parties, crypto_provider=dealer)
    y = ln(mpc.share(torch.randn(1, 16), *parties, crypto_provider=dealer))
    view = y.view(-1, 16)
    state = weakref.ref(y.deferred.state)
    gc.disable()
    try:
        del y, view
        assert state() is None
    finally:
        gc.enable()
