"""Exact bilinear products in the ring Z/2^64, stored as ``torch.int64`` (wrap-around).

Two functions form the seam that device-specific code may swap: :func:`ring_matmul` and
:func:`ring_conv2d`. Each equals the wrap-around int64 result of ``torch.matmul`` /
``torch.nn.functional.conv2d`` exactly, by one of two methods:

``"int64"``
    torch's own int64 kernels. Exact (two's complement wrap-around) and, on CPU with torch
    2.13, faster than the limb method: single-threaded, an int64 GEMM costs ~4-5 float64
    GEMMs and an int64 convolution ~2-3 float64 ones, while the limb method needs 6 of them
    plus conversions (about 2x and 3-5x slower than int64 overall). CUDA has no int64 GEMM.

``"limbs"``
    float64 BLAS on small signed limbs, for devices without integer GEMM. Every ring element
    ``v`` is written mod 2^64 as ``v = sum_i d_i * 2**o_i`` with signed digits
    ``d_i in [-2**(w_i-1), 2**(w_i-1))`` (offsets ``o_i``, widths ``w_i``, ``L`` limbs). Then
    ``A @ B = sum_{i,j} (D_i @ E_j) * 2**(o_i+o_j)  (mod 2^64)``, and pairs with
    ``o_i + o_j >= 64`` vanish mod 2^64. With ``w = ceil(64/L)`` for the lower limbs exactly
    ``L(L+1)/2`` pairs remain (``i + j < L``). A float64 product ``D_i @ E_j`` is exact when
    every partial sum stays an integer of magnitude ``<= 2**53``; each term is at most
    ``2**(2w-2)`` in magnitude, so it is exact for inner dimension
    ``K <= 2**(55 - 2w)``: ``L = 3`` (w = 22) up to K = 2048, ``L = 4`` (w = 16) up to
    K = 2**23. Signed digits give 4x the K of unsigned ones (``2**(2w)`` per term). Larger
    inner dimensions are split into chunks of at most 2048 that are summed in int64 (6 GEMMs
    per chunk beat 10 for ``L = 4``); only a convolution whose kernel alone has more than
    2048 taps falls back to more limbs. The float64 results are converted back with
    ``.to(torch.int64)`` (exact below 2**53) and combined with wrap-around shifts and adds.
    The limbs of one operand are stacked (the rows of ``a`` for matmul, the output channels
    of ``w`` for conv), so the ``L(L+1)/2`` products take ``L`` BLAS calls.

Exactness of the limb method rests on the backend computing ``D_i @ E_j`` as sums of exact
products (true of BLAS GEMM and of im2col/GEMM convolution; not of FFT or Winograd
convolution, which is why cuDNN is disabled for the limb convolution off the CPU).
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

__all__ = ["ring_conv2d", "ring_matmul"]

Method = Literal["auto", "int64", "limbs"]
IntPair = int | tuple[int, int]

_FLOAT_MANTISSA = 53  # float64 represents every integer of magnitude <= 2**53
_CHUNK_K = 2048  # the largest inner dimension that three 22-bit limbs keep exact


def _widths(n_limbs: int) -> tuple[int, ...]:
    """Limb widths: ``ceil(64/L)`` bits for the lower limbs, the rest for the top one."""
    w = -(-64 // n_limbs)
    return (w,) * (n_limbs - 1) + (64 - w * (n_limbs - 1),)


def _max_k(widths: tuple[int, ...]) -> int:
    """The largest inner dimension for which every kept limb product is exact in float64."""
    offsets = _offsets(widths)
    worst = max(
        (wi - 1) + (wj - 1)
        for i, wi in enumerate(widths)
        for j, wj in enumerate(widths)
        if offsets[i] + offsets[j] < 64
    )
    return 2 ** (_FLOAT_MANTISSA - worst)


def _offsets(widths: tuple[int, ...]) -> tuple[int, ...]:
    out, o = [], 0
    for w in widths:
        out.append(o)
        o += w
    return tuple(out)


def _plan(k: int) -> tuple[int, ...]:
    """The fewest limbs (at least 3) whose products stay exact for inner dimension ``k``."""
    n = 3
    while _max_k(_widths(n)) < k:
        n += 1
    return _widths(n)


def _as_int64_scalar(shift: int) -> int:
    """``2**shift`` as the int64 value congruent to it mod 2^64."""
    v = 1 << shift
    return v - (1 << 64) if v >= 1 << 63 else v


def _split_into(v: torch.Tensor, widths: tuple[int, ...], out: list[torch.Tensor]) -> None:
    """Write the signed limbs of ``v`` (float64) into the tensors of ``out``, one per limb.

    With ``bias = sum_{i<top} 2**(o_i + w_i - 1)``, the unsigned fields ``u_i`` of ``v + bias``
    give the signed digits ``d_i = u_i - 2**(w_i - 1)``; the top digit is the arithmetic shift
    ``(v + bias) >> o_top``, which is congruent mod 2^64.
    """
    offsets = _offsets(widths)
    bias = sum(1 << (o + w - 1) for o, w in zip(offsets[:-1], widths[:-1]))  # < 2**63
    vb = v + bias
    for o, w, dst in zip(offsets[:-1], widths[:-1], out[:-1]):
        field = (vb >> o) if o else vb
        dst.copy_(field & ((1 << w) - 1))
        dst.sub_(float(1 << (w - 1)))
    out[-1].copy_(vb >> offsets[-1])


def _limb_matmul(a: torch.Tensor, b: torch.Tensor, widths: tuple[int, ...]) -> torch.Tensor:
    """``a @ b`` mod 2^64 for int64 ``a`` (at least 2-D) and ``b`` (at least 2-D), by limbs.

    The limbs of ``a`` are stacked along the rows, so the products with limb ``j`` of ``b``
    (the pairs ``i < L - j``) are one GEMM on a prefix of the stacked rows.
    """
    n, offsets, rows = len(widths), _offsets(widths), a.shape[-2]
    a_limbs = torch.empty(
        (*a.shape[:-2], n * rows, a.shape[-1]), dtype=torch.float64, device=a.device
    )
    _split_into(a, widths, list(a_limbs.split(rows, dim=-2)))
    b_limbs = [torch.empty(b.shape, dtype=torch.float64, device=b.device) for _ in widths]
    _split_into(b, widths, b_limbs)
    acc: torch.Tensor | None = None
    for j in range(n):
        keep = n - j  # pairs (i, j) with o_i + o_j < 64 are exactly i < n - j
        prod = torch.matmul(a_limbs.narrow(-2, 0, keep * rows), b_limbs[j]).to(torch.int64)
        for i, block in enumerate(prod.split(rows, dim=-2)):
            if acc is None:
                acc = block.clone()
            else:
                acc.add_(block, alpha=_as_int64_scalar(offsets[i] + offsets[j]))
    assert acc is not None
    return acc


def _limb_conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    conv: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    groups: int,
    widths: tuple[int, ...],
) -> torch.Tensor:
    """``conv(x, w)`` mod 2^64 for int64 4-D ``x`` and ``w``, by limbs.

    The limbs of ``w`` are stacked along the output channels of each group, so the products
    with limb ``i`` of ``x`` (the pairs ``j < L - i``) are one convolution, which unfolds
    ``x`` once. (Stacking ``x`` along the batch instead was 2-9x slower on CPU.)
    """
    n, offsets = len(widths), _offsets(widths)
    c_out, cg, kh, kw = w.shape
    cog = c_out // groups
    x_limbs = [torch.empty(x.shape, dtype=torch.float64, device=x.device) for _ in widths]
    _split_into(x, widths, x_limbs)
    w_limbs = torch.empty((groups, n, cog, cg, kh, kw), dtype=torch.float64, device=w.device)
    _split_into(w.reshape(groups, cog, cg, kh, kw), widths, list(w_limbs.unbind(1)))
    acc: torch.Tensor | None = None
    for i in range(n):
        keep = n - i
        w_i = w_limbs[:, :keep].reshape(groups * keep * cog, cg, kh, kw)
        prod = conv(x_limbs[i], w_i).to(torch.int64)
        batch, _, ho, wo = prod.shape
        prod = prod.view(batch, groups, keep, cog, ho, wo)
        for j in range(keep):
            block = prod[:, :, j]
            if acc is None:
                acc = block.reshape(batch, c_out, ho, wo)
            else:
                acc.view(batch, groups, cog, ho, wo).add_(
                    block, alpha=_as_int64_scalar(offsets[i] + offsets[j])
                )
    assert acc is not None
    return acc


def _resolve(method: str, device: torch.device) -> str:
    if method not in ("auto", "int64", "limbs"):
        raise ValueError(f"method must be 'auto', 'int64' or 'limbs', got {method!r}")
    if method == "auto":
        return "int64" if device.type == "cpu" else "limbs"
    return method


def _check_ring(name: str, t: object) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int64:
        raise TypeError(f"{name} must hold int64 ring elements, got dtype {t.dtype}")


def _check_same_device(a: torch.Tensor, b: torch.Tensor) -> None:
    if a.device != b.device:
        raise ValueError(f"operands are on different devices: {a.device} and {b.device}")


_COLUMNS_FROM = 16  # rows of ``a`` from which ``b`` may be laid out anew first
_MV_FROM = 1 << 15  # multiply-adds from which fewer rows may go through torch.mv one by one
_RELAYOUT_FROM = 1 << 20  # multiply-adds from which ``b`` may be laid out anew


def _rows_by_mv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for a 2-D ``b``, one ``torch.mv(b.T, row)`` per row of ``a`` (its batch
    dimensions folded into the rows), written into one output tensor."""
    k, n = b.shape
    flat = a.reshape(-1, k)
    out = torch.empty((flat.shape[0], n), dtype=torch.int64, device=a.device)
    bt = b.t()
    for i in range(flat.shape[0]):
        torch.mv(bt, flat[i], out=out[i])
    return out.view(*a.shape[:-1], n)


def _relaid(b: torch.Tensor) -> torch.Tensor:
    """``b`` with the other memory layout of its last two dimensions (row-major becomes
    column-major, anything else row-major), same values."""
    if b.stride(-1) == 1:
        return b.transpose(-1, -2).contiguous().transpose(-1, -2)
    return b.contiguous()


def _seconds(fn: Callable[[], Any], runs: int = 3) -> float:
    """The fastest of ``runs`` timed calls of ``fn`` (after one untimed)."""
    fn()
    best = float("inf")
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@dataclass(frozen=True)
class Speeds:
    """This CPU's speed of torch's int64 products (no BLAS: a plain kernel) with a ``b``
    of one memory layout, in seconds per multiply-add (``copy``: per element of ``b``)."""

    many: float  # torch.matmul, 64 rows of ``a``
    one: float  # torch.matmul, one row
    mv: float  # torch.mv, one row
    copy: float  # laying ``b`` out the other way
    limbs: float = float("inf")  # the float64 limb method (BLAS), 64 rows of ``a``


@functools.cache
def measured_speeds(row_major: bool) -> Speeds:
    """:class:`Speeds` for a row-major ``b`` (or a column-major one), measured once per
    process on products of a typical size (about 40-100 ms in all), then kept. Which way is
    fastest differs by CPU, by 2 to 13 times either way, so it is measured, not assumed
    (one thread: (128, 768) x (768, 3072) with ``b`` copied column-major first was 2.4x
    faster on one machine of this project and 2.3x slower on another; one row times a
    row-major (768, 768) by ``torch.mv``, 4x faster on the first and 1.8x slower on the
    second), and so does the float64 limb method against the int64 kernel (:func:`_limbs_pay`).
    Timing only picks the way: every way gives the same wrap-around sums. The
    measurement holds about 35 MB for a moment, once per process (not counted in any
    step's declared temporaries: tests/test_limits_memory.py measures after it)."""
    rows, k, n = 64, 768, 1024
    a = torch.arange(rows * k, dtype=torch.int64).view(rows, k).mul_(0x9E3779B97F4A7C15 >> 2)
    b = torch.arange(k * n, dtype=torch.int64).view(k, n).mul_(0x632BE59BD9B4E019 >> 2)
    if not row_major:
        b = _relaid(b)
    row = a[:1]
    return Speeds(
        many=_seconds(lambda: torch.matmul(a, b)) / (rows * k * n),
        one=_seconds(lambda: torch.matmul(row, b)) / (k * n),
        mv=_seconds(lambda: _rows_by_mv(row, b)) / (k * n),
        copy=_seconds(lambda: _relaid(b)) / (k * n),
        # the limbs copy ``b`` into new float64 limbs whatever its layout: measured once
        limbs=(
            _seconds(lambda: _limb_matmul(a, b, _plan(k))) / (rows * k * n)
            if row_major
            else measured_speeds(True).limbs
        ),
    )


def speeds_measured() -> bool:
    """Whether :func:`measured_speeds` has measured both layouts in this process (the
    first large product does): what :func:`limbs_pay` and :func:`relayout_pays` decide
    is then known without measuring."""
    return measured_speeds.cache_info().currsize >= 2


_LIMBS_MARGIN = 0.7  # the limb method is taken where it measured at most this times int64's


def limbs_pay(rows: int, b_shape: tuple[int, ...], b_row_major: bool) -> bool:
    """Whether a large CPU product of ``rows`` rows of ``a`` (at least
    :data:`_COLUMNS_FROM` rows and :data:`_RELAYOUT_FROM` multiply-adds, ``b`` of
    ``b_shape`` a matrix or a batch of them) is faster by float64 limbs than by torch's
    int64 kernel on this CPU, as measured. CPUs differ by 20 times here: one machine of
    this project ran (128, 768) x (768, 768) in 10 ms by the int64 kernel, another in
    150-260 ms, where the limbs took 30 ms (BLAS is fast on both). The limbs' temporaries
    are larger (see :func:`mpc.protocols.sizes.bilinear`)."""
    if len(b_shape) < 2 or b_shape[-1] < 2:
        return False
    if rows < _COLUMNS_FROM or rows * b_shape[-2] * b_shape[-1] < _RELAYOUT_FROM:
        return False
    here, other = measured_speeds(b_row_major), measured_speeds(not b_row_major)
    return here.limbs < _LIMBS_MARGIN * min(here.many, other.many)


def _limbs_pay(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.device.type != "cpu":
        return False
    rows = a.numel() // max(a.shape[-1], 1)
    return limbs_pay(rows, tuple(b.shape), b.dim() >= 2 and b.stride(-1) == 1)


def relayout_pays(a_shape: tuple[int, ...], b_shape: tuple[int, ...], b_row_major: bool) -> bool:
    """Whether torch's int64 product of an ``a`` of ``a_shape`` by a ``b`` of ``b_shape``
    (on CPU) copies ``b`` to the other layout first (:func:`_int64_matmul`): where
    :func:`measured_speeds` says that pays for the rows that read each matrix of ``b``."""
    if len(a_shape) < 2 or len(b_shape) < 2 or b_shape[-1] <= 1 or b_shape[-2] <= 1:
        return False
    rows = math.prod(a_shape) // max(a_shape[-1], 1)
    if len(b_shape) == 2 and rows < _COLUMNS_FROM:
        return False  # (fewer rows: torch's matmul or torch.mv, b as it is)
    per_b = rows if len(b_shape) == 2 else a_shape[-2]  # rows that read each matrix of b
    if per_b * math.prod(b_shape) < _RELAYOUT_FROM:
        return False
    here, other = measured_speeds(b_row_major), measured_speeds(not b_row_major)
    return per_b * (here.many - other.many) > here.copy


# a kept operand is laid out anew where its products measured at most this times as long
# that way: measured on a (768, 1024) ``b`` that stays in cache, the gain is larger on a
# model's weights (one machine of this project: 0.61 measured, 0.45-0.55 on GPT-2's)
_SETTLE_MARGIN = 0.75
COLUMNS_FROM = _COLUMNS_FROM  # (public: the rows from which no operand is settled)


def _few_rows_cost(rows: int, n: int, speeds: Speeds) -> float:
    """Seconds per element of a 2-D ``b`` of ``n`` elements that :func:`_int64_matmul`
    takes for ``rows`` (fewer than :data:`_COLUMNS_FROM`) rows of ``a`` in the layout
    that ``speeds`` was measured for."""
    if rows * n >= _MV_FROM and rows * speeds.mv < speeds.one:
        return rows * speeds.mv
    return speeds.one


def settle_pays(rows: int, b_shape: tuple[int, ...], b_row_major: bool) -> bool:
    """Whether products of ``rows`` rows (fewer than :data:`_COLUMNS_FROM`: a decoding
    step's) by a 2-D ``b`` of ``b_shape`` are faster on this CPU, as measured, with ``b``
    in the other memory layout, by a margin that repays laying it out anew once
    (:func:`settle_layout`)."""
    if len(b_shape) != 2 or min(b_shape) <= 1 or not 0 < rows < _COLUMNS_FROM:
        return False
    n = math.prod(b_shape)
    if rows * n < _MV_FROM:
        return False
    here = _few_rows_cost(rows, n, measured_speeds(b_row_major))
    there = _few_rows_cost(rows, n, measured_speeds(not b_row_major))
    return there < _SETTLE_MARGIN * here


def settle_layout(b: torch.Tensor, rows: int) -> bool:
    """Lay the 2-D int64 ``b`` out anew, in place (same object, same values, the other of
    row-major and column-major; its old memory is freed where nothing else uses it),
    where :func:`settle_pays` says products of ``rows`` rows by it are faster that way:
    for an operand kept across many such products, such as a fixed weight's mask in the
    one-row products of decoding (one row times a row-major weight runs about 2x slower
    than ``torch.mv`` on a column-major one on CPUs measured in this project). True if
    it did. Exact: only the layout changes."""
    if b.device.type != "cpu" or b.dim() != 2 or b.dtype != torch.int64:
        return False
    row_major, col_major = b.is_contiguous(), b.t().is_contiguous()
    if row_major == col_major:  # a strided view (or one row or column): left as it is
        return False
    if not settle_pays(rows, tuple(b.shape), row_major):
        return False
    b.data = _relaid(b)
    return True


def _int64_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``torch.matmul`` of int64 tensors, in the way :func:`measured_speeds` says is
    fastest on this CPU for ``b``'s layout and ``a``'s rows: with fewer than
    :data:`_COLUMNS_FROM` rows and a 2-D ``b`` (a decoding step's products: one token's
    row times a weight), torch's matmul or one ``torch.mv`` with ``b``'s transpose per row
    (torch's matmul reads ``b`` whole whatever the rows, ``torch.mv`` once per row); with
    more, ``b`` as it is or copied to the other layout first (the copy pays where the
    rows are many). Exact either way (wrap-around sums)."""
    if a.device.type != "cpu" or b.dim() < 2 or not a.numel() or not b.numel():
        return torch.matmul(a, b)
    row_major = b.stride(-1) == 1
    rows = a.numel() // a.shape[-1]
    if b.dim() == 2 and rows < _COLUMNS_FROM:
        if rows * b.numel() >= _MV_FROM:
            speeds = measured_speeds(row_major)
            if rows * speeds.mv < speeds.one:
                return _rows_by_mv(a, b)
    elif relayout_pays(tuple(a.shape), tuple(b.shape), row_major):
        b = _relaid(b)
    return torch.matmul(a, b)


def ring_matmul(a: torch.Tensor, b: torch.Tensor, *, method: Method = "auto") -> torch.Tensor:
    """``torch.matmul(a, b)`` over Z/2^64 for int64 ``a`` and ``b``, exactly.

    Same shape rules as ``torch.matmul`` (1-D, 2-D, batched with broadcasting). ``method``
    is ``"int64"`` (torch's int64 kernel), ``"limbs"`` (float64 limb split) or ``"auto"``
    (``"int64"`` on CPU unless this CPU measured the limbs faster for a product this large,
    :func:`_limbs_pay`; ``"limbs"`` elsewhere).
    """
    _check_ring("a", a)
    _check_ring("b", b)
    _check_same_device(a, b)
    if a.dim() == 0 or b.dim() == 0:
        raise ValueError(
            f"ring_matmul needs tensors of at least 1 dim, got {a.dim()}-D and {b.dim()}-D"
        )
    k = a.shape[-1]
    kb = b.shape[0] if b.dim() == 1 else b.shape[-2]
    if k != kb:
        raise ValueError(
            f"ring_matmul inner dimensions differ: a {tuple(a.shape)} and b {tuple(b.shape)}"
        )
    a2 = a.unsqueeze(0) if a.dim() == 1 else a
    b2 = b.unsqueeze(-1) if b.dim() == 1 else b
    try:
        batch = torch.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    except RuntimeError as e:
        raise ValueError(
            f"ring_matmul batch dimensions do not broadcast: a {tuple(a.shape)} and b "
            f"{tuple(b.shape)}"
        ) from e
    if _resolve(method, a.device) == "int64" and not (method == "auto" and _limbs_pay(a2, b2)):
        return _int64_matmul(a, b)

    if k <= _CHUNK_K:
        out = _limb_matmul(a2, b2, _plan(k))
    else:
        out = torch.zeros((*batch, a2.shape[-2], b2.shape[-1]), dtype=torch.int64, device=a.device)
        n_chunks = -(-k // _CHUNK_K)
        step = -(-k // n_chunks)
        widths = _plan(step)
        for k0 in range(0, k, step):
            k1 = min(k, k0 + step)
            out += _limb_matmul(a2[..., k0:k1], b2[..., k0:k1, :], widths)
    if b.dim() == 1:
        out = out.squeeze(-1)
    if a.dim() == 1:
        out = out.squeeze(-2 if b.dim() > 1 else -1)
    return out


def ring_conv2d(
    x: torch.Tensor,
    w: torch.Tensor,
    stride: IntPair = 1,
    padding: IntPair | str = 0,
    dilation: IntPair = 1,
    groups: int = 1,
    *,
    method: Method = "auto",
) -> torch.Tensor:
    """``torch.nn.functional.conv2d(x, w, None, stride, padding, dilation, groups)`` over
    Z/2^64 for int64 ``x`` and ``w``, exactly. No bias: add it separately.

    ``x`` is ``(N, C, H, W)`` or unbatched ``(C, H, W)``; ``w`` is ``(C_out, C/groups, kh,
    kw)``. ``method`` is as for :func:`ring_matmul`.
    """
    _check_ring("x", x)
    _check_ring("w", w)
    _check_same_device(x, w)
    if x.dim() not in (3, 4) or w.dim() != 4:
        raise ValueError(
            f"ring_conv2d expects x (N, C, H, W) or (C, H, W) and w (C_out, C/groups, kh, kw), "
            f"got x {tuple(x.shape)} and w {tuple(w.shape)}"
        )
    if groups < 1 or x.shape[-3] != w.shape[1] * groups or w.shape[0] % groups:
        raise ValueError(
            f"ring_conv2d channels do not match: x {tuple(x.shape)}, w {tuple(w.shape)}, "
            f"groups={groups}"
        )

    def conv(xf: torch.Tensor, wf: torch.Tensor) -> torch.Tensor:
        return F.conv2d(xf, wf, None, stride, padding, dilation, groups)

    if _resolve(method, x.device) == "int64":
        return conv(x, w)

    unbatched = x.dim() == 3
    x4 = x.unsqueeze(0) if unbatched else x
    n, _, h, wd = x4.shape
    cg, taps = w.shape[1], w.shape[2] * w.shape[3]
    # chunk the input channels of every group so that each chunk's K is at most _CHUNK_K
    per_chunk = max(1, min(cg, _CHUNK_K // max(taps, 1)))
    n_chunks = -(-cg // per_chunk) if cg else 1
    per_chunk = -(-cg // n_chunks) if cg else 0
    widths = _plan(per_chunk * taps)

    # cuDNN may pick FFT/Winograd algorithms, which are not exact; use im2col + GEMM
    exact_algorithms = (
        torch.backends.cudnn.flags(enabled=False)
        if x.device.type == "cuda"
        else contextlib.nullcontext()
    )
    with exact_algorithms:
        if n_chunks == 1:
            out = _limb_conv2d(x4, w, conv, groups, widths)
        else:
            xg = x4.reshape(n, groups, cg, h, wd)

            def chunk(c0: int) -> torch.Tensor:
                c1 = min(cg, c0 + per_chunk)
                xc = xg[:, :, c0:c1].reshape(n, groups * (c1 - c0), h, wd)
                return _limb_conv2d(xc, w[:, c0:c1], conv, groups, widths)

            out = chunk(0)
            for c0 in range(per_chunk, cg, per_chunk):
                out.add_(chunk(c0))
    return out.squeeze(0) if unbatched else out


def ring_bilinear(
    op: str, params: dict[str, Any], a: torch.Tensor, b: torch.Tensor
) -> torch.Tensor:
    """The ring (Z/2^64) version of the bilinear ``op`` (mul, matmul, conv2d) on int64
    tensors: the products Beaver triples serve."""
    if op == "mul":
        return torch.mul(a, b)
    if op == "matmul":
        return ring_matmul(a, b)
    if op == "conv2d":
        return ring_conv2d(
            a,
            b,
            stride=tuple(params["stride"]),
            padding=tuple(params["padding"]),
            dilation=tuple(params["dilation"]),
            groups=int(params["groups"]),
        )
    raise ValueError(f"unknown bilinear op {op!r}")
