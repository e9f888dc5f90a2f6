"""A tensor larger than a network message (GPT-2's 309 MB token embedding against the
256 MiB default) is shared all the same: the last party's share travels in pieces that
its worker joins (``mpc.config.PIECE_BYTES``). Runs on both worker kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import mpc
import mpc.config


def test_a_share_larger_than_a_piece_arrives_whole(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, carol = (make_worker(n) for n in ("alice", "bob", "carol"))
    monkeypatch.setattr(mpc.config, "PIECE_BYTES", 4096)
    x = torch.randn(100, 50)  # 40,000 bytes of int64 shares: 10 pieces
    shared = mpc.share(x, alice, bob, crypto_provider=carol)
    assert tuple(shared.shares[-1].shape) == (100, 50)
    assert torch.allclose(shared.clone().get(), x, atol=1e-4)
    w = torch.randn(50, 3)
    assert torch.allclose(
        (shared @ mpc.share(w, alice, bob, crypto_provider=carol)).get(), x @ w, atol=1e-2
    )


def test_a_weight_larger_than_a_piece_runs_in_pieces(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A model's weight over a piece (GPT-2's LM head and token embedding over 64 MiB) is
    split along the contraction into instances of at most a piece each; a round's
    openings travel in packs of at most a piece. Results as plaintext, queries after the
    first open no weight, and the round count is that of one product."""
    alice, bob, carol = (make_worker(n) for n in ("alice", "bob", "carol"))
    monkeypatch.setattr(mpc.config, "PIECE_BYTES", 2048)
    torch.manual_seed(0)
    lin = nn.Linear(64, 12, bias=False)  # W.t(): 64 x 12 int64 = 6,144 bytes: 4 pieces
    emb = torch.randn(40, 16)  # a table used as onehot @ E: 5,120 bytes
    holder = nn.Module()
    holder.lin, holder.emb = lin, nn.Parameter(emb.clone())
    plain_w = lin.weight.detach().clone()
    mpc.share(holder, alice, bob, crypto_provider=carol)
    sent = []
    for _ in range(3):
        x = torch.randn(5, 64)
        onehot = torch.nn.functional.one_hot(torch.randint(0, 40, (5,)), 40).float()
        sx = mpc.share(x, alice, bob, crypto_provider=carol)
        so = mpc.share(onehot, alice, bob, crypto_provider=carol)
        with mpc.stats() as s:
            got = holder.lin(sx).get()
        assert s.rounds == 1  # the pieces open together (get() decodes the truncation)
        assert torch.allclose(got, x @ plain_w.t(), atol=1e-2)
        assert torch.allclose((so @ holder.emb).get(), onehot @ emb, atol=1e-2)
        sent.append(s.bytes_per_party["alice"])
    assert sent[0] > sent[1] == sent[2]
    assert len(holder.lin.weight._weight_instances) == 4  # 21 rows of 12 (2,016 bytes) a piece
