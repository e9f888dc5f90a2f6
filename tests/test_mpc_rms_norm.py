"""Llama's RMSNorm on shares runs as one fused op (mpc/ops/norms.py): against the
plaintext module (hypothesis: rows, magnitudes, 2 and 3 parties, FSS), with a shared
and a public weight, on an input still to be truncated, and in the rounds it claims."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig

transformers = pytest.importorskip("transformers")
from transformers.models.llama.modeling_llama import LlamaRMSNorm  # noqa: E402


def _workers(n: int) -> tuple[list[pt.VirtualWorker], pt.VirtualWorker]:
    return [pt.VirtualWorker(f"p{i}") for i in range(n)], pt.VirtualWorker("dealer")


@settings(max_examples=12, deadline=None)
@given(
    st.sampled_from([(2, "default"), (3, "default"), (2, "fss")]),
    st.integers(1, 6),  # rows
    st.sampled_from([0.05, 1.0, 30.0]),  # magnitude of x (mean(x^2) in the domain)
    st.integers(0, 2**31),
)
def test_rms_norm_agrees_with_llamas_module(mode, rows, magnitude, seed):
    n, comparison = mode
    g = torch.Generator().manual_seed(seed)
    module = LlamaRMSNorm(96, eps=1e-5)
    module.weight.data = torch.randn(96, generator=g) * 0.3 + 1
    plain = copy.deepcopy(module)
    x = torch.randn(rows, 96, generator=g) * magnitude
    parties, dealer = _workers(n)
    config = MPCConfig(comparison=comparison)
    shared = mpc.share(module, *parties, crypto_provider=dealer, config=config)
    sx = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    got = shared(sx).get()
    want = plain(x).detach()
    # 16 fractional bits in x: relative 2^-16 / magnitude per element, plus the division's
    assert torch.allclose(got, want, atol=4e-4 + 2e-4 * want.abs().max().item(), rtol=1e-4)


@pytest.mark.parametrize("fss", [False, True])
def test_a_decoding_steps_rms_norm_rounds(fss: bool) -> None:
    """One row (a decoding step's), after a product (its truncation pending): the
    truncation with x^2 and x w riding (1), the fine bins' comparison (2 by digit look-ups;
    FSS 1) and the factor's two rounds when the result is read (mpc.ops.row_scaled; get()
    decodes its pending truncation; by default the first is the comparison's second, its
    selections giving the factor): 4 either way, where pow, mean, rsqrt and the products
    took 24."""
    torch.manual_seed(5)
    module = LlamaRMSNorm(64, eps=1e-6)
    module.weight.data = torch.randn(64) * 0.2 + 1
    plain = copy.deepcopy(module)
    x, w = torch.randn(1, 32), torch.randn(32, 64) / 4
    parties, dealer = _workers(2)
    config = MPCConfig(comparison="fss" if fss else "default")
    shared = mpc.share(module, *parties, crypto_provider=dealer, config=config)
    sx = mpc.share(x, *parties, crypto_provider=dealer, config=config)
    sw = mpc.share(w, *parties, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        got = shared(sx @ sw).get()
    # the product's Beaver round, then RMSNorm's (its bins' comparison by digit look-ups
    # by default: 2 rounds, whose selections give the factor)
    assert s.rounds == 1 + 4
    assert torch.allclose(got, plain(x @ w).detach(), atol=5e-4)


def test_rms_norm_with_a_public_weight() -> None:
    from mpc.ops.norms import rms_norm

    parties, dealer = _workers(2)
    x = torch.randn(3, 40)
    weight = torch.randn(40)
    sx = mpc.share(x, *parties, crypto_provider=dealer)
    got = rms_norm(sx, weight, 1e-5).get()
    want = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * weight
    assert torch.allclose(got, want, atol=5e-4)
