"""The steps of a masked Fourier series times a shared value (the protocol:
:func:`mpc.protocols.series_product.run.series_times`): the dealer's shares of
cos k theta, sin k theta and of their products with a mask a, each party's masks, and its
local evaluation once c = x + r and e = v - a are open.

F(x) is linear in the dealer's cos k theta and sin k theta once c is open (public
coefficients P_k, Q_k of c: :func:`mpc.protocols.fourier.steps.fourier_finish`), so

    v F(x) = const v + sum_k P_k [v cos k theta] + Q_k [v sin k theta],
    [v m] = e [m] + [a m]  for each of the dealer's words m,

with e = v - a opened beside c: the dealer deals [m] and [a m] (4 K words an element), and
the product costs no round of its own.

Instance: one nonce for r (x's mask), a (v's mask), the harmonics and their products. The
dealer's shares go to the last party (the others derive theirs). The finish takes the v
that the mask step masked (bound to it), the c and e opened from that step.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math.fourier import check_series_params, harmonic_steps, ring_angle
from mpc.protocols.fourier.steps import check_coefficients, harmonic_coefficients
from mpc.protocols.rules import OPENED, dealer_seeds, nonce_of, party_seed, record, same
from mpc.protocols.sizes import WORD, declared, elementwise, numel, stream_records, tensor_elems
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_C,
    TAG_R,
    TAG_TRIG,
    consume,
    derive,
    stream,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

#: the opened masked x and v, and the dealer's material
SERIES_C, SERIES_E, DEALER_SERIES = "series.c", "series.e", "dealer.series"


def _terms(p: dict[str, Any]) -> int:
    terms = p.get("terms")
    if type(terms) is int and 1 <= terms <= 1 << 12:
        return terms
    sin = p.get("sin")
    return min(len(sin), 1 << 12) if isinstance(sin, list) else 1


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    return [seal(DEALER_SERIES, nonce_of(call), deliveries=1)]


def _dealer_size(p: dict[str, Any]) -> int:
    """The output (four words a harmonic), the masks, the angle and a harmonic's terms:
    4 K + 10 words an element."""
    return declared((4 * _terms(p) + 10) * WORD * numel(p.get("shape")))


@step(rule=_dealer_rule, size=_dealer_size, keeps=stream_records(4), makes_material=True)
def dealer_series_product(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], bits: int, terms: int,
    scale: int, single: bool,
) -> torch.Tensor:  # fmt: skip
    """The last party's shares, [2, K, *shape, 2]: of m_k = (cos k theta, sin k theta) at
    ``scale`` fractional bits (theta the angle of r modulo 2^bits), then of a m_k, r and a
    the sums of the parties' derived masks (``single``: the trigonometry in float32)."""
    check_series_params(bits, terms, scale, single)
    consume(ctx, seeds, nonce, TAG_R, TAG_A, TAG_TRIG, TAG_C)
    r = sum_derived(seeds, nonce, TAG_R, shape)
    a = sum_derived(seeds, nonce, TAG_A, shape).unsqueeze(-1)
    angle = ring_angle(r, bits, torch.float32 if single else torch.float64)
    del r
    out = torch.empty([2, terms, *shape, 2], dtype=torch.int64)
    trig_others = [stream(s, nonce, TAG_TRIG) for s in seeds[:-1]]
    prod_others = [stream(s, nonce, TAG_C) for s in seeds[:-1]]
    for k, h in enumerate(harmonic_steps(angle, terms)):
        m, am = out[0, k], out[1, k]
        m.copy_(torch.view_as_real(h).mul(2.0**scale).round_())
        torch.mul(m, a, out=am)  # (before m becomes a share)
        for other in trig_others:
            m -= other.int64(m.shape)
        for other in prod_others:
            am -= other.int64(am.shape)
    return out


# -- the parties ---------------------------------------------------------------------------


def _mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    call.share("x")
    record(call, ("series", nonce), call.share("v"))
    return [seal(SERIES_C, nonce), seal(SERIES_E, nonce)]


@step(
    rule=_mask_rule,
    size=elementwise(2.2, "x"),
    keeps=stream_records(2),
    makes_material=True,
    opens={SERIES_C: SUM, SERIES_E: SUM},
)
def series_mask(
    ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor, v: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Party i: c_i = x_i + r_i and e_i = v_i - a_i."""
    if x.shape != v.shape:
        raise ValueError(f"x {list(x.shape)} and v {list(v.shape)} differ in shape")
    consume(ctx, [seed], nonce, TAG_R, TAG_A)
    shape = list(x.shape)
    c = derive(seed, nonce, TAG_R, shape).add_(x)
    e = derive(seed, nonce, TAG_A, shape).neg_().add_(v)
    return c, e


def _finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "material")
    call.material("material", DEALER_SERIES, nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + SERIES_C, nonce, local=True, consume=True)
    call.material("e", OPENED + SERIES_E, nonce, local=True, consume=True)
    same(call, ("series", nonce), "v")
    return None


def _finish_size(p: dict[str, Any]) -> int:
    """One harmonic at a time: its terms, its two material pieces (derived or dealt) and
    the products, 14 words an element in float32 (``single``), 16 in float64."""
    words = 14 if p.get("single") is True else 16
    return declared(words * WORD * tensor_elems(p, "c"))


@step(rule=_finish_rule, size=_finish_size, keeps=stream_records(2))
def series_product_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    material: torch.Tensor | None,
    c: torch.Tensor,
    e: torch.Tensor,
    v: torch.Tensor,
    bits: int,
    const: float,
    cos: list[float],
    sin: list[float],
    coef_bits: int,
    scale: int,
    single: bool,
) -> torch.Tensor:
    """Party i's share of v F(x) at ``coef_bits + scale`` fractional bits (v an integer:
    a bit, or small enough that v F stays in the ring there), F as in :func:`mpc.protocols.fourier.steps.fourier_finish`, from the opened
    c = x + r and e = v - a, its share of v and its shares of the dealer's m_k and a m_k
    (``material``, [2, K, *x.shape, 2]: dealt at the last party, derived elsewhere)."""
    terms = check_coefficients(bits, const, cos, sin, coef_bits, scale, single)
    if c.shape != e.shape or c.shape != v.shape:
        raise ValueError(f"c {list(c.shape)}, e {list(e.shape)} and v {list(v.shape)} differ")
    piece = [*c.shape, 2]  # one harmonic's (cos, sin) pairs
    if material is not None and list(material.shape) != [2, terms, *piece]:
        raise ValueError(f"series material of shape {list(material.shape)} for {list(c.shape)}")
    consume(ctx, [seed], nonce, TAG_TRIG, TAG_C)
    trig, prods = stream(seed, nonce, TAG_TRIG), stream(seed, nonce, TAG_C)
    ee = e.unsqueeze(-1)
    out = v * round(const * 2.0 ** (coef_bits + scale))
    for k, buf in harmonic_coefficients(c, bits, cos, sin, coef_bits, single):
        m = trig.int64(piece) if material is None else material[0, k]
        am = prods.int64(piece) if material is None else material[1, k]
        buf.mul_(torch.mul(m, ee).add_(am))  # times this party's share of v m_k
        out += buf[..., 0]
        out += buf[..., 1]
    return out
