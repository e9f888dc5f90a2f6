"""Comparisons in the malicious mode (``security="malicious"``): x < y, ReLU, max and
max-pooling on authenticated shares against plaintext torch, for 2 and 3 parties, in
process and on network workers; their rounds; their errors. The attacks on their steps are
in tests/test_malicious_attacks.py."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import strategies as st
from test_mpc_malicious import SETTINGS, Parties, floats, property_test, reveal, shapes
from torch import nn

import mpc
import pointers as pt

U = 2.0**-16  # one unit of the fixed-point encoding
# values a comparison must get right: zero, one unit either side, and far from zero (the
# comparison is exact for |x - y| < 2^46 at 16 fractional bits)
EDGES = [0.0, U, -U, 2 * U, -2 * U, 1.0, -1.0, 2.0**44, -(2.0**44), 2.0**45 - 1, -(2.0**45)]


@pytest.fixture(params=[2, 3, "fss"], ids=lambda n: n if n == "fss" else f"{n}parties")
def mp(request: pytest.FixtureRequest, make_worker: Any, worker_kind: str) -> Parties:
    """2 and 3 parties with the default comparison; 2 with the FSS comparison."""
    fss = request.param == "fss"
    parties = Parties(make_worker, 2 if fss else request.param, worker_kind)
    if fss:
        parties.config = mpc.MPCConfig(security="malicious", comparison="fss")
    return parties


def encoded(x: torch.Tensor) -> torch.Tensor:
    """x as the engine holds it (rounded to the fixed-point grid), in float64."""
    return torch.round(x.double() / U) * U


@pytest.mark.virtual_only("served parties: the small CNN below and tests/test_malicious_faults.py")
@property_test(SETTINGS)
def test_comparisons_match_torch(mp: Parties, data: Any) -> None:
    shape = shapes(data, 2)
    x, y = floats(data, shape), floats(data, shape)
    # ties and values one unit apart
    x.view(-1)[0] = y.view(-1)[0]
    if x.numel() > 1:
        x.view(-1)[1] = y.view(-1)[1] + U
    sx, sy = mp.share(x), mp.share(y)
    ex, ey = encoded(x), encoded(y)
    for name, got, want in [
        ("lt", sx < sy, ex < ey),
        ("gt", sx > sy, ex > ey),
        ("ge", sx >= sy, ex >= ey),
        ("le", sx <= sy, ex <= ey),
        ("lt public", sx < 0.5, ex < 0.5),
        ("gt public", 0.25 > sx, 0.25 > ex),
    ]:
        out = reveal(got)
        assert out.dtype == torch.bool, name
        assert torch.equal(out, want), (name, x, y)


@pytest.mark.virtual_only("served parties: the small CNN below and tests/test_malicious_faults.py")
def test_comparisons_at_the_edges_of_the_range(mp: Parties) -> None:
    x = torch.tensor(EDGES, dtype=torch.float64)
    sx = mp.share(x)
    assert torch.equal(reveal(sx < 0), x < 0)
    assert torch.equal(reveal(sx > 0), x > 0)
    torch.testing.assert_close(reveal(torch.relu(sx)), torch.relu(x), atol=U, rtol=0)


@pytest.mark.virtual_only("served parties: the small CNN below and tests/test_malicious_faults.py")
@property_test(SETTINGS)
def test_relu_and_max_match_torch(mp: Parties, data: Any) -> None:
    shape = shapes(data, 3)
    x, y = floats(data, shape), floats(data, shape)
    sx, sy = mp.share(x), mp.share(y)
    tol = dict(atol=U, rtol=0)
    torch.testing.assert_close(reveal(torch.relu(sx)), torch.relu(encoded(x)).float(), **tol)
    torch.testing.assert_close(reveal(torch.maximum(sx, sy)), torch.maximum(x, y), **tol)
    torch.testing.assert_close(reveal(torch.minimum(sx, sy)), torch.minimum(x, y), **tol)
    torch.testing.assert_close(reveal(torch.amax(sx, dim=-1)), x.amax(-1), **tol)
    torch.testing.assert_close(reveal(sx.amax(0, keepdim=True)), x.amax(0, keepdim=True), **tol)
    torch.testing.assert_close(reveal(sx.max()), x.max(), **tol)


def test_max_pooling_and_a_small_cnn_match_torch(mp: Parties) -> None:
    torch.manual_seed(0)
    img = torch.randn(2, 3, 6, 7)
    got = reveal(F.max_pool2d(mp.share(img), 2))
    torch.testing.assert_close(got, F.max_pool2d(img, 2), atol=U, rtol=0)
    got = reveal(F.max_pool2d(mp.share(img), 3, stride=2))
    torch.testing.assert_close(got, F.max_pool2d(img, 3, stride=2), atol=U, rtol=0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(36, 10), nn.ReLU(),
        nn.Linear(10, 3),
    ).eval()  # fmt: skip
    x = torch.rand(2, 1, 8, 8)
    with torch.no_grad():
        want = model(x)
    mp.share_model(model)
    torch.testing.assert_close(reveal(model(mp.share(x))), want, atol=2e-3, rtol=1e-3)


@pytest.mark.virtual_only("served parties: the small CNN above")
@property_test(SETTINGS)
def test_a_max_pool_of_a_relu_pools_first_and_matches_torch(mp: Parties, data: Any) -> None:
    """max-pool(relu(x)) runs as relu(max-pool(x)): the same values, the same rounds, a
    comparison a window fewer than an element's ReLU; the ReLU read afterwards is right."""
    n, c = data.draw(st.integers(1, 2)), data.draw(st.integers(1, 2))
    h, w = data.draw(st.integers(2, 5)), data.draw(st.integers(2, 5))
    kernel = data.draw(st.sampled_from([1, 2, (2, 1)]))
    stride = data.draw(st.sampled_from([None, 1, 2]))
    img = floats(data, (n, c, h, w))
    img.view(-1)[0] = 0.0  # (a zero in the first window)
    want = F.max_pool2d(torch.relu(encoded(img)), kernel, stride).float()
    x = mp.share(img)
    x.get()  # (the input's check: not counted below)
    with mpc.stats() as pooled_first:
        got = F.max_pool2d(torch.relu(x), kernel, stride)
    with mpc.stats() as relu_first:
        r = torch.relu(x).materialize()
        eager = F.max_pool2d(r, kernel, stride)
    torch.testing.assert_close(reveal(got), want, atol=U, rtol=0)
    torch.testing.assert_close(reveal(eager), want, atol=U, rtol=0)
    torch.testing.assert_close(reveal(r), torch.relu(encoded(img)).float(), atol=U, rtol=0)
    assert pooled_first.rounds == relu_first.rounds
    if want.numel() < img.numel():  # (windows of one value compare as much either way)
        assert pooled_first.dealer_bytes < relu_first.dealer_bytes


def test_a_relu_runs_once_whoever_reads_it(mp: Parties) -> None:
    x = mp.share(torch.tensor([[1.5, -2.0], [0.25, -0.5]]))
    x.get()
    r = torch.relu(x)
    with mpc.stats() as first:
        y = r + r  # (the first read runs the comparison)
    with mpc.stats() as second:
        z = r * 2.0
        pooled = F.max_pool2d(r.view(1, 1, 2, 2), 2)  # (a ReLU that ran: pooled as it is)
    assert first.rounds >= 1
    assert second.rounds == pooled_rounds(mp)
    want = torch.tensor([[1.5, 0.0], [0.25, 0.0]])
    torch.testing.assert_close(reveal(y), 2 * want, atol=U, rtol=0)
    torch.testing.assert_close(reveal(z), 2 * want, atol=U, rtol=0)
    torch.testing.assert_close(reveal(pooled).view(()), torch.tensor(1.5), atol=U, rtol=0)


def pooled_rounds(mp: Parties) -> int:
    """Rounds of the max of four values (two levels of the max of two)."""
    x = mp.share(torch.zeros(1, 1, 2, 2))
    x.get()
    with mpc.stats() as s:
        F.max_pool2d(x, 2)
    return s.rounds


@pytest.mark.slow
@pytest.mark.virtual_only("LeNet in process; the served case is the small CNN above")
def test_lenet_of_the_benchmark_matches_torch(mp: Parties) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 100), nn.ReLU(), nn.Linear(100, 10),
    ).eval()  # fmt: skip
    x = torch.rand(2, 1, 28, 28)
    with torch.no_grad():
        want = model(x)
    mp.share_model(model)
    out = reveal(model(mp.share(x)))
    torch.testing.assert_close(out, want, atol=2e-3, rtol=1e-3)
    assert torch.equal(out.argmax(1), want.argmax(1))


# -- what it costs --------------------------------------------------------------------------


@pytest.mark.virtual_only("rounds are the same on network workers")
def test_rounds_of_a_comparison_and_a_relu(mp: Parties) -> None:
    x = mp.share(torch.tensor([1.5, -2.0, 0.0]))
    x.get()  # (the inputs' check: not counted below)
    fss = mp.config.comparison == "fss"
    with mpc.stats() as s:
        bit = x < 0
    # the opening of c, then by default the borrow tree's 6 levels (62 leaves) and the
    # last bit's product; with FSS nothing more (the DCF is local)
    assert s.rounds == (1 if fss else 8)
    with mpc.stats() as s:
        y = torch.relu(x)
    assert s.rounds == 0  # (a ReLU runs at the first read of its shares)
    with mpc.stats() as s:
        y.materialize()
    # by default the product by the bit after the comparison; with FSS it rides on the
    # comparison's round (the DCF's payload carries the mask's product with the bit)
    assert s.rounds == (1 if fss else 9)
    assert torch.equal(bit.get(), torch.tensor([False, True, False]))
    assert torch.equal(y.get(), torch.tensor([1.5, 0.0, 0.0]))


# -- errors -----------------------------------------------------------------------------------


@pytest.mark.virtual_only("the errors are raised at the client")
def test_clear_errors_of_the_comparisons() -> None:
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(1, 1, 4, 4), alice, bob, crypto_provider=carol, security="malicious")
    with pytest.raises(mpc.UnsupportedOpError, match="padding"):
        F.max_pool2d(x, 2, padding=1)
    with pytest.raises(mpc.UnsupportedOpError, match="one dim"):
        torch.amax(x, dim=(2, 3))
    with pytest.raises(mpc.UnsupportedOpError, match="authenticated mode"):
        torch.max(x, dim=1)  # (indices would cost an argmax)
    with pytest.raises(mpc.UnsupportedOpError, match="both operands"):
        torch.maximum(x, torch.zeros(1, 1, 4, 4))
    _, idx = F.max_pool2d(x, 2, return_indices=True)
    assert idx.device.type == "meta"  # (no indices: any use fails loudly)
