"""No nonce, and so no triple or mask, is ever used twice: op by op, inside ``mpc.plan``
with operands from different sharings in every order, over several calls (issue 10).

Runs on both worker kinds (conftest.py). The observer sits where the client's commands
leave it (every worker's ``_exchange``): it reads the nonce of every protocol function
call, op by op and inside every recorded program run (binding the program's slots as the
worker will), so the check does not trust the code under test to report its nonces.
The workers enforce the rule themselves as well: a replayed nonce is refused.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.protocols.functions import FUNCTIONS
from pointers.wire.messages import (
    CallFunction,
    Describe,
    Message,
    RunProgram,
    StoreProgram,
    decode_message,
    encode_message,
    message_from_list,
)
from pointers.wire.serde import ref_id
from pointers.worker.program import bind

# the protocol functions that take (seed or seeds, nonce, ...)
NONCE_FUNCTIONS = {
    name
    for name in FUNCTIONS
    if name
    not in (
        "mpc.new_seed",
        "mpc.cmp_select_finish",
        "mpc.arith_mask",  # (no seed or nonce: the local complement of a kept last level)
        "mpc.bilinear_public",
        # (no seed or nonce: an input share's one-time seed, a round's shares packed)
        "mpc.share_from_seed",
        "mpc.pack",
        "mpc.unpack",
        "mpc.open_unpack",
        "mpc.open_bits",
    )
}
DEALER_FUNCTIONS = {name for name in NONCE_FUNCTIONS if name.startswith("mpc.dealer_")}


class NonceObserver:
    """Every (worker, function, seed, nonce) the client makes a worker use."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workers: list[Any]) -> None:
        self.uses: list[tuple[str, str, tuple[int, ...], int]] = []
        self.programs: dict[tuple[str, int], list[Any]] = {}
        ids = {w.id for w in workers}
        for cls in {type(w) for w in workers}:
            original = cls._exchange

            def exchange(w: Any, msg: Message, *more: Any, _orig: Any = original) -> Any:
                if w.id in ids:
                    self._see(w.id, msg)
                return _orig(w, msg, *more)

            monkeypatch.setattr(cls, "_exchange", exchange)

    def _see(self, wid: str, msg: Message) -> None:
        if isinstance(msg, CallFunction):
            self._call(wid, msg)
        elif isinstance(msg, StoreProgram):
            # as the worker will hold it: through the wire form
            stored = decode_message(*encode_message(msg))
            assert isinstance(stored, StoreProgram)
            self.programs[(wid, msg.obj_id)] = stored.messages
        elif isinstance(msg, RunProgram):
            for raw in self.programs[(wid, msg.program_id)]:
                step = message_from_list(bind(raw, list(msg.bindings)))
                if isinstance(step, CallFunction):
                    self._call(wid, step)

    def _call(self, wid: str, msg: CallFunction) -> None:
        if msg.name not in NONCE_FUNCTIONS:
            return
        seed, nonce = msg.args[0], msg.args[1]
        seeds = seed if isinstance(seed, list) else [seed]
        key = tuple(ref_id(s) for s in seeds)
        assert all(k is not None for k in key), f"{msg.name}: a seed that is not a reference"
        self.uses.append((wid, msg.name, key, int(nonce)))  # type: ignore[arg-type]

    def assert_no_reuse(self) -> None:
        per_function = Counter((w, name, key, n) for w, name, key, n in self.uses)
        again = [use for use, count in per_function.items() if count > 1]
        assert not again, f"nonces used twice: {again[:5]}"
        dealer = Counter((w, key, n) for w, name, key, n in self.uses if name in DEALER_FUNCTIONS)
        again = [use for use, count in dealer.items() if count > 1]
        assert not again, f"dealer material dealt twice for one nonce: {again[:5]}"

    def calls(self) -> int:
        return len(self.uses)


@pytest.fixture
def trio(make_worker: Callable[[str], Any]) -> tuple[Any, Any, Any]:
    return tuple(make_worker(n) for n in ("alice", "bob", "carol"))  # type: ignore[return-value]


def _shared_pair(trio: Any, a: torch.Tensor, b: torch.Tensor, mixed: bool) -> tuple[Any, Any]:
    """Two operands from different ``share`` calls; ``mixed``: the second one also from a
    session object of its own (same parties), as a user holding ``mpc.Session`` may."""
    alice, bob, carol = trio
    x = mpc.share(a, alice, bob, crypto_provider=carol)
    if mixed:
        other = mpc.Session([alice, bob], carol)
        y = mpc.share(b, session=other)
    else:
        y = mpc.share(b, alice, bob, crypto_provider=carol)
    return x, y


# (name, function of two operands, shapes of the two operands, plaintext reference)
PROTOCOLS: list[tuple[str, Callable[..., Any], tuple[int, ...], tuple[int, ...]]] = [
    ("mul a*b", lambda a, b: a * b, (2, 3), (2, 3)),
    ("mul b*a", lambda a, b: b * a, (2, 3), (2, 3)),
    ("matmul a@b", lambda a, b: a @ b, (2, 3), (3, 2)),
    ("matmul b@a", lambda a, b: b @ a, (2, 3), (3, 2)),
    ("conv2d", lambda a, b: F.conv2d(a, b, padding=1), (1, 1, 4, 4), (2, 1, 3, 3)),
    ("conv2d weights first", lambda a, b: F.conv2d(b, a), (2, 1, 3, 3), (1, 1, 4, 4)),
    ("truncation", lambda a, b: (b * a) * a + b, (3,), (3,)),
    ("comparison", lambda a, b: (b < a) * 1.0 + a, (4,), (4,)),
    ("relu of a product", lambda a, b: F.relu(b * a), (5,), (5,)),
    ("relu", lambda a, b: F.relu(b) + F.relu(a), (5,), (5,)),
    ("max", lambda a, b: torch.max(b + a) + a, (4,), (4,)),
    ("max over a dim", lambda a, b: (b + a).max(dim=1).values, (3, 4), (3, 4)),
    ("max pool", lambda a, b: F.max_pool2d(b * a, 2), (1, 1, 4, 4), (1, 1, 4, 4)),
]


@pytest.mark.parametrize("mixed", [False, True], ids=["one session", "two sessions"])
@pytest.mark.parametrize("case", PROTOCOLS, ids=[c[0] for c in PROTOCOLS])
def test_no_nonce_is_used_twice_in_plans(
    trio: Any, monkeypatch: pytest.MonkeyPatch, case: Any, mixed: bool
) -> None:
    _name, fn, shape_a, shape_b = case
    observer = NonceObserver(monkeypatch, list(trio))
    gen = torch.Generator().manual_seed(7)
    a0, b0 = torch.randn(shape_a, generator=gen), torch.randn(shape_b, generator=gen)
    x, y = _shared_pair(trio, a0, b0, mixed)
    p = mpc.plan(fn, x, y)
    before = observer.calls()
    for _ in range(3):
        a, b = torch.randn(shape_a, generator=gen), torch.randn(shape_b, generator=gen)
        xs, ys = _shared_pair(trio, a, b, mixed)
        got = p(xs, ys).get()
        assert torch.allclose(got, fn(a, b), atol=2e-3), (got, fn(a, b))
    assert observer.calls() > before, "the observer saw no protocol step of the plan runs"
    ref = fn(x, y).get()  # op by op too, with the same session
    assert torch.allclose(ref, fn(a0, b0), atol=2e-3)
    observer.assert_no_reuse()


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    n=st.integers(1, 6),
    order=st.permutations([0, 1, 2]),
    calls=st.integers(2, 4),
)
def test_operand_order_and_batch_sizes_never_reuse(
    trio: Any, n: int, order: list[int], calls: int
) -> None:
    """Three operands from three sharings, multiplied in a random order, at random sizes:
    a new size records a new program set (once), and no call reuses a nonce."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        _order_and_sizes(trio, monkeypatch, n, order, calls)


def _order_and_sizes(
    trio: Any, monkeypatch: pytest.MonkeyPatch, n: int, order: list[int], calls: int
) -> None:
    observer = NonceObserver(monkeypatch, list(trio))
    alice, bob, carol = trio

    def fn(*v: Any) -> Any:
        u = [v[i] for i in order]
        return F.relu(u[0] * u[1]) * u[2]

    def operands(size: int) -> tuple[list[torch.Tensor], list[Any]]:
        plain = [torch.randn(size) for _ in range(3)]
        return plain, [mpc.share(t, alice, bob, crypto_provider=carol) for t in plain]

    _, shared = operands(n)
    p = mpc.plan(fn, *shared)
    for k in range(calls):
        plain, shared = operands(n if k % 2 else n + 1)  # alternate two sizes
        assert torch.allclose(p(*shared).get(), fn(*plain), atol=2e-3)
    assert len(p.signatures) == 2
    observer.assert_no_reuse()


def test_share_calls_of_one_group_share_one_session(trio: Any) -> None:
    alice, bob, carol = trio
    x = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol)
    y = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol)
    assert x.session is y.session
    z = mpc.share(torch.ones(2), bob, alice, crypto_provider=carol)  # another order: another group
    assert z.session is not x.session
    with mpc.Session([alice, bob], carol) as mine:
        w = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol)
        assert w.session is mine
    assert mpc.share(torch.ones(2), alice, bob, crypto_provider=carol).session is x.session


def test_repeated_share_calls_deal_seeds_once(trio: Any) -> None:
    """The set-up messages of a group's session are paid once, not at every share."""
    alice, bob, carol = trio
    keep = mpc.share(torch.ones(2), alice, bob, crypto_provider=carol)
    kept = []
    for w in trio:  # earlier deletes travel before the count
        w.request(Describe([]))
    with mpc.stats() as s:
        for _ in range(5):
            kept.append(mpc.share(torch.ones(4), alice, bob, crypto_provider=carol))
    assert s.client_messages == 5 * 2  # one store per party and call, no seed dealing
    before = sum(w.stats.messages_received for w in trio)
    mpc.Session([alice, bob], carol)  # what every share call cost before: a session's set-up
    for w in trio:
        w.request(Describe([]))
    setup = sum(w.stats.messages_received for w in trio) - before - 3  # (less the syncs)
    assert setup >= 4  # a seed made and delivered per party, at least
    assert keep.session is mpc.share(torch.ones(1), alice, bob, crypto_provider=carol).session


def test_a_replayed_nonce_is_refused_by_the_worker(trio: Any) -> None:
    """A client that sends a protocol step twice with one nonce gets an error; the mask
    is never derived again."""
    alice, bob, carol = trio
    x = mpc.share(torch.ones(3), alice, bob, crypto_provider=carol)
    session = x.session
    nonce = session.next_nonce()
    seed, share = session.party_seeds[0], x.shares[0]
    out = [((6,), torch.int64), ((3,), torch.int64)]  # [e | f] packed, and a
    pt.call_function(alice, "mpc.beaver_mask", [seed, nonce, share, share], out=out)
    pt.call_function(alice, "mpc.beaver_mask", [seed, nonce + 1, share, share], out=out)
    alice.request(Describe([]))  # both went through
    _refused_at(alice, "mpc.beaver_mask", [seed, nonce, share, share], out)
    dealer_seeds = session.dealer_seeds
    trunc_out = [((4,), torch.int64)]  # U and the narrow s of D, packed: 3 + 1 words
    pt.call_function(carol, "mpc.dealer_trunc", [dealer_seeds, nonce, [3], 16], out=trunc_out)
    _refused_at(carol, "mpc.dealer_trunc", [dealer_seeds, nonce, [3], 16], trunc_out)
    assert torch.equal(x.get(), torch.ones(3))  # the workers stay usable


def _refused_at(worker: Any, name: str, args: list[Any], out: list[Any]) -> None:
    with pytest.raises(pt.RemoteError, match="already used"):
        pt.call_function(worker, name, args, out=out)  # in process: raises here
        worker.request(Describe([]))  # network: at the next synchronising call


def test_a_models_weights_keep_one_mask_and_every_query_a_fresh_one(trio: Any) -> None:
    """Issue 23's weight instances: queried op by op, a shared model's weight is masked
    once (one ``weight_mask`` per weight and view, one dealer B), while every query's
    activation masks and the dealer's products take nonces never used before, at the
    parties and at the dealer."""
    alice, bob, carol = trio
    with pytest.MonkeyPatch.context() as monkeypatch:
        observer = NonceObserver(monkeypatch, list(trio))
        torch.manual_seed(3)
        model = torch.nn.Sequential(
            torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8, 3)
        ).eval()
        plain = [torch.randn(1, 1, 4, 4) for _ in range(3)]
        want = [model(x) for x in plain]
        mpc.share(model, alice, bob, crypto_provider=carol)
        for x, w in zip(plain, want):
            got = model(mpc.share(x, alice, bob, crypto_provider=carol)).get()
            assert torch.allclose(got, w, atol=2e-3)
        observer.assert_no_reuse()
        masks = [u for u in observer.uses if u[1] == "mpc.weight_mask"]
        products = [u for u in observer.uses if u[1] == "mpc.weight_product_mask"]
        assert len(masks) == 2 * 2  # two weights (the conv's, the linear's t()), two parties
        assert len(products) == 3 * len(masks)  # one fresh activation mask per query
        weights = {n for _, _, _, n in masks}
        assert not weights & {n for _, _, _, n in products}
