"""A model's weight keeps its Beaver mask across queries (issue 23, point 8;
mpc.protocols.weights): results against plaintext torch, the per-query bytes, a new
instance after an in-place update, and the rules as an attacker calls the steps.

Runs on both worker kinds (conftest.py): on network workers the rules are the trust
boundary.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from refusals import refused
from test_sealing_attacks import Recorder
from torch import nn

import mpc
import pointers as pt
from mpc.protocols import parties as party_calls
from pointers.wire.messages import Describe

I64 = torch.int64


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _sync(worker: Any) -> None:
    worker.request(Describe([]))


_refused = refused  # (tests/refusals.py)


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)).eval()


def test_queries_open_the_weights_once(trio: Any) -> None:
    """The first query opens F = W - B (one element per weight), every later one only the
    activations: the bytes per party drop by the weights' size and stay there."""
    alice, bob, carol = trio
    model = _mlp()
    params = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight"))
    xs = [torch.randn(5, 16) for _ in range(3)]
    want = [model(x) for x in xs]
    mpc.share(model, alice, bob, crypto_provider=carol)
    sent = []
    for x, w in zip(xs, want):
        shared = mpc.share(x, alice, bob, crypto_provider=carol)
        with mpc.stats() as s:
            got = model(shared).get()
        assert torch.allclose(got, w, atol=1e-3)
        sent.append(s.bytes_per_party["alice"])
    assert sent[0] - sent[1] >= 8 * params  # F travelled once: 8 bytes per weight element
    assert sent[1] == sent[2]


@pytest.mark.virtual_only("each example makes its own workers (a network test has six)")
@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    rows=st.integers(1, 4),
    inner=st.integers(1, 6),
    cols=st.integers(1, 5),
    w_first=st.booleans(),
    parties=st.sampled_from([2, 3]),
    data=st.data(),
)
def test_products_with_a_fixed_weight_match_torch(
    make_worker: Callable[[str], Any],
    rows: int,
    inner: int,
    cols: int,
    w_first: bool,
    parties: int,
    data: st.DataObject,
) -> None:
    """x @ W, W @ x and x * W with W a model's parameter, twice (the instance made, then
    reused), for 2 and 3 parties, against float32 torch."""
    names = ["alice", "bob", "dave"][:parties]
    workers = [make_worker(n) for n in names]
    dealer = make_worker("carol")
    floats = st.floats(-8, 8, allow_nan=False, width=32)
    w_shape = (inner, cols) if not w_first else (rows, inner)
    holder = nn.Module()
    n = w_shape[0] * w_shape[1]
    w = torch.tensor(data.draw(st.lists(floats, min_size=n, max_size=n)), dtype=torch.float32)
    holder.w = nn.Parameter(w.reshape(w_shape))
    plain_w = holder.w.detach().clone()
    mpc.share(holder, *workers, crypto_provider=dealer)
    for _ in range(2):
        x = torch.randn((rows, inner) if not w_first else (inner, cols))
        sx = mpc.share(x, *workers, crypto_provider=dealer)
        got = (holder.w @ sx if w_first else sx @ holder.w).get()
        want = plain_w @ x if w_first else x @ plain_w
        assert torch.allclose(got, want, atol=2e-3 * (1 + inner)), (got, want)
        ew = torch.randn(tuple(plain_w.shape))
        se = mpc.share(ew, *workers, crypto_provider=dealer)
        assert torch.allclose((se * holder.w).get(), ew * plain_w, atol=1e-3)
        # a view of the weight (as nn.Linear takes W.t()) has an instance of its own
        got_t = (se @ holder.w.t()).get()
        assert torch.allclose(got_t, ew @ plain_w.t(), atol=2e-3 * (1 + max(w_shape))), got_t


def test_an_in_place_update_makes_a_new_instance(trio: Any) -> None:
    """An optimizer step writes the weight in place: the next product uses the new W (a
    new instance, a new B), and the old F is never combined with it."""
    alice, bob, carol = trio
    lin = nn.Linear(4, 3)
    plain = nn.Linear(4, 3)
    plain.load_state_dict(lin.state_dict())
    mpc.share(lin, alice, bob, crypto_provider=carol)
    x = torch.randn(2, 4)
    sx = mpc.share(x, alice, bob, crypto_provider=carol)
    assert torch.allclose(lin(sx).get(), plain(x), atol=1e-3)
    delta = torch.randn(3, 4)
    with torch.no_grad():
        lin.weight.add_(mpc.share(delta, alice, bob, crypto_provider=carol))
        plain.weight.add_(delta)
    with mpc.stats() as s:
        got = lin(sx).get()
    assert torch.allclose(got, plain(x), atol=1e-3)
    assert s.bytes_per_party["alice"] >= 8 * 12  # the new F travelled


@pytest.mark.virtual_only("it forces this process's measured speeds and counts the layouts")
def test_one_row_products_lay_the_kept_masks_out_anew_and_stay_exact(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Decoding's one-row products, where this CPU measured them faster by torch.mv on a
    column-major weight: the first lays out anew, in place, the dealer's B, each party's F
    and its share W (where nothing else uses W's memory); the results match torch before,
    after, with many rows again, and after an in-place update (a new instance)."""
    import mpc.math.ring as ring
    from mpc.protocols.weights import steps

    fast, slow = 1e-12, 1e-9
    row = ring.Speeds(many=fast, one=slow, mv=slow, copy=slow)
    col = ring.Speeds(many=slow, one=slow, mv=fast, copy=slow)
    monkeypatch.setattr(ring, "measured_speeds", lambda row_major: row if row_major else col)
    settled: list[tuple[int, ...]] = []
    settle = steps.settle_layout

    def spy(b: torch.Tensor, rows: int) -> bool:
        done = settle(b, rows)
        if done:
            settled.append(tuple(b.shape))
        return done

    monkeypatch.setattr(steps, "settle_layout", spy)
    alice, bob, carol = trio
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 192), nn.Linear(192, 176)).eval()
    plain = nn.Sequential(nn.Linear(256, 192), nn.Linear(192, 176)).eval()
    plain.load_state_dict(model.state_dict())
    model.w = nn.Parameter(torch.randn(176, 224) / 16)  # a product x @ W (GPT-2's Conv1D)
    plain.w = nn.Parameter(model.w.detach().clone())
    mpc.share(model, alice, bob, crypto_provider=carol)

    def both(rows: int) -> None:
        x = torch.randn(rows, 256)
        got = model[1](model[0](mpc.share(x, alice, bob, crypto_provider=carol))) @ model.w
        assert torch.allclose(got.get(), plain[1](plain[0](x)) @ plain.w, atol=5e-2)

    both(20)  # the instances, made by many rows: nothing laid out anew
    assert settled == []
    both(1)
    # B at the dealer, F and W at each of the two parties (the instances' contiguous
    # copies of the Linear layers' W.t() and the parameter w itself), for the three weights
    assert sorted(settled) == sorted(5 * [(256, 192), (192, 176), (176, 224)])
    both(1)
    both(20)
    assert len(settled) == 15  # once
    with torch.no_grad():
        delta = torch.randn(176, 224) / 16
        model.w.add_(mpc.share(delta, alice, bob, crypto_provider=carol))
        plain.w.add_(delta)
    both(1)  # a new instance of w: its new B and F laid out anew (its W already is)
    assert settled[15:] == 3 * [(176, 224)]


def test_training_steps_stay_exact(trio: Any) -> None:
    """SGD on shared parameters: every step's products use the weights of that step."""
    alice, bob, carol = trio
    torch.manual_seed(1)
    model = nn.Linear(3, 1)
    plain = nn.Linear(3, 1)
    plain.load_state_dict(model.state_dict())
    mpc.share(model, alice, bob, crypto_provider=carol)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    popt = torch.optim.SGD(plain.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    sx = mpc.share(x, alice, bob, crypto_provider=carol)
    sy = mpc.share(y, alice, bob, crypto_provider=carol)
    for _ in range(3):
        opt.zero_grad()
        ((model(sx) - sy) ** 2).mean().backward()
        opt.step()
        popt.zero_grad()
        ((plain(x) - y) ** 2).mean().backward()
        popt.step()
    assert torch.allclose(model.weight.get(), plain.weight.detach(), atol=1e-2)


def test_the_instance_steps_refuse_an_attackers_operands(
    trio: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client calls the steps with operands of its choosing: a second F for the same
    instance, F combined with another weight or a modified one, the dealer's product of
    another instance, the client's own tensor as the dealer's B, an activation mask used
    twice. Each is refused, and nothing sealed can be fetched."""
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    lin = nn.Linear(3, 2, bias=False)
    w_plain = lin.weight.detach().clone()
    mpc.share(lin, alice, bob, crypto_provider=carol)
    x = torch.randn(1, 3)
    sx = mpc.share(x, alice, bob, crypto_provider=carol)
    assert torch.allclose(lin(sx).get(), x @ w_plain.t(), atol=1e-3)
    s = sx.session
    (_, _, margs, (f0,)) = rec.of("mpc.weight_mask")[0]
    seed, weight, w0 = margs
    (_, _, pargs, _) = rec.of("mpc.weight_product")[0]
    _, nonce, _, c, w_view, f_opened, a0, e_opened, w_first, op, params = pargs
    out = [((2, 3), I64)]
    # the same instance made again (a second F = W' - B would give W - W')
    other = pt.send(torch.zeros(tuple(w_view.shape), dtype=I64), alice)
    _refused(
        alice,
        lambda: party_calls.call(alice, "mpc.weight_mask", [seed, weight, other], out),
        "made before",
    )
    # F combined with another weight, under a fresh product
    n2 = s.next_nonce()
    e2, a2 = party_calls.call(
        alice, "mpc.weight_product_mask", [seed, n2, sx.shares[0]], [((1, 3), I64)] * 2
    )
    _refused(
        alice,
        lambda: party_calls.call(
            alice,
            "mpc.weight_product",
            [seed, n2, weight, None, other, f_opened, a2, e2, w_first, op, params],
            [((1, 2), I64)],
        ),
        "open:wprod.e|must be the share",
    )
    # the used product's material again (its mask and opening were consumed)
    _refused(
        alice,
        lambda: party_calls.call(
            alice,
            "mpc.weight_product",
            [seed, nonce, weight, None, w_view, f_opened, a0, e_opened, w_first, op, params],
            [((1, 2), I64)],
        ),
        "spent|takes a",
    )
    # the dealer's B must be its own sealed B, not a tensor of the client's
    mine = pt.send(torch.zeros(3, 2, dtype=I64), carol)
    _refused(
        carol,
        lambda: party_calls.call(
            carol,
            "mpc.dealer_weight_triple",
            [s.dealer_seeds, s.next_nonce(), mine, [1, 3], False, "matmul", {}],
            [((1, 2), I64)],
        ),
        "protocol material only",
    )
    # nothing sealed can be read: F at a party, B at the dealer
    (_, _, _, (b,)) = rec.of("mpc.dealer_weight")[0]
    _refused(alice, lambda: f_opened.get(), "sealed")
    _refused(carol, lambda: b.get(), "sealed")
    # the workers stay usable
    assert torch.allclose(lin(sx).get(), x @ w_plain.t(), atol=1e-3)


def test_a_modified_weight_is_refused_at_the_party(
    trio: Any, monkeypatch: pytest.MonkeyPatch, worker_kind: str
) -> None:
    """If the client's bookkeeping missed a write to the weight (here: a share written
    behind the library's back), the party refuses to combine the old F with it.

    Network workers only: an in-process worker runs a pointer's op inside the client's
    own torch dispatch, where torch does not count in-place writes (tensor ``_version``),
    so the check cannot see them there (in process, the client shares the workers' memory
    anyway: the rules guard the network boundary)."""
    if worker_kind == "virtual":
        pytest.skip("in process, a pointer's in-place op does not bump the tensor's version")
    alice, bob, carol = trio
    rec = Recorder(monkeypatch)
    lin = nn.Linear(3, 2, bias=False)
    mpc.share(lin, alice, bob, crypto_provider=carol)
    sx = mpc.share(torch.randn(1, 3), alice, bob, crypto_provider=carol)
    lin(sx).get()
    (_, _, pargs, _) = rec.of("mpc.weight_product")[0]
    w_view = pargs[4]
    w_view.add_(torch.ones(tuple(w_view.shape), dtype=I64))
    with pytest.raises(pt.RemoteError, match="unmodified"):
        lin(sx).get()
