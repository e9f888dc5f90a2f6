"""``mpc.debug()``: every op on values the client shared is also run in plaintext and
compared; a wrong result raises an error naming the op, the range it left and the fix.
It says loudly that it reveals everything to the client, and refuses values the client
does not own."""

from __future__ import annotations

import re
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
import pointers as pt

SETTINGS = settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))


@pytest.fixture(scope="module")
def trio():
    return tuple(pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))


def _share(t, trio):
    alice, bob, carol = trio
    return mpc.share(t, alice, bob, crypto_provider=carol)


@pytest.fixture(autouse=True)
def _quiet_banner():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mpc.DebugRevealWarning)
        yield


# the silent garbage, each caught: (op, input, the range named, the fix named)
GARBAGE = [
    ("sqrt", torch.sqrt, -4.0, r"sqrt is valid for 0 <= x", "non-negative"),
    (
        "1/0",
        lambda x: 1 / x,
        0.0,
        r"reciprocal is valid for 0.0002441 <= \|x\| < 4096",
        "away from 0",
    ),
    ("1/1e-5", torch.reciprocal, 1e-5, r"reciprocal is valid for", "scale the divisor"),
    ("exp(20)", torch.exp, 20.0, r"exp is valid for -16.6 <= x < 11.09", "exp\\(x - max\\)"),
    ("log(0)", torch.log, 0.0, r"log is valid for 1.526e-05 <= x", "positive"),
    (
        "x^4",
        lambda x: (x * x) * (x * x),
        1000.0,
        r"product left the fixed-point range: \|result\| < 2\*\*30",
        "fewer fractional bits",
    ),
]


@pytest.mark.parametrize("name, fn, value, range_, fix", GARBAGE, ids=[g[0] for g in GARBAGE])
def test_each_silent_garbage_is_caught(trio, name, fn, value, range_, fix):
    x = _share(torch.tensor([value, 1.0]), trio)
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always", mpc.FixedPointRangeWarning)
        silent = fn(x).get()  # normal mode: no error, a wrong value
    # (the product's range the client can know, and warns about; the functions' it cannot)
    assert bool(rec) == (name == "x^4")
    want = fn(torch.tensor([value, 1.0], dtype=torch.float64))
    assert not torch.allclose(silent.double()[:1], want[:1], rtol=1e-2, equal_nan=False)
    with pytest.raises(mpc.DebugMismatch, match=range_) as e, mpc.debug():
        fn(x)  # (x^4: raised at the second product, before its range warning)
    msg = str(e.value)
    assert "Fix:" in msg and e.value.op and "torch gives" in msg
    assert re.search(fix, msg), msg


def test_it_says_loudly_that_it_reveals_everything(trio, capsys):
    with pytest.warns(mpc.DebugRevealWarning, match="AT THE CLIENT"), mpc.debug():
        pass
    assert "never with another party's data" in capsys.readouterr().err


def test_a_model_in_its_ranges_runs_unchanged_and_every_op_is_checked(trio):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(36, 16),
        nn.LayerNorm(16),
        nn.GELU(),
        nn.Linear(16, 5),
        nn.Softmax(dim=-1),
    ).eval()
    x = torch.randn(3, 1, 8, 8)
    want = model(x).detach()
    alice, bob, carol = trio
    mpc.share(model, alice, bob, crypto_provider=carol)
    with torch.no_grad(), mpc.debug() as state:
        got = model(_share(x, trio)).get()
    assert state.checked >= 9
    assert torch.allclose(got, want, atol=2e-2)


@SETTINGS
@given(st.integers(0, 9), st.integers(1, 6), st.integers(0, 2**31 - 1))
def test_no_false_alarm_inside_the_valid_ranges(trio, which, n, seed):
    g = torch.Generator().manual_seed(seed)

    def u(lo, hi):
        return torch.rand(n, generator=g) * (hi - lo) + lo

    cases = [
        (lambda a, b: a * b + a, (u(-100, 100), u(-100, 100))),
        (lambda a, b: a.view(1, n) @ b.view(n, 1), (u(-50, 50), u(-50, 50))),
        (lambda a: torch.exp(a), (u(-8, 4),)),
        (lambda a: torch.log(a), (u(0.01, 100),)),
        (lambda a: torch.reciprocal(a), (u(0.01, 100) * (1 - 2 * (u(0, 1) > 0.5)),)),
        (lambda a: torch.sqrt(a), (u(0.01, 100),)),
        (lambda a: torch.sigmoid(a) + torch.tanh(a), (u(-12, 12),)),
        (lambda a: torch.softmax(a, -1), (u(-10, 10),)),
        (lambda a, b: a / b, (u(-10, 10), u(0.5, 10))),
        (lambda a: (a < 0.5, a.max(), a.argmax()), (u(-3, 3),)),
    ]
    fn, inputs = cases[which]
    shared = [_share(t, trio) for t in inputs]
    with mpc.debug() as state:
        fn(*shared)
    assert state.checked >= 1


def test_values_the_client_does_not_own_are_refused(trio):
    alice, bob, carol = trio
    model = nn.Sequential(nn.Linear(3, 2))
    x = torch.randn(1, 3)
    owner = pt.VirtualWorker("owner")
    approval = mpc.approve(model, x, parties=["alice", "bob"], crypto_provider="carol")
    held = mpc.share(mpc.offer(model, owner, approval), alice, bob, crypto_provider=carol)
    query = mpc.plan(held, _share(x, trio))
    with mpc.debug():
        with pytest.raises(mpc.DebugRefused, match="its owner shared from its worker"):
            query(_share(x, trio))
        with pytest.raises(mpc.DebugRefused, match="HeldShared"):
            held[0].weight * 2
    pt.hook(torch)
    w1, w2 = pt.VirtualWorker("w1"), pt.VirtualWorker("w2")
    owned = torch.tensor([1.5]).send(w1).fix_precision().share(alice, bob, crypto_provider=carol)
    with mpc.debug(), pytest.raises(mpc.DebugRefused, match="OwnedShared"):
        owned * 2
    del w2


def test_outside_the_mode_nothing_is_opened(trio):
    x = _share(torch.tensor([2.0, 3.0]), trio)
    with mpc.stats() as plain:
        F.relu(x * x - 5).materialize()
    with mpc.debug(), mpc.stats() as checked:
        F.relu(x * x - 5).materialize()
    assert plain.rounds == checked.rounds  # (the protocol is the same)
    assert checked.client_messages > plain.client_messages  # (the mode's fetches)
