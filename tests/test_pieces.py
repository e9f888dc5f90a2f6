"""Operands too big for one step run in pieces (mpc.protocols.pieces): a comparison, a
selection, ReLU, the max of groups of four and a Fourier series whose dealer's step would
declare more than ``mpc.config.STEP_BYTES`` run on pieces of their operands, one after the
other, with the right results; on a served worker with a small limit, the comparison that
one run would ask too much for runs, where it was refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from network_fixtures import Cluster

import mpc
import pointers as pt
from mpc import config
from mpc.protocols import compare

MB = 1 << 20


def _trio() -> tuple[pt.VirtualWorker, pt.VirtualWorker, pt.VirtualWorker]:
    return pt.VirtualWorker("alice"), pt.VirtualWorker("bob"), pt.VirtualWorker("carol")


@pytest.mark.parametrize("mode", ["default", pytest.param("fss", marks=pytest.mark.slow)])
def test_comparisons_too_big_for_one_step_run_in_pieces(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    alice, bob, carol = _trio()
    a, b = torch.randn(6, 500), torch.randn(6, 500)
    cfg = mpc.MPCConfig(comparison=mode)
    x = mpc.share(a, alice, bob, crypto_provider=carol, config=cfg)
    y = mpc.share(b, alice, bob, crypto_provider=carol, config=cfg)
    with mpc.stats() as whole:
        lt = (x < y).get()
    assert compare.in_pieces(x.session, [3000]) == 1
    monkeypatch.setattr(config, "STEP_BYTES", 256 << 10)  # a piece of a few hundred values
    k = compare.in_pieces(x.session, [3000])
    assert k > 2
    with mpc.stats() as cut:
        lt_cut = (x < y).get()
    assert torch.equal(lt, a < b) and torch.equal(lt_cut, a < b)
    # one run a piece, one after the other: the rounds of the whole, once a piece
    assert cut.rounds > whole.rounds and cut.rounds % whole.rounds == 0
    relu = F.relu(x).get()
    assert torch.allclose(relu, F.relu(a), atol=1e-4)
    assert torch.allclose(
        torch.stack([x, y]).max(dim=0).values.get(), torch.maximum(a, b), atol=1e-4
    )


@pytest.mark.slow  # (80 s: dozens of pieces, each a full run)
def test_the_max_of_groups_and_a_series_run_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    alice, bob, carol = _trio()
    img = torch.randn(1, 2, 32, 32)
    v = torch.linspace(-6, 6, 2000)
    x = mpc.share(img, alice, bob, crypto_provider=carol)
    s = mpc.share(v, alice, bob, crypto_provider=carol)
    monkeypatch.setattr(config, "STEP_BYTES", 128 << 10)
    assert compare.in_pieces(x.session, [img.numel() // 4, 6], grouped=True) > 1
    pooled = F.max_pool2d(x, 2).get()
    assert torch.allclose(pooled, F.max_pool2d(img, 2), atol=1e-4)
    sig = torch.sigmoid(s).get()
    assert torch.allclose(sig, torch.sigmoid(v), atol=2e-3)


@pytest.mark.network
def test_a_served_worker_runs_in_pieces_the_comparison_it_would_refuse(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Served workers with a 32 MiB limit: one comparison of 2^17 values declares more
    than that at its dealer; with STEP_BYTES under the limit it runs in pieces and is
    right, and in one run it is refused before the dealer's step runs."""
    cluster = Cluster(
        tmp_path_factory.mktemp("pieces"), ["alice", "bob", "carol"], args=["--max-stored-mb", "32"]
    )
    cluster.start()
    try:
        ctx = pt.network.ClientContext()
        alice, bob, carol = (cluster.connect(w, context=ctx) for w in ("alice", "bob", "carol"))
        n = 1 << 17
        a, b = torch.randn(n), torch.randn(n)
        x = mpc.share(a, alice, bob, crypto_provider=carol)
        y = mpc.share(b, alice, bob, crypto_provider=carol)
        monkeypatch.setattr(config, "STEP_BYTES", 8 * MB)
        assert compare.in_pieces(x.session, [n]) > 1
        lt = (x < y).get()
        clear = (a - b).abs() > 1e-4  # (closer pairs are equal at 16 fractional bits)
        assert torch.equal(lt[clear], (a < b)[clear])
        monkeypatch.setattr(config, "STEP_BYTES", 1 << 30)
        assert compare.in_pieces(x.session, [n]) == 1
        with pytest.raises(pt.LimitExceeded, match="mpc.dealer_compare"):
            lt = x < y
            carol.sync()  # (the dealer's refusal; the parties then miss its material)
    finally:
        cluster.close_connections()
        cluster.stop()
