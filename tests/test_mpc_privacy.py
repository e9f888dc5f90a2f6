"""Privacy of the sharing, checked statistically and by auditing what the parties hold.

(a) every share is uniform over Z/2^64 whatever the secret (bit balance and chi-square);
(b) shares come from a CSPRNG, not from torch's (or numpy's, or Python's) seeded PRNG;
(c) during a multiplication, a comparison and a small CNN inference, no tensor stored at,
    delivered to or sent by a party (or the dealer) contains a secret input, a secret
    weight or its fixed-point encoding, and the client fetches nothing before ``get()``.

(a) and (b) run on both worker kinds (see conftest.py): on network workers the shares are
the ones the parties hold after the trip over loopback, and the dealer's seeds come from
the dealer's own process. The audits (c) record what a worker stores, receives and
delivers by wrapping the in-process worker's store, message handler and peer delivery,
which a network worker's client does not have (it runs in another process): they build
``VirtualWorker`` parties and run in process only.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import fields
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import mpc
import pointers as pt
from pointers.wire.messages import Fetch, decode_message

FRAC = 16
N_SAMPLES = 20_000  # per share: the bit means have a standard deviation of 0.0035
BIT_TOLERANCE = 0.05  # 14 standard deviations: a uniform share never fails by chance
# chi-square with 255 degrees of freedom: P(chi2 > 413) ~ 1e-9 (Wilson-Hilferty)
CHI2_LIMIT = 413.0


def encode(x: torch.Tensor, frac: int = FRAC) -> torch.Tensor:
    """The fixed-point ring encoding the parties must never see: round(x * 2^16)."""
    return torch.round(x.double() * 2**frac).to(torch.int64)


def make_parties(
    n: int, make_worker: Callable[[str], Any] = pt.VirtualWorker
) -> tuple[list[Any], Any]:
    return [make_worker(f"party{i}") for i in range(n)], make_worker("dealer")


# ------------------------------------------------------------------ (a) uniformity


def bit_means(share: torch.Tensor) -> torch.Tensor:
    bits = (share.reshape(-1, 1) >> torch.arange(64)) & 1
    return bits.double().mean(0)


def chi_square(byte: torch.Tensor) -> float:
    counts = torch.bincount(byte.reshape(-1), minlength=256).double()
    expected = byte.numel() / 256
    return float(((counts - expected) ** 2 / expected).sum())


def uniformity_failures(share: torch.Tensor) -> list[str]:
    """Why ``share`` (int64 ring elements) does not look uniform over Z/2^64 (empty: fine)."""
    out = []
    means = bit_means(share)
    off = (means - 0.5).abs()
    if bool((off > BIT_TOLERANCE).any()):
        bad = [int(i) for i in torch.nonzero(off > BIT_TOLERANCE)]
        out.append(f"bits {bad} are unbalanced: means {[round(float(means[i]), 3) for i in bad]}")
    for name, byte in (("top", (share >> 56) & 0xFF), ("bottom", share & 0xFF)):
        chi2 = chi_square(byte)
        if chi2 > CHI2_LIMIT:
            out.append(f"{name} byte chi-square {chi2:.0f} > {CHI2_LIMIT}")
    return out


def shares_of(value: torch.Tensor, parties: list[Any], dealer: Any) -> list[torch.Tensor]:
    x = mpc.share(value, *parties, crypto_provider=dealer)
    return [s.get() for s in x.shares]


def test_the_uniformity_check_has_power() -> None:
    """The statistic rejects what is not uniform: encodings, small integers, a biased PRG."""
    assert uniformity_failures(encode(torch.full((N_SAMPLES,), 1e6)))
    assert uniformity_failures(torch.randint(-1000, 1000, (N_SAMPLES,)))
    biased = torch.randint(-(2**63), 2**63 - 1, (N_SAMPLES,)) | 1  # lowest bit stuck at 1
    assert uniformity_failures(biased)
    assert not uniformity_failures(torch.randint(-(2**63), 2**63 - 1, (N_SAMPLES,)))


@pytest.mark.parametrize("n", [2, 3, 5])
@pytest.mark.parametrize(
    "value",
    [
        pytest.param(torch.zeros(N_SAMPLES), id="float_0"),
        pytest.param(torch.full((N_SAMPLES,), 1e6), id="float_1e6"),
        pytest.param(torch.full((N_SAMPLES,), -1234.5678), id="float_-1234.5678"),
        pytest.param(torch.full((N_SAMPLES,), 7, dtype=torch.int64), id="int_7"),
    ],
)
def test_each_share_is_uniform(
    make_worker: Callable[[str], Any], n: int, value: torch.Tensor
) -> None:
    for i, share in enumerate(shares_of(value, *make_parties(n, make_worker))):
        assert share.dtype == torch.int64 and share.shape == value.shape
        assert not uniformity_failures(share), f"share of party {i}: {uniformity_failures(share)}"


@pytest.mark.parametrize("n", [2, 3])
def test_shares_of_0_and_1e6_are_indistinguishable(
    make_worker: Callable[[str], Any], n: int
) -> None:
    parties, dealer = make_parties(n, make_worker)
    zero = shares_of(torch.zeros(N_SAMPLES), parties, dealer)
    million = shares_of(torch.full((N_SAMPLES,), 1e6), parties, dealer)
    for i, (a, b) in enumerate(zip(zero, million)):
        gap = (bit_means(a) - bit_means(b)).abs().max().item()
        assert gap < BIT_TOLERANCE, f"party {i}: bit means differ by {gap:.3f}"
        top_a, top_b = (a >> 56) & 0xFF, (b >> 56) & 0xFF
        assert abs(chi_square(top_a) - chi_square(top_b)) < CHI2_LIMIT - 255
        # and the shares themselves are unrelated
        assert not bool(torch.isin(a, b).any())


# ------------------------------------------------------------ (b) not torch's PRNG


def reseed_everything() -> None:
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)


def test_shares_do_not_repeat_after_reseeding_torch(make_worker: Callable[[str], Any]) -> None:
    (alice, bob), carol = make_parties(2, make_worker)
    x = torch.full((256,), 3.25)
    runs = []
    for _ in range(2):
        reseed_everything()
        s = mpc.share(x, alice, bob, crypto_provider=carol)
        runs.append([share.get() for share in s.shares])
    for first, second in zip(*runs):
        assert not bool((first == second).any()), "a share repeated after torch.manual_seed(0)"


def _peek_sealed(p: pt.PointerTensor) -> torch.Tensor | None:
    """A seed's value, read inside the worker's own process (in process: its store); a
    client's fetch of it is refused (the seed is sealed)."""
    with pytest.raises(pt.RemoteError, match="sealed"):
        p.get(delete=False)
    if isinstance(p.location, pt.VirtualWorker):
        return p.location.store.get(p.id_at_location)
    return None


def test_dealer_material_does_not_repeat_after_reseeding_torch(
    make_worker: Callable[[str], Any],
) -> None:
    """Session seeds, and so triples and masks, come from os.urandom."""
    (alice, bob), carol = make_parties(2, make_worker)
    x, y = torch.tensor([1.5, -2.0, 0.25]), torch.tensor([4.0, 0.5, -3.0])
    seeds, products = [], []
    for _ in range(2):
        reseed_everything()
        session = mpc.Session([alice, bob], carol)
        seeds.append([_peek_sealed(s) for s in session.party_seeds])
        reseed_everything()
        xs = mpc.share(x, alice, bob, crypto_provider=carol)
        ys = mpc.share(y, alice, bob, crypto_provider=carol)
        products.append([s.get() for s in (xs * ys).shares])
    for a, b in zip(*seeds):
        if a is None:  # a network worker's seed: only its own process can read it
            continue
        assert a.dtype == torch.uint8 and a.numel() == 16
        assert not torch.equal(a, b)
    for a, b in zip(*products):
        assert not bool((a == b).any())


# --------------------------------------------------------------------- (c) audit


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, list | tuple):
        return [leaf for o in obj for leaf in _leaves(o)]
    if isinstance(obj, dict):
        return [leaf for o in obj.values() for leaf in _leaves(o)]
    if isinstance(obj, float) or (isinstance(obj, int) and not isinstance(obj, bool)):
        return [obj]
    return []  # object references, strings, None


class Audit:
    """Records every tensor a worker stores, receives (from the client or a peer) or
    delivers to a peer, the scalars in the commands it receives, and the kinds of
    messages it receives. Installed by monkeypatching the worker instances."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, workers: list[pt.VirtualWorker]) -> None:
        self.workers = workers
        self.tensors: list[tuple[str, str, torch.Tensor]] = []
        self.ints: list[tuple[str, int]] = []
        self.floats: list[tuple[str, float]] = []
        self.kinds: Counter[tuple[str, str]] = Counter()
        for w in workers:
            self._install(monkeypatch, w)

    def _record(self, who: str, how: str, value: Any) -> None:
        for leaf in _leaves(value):
            if isinstance(leaf, torch.Tensor):
                self.tensors.append((who, how, leaf.detach().clone()))
            elif isinstance(leaf, int):
                self.ints.append((who, leaf))
            else:
                self.floats.append((who, leaf))

    def _install(self, monkeypatch: pytest.MonkeyPatch, w: pt.VirtualWorker) -> None:
        put, handle, deliver = w.store.put, w.handle_frames, w.deliver

        def audited_put(obj_id: int, value: Any, *args: Any, **kwargs: Any) -> None:
            if isinstance(value, torch.Tensor):
                self._record(w.id, "stored", value)
            return put(obj_id, value, *args, **kwargs)

        def audited_handle(header: bytes, buffers: list[Any], **kwargs: Any) -> Any:
            msg = decode_message(header, buffers)  # a copy: the real decode may take buffers
            self.kinds[(w.id, type(msg).__name__)] += 1
            for f in fields(msg):
                if f.name in ("args", "kwargs", "value"):
                    self._record(w.id, f"received {type(msg).__name__}", getattr(msg, f.name))
            return handle(header, buffers, **kwargs)

        def audited_deliver(peer: str, obj_id: int, value: Any, **kwargs: Any) -> None:
            self._record(w.id, f"sent to {peer}", value)
            return deliver(peer, obj_id, value, **kwargs)

        monkeypatch.setattr(w.store, "put", audited_put)
        monkeypatch.setattr(w, "handle_frames", audited_handle)
        monkeypatch.setattr(w, "deliver", audited_deliver)

    def snapshot_stores(self) -> None:
        """Also look at every object now held (catches values changed in place)."""
        for w in self.workers:
            for value in w.store.view().values():
                if isinstance(value, torch.Tensor):
                    self._record(w.id, "held", value)

    def fetches(self) -> Counter[str]:
        return Counter({w: n for (w, kind), n in self.kinds.items() if kind == Fetch.__name__})

    def assert_clean(self, secret_floats: torch.Tensor, secret_ints: torch.Tensor) -> None:
        """No recorded tensor or scalar contains a secret value or its encoding."""
        assert self.tensors, "the audit recorded nothing"
        secret_floats = secret_floats.detach().reshape(-1)
        secret_ints = secret_ints.reshape(-1)
        # distinctive: beyond 2^17, since a comparison's last carry level packs 16
        # uniformly random bits into each int64 word, which hold every 16-bit value by chance
        assert bool((secret_ints.abs() > 2**17).all()), "secrets must be distinctive"
        for who, how, t in self.tensors:
            if t.dtype == torch.bool or t.numel() == 0:
                continue
            if t.dtype in (torch.int8, torch.uint8, torch.int16):
                # the dealer's truncation corrections travel in f bits (int16 at f = 16):
                # uniform over their range, so a few thousand of them hold every 16-bit
                # value by chance, encodings of small secrets among them; what they are
                # (uniform, independent of the data) is tested in
                # tests/test_trunc_narrow_correction.py. A secret's encoding is 64 bits.
                continue
            if t.is_floating_point():
                hit = torch.isin(t.float(), secret_floats.float()).any()
                hit |= torch.isin(t.double(), secret_floats.double()).any()
            else:
                hit = torch.isin(t.to(torch.int64), secret_ints).any()
            assert not bool(hit), f"{who} {how} a tensor holding a secret: {t.flatten()[:8]}"
        ints, floats = set(secret_ints.tolist()), set(secret_floats.double().tolist())
        for who, v in self.ints:
            assert v not in ints, f"{who} received the secret encoding {v} in a command"
        for who, v in self.floats:
            assert v not in floats, f"{who} received the secret value {v} in a command"


def ring_value(s: mpc.SharedTensor) -> torch.Tensor:
    """The ring element a result reconstructs to (at its own scale)."""
    total = s.shares[0].get(delete=False)
    for share in s.shares[1:]:
        total = total + share.get(delete=False)
    return total


def run_audited(
    monkeypatch: pytest.MonkeyPatch, n: int, protocol: Any
) -> tuple[Audit, list[pt.VirtualWorker], Any]:
    # in process only: the audit wraps the workers' own store, handler and delivery
    parties, dealer = make_parties(n, pt.VirtualWorker)
    audit = Audit(monkeypatch, [*parties, dealer])
    result = protocol(parties, dealer)
    audit.snapshot_stores()
    assert not audit.fetches(), f"the client fetched during the protocol: {audit.fetches()}"
    return audit, parties, result


def check_final_get(audit: Audit, parties: list[pt.VirtualWorker], out: mpc.SharedTensor) -> Any:
    before = audit.fetches()
    value = out.get()
    fetched = audit.fetches() - before
    assert fetched == Counter({p.id: 1 for p in parties}), fetched
    return value


SECRET_X = 1234.5678 + torch.arange(12, dtype=torch.float32) * 1.0009
SECRET_Y = -987.6543 + torch.arange(12, dtype=torch.float32) * 0.731


@pytest.mark.parametrize("n", [2, 3])
def test_audit_multiplication(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    def protocol(parties: list[pt.VirtualWorker], dealer: pt.VirtualWorker) -> Any:
        xs = mpc.share(SECRET_X, *parties, crypto_provider=dealer)
        ys = mpc.share(SECRET_Y, *parties, crypto_provider=dealer)
        z = xs * ys
        w = (z * 0.5).view(3, 4) @ ys.view(4, 3)  # products with truncations in between
        return z, w

    # (the values are large on purpose: w's matmul, 2.4e9, leaves the product range)
    with pytest.warns(mpc.FixedPointRangeWarning, match="mm: the product can reach 2.4"):
        audit, parties, (z, w) = run_audited(monkeypatch, n, protocol)
    seen = {(who, how) for who, how, _ in audit.tensors}
    for p in parties:  # the audit sees peer traffic both ways at every party
        assert (p.id, "received Store") in seen
        assert any(who == p.id and how.startswith("sent to") for who, how in seen)
    z_ring = ring_value(z)  # (before get(), which frees z's shares)
    got = check_final_get(audit, parties, z)
    ref = SECRET_X.double() * SECRET_Y.double()
    assert torch.allclose(got.double(), ref, atol=1e-2)
    secret_ints = torch.cat(
        [encode(SECRET_X), encode(SECRET_Y), encode(ref), z_ring, ring_value(w).flatten()]
    )
    secret_floats = torch.cat([SECRET_X, SECRET_Y, ref.float()])
    audit.assert_clean(secret_floats, secret_ints)


@pytest.mark.parametrize("n", [2, 3])
def test_audit_comparison(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    def protocol(parties: list[pt.VirtualWorker], dealer: pt.VirtualWorker) -> Any:
        xs = mpc.share(SECRET_X, *parties, crypto_provider=dealer)
        ys = mpc.share(SECRET_Y, *parties, crypto_provider=dealer)
        return xs > ys, xs.max(), torch.relu(ys)

    audit, parties, (gt, mx, relu) = run_audited(monkeypatch, n, protocol)
    assert bool(check_final_get(audit, parties, gt).all())
    secret_ints = torch.cat(
        [
            encode(SECRET_X),
            encode(SECRET_Y),
            encode(SECRET_X) - encode(SECRET_Y),  # the difference a comparison is about
            ring_value(mx).reshape(1),
        ]
    )
    audit.assert_clean(torch.cat([SECRET_X, SECRET_Y]), secret_ints)
    assert mx.get().item() == pytest.approx(SECRET_X.max().item(), abs=1e-4)


def distinctive_cnn() -> nn.Sequential:
    model = nn.Sequential(
        nn.Conv2d(1, 2, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        nn.Linear(2 * 2 * 2, 3),
    )
    with torch.no_grad():
        for k, p in enumerate(model.parameters()):
            steps = torch.arange(p.numel(), dtype=torch.float32)
            signs = 1 - 2 * (steps % 2)
            p.copy_(((2.1 + 2 * k + 0.0137 * steps) * signs).reshape(p.shape))
    return model


@pytest.mark.parametrize("n", [2, 3])
def test_audit_cnn_inference(monkeypatch: pytest.MonkeyPatch, n: int) -> None:
    model = distinctive_cnn()
    weights = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    x = (12.345678 + torch.arange(16, dtype=torch.float32) * 0.0371).reshape(1, 1, 4, 4)
    with torch.no_grad():
        ref = model(x)

    def protocol(parties: list[pt.VirtualWorker], dealer: pt.VirtualWorker) -> Any:
        shared_model = mpc.share(model, *parties, crypto_provider=dealer)
        out = shared_model(mpc.share(x, *parties, crypto_provider=dealer))
        return out, out.argmax(dim=1)

    audit, parties, (out, label) = run_audited(monkeypatch, n, protocol)
    out_ring = ring_value(out).reshape(-1)  # (before get(), which frees out's shares)
    logits = check_final_get(audit, parties, out)
    assert torch.allclose(logits, ref, atol=1e-2)
    secret_ints = torch.cat([encode(x).reshape(-1), encode(weights), out_ring])
    secret_floats = torch.cat([x.reshape(-1), weights])
    audit.assert_clean(secret_floats, secret_ints)
    assert label.get().tolist() == ref.argmax(dim=1).tolist()


def test_the_audit_catches_a_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: a secret's encoding sent to a party is found, as is a fetch."""
    audit, parties, _ = run_audited(
        monkeypatch,
        2,
        lambda parties, dealer: mpc.share(SECRET_X, *parties, crypto_provider=dealer),
    )
    leaked = pt.send(encode(SECRET_X)[3:5], parties[1])
    with pytest.raises(AssertionError, match="holding a secret"):
        audit.assert_clean(SECRET_X, encode(SECRET_X))
    leaked.get()
    assert audit.fetches() == Counter({"party1": 1})
