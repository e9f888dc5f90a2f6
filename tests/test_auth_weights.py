"""Authenticated weight instances (mpc.protocols.auth_weights): a model shared in the
malicious mode opens its weights' F = W - B once, and every later query opens only the
activations. Against plaintext torch (2 and 3 parties, both comparison modes, in process
and on network workers), what a query then sends, and the attacks: a party that deviates
at each new step, and a client that combines an instance with another weight."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
import torch
from deviations import deviating
from refusals import refused
from torch import nn

import mpc
import pointers as pt
from mpc.protocols.auth_weights.steps import (
    auth_weight_mask,
    auth_wprod,
    auth_wprod_mask,
)

ERRORS = {"1": 1, "2^16": 1 << 16, "2^63": 1 << 63, "random": None}


def _error(e: int | None) -> int:
    return int.from_bytes(os.urandom(8), "little") | 1 if e is None else e


def small_net() -> nn.Module:
    """A convolution, a ReLU and two linear layers (a weight first in a matmul: no)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        return nn.Sequential(
            nn.Conv2d(1, 3, 3), nn.ReLU(), nn.Flatten(), nn.Linear(48, 5), nn.Linear(5, 2)
        ).eval()


IMAGES = [torch.rand(2, 1, 6, 6, generator=torch.Generator().manual_seed(k)) for k in (1, 2)]


@pytest.fixture(params=[(2, "default"), (3, "default"), (2, "fss")], ids=lambda p: f"{p[0]}-{p[1]}")
def parties(
    request: pytest.FixtureRequest, make_worker: Callable[[str], Any]
) -> tuple[list[Any], Any, mpc.MPCConfig]:
    n, comparison = request.param
    workers = [make_worker(f"party{i}") for i in range(n)]
    return (
        workers,
        make_worker("dealer"),
        mpc.MPCConfig(security="malicious", comparison=comparison),
    )


def test_queries_match_torch_and_open_the_weights_once(
    parties: tuple[list[Any], Any, mpc.MPCConfig],
) -> None:
    workers, dealer, config = parties
    net = small_net()
    shared = mpc.share(small_net(), *workers, crypto_provider=dealer, config=config)
    sent = []
    for img in IMAGES:
        x = mpc.share(img, *workers, crypto_provider=dealer, config=config)
        with mpc.stats() as s:
            out = shared(x).get()
        torch.testing.assert_close(out, net(img).detach(), atol=2e-3, rtol=1e-3)
        sent.append(max(s.bytes_per_party.values()))
    # the second query opens no weight: 27 + 240 + 10 weights of 16 bytes to each peer,
    # in three messages of their own (up to 128 bytes of framing each); nothing else
    # changes between the two
    weights = sum(p.numel() for name, p in net.named_parameters() if name.endswith("weight"))
    peers = len(workers) - 1
    assert 0 <= sent[0] - sent[1] - 16 * weights * peers <= 3 * 128 * peers


def test_a_matmul_of_two_activations_still_opens_both(
    parties: tuple[list[Any], Any, mpc.MPCConfig],
) -> None:
    workers, dealer, config = parties
    a, b = torch.randn(3, 4), torch.randn(4, 2)
    sa = mpc.share(a, *workers, crypto_provider=dealer, config=config)
    sb = mpc.share(b, *workers, crypto_provider=dealer, config=config)
    with mpc.stats() as s:
        out = (sa @ sb).get()
    torch.testing.assert_close(out, a @ b, atol=2e-3, rtol=1e-3)
    assert max(s.bytes_per_party.values()) >= 16 * (12 + 8) * (len(workers) - 1)


def test_a_weight_changed_after_its_instance_gets_a_new_one() -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    s = mpc.Session(workers, pt.VirtualWorker("carol"), security="malicious")
    lin = nn.Linear(4, 3)
    bias = lin.bias.detach().clone()
    shared = mpc.share(lin, session=s)  # (in place)
    x = torch.randn(2, 4)
    shared(mpc.share(x, session=s)).get()
    new = torch.randn(3, 4)
    shared.weight = nn.Parameter(mpc.share(new, session=s), requires_grad=False)
    out = shared(mpc.share(x, session=s)).get()  # (a plain shared tensor: a Beaver product)
    torch.testing.assert_close(out, x @ new.t() + bias, atol=2e-3, rtol=1e-3)


# -- attacks ------------------------------------------------------------------------------


def _two() -> tuple[list[Any], mpc.Session]:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    return workers, mpc.Session(workers, pt.VirtualWorker("carol"), security="malicious")


def _queries(s: mpc.Session) -> torch.Tensor:
    """Two queries of a shared net: the first makes the instances, the second uses them."""
    shared = mpc.share(small_net(), session=s)
    outs = [shared(mpc.share(img, session=s)) for img in IMAGES]
    return torch.stack([o.get() for o in outs])


CASES: list[tuple[Any, int, tuple[int, ...], str]] = [
    (auth_weight_mask, 0, (0,), "its piece of a weight's F"),
    (auth_weight_mask, 1, (0,), "the MAC of its piece of F"),
    (auth_wprod_mask, 0, (0,), "its piece of the activation's e"),
    (auth_wprod_mask, 1, (0,), "the MAC of its piece of e"),
    (auth_wprod_mask, 2, (0, 0), "its share of A"),
    (auth_wprod_mask, 2, (0, 1), "the MAC of its share of A"),
    (auth_wprod_mask, 3, (0, 0), "its share of C"),
    (auth_wprod_mask, 3, (0, 1), "the MAC of its share of C"),
    (auth_wprod, 0, (0, 0), "its product share"),
    (auth_wprod, 0, (0, 1), "its product share's MAC"),
]


@pytest.mark.parametrize("error", list(ERRORS), ids=list(ERRORS))
@pytest.mark.parametrize("who", [0, 1], ids=["first", "last"])
@pytest.mark.parametrize("step,output,part,what", CASES, ids=[c[3] for c in CASES])
def test_every_deviation_in_a_weight_product_is_caught(
    step: Any, output: int, part: tuple[int, ...], what: str, who: int, error: str
) -> None:
    workers, s = _two()
    e = _error(ERRORS[error])
    with deviating(workers[who], step, output, e, part, every=True) as count:
        with pytest.raises(mpc.MACCheckError):
            out = _queries(s)
            pytest.fail(f"no check caught {what} + {e}: the client got {out}")
    assert count[0] >= 1


def test_stale_product_material_is_caught() -> None:
    workers, s = _two()
    with deviating(workers[1], auth_wprod_mask, 2, stale=True) as count:
        with pytest.raises(mpc.MACCheckError):
            _queries(s)
    assert count[0] >= 1


def test_an_instance_combines_with_the_weight_it_masked_only() -> None:
    workers, s = _two()
    lin = mpc.share(nn.Linear(4, 3), session=s)
    x = mpc.share(torch.randn(2, 4), session=s)
    lin(x).get()  # (makes the instance of the weight's transpose)
    (inst,) = lin.weight.__dict__["_auth_weight_instances"].values()
    other = mpc.share(torch.randn(4, 3), session=s)
    # a client that hands the instance's last step another tensor for W (same shape)
    inst.w = list(other.shares)
    refused(workers[0], lambda: lin(x).get(), "must be the share that weight instance")


def test_an_instance_is_made_once() -> None:
    workers, s = _two()
    lin = mpc.share(nn.Linear(4, 3), session=s)
    lin(mpc.share(torch.randn(2, 4), session=s)).get()
    (inst,) = lin.weight.__dict__["_auth_weight_instances"].values()
    alice = workers[0]
    seed = s.party_seeds[0]
    refused(
        alice,
        lambda: pt.call_function(
            alice,
            "mpc.auth_weight_mask",
            [seed, inst.weight, inst.w[0], None],
            out=[((2, 3, 4), torch.int64), ((2, 3, 4), torch.int64)],
        ),
        "was made before",
    )
