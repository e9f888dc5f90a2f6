"""Rounds by module kind (benchmarks.workloads.by_module): each kind counts the rounds its
modules ran, the innermost kind where kinds nest, one pass per forward of the model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpc
import pointers as pt
from benchmarks.workloads.by_module import REST, by_module, describe, kind_of
from benchmarks.workloads.tables import rounds_by_module


class ToyLayerNorm(nn.Module):
    """A layer norm whose result is formed here (a layer norm's result is formed at its
    first read, mpc.ops.row_scaled: a product reading it takes its last rounds)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],)).resolve()  # type: ignore[attr-defined]


class ToyAttention(nn.Module):
    """A product (2 rounds: its opening and its truncation) and, inside, a layer norm."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = ToyLayerNorm()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm((x * x).materialize())  # type: ignore[attr-defined]


class ToyMLP(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(x).materialize()  # type: ignore[attr-defined]


class Toy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn, self.mlp = ToyAttention(), ToyMLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mlp(self.attn(x))


def _rounds(fn: object, x: torch.Tensor) -> int:
    with mpc.stats() as s:
        fn(x)  # type: ignore[operator]
    return s.rounds


def test_rounds_count_under_the_innermost_kind_one_pass_a_forward() -> None:
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.randn(4, 8), alice, bob, crypto_provider=carol)
    product = _rounds(lambda t: (t * t).materialize(), x)
    norm = _rounds(lambda t: F.layer_norm(t, (8,)).resolve(), x)
    relu = _rounds(lambda t: F.relu(t).materialize(), x)
    model = Toy()
    with by_module(model) as bd:
        model(x)
        with mpc.stats() as run:  # one run: a pass, then a product (the rest)
            model(x)
            (x * x).materialize()
    assert len(bd.passes) == 2
    for p in bd.passes:
        assert p.by_kind == {"attention": product, "layer norm": norm, "MLP": relu}
    table = bd.last.table(run.rounds)
    assert table == {"attention": product, "layer norm": norm, "MLP": relu, REST: product,
                     "total": run.rounds}  # fmt: skip
    assert describe(table) == (
        f"attention {product}, layer norm {norm}, MLP {relu}, {REST} {product} "
        f"({run.rounds} in all)"
    )
    row = {"workload": "W16", "op": "decode", "size": "p32", "rounds": run.rounds}
    assert rounds_by_module(row) == ""  # (a row without the breakdown prints none)
    row["rounds_by_module"] = bd.last.by_kind
    assert rounds_by_module(row) == f"W16 decode p32: rounds by module: {describe(table)}"


def test_kinds_of_the_transformers_modules() -> None:
    names = {
        "GPT2Attention": "attention",
        "LlamaAttention": "attention",
        "BertSelfAttention": "attention",
        "BertSelfOutput": "attention",
        "LayerNorm": "layer norm",
        "LlamaRMSNorm": "layer norm",
        "GPT2MLP": "MLP",
        "BertIntermediate": "MLP",
        "BertOutput": "MLP",
        "GPT2Block": None,
        "Embedding": None,
    }
    for name, kind in names.items():
        assert kind_of(type(name, (nn.Module,), {})()) == kind, name


@pytest.mark.parametrize("comparison", ["default", "fss"])
def test_the_dealers_material_is_counted_as_the_protocols_ask_for_it(comparison: str) -> None:
    """mpc.stats().dealt: the bytes of the dealer's material the protocols asked for, which
    its messages then carried (dealer_bytes: the same, with their framing)."""
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    config = mpc.MPCConfig(comparison=comparison)
    x = mpc.share(torch.randn(64, 32), alice, bob, crypto_provider=carol, config=config)
    y = mpc.share(torch.randn(32, 16), alice, bob, crypto_provider=carol, config=config)
    for fn in (
        lambda: (x @ y).materialize(),
        lambda: (x < 0.5).get(),
        lambda: F.relu(x).materialize(),
        lambda: F.gelu(x).materialize(),
    ):
        with mpc.stats() as s:
            fn()
        assert s.dealt > 0
        assert 0.9 * s.dealer_bytes <= s.dealt <= s.dealer_bytes, (s.dealt, s.dealer_bytes)
