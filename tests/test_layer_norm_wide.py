"""layer_norm of an input wider than the session's scale (tanh gives 24 fractional bits,
as GPT-2's gelu_new does): its squared deviations were summed at 56 bits and passed 2^62
for a row variance above ~0.08 over 768 features, so GPT-2 small's last layers came out
wrong by ~1e2 (found by the W15 benchmark). Against float32, for both branches of the mean
(768 features: a truncation; 512: a shift)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import mpc
import pointers as pt


@pytest.mark.parametrize("features", [768, 512])
@pytest.mark.parametrize("scale", [0.3, 0.6, 1.5])
def test_layer_norm_of_a_wide_input(features: int, scale: float) -> None:
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = torch.randn(16, features, generator=torch.Generator().manual_seed(3)) * scale
    shared = torch.tanh(mpc.share(x, alice, bob, crypto_provider=carol))
    assert shared.frac_bits > 16  # the case: wider than the session's 16 bits
    got = F.layer_norm(shared, (features,)).get()
    assert (got - F.layer_norm(torch.tanh(x), (features,))).abs().max() < 5e-3
