"""The one-round ReLU of a product by FSS (mpc.protocols.fss.relu) and the DCF with a
payload of several words it rests on (mpc.math.dcf_vec), against plaintext: the DCF at
the edges of its domain, the ReLU over its whole exact range [-2^62, 2^62) and at its
edges, for every truncation width LeNet and the transformers use and at the extremes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.math import dcf as dcf_vec
from mpc.protocols.fss import relu as fss_relu
from mpc.protocols.fss import run as fss
from pointers.wire.messages import Describe

FSS = MPCConfig(comparison="fss")


def _roots(n: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(  # type: ignore[return-value]
        torch.randint(-(2**62), 2**62, (n, 2), generator=gen) for _ in range(2)
    )


def _unsigned_lt(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    top = torch.tensor(-(2**63), dtype=torch.int64)
    return (x ^ top) < (a ^ top)


@settings(max_examples=40, deadline=None)
@given(
    bits=st.integers(1, 64),
    words=st.integers(1, 3),
    seed=st.integers(0, 2**31),
)
def test_dcf_vec_at_the_edges(bits: int, words: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = 12
    hi = (1 << bits) - 1
    alpha = torch.randint(-(2**63), 2**63 - 1, (n,), generator=gen)
    if bits < 64:
        alpha &= hi
    alpha[0], alpha[1] = 0, hi if bits < 64 else -1
    # x = alpha - 1, alpha, alpha + 1, 0 and 2^bits - 1, wrapped into the domain
    x = torch.cat([alpha - 1, alpha, alpha + 1, torch.tensor([0, hi if bits < 64 else -1])])
    if bits < 64:
        x &= hi
    a = torch.cat([alpha, alpha, alpha, alpha[:2]])
    beta = torch.randint(-(2**63), 2**63 - 1, (words, a.numel()), generator=gen)
    roots = _roots(a.numel(), gen)
    cw = dcf_vec.gen(a, beta, bits, roots)
    assert cw.shape == (dcf_vec.key_words(bits, words), a.numel())
    y = dcf_vec.evaluate(0, roots[0], cw, x, bits, words)
    y = y + dcf_vec.evaluate(1, roots[1], cw, x, bits, words)
    assert torch.equal(y, beta * _unsigned_lt(x, a))


def test_dcf_vec_refuses_bad_shapes() -> None:
    gen = torch.Generator().manual_seed(0)
    roots = _roots(3, gen)
    with pytest.raises(ValueError, match="payload"):
        dcf_vec.gen(
            torch.zeros(3, dtype=torch.int64), torch.zeros(4, 3, dtype=torch.int64), 8, roots
        )
    with pytest.raises(ValueError, match="shape"):
        dcf_vec.gen(torch.zeros(3, dtype=torch.int64), torch.zeros(4, dtype=torch.int64), 8, roots)


def _relu_ring(z: torch.Tensor, f: int) -> tuple[torch.Tensor, int]:
    """relu(z >> f) by the one-round protocol on exactly shared ring elements, and its
    rounds."""
    alice, bob, carol = (pt.VirtualWorker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(z, alice, bob, crypto_provider=carol, config=FSS)
    with mpc.stats() as s:
        out = fss.relu_truncating(x.session, x.shares, f)
    assert out is not None
    return x.with_shares(out).get(), s.rounds


def _check(z: torch.Tensor, f: int, got: torch.Tensor) -> None:
    floor = torch.div(z, 2**f, rounding_mode="floor")
    want = torch.where(z >= 0, floor, torch.zeros_like(z))
    err = got - want
    # floor(z / 2^f) or one more where z >= 0 (the truncation's rounding); 0 below
    assert bool(((err == 0) | ((err == 1) & (z >= 0))).all()), (z, f, got, want)


EDGES = [-(2**62), -(2**62) + 1, -(2**40), -1, 0, 1, 2**40, 2**62 - 2, 2**62 - 1]


@pytest.mark.parametrize("f", [1, 16, 32, 61])
def test_relu_truncating_at_the_edges_of_its_range(f: int) -> None:
    z = torch.tensor(EDGES + [-(2**f), 2**f - 1, 2**f, 2**f + 1], dtype=torch.int64)
    got, rounds = _relu_ring(z, f)
    assert rounds == 1
    _check(z, f, got)


@settings(max_examples=25, deadline=None)
@given(
    zs=st.lists(st.integers(-(2**62), 2**62 - 1), min_size=1, max_size=16),
    f=st.integers(1, 61),
)
def test_relu_truncating_matches_plaintext(zs: list[int], f: int) -> None:
    z = torch.tensor(zs, dtype=torch.int64)
    got, _ = _relu_ring(z, f)
    _check(z, f, got)


def test_relu_of_a_product_in_two_rounds_agrees_with_the_default() -> None:
    gen = torch.Generator().manual_seed(7)
    xs, ys = torch.randn(2, 300, generator=gen) * 3
    out = {}
    for mode in ("default", "fss"):
        ws = [pt.VirtualWorker(w) for w in ("alice", "bob", "carol")]
        config = MPCConfig(comparison=mode)
        a, b = (mpc.share(t, ws[0], ws[1], crypto_provider=ws[2], config=config) for t in (xs, ys))
        with mpc.stats() as s:
            r = F.relu(a * b)
            r.materialize()
        out[mode] = (r.get(), s.rounds)
    # default: the Beaver round, then the ReLU's run with the truncation fused, 3 rounds
    # (300 elements, within MPCConfig.three_round_up_to: no d round; 5 in all with it)
    assert out["fss"][1] == 2 and out["default"][1] == 4
    ref = F.relu(xs * ys)
    for mode in out:
        assert torch.allclose(out[mode][0], ref, atol=1e-3), mode


def test_a_narrower_domain_keeps_the_two_round_run() -> None:
    ws = [pt.VirtualWorker(w) for w in ("alice", "bob", "carol")]
    config = MPCConfig(comparison="fss", fss_bits=48)
    a, b = (
        mpc.share(torch.tensor([1.5, -2.0]), ws[0], ws[1], crypto_provider=ws[2], config=config)
        for _ in range(2)
    )
    assert fss.relu_truncating(a.session, (a * b).shares, 16) is None
    with mpc.stats() as s:
        r = F.relu(a * b)
        r.materialize()
    assert s.rounds == 3
    assert torch.allclose(r.get(), torch.tensor([2.25, 4.0]), atol=1e-3)


def test_the_step_is_sealed_and_runs_once() -> None:
    """The dealer's words are sealed (no client reads them), the last party's words go to
    the last party only, and replaying a party's step is refused (key and streams consumed)."""
    alice, bob, carol = (pt.VirtualWorker(w) for w in ("alice", "bob", "carol"))
    x = mpc.share(torch.tensor([5, -5, 7]), alice, bob, crypto_provider=carol, config=FSS)
    calls: list[tuple[Any, list[Any]]] = []
    original = pt.call_function

    def spy(worker: Any, name: str, args: list[Any], out: Any = None) -> Any:
        result = original(worker, name, args, out=out)
        if name in ("mpc.fss_relu_eval", "mpc.dealer_fss_relu"):
            calls.append((worker, list(args), result))
        return result

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pt, "call_function", spy)
        out = fss.relu_truncating(x.session, x.shares, 1)
        assert out is not None
        got = x.with_shares(out).get()
    _check(torch.tensor([5, -5, 7]), 1, got)
    (_, _, (cw, _)), *evals = calls  # (the last party's words moved on to it)
    with pytest.raises(pt.RemoteError, match="sealed"):
        cw.get()
    worker, args, _ = evals[0]
    with pytest.raises(pt.RemoteError, match="protocol material|already used|spent"):
        original(worker, "mpc.fss_relu_eval", args, out=[((3,), torch.int64)])
        worker.request(Describe([]))
    # party 0 with the last party's words: refused
    s = x.session
    nonce = s.next_nonce()
    n = 3
    cw, consts = pt.call_function(
        carol,
        "mpc.dealer_fss_relu",
        [s.dealer_seeds, nonce, [n], 1],
        out=[((fss_relu.key_words(n),), torch.int64), ((5 * n,), torch.int64)],
    )
    with pytest.raises(pt.RemoteError, match="goes only to 'bob'"):
        consts.move(alice)  # its dealer sends the last party's words to the last party only
        carol.request(Describe([]))
