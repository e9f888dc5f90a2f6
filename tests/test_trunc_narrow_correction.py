"""The truncation's [D] correction travels narrow (mpc/protocols/truncation/steps.py ``dealer_trunc``).

D = 2^(64-f) (1 - h) is shared as D_i = 2^(64-f) s_i with s_i in Z/2^f, so the dealer
ships the last party only s_{n-1}, f bits, in the narrowest dtype that holds them (int16
at f = 16: 2 bytes an element, not 8). Here: the ring-level truncation stays exact up to
one unit, fixed-point products (also fused into ReLU) match plaintext torch within the
documented error for several scales and 2 and 3 parties, the dealer's correction
reconstructs D and is uniform whatever h is, and the dealer's bytes drop accordingly.
"""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mpc
import pointers as pt
from mpc.math.encoding import product_safe_value
from mpc.protocols.seeds.steps import new_seed
from mpc.protocols.streams import TAG_D, TAG_R, TAG_U, derive
from mpc.protocols.truncation.run import truncate
from mpc.protocols.truncation.steps import (
    dealer_trunc,
    trunc_correction_dtype,
    unpack_trunc_correction,
)

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
# shifts at and around the dtype boundaries of the correction (8, 16, 32 bits) and beyond
BITS = st.sampled_from([1, 7, 8, 9, 15, 16, 17, 20, 24, 31, 32, 33, 40, 61, 62])


@pytest.fixture(scope="module")
def workers() -> tuple[list[Any], Any]:
    return [pt.VirtualWorker(f"tn{i}") for i in range(3)], pt.VirtualWorker("tn_dealer")


def _shape(draw: Any) -> tuple[int, ...]:
    return tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))


@SETTINGS
@given(data=st.data(), n=st.sampled_from([2, 3]), bits=BITS)
def test_ring_truncation_is_floor_or_one_more(
    workers: tuple[list[Any], Any], data: st.DataObject, n: int, bits: int
) -> None:
    parties, dealer = workers
    shape = _shape(data.draw)
    count = 1
    for d in shape:
        count *= d
    edge = st.sampled_from([-(2**62) + 1, -(2**62) + 2**bits, -1, 0, 1, 2**62 - 1])
    zs = data.draw(
        st.lists(
            st.one_of(st.integers(-(2**62) + 1, 2**62 - 1), edge),
            min_size=count,
            max_size=count,
        ),
        label="z",
    )
    z = torch.tensor(zs, dtype=torch.int64).view(shape)
    shared = mpc.share(z, *parties[:n], crypto_provider=dealer)  # integers: exact
    out = truncate(shared.session, shared.shares, bits)
    got = sum(s.get() for s in out)
    assert isinstance(got, torch.Tensor) and got.dtype == torch.int64
    diff = got - torch.div(z, 2**bits, rounding_mode="floor")
    assert bool(((diff == 0) | (diff == 1)).all()), (zs, bits, got.tolist())


@SETTINGS
@given(
    data=st.data(),
    n=st.sampled_from([2, 3]),
    f=st.sampled_from([8, 12, 15, 16, 17, 20, 24]),
)
def test_products_match_plaintext_within_the_documented_error(
    workers: tuple[list[Any], Any], data: st.DataObject, n: int, f: int
) -> None:
    """|x y - got| <= (|x| + |y| + 2) 2^-f: half a unit of each input's rounding times the
    other operand, plus one unit of truncation (the bound of test_fixed_point_range)."""
    parties, dealer = workers
    shape = _shape(data.draw)
    r = product_safe_value(f)
    val = st.floats(-r, r, allow_nan=False, exclude_min=True, exclude_max=True)
    count = 1
    for d in shape:
        count *= d

    def draw_vec(label: str) -> torch.Tensor:
        xs = data.draw(st.lists(val, min_size=count, max_size=count), label=label)
        return torch.tensor(xs, dtype=torch.float64).view(shape)

    x, y = draw_vec("x"), draw_vec("y")
    a = mpc.share(x, *parties[:n], crypto_provider=dealer, frac_bits=f)
    b = mpc.share(y, *parties[:n], crypto_provider=dealer, frac_bits=f)
    prod = a * b
    relu = F.relu(a * b)  # the truncation fused into the comparison's rounds
    got = prod.materialize().get()
    got_relu = relu.get()
    want = x * y
    tol = (x.abs() + y.abs() + 2) * 2.0**-f
    assert bool(((got - want).abs() <= tol).all()), (f, n, got, want)
    assert bool(((got_relu - want.relu()).abs() <= tol).all()), (f, n, got_relu, want)


class _Ctx:
    def __init__(self) -> None:
        self.id = "dealer"
        self.function_state: dict[str, Any] = {}


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("bits", [1, 8, 16, 20, 32, 40, 62])
def test_the_dealers_correction_reconstructs_u_and_d_and_is_narrow(n: int, bits: int) -> None:
    """The parties' derived shares and the dealer's correction sum to U and D, and the D
    correction has ``bits`` bits in the narrowest dtype (int16 at 16 bits)."""
    seeds = [new_seed(types.SimpleNamespace(), i, n) for i in range(n)]
    shape, nonce = [4096], 7
    packed = dealer_trunc(_Ctx(), seeds, nonce, shape, bits)
    # U and s travel as one int64 tensor: 8 bytes an element for U, then s's bytes
    narrow = trunc_correction_dtype(bits).itemsize
    assert packed.dtype == torch.int64 and packed.dim() == 1
    assert packed.numel() == 4096 + -(-4096 * narrow // 8)
    u_last, s_last = unpack_trunc_correction(packed, shape, bits)
    assert s_last.dtype == trunc_correction_dtype(bits)
    assert trunc_correction_dtype(16) == torch.int16
    r = sum(derive(s, nonce, TAG_R, shape) for s in seeds)
    assert isinstance(r, torch.Tensor)
    r = r - (1 << 62)
    h = (r >> 63) & 1
    u = u_last.clone()
    d = s_last.to(torch.int64) << (64 - bits)
    for s in seeds[:-1]:
        u += derive(s, nonce, TAG_U, shape)
        d += derive(s, nonce, TAG_D, shape) << (64 - bits)  # D_i = 2^(64-f) s_i
    assert torch.equal(u, -(r >> bits) - (1 << (62 - bits)))
    assert torch.equal(d, (1 - h) << (64 - bits))
    # s_{n-1} is padded by the others' s_i: it is uniform in Z/2^f whatever h is
    # (here: its low bit is as often set where h = 0 as where h = 1)
    low = (s_last.to(torch.int64) & 1).double()
    for side in (h == 0, h == 1):
        assert abs(float(low[side].mean()) - 0.5) < 0.1


def test_the_correction_for_d_travels_as_int16_at_16_bits(
    workers: tuple[list[Any], Any],
) -> None:
    """One truncation of N elements at f = 16: the dealer sends U (8 bytes an element) and
    the f-bit s of D (2 bytes an element, int16), 10 N in all; it used to send 16 N."""
    parties, dealer = workers
    count = 10_000
    shared = mpc.share(torch.arange(count, dtype=torch.int64), *parties[:2], crypto_provider=dealer)
    with mpc.stats() as s:
        shared.session.watch()
        out = truncate(shared.session, shared.shares, 16)
    sent = s.dealer_bytes
    assert (8 + 2) * count <= sent <= (8 + 2) * count + 256, sent
    assert sent < (8 + 8) * count  # the full-width correction it replaces
    got = sum(o.get() for o in out)
    diff = got - torch.arange(count) // 2**16
    assert bool(((diff == 0) | (diff == 1)).all())


@pytest.mark.parametrize(("bits", "d_bytes"), [(8, 1), (16, 2), (20, 4), (32, 4), (40, 8)])
def test_the_dealers_bytes_per_truncated_element(
    workers: tuple[list[Any], Any], bits: int, d_bytes: int
) -> None:
    parties, dealer = workers
    count = 4096
    shared = mpc.share(torch.ones(count, dtype=torch.int64), *parties, crypto_provider=dealer)
    with mpc.stats() as s:
        shared.session.watch()
        truncate(shared.session, shared.shares, bits)
    assert (8 + d_bytes) * count <= s.dealer_bytes <= (8 + d_bytes) * count + 256


def test_a_packed_correction_of_the_wrong_size_or_dtype_is_refused() -> None:
    """The last party unpacks U and s from one tensor: a client or dealer handing it
    anything else gets a clear error, not a misread."""
    good = torch.zeros(4096 + 4096 * 2 // 8, dtype=torch.int64)
    u, s = unpack_trunc_correction(good, [64, 64], 16)
    assert u.shape == (64, 64) and s.shape == (64, 64) and s.dtype == torch.int16
    for bad in (good[:-1], good.to(torch.int32), good.view(2, -1)):
        with pytest.raises(ValueError, match="truncation correction"):
            unpack_trunc_correction(bad, [64, 64], 16)
