"""Property tests of the pure math of ``mpc``: fixed-point encoding, the PRG, ring products.

References are independent of the code under test: numpy int64 arithmetic (which wraps
mod 2^64 and uses no BLAS) for matmul and for an im2col convolution, and the raw AES-CTR
keystream from ``cryptography`` for the PRG.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from hypothesis import given, settings
from hypothesis import strategies as st

from mpc.math.encoding import EncodingError, decode, encode, max_safe_value
from mpc.math.prg import PRG, new_seed, random_ring
from mpc.math.ring import _limb_matmul, _offsets, _plan, _widths, ring_conv2d, ring_matmul

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
METHODS = ("auto", "int64", "limbs")
seeds = st.binary(min_size=16, max_size=16)


# --------------------------------------------------------------------------- encoding


@settings(max_examples=200, deadline=None)
@given(
    frac_bits=st.integers(0, 40),
    data=st.data(),
)
def test_encode_decode_round_trip_within_half_ulp(frac_bits: int, data: st.DataObject) -> None:
    bound = max_safe_value(frac_bits)
    xs = data.draw(
        st.lists(
            st.floats(-bound, bound, allow_nan=False, exclude_min=True, exclude_max=True),
            min_size=1,
            max_size=20,
        )
    )
    x = torch.tensor(xs, dtype=torch.float64)
    enc = encode(x, frac_bits)
    assert enc.dtype == torch.int64
    back = decode(enc, frac_bits, torch.float64)
    assert torch.all((back - x).abs() <= 2.0 ** (-frac_bits) / 2)


def test_encode_rounds_exactly() -> None:
    x = torch.tensor([0.5, 1.5, -0.5, 0.25, -0.75, 1 / 3], dtype=torch.float64)
    # half to even at 0 fractional bits; power-of-two scales are exact
    assert encode(x, 0).tolist() == [0, 2, 0, 0, -1, 0]
    assert encode(x, 2).tolist() == [2, 6, -2, 1, -3, 1]
    assert encode(x, 16).tolist() == [32768, 98304, -32768, 16384, -49152, 21845]
    # a float32 input is widened first, not rounded in float32
    big = torch.tensor([3.0e6 + 0.25], dtype=torch.float32)
    assert encode(big, 16).item() == round(float(big.item()) * 2**16)


@settings(max_examples=50, deadline=None)
@given(
    values=st.lists(st.integers(INT64_MIN, INT64_MAX), min_size=1, max_size=20),
    frac_bits=st.integers(0, 62),
)
def test_integers_are_exact_and_unscaled(values: list[int], frac_bits: int) -> None:
    x = torch.tensor(values, dtype=torch.int64)
    enc = encode(x, frac_bits)
    assert torch.equal(enc, x)
    assert torch.equal(decode(enc, 0, torch.int64), x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.uint8, torch.bool])
def test_small_integer_dtypes_are_exact(dtype: torch.dtype) -> None:
    x = torch.tensor([0, 1, 1, 0, 1]).to(dtype)
    assert torch.equal(encode(x, 16), x.to(torch.int64))
    assert torch.equal(decode(encode(x, 0), 0, dtype), x)


def test_encode_scalars_and_low_precision_floats() -> None:
    assert encode(1.5, 16).item() == 98304
    assert encode(3, 16).item() == 3  # a Python int is an integer: not scaled
    assert encode(True, 0).item() == 1
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert encode(torch.tensor([-2.5], dtype=dtype), 8).tolist() == [-640]
    assert decode(torch.tensor([-640]), 8).dtype == torch.float32
    assert decode(torch.tensor([-640]), 8).item() == -2.5
    assert encode(torch.zeros(0), 16).shape == (0,)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encode_rejects_non_finite(bad: float) -> None:
    with pytest.raises(EncodingError, match="NaN or infinity"):
        encode(torch.tensor([1.0, bad]), 16)


@settings(max_examples=50, deadline=None)
@given(frac_bits=st.integers(0, 62), factor=st.floats(1.0, 1e6))
def test_encode_rejects_out_of_range(frac_bits: int, factor: float) -> None:
    bound = max_safe_value(frac_bits)
    assert bound == 2.0 ** (62 - frac_bits)
    for value in (bound * factor, -bound * factor):
        with pytest.raises(EncodingError, match="safe range") as info:
            encode(torch.tensor([0.0, value], dtype=torch.float64), frac_bits)
        message = str(info.value)
        assert repr(abs(value)) in message  # the offending max |value|
        assert repr(bound) in message  # and the allowed bound
    # just inside the bound encodes, and stays below 2**62 in the ring
    inside = math.nextafter(bound, 0.0)
    assert abs(encode(torch.tensor([inside], dtype=torch.float64), frac_bits).item()) < 2**62


def test_bad_arguments() -> None:
    with pytest.raises(EncodingError, match="frac_bits"):
        encode(torch.ones(1), -1)
    with pytest.raises(EncodingError, match="frac_bits"):
        encode(torch.ones(1), 63)
    with pytest.raises(EncodingError, match="complex"):
        encode(torch.ones(1, dtype=torch.complex64), 16)
    with pytest.raises(EncodingError, match="int64"):
        encode(2**64, 0)
    with pytest.raises(EncodingError, match="2\\*\\*63"):
        encode(torch.tensor([2**63], dtype=torch.uint64), 0)
    with pytest.raises(EncodingError, match="int64 tensor"):
        decode(torch.ones(2), 16)
    with pytest.raises(EncodingError, match="frac_bits=0"):
        decode(torch.ones(2, dtype=torch.int64), 16, torch.int64)


# --------------------------------------------------------------------------- PRG


def _aes_ctr_keystream(seed: bytes, n: int) -> bytes:
    # counter blocks 0^96 || 2, 0^96 || 3, ...: plain AES-CTR, independent of the GCM path
    enc = Cipher(algorithms.AES(seed), modes.CTR(bytes(15) + b"\x02")).encryptor()
    return enc.update(bytes(n)) + enc.finalize()


def test_prg_known_answer() -> None:
    # AES-128 of the block 0^96 || 2 under the all-zero key: the ciphertext of the
    # McGrew-Viega GCM test case 2 (zero key, zero IV, one zero block)
    assert PRG(bytes(16)).randbytes(16).hex() == "0388dace60b6a392f328c2b971b2fe78"


@settings(max_examples=50, deadline=None)
@given(seed=seeds, sizes=st.lists(st.integers(0, 40), min_size=1, max_size=6))
def test_prg_is_the_keystream_and_calls_continue_it(seed: bytes, sizes: list[int]) -> None:
    prg = PRG(seed)
    parts = [prg.int64(n) for n in sizes]
    stream = _aes_ctr_keystream(seed, 8 * sum(sizes))
    expected = torch.from_numpy(np.frombuffer(stream, dtype="<i8").astype(np.int64))
    assert torch.equal(torch.cat(parts), expected)
    # the same seed replays the same sequence of calls
    again = PRG(seed)
    assert all(torch.equal(again.int64(n), p) for n, p in zip(sizes, parts))


def test_prg_large_draws_cross_internal_chunks() -> None:
    seed = b"large-draw-seed!"
    prg = PRG(seed)
    n = 3 * (1 << 20) // 8 + 5  # several 1 MiB pieces and a partial last block
    got = prg.int64(n).numpy().tobytes() + prg.randbytes(3) + prg.int64(2).numpy().tobytes()
    assert got == _aes_ctr_keystream(seed, len(got))


@settings(max_examples=30, deadline=None)
@given(seed=seeds, n=st.integers(0, 100))
def test_prg_bits_come_from_the_keystream(seed: bytes, n: int) -> None:
    prg = PRG(seed)
    bits = prg.bits(n)
    assert bits.dtype == torch.int64 and bits.shape == (n,)
    raw = np.frombuffer(_aes_ctr_keystream(seed, (n + 7) // 8 + 8), dtype=np.uint8)
    expected = np.unpackbits(raw[: (n + 7) // 8], bitorder="little")[:n]
    assert bits.tolist() == expected.tolist()
    # the next draw continues after the bytes that the bits used
    assert prg.randbytes(8) == raw[(n + 7) // 8 :].tobytes()


def test_prg_shapes_and_ownership() -> None:
    prg = PRG(new_seed())
    assert prg.int64((2, 3)).shape == (2, 3)
    assert prg.int64(torch.Size([4, 0])).shape == (4, 0)
    assert prg.int64(()).shape == ()
    assert prg.bits([3, 5]).shape == (3, 5)
    out = prg.int64(8)
    out.zero_()  # writable, and owned by the caller
    assert out.abs().sum() == 0
    assert bool(prg.int64(8).ne(0).any())
    with pytest.raises(ValueError, match="shape"):
        prg.int64((2, -1))


def test_prg_different_seeds_differ() -> None:
    a, b = new_seed(), new_seed()
    assert a != b and len(a) == 16
    assert not torch.equal(PRG(a).int64(64), PRG(b).int64(64))
    assert not torch.equal(random_ring(64), random_ring(64))


def test_prg_bits_are_uniform() -> None:
    words = PRG(b"uniformity-test!").int64(100_000)
    positions = torch.arange(64)
    bits = (words.unsqueeze(-1) >> positions) & 1
    means = bits.double().mean(0)
    assert torch.all((means - 0.5).abs() < 0.01), means
    assert abs(PRG(b"uniformity-bits!").bits(100_000).double().mean().item() - 0.5) < 0.01


def test_prg_ignores_torch_and_numpy_seeds() -> None:
    seed = new_seed()
    torch.manual_seed(0)
    np.random.seed(0)
    first, fresh = PRG(seed).int64(16), random_ring(16)
    torch.manual_seed(1)
    np.random.seed(1)
    assert torch.equal(PRG(seed).int64(16), first)
    torch.manual_seed(0)
    np.random.seed(0)
    assert not torch.equal(random_ring(16), fresh)


def test_prg_validates_seed() -> None:
    with pytest.raises(TypeError, match="bytes"):
        PRG("0123456789abcdef")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="16 bytes"):
        PRG(bytes(15))
    seed = new_seed()
    assert seed.hex() not in repr(PRG(seed)) and repr(seed) not in repr(PRG(seed))


# --------------------------------------------------------------------------- ring products

EDGE = [0, 1, -1, 2, INT64_MIN, INT64_MAX, INT64_MIN + 1, 2**62, -(2**62), 2**32 - 1, -(2**21)]


def ring_values(seed: bytes, shape: tuple[int, ...], mode: str) -> torch.Tensor:
    """Ring elements drawn from a PRG: uniform, small, or edge values (incl. extreme limbs)."""
    prg = PRG(seed)
    u = prg.int64(shape)
    if mode == "uniform":
        return u
    if mode == "small":
        return u % 7 - 3
    # all limbs at their extremes: v + bias == -2**63 for the 3-limb plan
    edges = torch.tensor(EDGE + [_extreme(_widths(3)), _extreme(_widths(4))], dtype=torch.int64)
    return edges[u % len(edges)]


def _extreme(widths: tuple[int, ...], bump: int = 0) -> int:
    """The ring element whose signed limbs are all -2**(w-1), plus ``bump`` on limb 0."""
    offsets = _offsets(widths)
    bias = sum(1 << (o + w - 1) for o, w in zip(offsets[:-1], widths[:-1]))
    v = (INT64_MIN - bias + bump) % 2**64
    return v - 2**64 if v > INT64_MAX else v


def np_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with np.errstate(over="ignore"):
        return torch.from_numpy(np.asarray(np.matmul(a.numpy(), b.numpy()), dtype=np.int64))


def np_conv2d(
    x: torch.Tensor, w: torch.Tensor, stride: int, padding: int, dilation: int, groups: int
) -> torch.Tensor:
    """Direct convolution: one int64 numpy contraction per kernel tap."""
    n, _, h, wd = x.shape
    co, cg, kh, kw = w.shape
    xp = np.pad(x.numpy(), ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho = (h + 2 * padding - dilation * (kh - 1) - 1) // stride + 1
    wo = (wd + 2 * padding - dilation * (kw - 1) - 1) // stride + 1
    wg = w.numpy().reshape(groups, co // groups, cg, kh, kw)
    out = np.zeros((n, groups, co // groups, ho, wo), dtype=np.int64)
    with np.errstate(over="ignore"):
        for i in range(kh):
            for j in range(kw):
                r0, c0 = i * dilation, j * dilation
                patch = xp[:, :, r0 : r0 + stride * (ho - 1) + 1 : stride]
                patch = patch[:, :, :, c0 : c0 + stride * (wo - 1) + 1 : stride]
                patch = patch.reshape(n, groups, cg, ho, wo)
                out += np.einsum("ngchw,goc->ngohw", patch, wg[:, :, :, i, j])
    return torch.from_numpy(out.reshape(n, co, ho, wo))


modes_ = st.sampled_from(["uniform", "small", "edge"])


@st.composite
def matmul_shapes(draw: st.DrawFn, max_k: int = 300) -> tuple[tuple[int, ...], tuple[int, ...]]:
    k = draw(st.integers(1, max_k))
    m, n = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    kind = draw(st.sampled_from(["1d@2d", "2d@1d", "1d@1d", "2d@2d", "batched", "broadcast"]))
    if kind == "1d@2d":
        return (k,), (k, n)
    if kind == "2d@1d":
        return (m, k), (k,)
    if kind == "1d@1d":
        return (k,), (k,)
    if kind == "2d@2d":
        return (m, k), (k, n)
    b = draw(st.integers(1, 3))
    if kind == "batched":
        return (b, m, k), (b, k, n)
    # broadcasting batch dims, either side may be missing or of size 1
    return draw(
        st.sampled_from(
            [((b, 1, m, k), (2, k, n)), ((m, k), (b, k, n)), ((b, m, k), (k, n)), ((k,), (b, k, n))]
        )
    )


@settings(max_examples=150, deadline=None)
@given(shapes=matmul_shapes(), seed=seeds, mode=modes_, method=st.sampled_from(METHODS))
def test_ring_matmul_matches_wraparound_reference(
    shapes: tuple[tuple[int, ...], tuple[int, ...]], seed: bytes, mode: str, method: str
) -> None:
    sa, sb = shapes
    a = ring_values(seed, sa, mode)
    b = ring_values(seed[::-1], sb, mode)
    expected = np_matmul(a, b)
    got = ring_matmul(a, b, method=method)  # type: ignore[arg-type]
    assert got.dtype == torch.int64
    assert got.shape == torch.matmul(a, b).shape == expected.shape
    assert torch.equal(got, expected)


def _force_speeds(monkeypatch: pytest.MonkeyPatch, mv: bool, relayout: bool) -> list[str]:
    """Make mpc.math.ring believe torch.mv (``mv``) and laying b out anew (``relayout``)
    are the fastest ways on this CPU, or the slowest; returns the log of the ways taken."""
    import mpc.math.ring as ring

    fast, slow = 1e-12, 1e-9
    speeds = ring.Speeds(
        many=slow if relayout else fast, one=slow if mv else fast, mv=fast if mv else slow, copy=0.0
    )
    other = ring.Speeds(many=fast, one=slow, mv=slow, copy=0.0)
    monkeypatch.setattr(ring, "measured_speeds", lambda row_major: speeds if row_major else other)
    taken: list[str] = []
    by_mv, relaid = ring._rows_by_mv, ring._relaid
    monkeypatch.setattr(ring, "_rows_by_mv", lambda a, b: taken.append("mv") or by_mv(a, b))
    monkeypatch.setattr(ring, "_relaid", lambda b: taken.append("relayout") or relaid(b))
    return taken


@pytest.mark.parametrize(
    "sa, sb",
    [((32, 300), (300, 7)), ((2, 20, 64), (64, 33)), ((3, 16, 9), (3, 9, 5)), ((17, 8), (8,))],
)
@pytest.mark.parametrize("relayout", [False, True])
def test_ring_matmul_with_many_rows_is_exact(
    sa: tuple[int, ...], sb: tuple[int, ...], relayout: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From mpc.math.ring._COLUMNS_FROM rows, b is laid out anew first where this CPU's
    measured speeds say it pays: the same wrap-around result either way, for a row-major
    b, a transposed view and a batched one."""
    import mpc.math.ring as ring

    monkeypatch.setattr(ring, "_RELAYOUT_FROM", 1)
    taken = _force_speeds(monkeypatch, mv=False, relayout=relayout)
    a = ring_values(b"rows" * 4, sa, "uniform")
    b = ring_values(b"cols" * 4, sb, "uniform")
    for bb in (b, b.transpose(-1, -2).contiguous().transpose(-1, -2) if b.dim() > 1 else b):
        assert torch.equal(ring_matmul(a, bb, method="int64"), np_matmul(a, b))
    assert ("relayout" in taken) == (relayout and len(sb) > 1)


@pytest.mark.parametrize(
    "sa, sb",
    [((1, 768), (768, 64)), ((768,), (768, 50)), ((3, 5, 300), (300, 40)), ((15, 2100), (2100, 9))],
)
@pytest.mark.parametrize("mode", ["uniform", "edge"])
@pytest.mark.parametrize("mv", [False, True])
def test_ring_matmul_with_few_rows_is_exact(
    sa: tuple[int, ...], sb: tuple[int, ...], mode: str, mv: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Below mpc.math.ring._COLUMNS_FROM rows (batch dimensions folded in) and from
    _MV_FROM multiply-adds, each row is one torch.mv where this CPU's measured speeds say it
    is faster: the same wrap-around result either way, for a row-major b and a transposed
    view, a 1-D a and a batched one."""
    taken = _force_speeds(monkeypatch, mv=mv, relayout=False)
    a = ring_values(b"rows" * 4, sa, mode)
    b = ring_values(b"cols" * 4, sb, mode)
    for bb in (b, b.t().contiguous().t()):
        got = ring_matmul(a, bb)
        assert got.shape == torch.matmul(a, bb).shape
        assert torch.equal(got, np_matmul(a, b))
    assert taken.count("mv") == (1 if mv else 0)  # the row-major b (the other: never faster)


@pytest.mark.parametrize("column_major_faster", [False, True])
def test_settle_layout_lays_a_kept_operand_out_once_and_stays_exact(
    column_major_faster: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A kept operand (a weight's mask, multiplied by one row at each decoding step) is laid
    out anew in place where this CPU measured its few-row products faster the other way:
    the same object and values, so every later product is the same wrap-around sum; once
    (the other layout then measures slower), never for many rows, a strided view or a
    product too small for torch.mv."""
    import mpc.math.ring as ring

    fast, slow = 1e-12, 1e-9
    row = ring.Speeds(many=fast, one=slow, mv=slow, copy=slow)
    col = ring.Speeds(many=slow, one=slow, mv=fast if column_major_faster else slow, copy=slow)
    monkeypatch.setattr(ring, "measured_speeds", lambda row_major: row if row_major else col)
    b = ring_values(b"cols" * 4, (300, 200), "uniform")
    kept, a = b.clone(), ring_values(b"rows" * 4, (20, 300), "uniform")
    for rows in (20, 16, 0):  # many rows (or none): never
        assert not ring.settle_layout(kept, rows)
    assert not ring.settle_layout(kept.t()[:, :100], 1)  # a strided view: never
    assert not ring.settle_layout(ring_values(b"tiny" * 4, (30, 20), "uniform"), 1)
    assert kept.is_contiguous()
    assert ring.settle_layout(kept, 1) is column_major_faster
    assert torch.equal(kept, b)
    assert kept.t().is_contiguous() is column_major_faster
    assert not ring.settle_layout(kept, 1)  # (settled: the other way is now the slow one)
    for n in (1, 3, 20):
        assert torch.equal(ring_matmul(a[:n], kept), np_matmul(a[:n], b))


def test_measured_speeds_pick_a_way_that_is_exact() -> None:
    """The speeds are measured on this CPU (positive, once per process), and whichever way
    they pick, a product with many rows and one with a single row stay exact."""
    import mpc.math.ring as ring

    for row_major in (True, False):
        speeds = ring.measured_speeds(row_major)
        assert min(speeds.many, speeds.one, speeds.mv, speeds.copy, speeds.limbs) > 0
        assert ring.measured_speeds(row_major) is speeds
    a = ring_values(b"rows" * 4, (40, 700), "uniform")
    b = ring_values(b"cols" * 4, (700, 60), "uniform")
    for bb in (b, b.t().contiguous().t()):
        assert torch.equal(ring_matmul(a, bb), np_matmul(a, b))
        assert torch.equal(ring_matmul(a[:1], bb), np_matmul(a[:1], b))


@pytest.mark.parametrize(
    "sa, sb",
    [
        ((64, 300), (300, 64)),
        ((4, 40, 64), (64, 129)),
        ((12, 32, 64), (12, 64, 48)),
        ((20, 2100), (2100, 60)),
    ],
)
@pytest.mark.parametrize("mode", ["uniform", "edge"])
@pytest.mark.parametrize("limbs_faster", [False, True])
def test_ring_matmul_takes_the_limbs_where_this_cpu_measured_them_faster(
    sa: tuple[int, ...],
    sb: tuple[int, ...],
    mode: str,
    limbs_faster: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A large product (from _COLUMNS_FROM rows and _RELAYOUT_FROM multiply-adds) takes the
    float64 limbs where the measured speeds say they beat torch's int64 kernel (one CPU of
    this project: 5x), and the int64 kernel otherwise: the same wrap-around sums either way,
    batched or not, for a row-major b and a transposed view, past the 2048-wide chunk."""
    import mpc.math.ring as ring

    fast, slow = 1e-12, 1e-9
    speeds = ring.Speeds(
        many=slow, one=slow, mv=slow, copy=slow, limbs=fast if limbs_faster else slow
    )
    monkeypatch.setattr(ring, "measured_speeds", lambda row_major: speeds)
    taken: list[str] = []
    by_limbs = ring._limb_matmul
    monkeypatch.setattr(
        ring, "_limb_matmul", lambda a, b, w: taken.append("limbs") or by_limbs(a, b, w)
    )
    a = ring_values(b"rows" * 4, sa, mode)
    b = ring_values(b"cols" * 4, sb, mode)
    want = np_matmul(a, b)
    for bb in (b, b.transpose(-1, -2).contiguous().transpose(-1, -2)):
        taken.clear()
        assert torch.equal(ring_matmul(a, bb), want)
        assert bool(taken) == limbs_faster
    taken.clear()
    assert torch.equal(ring_matmul(a[..., :1, :], b), np_matmul(a[..., :1, :], b))
    assert not taken  # one row (or a batch of few rows): never the limbs


@pytest.mark.parametrize("shape", [((0, 5), (5, 3)), ((4, 0), (0, 3)), ((2, 0, 5), (5, 1))])
def test_ring_matmul_empty(shape: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    a, b = torch.ones(shape[0], dtype=torch.int64), torch.ones(shape[1], dtype=torch.int64)
    for method in METHODS:
        assert torch.equal(ring_matmul(a, b, method=method), torch.matmul(a, b))  # type: ignore[arg-type]


def test_ring_matmul_large_k() -> None:
    # K = 5000 > 2048: the public function splits K into exact chunks of three 22-bit limbs
    prg = PRG(b"large-K-matmul!!")
    a, b = prg.int64((3, 5000)), prg.int64((5000, 2))
    expected = np_matmul(a, b)
    assert torch.equal(ring_matmul(a, b, method="limbs"), expected)
    # without chunking, K = 5000 needs the smaller 16-bit limbs (four of them)
    widths = _plan(5000)
    assert widths == (16, 16, 16, 16)
    assert torch.equal(_limb_matmul(a, b, widths), expected)
    ext = torch.full((1, 5000), _extreme(widths), dtype=torch.int64)
    assert torch.equal(_limb_matmul(ext, ext.T, widths), np_matmul(ext, ext.T))


def test_limb_exactness_bound_is_tight() -> None:
    """At K = 2048 the worst case of three 22-bit limbs is exact; at K = 4096 it is not."""
    widths = _widths(3)
    for k, exact in ((2048, True), (4096, False)):
        a = torch.full((1, k), _extreme(widths), dtype=torch.int64)
        a[0, -1] = _extreme(widths, bump=1)  # odd low bits in the last product
        expected = np_matmul(a, a.T)
        got = _limb_matmul(a, a.T.contiguous(), widths)
        assert torch.equal(got, expected) is exact
    # the public function keeps K = 4096 exact by chunking
    assert torch.equal(ring_matmul(a, a.T, method="limbs"), expected)


@st.composite
def conv_cases(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], dict[str, int]]:
    groups = draw(st.integers(1, 3))
    cin = groups * draw(st.integers(1, 3))
    cout = groups * draw(st.integers(1, 3))
    kh, kw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    stride, dilation = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    padding = draw(st.integers(0, 2))
    h = draw(st.integers(max(1, dilation * (kh - 1) + 1 - 2 * padding), 10))
    wd = draw(st.integers(max(1, dilation * (kw - 1) + 1 - 2 * padding), 10))
    n = draw(st.integers(1, 3))
    kwargs = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
    return (n, cin, h, wd), (cout, cin // groups, kh, kw), kwargs


@settings(max_examples=120, deadline=None)
@given(case=conv_cases(), seed=seeds, mode=modes_, method=st.sampled_from(METHODS))
def test_ring_conv2d_matches_wraparound_reference(
    case: tuple[tuple[int, ...], tuple[int, ...], dict[str, int]],
    seed: bytes,
    mode: str,
    method: str,
) -> None:
    xs, ws, kwargs = case
    x = ring_values(seed, xs, mode)
    w = ring_values(seed[::-1], ws, mode)
    expected = np_conv2d(x, w, **kwargs)
    got = ring_conv2d(x, w, **kwargs, method=method)  # type: ignore[arg-type]
    assert got.dtype == torch.int64
    assert torch.equal(got, expected)


@pytest.mark.parametrize(
    ("xs", "ws", "kwargs"),
    [
        # LeNet-like layers
        ((2, 1, 28, 28), (16, 1, 5, 5), {}),
        ((2, 16, 12, 12), (16, 16, 5, 5), {}),
        # K = 300 * 9 = 2700 > 2048: input channels are chunked (per group)
        ((1, 300, 5, 5), (4, 300, 3, 3), {"padding": 1}),
        ((1, 600, 4, 4), (4, 300, 3, 3), {"groups": 2, "padding": 1}),
        # a kernel of 47 * 47 = 2209 taps cannot be chunked: four 16-bit limbs
        ((1, 2, 48, 49), (2, 2, 47, 47), {}),
        # unbatched input and string padding
        ((3, 9, 9), (4, 3, 3, 3), {"padding": "same"}),
    ],
)
def test_ring_conv2d_shapes(
    xs: tuple[int, ...], ws: tuple[int, ...], kwargs: dict[str, int | str]
) -> None:
    prg = PRG(b"conv-test-seed!!")
    x, w = prg.int64(xs), prg.int64(ws)
    expected = F.conv2d(x, w, **kwargs)  # torch's int64 conv, itself checked above
    if len(xs) == 4 and isinstance(kwargs.get("padding", 0), int):
        assert torch.equal(
            expected, np_conv2d(x, w, 1, kwargs.get("padding", 0), 1, kwargs.get("groups", 1))
        )
    assert torch.equal(ring_conv2d(x, w, **kwargs, method="limbs"), expected)


def test_limb_plan() -> None:
    assert _plan(1) == _plan(2048) == _widths(3) == (22, 22, 20)
    assert _plan(2049) == _plan(2**23) == _widths(4) == (16, 16, 16, 16)
    assert _plan(2**23 + 1) == _widths(5)


@pytest.mark.parametrize(
    ("xs", "ws"),
    [
        ((1, 128, 4, 4), (1, 128, 4, 4)),  # K = 2048: one chunk of three limbs
        ((1, 3, 4, 4), (1, 3, 4, 4)),  # K = 48: no chunking at all
        ((1, 1, 47, 47), (1, 1, 47, 47)),  # 2209 taps: four limbs
    ],
)
def test_ring_conv2d_extreme_limbs(xs: tuple[int, ...], ws: tuple[int, ...]) -> None:
    """Every limb product at its largest magnitude, plus odd low bits in the last one."""
    value = _extreme(_widths(3))
    x = torch.full(xs, value, dtype=torch.int64)
    x[0, -1, -1, -1] = _extreme(_widths(3), bump=1)
    w = x.reshape(ws).clone()
    assert torch.equal(ring_conv2d(x, w, method="limbs"), np_conv2d(x, w, 1, 0, 1, 1))


def test_ring_errors() -> None:
    a = torch.ones(2, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match="int64"):
        ring_matmul(a.double(), a.T)
    with pytest.raises(ValueError, match="inner dimensions"):
        ring_matmul(a, a)
    for method in METHODS:
        with pytest.raises(ValueError, match="broadcast"):
            ring_matmul(
                torch.ones(2, 2, 3, dtype=torch.int64),
                torch.ones(3, 3, 2, dtype=torch.int64),
                method=method,  # type: ignore[arg-type]
            )
    with pytest.raises(ValueError, match="method"):
        ring_matmul(a, a.T, method="fast")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 1 dim"):
        ring_matmul(torch.tensor(2), a)
    x, w = torch.ones(1, 4, 5, 5, dtype=torch.int64), torch.ones(2, 3, 3, 3, dtype=torch.int64)
    with pytest.raises(ValueError, match="channels"):
        ring_conv2d(x, w)
    with pytest.raises(TypeError, match="int64"):
        ring_conv2d(x.float(), w)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.int64])
def test_encode_never_changes_its_input(dtype):
    x = torch.tensor([1.0, -2.5, 3.25]).to(dtype)
    before = x.clone()
    encode(x, 8)
    assert torch.equal(x, before)
