"""The malicious mode (``security="malicious"``): authenticated shares against plaintext
torch, for 2 and 3 parties, in process and on network workers; what it costs in rounds; its
errors. The attacks (a party that deviates at every step) are tests/test_malicious_attacks.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
import pointers as pt

U = 2.0**-16  # one unit of the fixed-point encoding
ENC = U / 2  # rounding error of encoding one float
TRUNC = U  # error of one truncation after a product
BOUND = 10.0

SETTINGS = settings(
    max_examples=5,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class Parties:
    """Fresh parties and a crypto provider in the malicious mode."""

    def __init__(self, make_worker: Callable[[str], Any], n: int, kind: str) -> None:
        self.workers = [make_worker(f"party{i}") for i in range(n)]
        self.dealer = make_worker("dealer")
        self.kind = kind
        self.config = mpc.MPCConfig(security="malicious")

    def share(self, t: Any) -> mpc.AuthenticatedTensor:
        out = mpc.share(t, *self.workers, crypto_provider=self.dealer, config=self.config)
        assert isinstance(out, mpc.AuthenticatedTensor)
        return out

    def share_model(self, m: nn.Module) -> nn.Module:
        return mpc.share(m, *self.workers, crypto_provider=self.dealer, config=self.config)


@pytest.fixture(params=[2, 3], ids=lambda n: f"{n}parties")
def mp(
    request: pytest.FixtureRequest, make_worker: Callable[[str], Any], worker_kind: str
) -> Parties:
    return Parties(make_worker, request.param, worker_kind)


def property_test(examples: settings) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """``@examples @given(data=st.data())``, half as many examples on network parties."""

    def decorate(test: Callable[..., None]) -> Callable[..., None]:
        network = settings(examples, max_examples=-(-examples.max_examples // 2))
        by_kind = {
            "virtual": examples(given(data=st.data())(test)),
            "network": network(given(data=st.data())(test)),
        }

        @functools.wraps(test, updated=())
        def run(mp: Parties, **kwargs: Any) -> None:
            by_kind[mp.kind](mp=mp, **kwargs)

        run.__signature__ = inspect.signature(by_kind["virtual"])  # type: ignore[attr-defined]
        return run

    return decorate


def floats(data: Any, shape: tuple[int, ...], bound: float = BOUND) -> torch.Tensor:
    values = data.draw(
        st.lists(
            st.floats(-bound, bound, allow_nan=False, width=32),
            min_size=max(1, int(torch.Size(shape).numel())),
            max_size=max(1, int(torch.Size(shape).numel())),
        )
    )
    return torch.tensor(values, dtype=torch.float32).reshape(shape)


def shapes(data: Any, max_dims: int = 3) -> tuple[int, ...]:
    return tuple(data.draw(st.lists(st.integers(1, 4), min_size=1, max_size=max_dims)))


def reveal(s: Any) -> torch.Tensor:
    assert isinstance(s, mpc.AuthenticatedTensor), type(s).__name__
    out = s.get()
    assert type(out) is torch.Tensor
    return out


# -- against plaintext torch -----------------------------------------------------------------


@property_test(SETTINGS)
def test_linear_ops_match_torch(mp: Parties, data: Any) -> None:
    shape = shapes(data)
    x, y = floats(data, shape), floats(data, shape[-1:])
    c = data.draw(st.floats(-BOUND, BOUND, allow_nan=False, width=32))
    sx, sy = mp.share(x), mp.share(y)
    torch.testing.assert_close(reveal(sx), x, atol=ENC, rtol=0)
    torch.testing.assert_close(reveal(sx + sy), x + y, atol=2 * ENC, rtol=0)
    torch.testing.assert_close(reveal(sx - sy), x - y, atol=2 * ENC, rtol=0)
    torch.testing.assert_close(reveal(-sx + c), -x + c, atol=2 * ENC, rtol=0)
    torch.testing.assert_close(reveal(c - sx), c - x, atol=2 * ENC, rtol=0)
    torch.testing.assert_close(reveal(sx * 3), x * 3, atol=3 * ENC, rtol=0)
    tol = ENC * (x.abs() + abs(c) + 1) + TRUNC
    assert ((reveal(sx * c) - x * c).abs() <= tol).all()
    torch.testing.assert_close(reveal(sx.sum()), x.sum(), atol=x.numel() * ENC, rtol=1e-6)


@property_test(SETTINGS)
def test_products_match_torch(mp: Parties, data: Any) -> None:
    shape = shapes(data)
    x, y = floats(data, shape), floats(data, shape)
    sx, sy = mp.share(x), mp.share(y)
    tol = ENC * (x.abs() + y.abs() + ENC) + TRUNC
    assert ((reveal(sx * sy) - x * y).abs() <= tol + 1e-6 * (x * y).abs()).all()
    # a product of a product: two truncations
    z = reveal(sx * sy * sx)
    assert torch.allclose(z, x * y * x, atol=0.05, rtol=1e-4)
    n, k, m = (data.draw(st.integers(1, 5)) for _ in range(3))
    a, b = floats(data, (n, k)), floats(data, (k, m))
    ab = reveal(mp.share(a) @ mp.share(b))
    bound = k * (ENC * (BOUND + BOUND + ENC)) + TRUNC
    torch.testing.assert_close(ab, a @ b, atol=bound, rtol=1e-5)
    torch.testing.assert_close(reveal(mp.share(a) @ b), a @ b, atol=bound, rtol=1e-5)


def test_conv_and_linear_layers_match_torch(mp: Parties) -> None:
    torch.manual_seed(0)
    img = torch.randn(2, 2, 7, 7)
    conv, lin = nn.Conv2d(2, 3, 3, padding=1, stride=2), nn.Linear(48, 4)
    ref = lin(conv(img).flatten(1))
    mp.share_model(conv)
    mp.share_model(lin)
    out = lin(conv(mp.share(img)).flatten(1))
    torch.testing.assert_close(reveal(out), ref.detach(), atol=2e-3, rtol=1e-3)
    # a public weight
    w = torch.randn(3, 2, 3, 3)
    torch.testing.assert_close(
        reveal(F.conv2d(mp.share(img), w)), F.conv2d(img, w), atol=2e-3, rtol=1e-3
    )


def test_layout_ops_match_torch(mp: Parties) -> None:
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 8
    s = mp.share(x)
    cases: list[tuple[Callable[[Any], Any], str]] = [
        (lambda t: t.reshape(6, 4), "reshape"),
        (lambda t: t.permute(2, 0, 1), "permute"),
        (lambda t: t.transpose(0, 2), "transpose"),
        (lambda t: t[1], "select"),
        (lambda t: t[:, 1:, ::2], "slice"),
        (lambda t: t[:, torch.tensor([2, 0])], "index"),
        (lambda t: t.unsqueeze(1).squeeze(1), "unsqueeze"),
        (lambda t: t[:1].expand(3, 3, 4), "expand"),
        (lambda t: torch.cat([t, t], 1), "cat"),
        (lambda t: torch.stack([t, t], -1), "stack"),
        (lambda t: t.flip(0), "flip"),
        (lambda t: F.pad(t, (1, 1)), "pad"),
        (lambda t: t.sum(dim=(0, 2), keepdim=True), "sum"),
        (lambda t: t.mean(1), "mean"),
        (lambda t: t.flatten(), "flatten"),
    ]
    for fn, name in cases:
        torch.testing.assert_close(reveal(fn(s)), fn(x), atol=1e-4, rtol=0, msg=name)


def test_integers_are_shared_exactly(mp: Parties) -> None:
    x = torch.tensor([3, -4, 2**40])
    s = mp.share(x)
    assert s.frac_bits == 0
    out = reveal(s * 3 + 1)
    assert out.dtype == torch.int64 and torch.equal(out, x * 3 + 1)
    assert torch.equal(reveal(s * mp.share(torch.tensor([2, 2, 2]))), x * 2)


# -- what it costs ---------------------------------------------------------------------------


@pytest.mark.virtual_only("rounds and bytes are the same on network workers")
def test_rounds_of_a_product_and_its_output(mp: Parties) -> None:
    x, y = mp.share(torch.tensor([1.5, 2.0])), mp.share(torch.tensor([2.0, 3.0]))
    with mpc.stats() as s:
        out = (x * y).get()
    assert torch.equal(out, torch.tensor([3.0, 6.0]))
    # the product's opening, the output's, and the MAC check (coins committed, revealed;
    # z committed, opened): the product's truncation waits, get() decodes at full scale
    assert s.rounds == 6
    # a piece of [e | f] (2 values) and of y, 16 bytes an element each, to each peer,
    # and the check's 4 messages of 32 bytes
    peers = len(mp.workers) - 1
    for sent in s.bytes_per_party.values():
        assert sent >= peers * (3 * 2 * 16 + 4 * 32)


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.virtual_only("the errors are raised at the client")
def test_clear_errors() -> None:
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    with pytest.raises(mpc.MPCError, match="crypto provider"):
        mpc.share(torch.ones(2), alice, bob, security="malicious")
    with pytest.raises(ValueError, match="security must be one of"):
        mpc.MPCConfig(security="paranoid")
    with pytest.raises(ValueError, match="fss_bits=64"):
        mpc.MPCConfig(security="malicious", comparison="fss", fss_bits=32)
    with pytest.raises(mpc.MPCError, match="2 parties"):
        mpc.Session([alice, bob, carol], pt.VirtualWorker("d"), comparison="fss")
    x = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol, security="malicious")
    semi = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol)
    with pytest.raises(mpc.UnsupportedOpError, match="authenticated mode"):
        torch.exp(x)
    with pytest.raises((mpc.MPCError, mpc.UnsupportedOpError)):
        x + semi
    with pytest.raises(mpc.MPCError, match="needs the secret value"):
        x.tolist()
    with pytest.raises(mpc.MPCError, match="session's is"):
        mpc.share(torch.ones(2), session=semi.session, security="malicious")


@pytest.mark.virtual_only("the errors are raised at the client")
def test_plans_and_training_are_refused_clearly() -> None:
    """A user's plan and training loop, as in a semi-honest session: a clear refusal, not
    torch's or the plan's own confusion."""
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    s = mpc.Session([alice, bob], carol, security="malicious")
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU())
    mpc.share(model, session=s)
    x = mpc.share(torch.randn(2, 4), session=s)
    with pytest.raises(mpc.MPCError, match="mpc.plan does not record the authenticated mode"):
        mpc.plan(model, x)
    loss = model(x).sum()
    with pytest.raises(mpc.MPCError, match=r"training \(backward\) is not available"):
        loss.backward()
    assert model(x).get().shape == (2, 3)  # (the model still answers)


@pytest.mark.virtual_only("reads a worker's store")
def test_a_client_reads_no_share_nor_mac() -> None:
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol, security="malicious")
    for p in x.shares:
        with pytest.raises(pt.RemoteError, match="sealed"):
            p.get()
        with pytest.raises(pt.RemoteError, match="sealed"):
            (p + 0).get()
        with pytest.raises(pt.RemoteError, match="sealed|refused"):
            p.copy_to(carol)
    key = x.session.authenticated.keys[0]
    with pytest.raises(pt.RemoteError, match="sealed"):
        key.get()


# -- honest runs never abort --------------------------------------------------------------------


OPS: list[tuple[str, Callable[[Any, Any], Any]]] = [
    ("add", lambda a, b: a + b),
    ("sub", lambda a, b: a - b),
    ("mul", lambda a, b: a * b),
    ("public", lambda a, b: a * 0.5 + 1.25),
    ("sum", lambda a, b: a.sum(-1, keepdim=True) + b),
    ("flip", lambda a, b: a.flip(-1) - b),
    ("relu", lambda a, b: torch.relu(a - b)),
    ("max", lambda a, b: torch.maximum(a, b * 2)),
    ("lt", lambda a, b: (a < b) * a),
]


@pytest.mark.virtual_only("many random programs")
@settings(max_examples=12, deadline=None, database=None)
@given(data=st.data())
def test_honest_runs_never_abort(data: Any) -> None:
    """Whatever the values and the ops, a run in which every party follows the protocol
    passes every MAC check and returns what torch returns."""
    n = data.draw(st.sampled_from([2, 3]))
    workers = [pt.VirtualWorker(f"p{i}") for i in range(n)]
    dealer = pt.VirtualWorker("d")
    shape = (data.draw(st.integers(1, 5)),)
    x, y = floats(data, shape, 4.0), floats(data, shape, 4.0)
    sx = mpc.share(x, *workers, crypto_provider=dealer, security="malicious")
    sy = mpc.share(y, *workers, crypto_provider=dealer, security="malicious")
    steps = data.draw(st.lists(st.sampled_from(OPS), min_size=1, max_size=4))
    for _, op in steps:
        sx, x = op(sx, sy), op(x, y)
        if x.abs().max() >= 1000:  # (products of products: keep to the fixed-point range)
            break
        got = sx.get()
        assert torch.allclose(got, x, atol=0.01, rtol=1e-3), [s for s, _ in steps]
