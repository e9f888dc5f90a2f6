"""A tensor larger than a network message (GPT-2's 309 MB token embedding against the
256 MiB default) is shared all the same: the last party's share travels in pieces that
its worker joins (``mpc.shared.PIECE_BYTES``). Runs on both worker kinds."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

import mpc
import mpc.shared


def test_a_share_larger_than_a_piece_arrives_whole(
    make_worker: Callable[[str], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    alice, bob, carol = (make_worker(n) for n in ("alice", "bob", "carol"))
    monkeypatch.setattr(mpc.shared, "PIECE_BYTES", 4096)
    x = torch.randn(100, 50)  # 40,000 bytes of int64 shares: 10 pieces
    shared = mpc.share(x, alice, bob, crypto_provider=carol)
    assert tuple(shared.shares[-1].shape) == (100, 50)
    assert torch.allclose(shared.get(), x, atol=1e-4)
    w = torch.randn(50, 3)
    assert torch.allclose(
        (shared @ mpc.share(w, alice, bob, crypto_provider=carol)).get(), x @ w, atol=1e-2
    )
