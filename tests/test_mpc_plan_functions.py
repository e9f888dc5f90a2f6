"""mpc.plan and mpc.preprocess with the Fourier-series functions (sigmoid, softmax's exp)
and the comparison's single dealer delivery, on both worker kinds: recorded once, dealt
ahead, replayed on fresh inputs, against plaintext torch."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import mpc


@pytest.fixture
def trio(make_worker):
    return make_worker("alice"), make_worker("bob"), make_worker("carol")


def _share(t: torch.Tensor, trio) -> mpc.SharedTensor:
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


def test_a_preprocessed_plan_with_sigmoid_and_softmax(trio):
    alice, bob, carol = trio
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(6, 8), nn.Sigmoid(), nn.Linear(8, 4), nn.Softmax(dim=1))
    model = model.eval()
    plain = copy.deepcopy(model)
    mpc.share(model, alice, bob, crypto_provider=carol)
    model_plan = mpc.plan(model, _share(torch.randn(5, 6), trio))
    mpc.preprocess(model_plan, 1)
    carol.wait_programs(20)
    assert model_plan.prepared() == 1
    for _ in range(2):  # one prepared call, then one that deals as it goes
        images = torch.randn(5, 6) * 3
        with mpc.stats() as s:
            out = model_plan(_share(images, trio))
            for w in trio:
                w.wait_programs(20)
        assert s.rounds == model_plan.rounds
        with torch.no_grad():
            assert torch.allclose(out.get(), plain(images), atol=2e-3)
    assert model_plan.prepared() == 0
