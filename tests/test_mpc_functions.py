"""Non-linear functions on shared values (issue 13): property tests against float64 torch.

Tolerances follow from each method's error bound (docs/secret-sharing.md, "Non-linear
functions"), with U = 2^-16 the fixed-point unit and ENC = U / 2 the encoding error of
an input: the function's own approximation error (the fit's bound, with a 2x margin for
the fixed-point arithmetic inside it), plus the input's encoding error times the
function's derivative (ENC |f'(x)|), plus one output unit. Saturation outside a domain
is tested at the edges.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch import nn

import mpc
from mpc.protocols.fourier import run as trig

U = 2.0**-16
ENC = U / 2
HI = 2.0**-24  # unit of the 24-bit outputs (exp, reciprocal)
PROPS = settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def share(t: torch.Tensor, group: tuple[list[Any], Any]) -> mpc.SharedTensor:
    return mpc.share(t, *group[0], crypto_provider=group[1])


def values(lo: float, hi: float, n: int = 12) -> st.SearchStrategy[torch.Tensor]:
    """n floats in [lo, hi], always including both edges."""
    inner = st.lists(st.floats(lo, hi, allow_nan=False), min_size=n, max_size=n)
    return inner.map(lambda v: torch.tensor([lo, hi, *v], dtype=torch.float64))


def run(fn: Callable[[Any], Any], x: torch.Tensor, group: Any) -> torch.Tensor:
    return fn(share(x.float(), group)).get().double()


def assert_within(got: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> None:
    err = (got - ref).abs()
    assert bool((err <= bound).all()), (
        f"max excess {(err - bound).max().item():.3g}; worst at x-index "
        f"{int((err - bound).argmax())}: got {got.flatten()[int((err - bound).argmax())]}"
    )


# -- exp, log, reciprocal, sqrt, rsqrt ----------------------------------------------------


@PROPS
@given(x=values(-16.0, 11.0))
def test_exp(x: torch.Tensor, group: Any) -> None:
    # polynomial: relative 1e-4 (degree 8 on bins of 8 in log2 units); input: ENC * e^x;
    # output unit 2^-24
    ref = torch.exp(x)
    assert_within(run(torch.exp, x, group), ref, ref * (2e-4 + ENC) + 4 * HI)


def test_exp_saturates(group: Any) -> None:
    x = torch.tensor([-40.0, -17.0, 11.2, 30.0])
    got = run(torch.exp, x, group)
    assert torch.allclose(
        got, torch.tensor([0.0, 0.0, 2.0**16, 2.0**16], dtype=torch.float64), atol=1e-6
    )


@PROPS
@given(x=values(0.01, 60000.0))
def test_log(x: torch.Tensor, group: Any) -> None:
    # polynomial: absolute 5.4e-5 (+ its evaluation at 2^-24); input: ENC / x
    assert_within(run(torch.log, x, group), torch.log(x), 1.5e-4 + ENC / x + U)


def test_log_saturates(group: Any) -> None:
    got = run(torch.log, torch.tensor([0.0, -3.0, 1e-6, 70000.0]), group)
    want = torch.tensor([-16, -16, -16, 16], dtype=torch.float64) * math.log(2)
    assert torch.allclose(got, want, atol=2e-4)


@PROPS
@given(x=values(2.0**-12, 4000.0), neg=st.booleans())
def test_reciprocal(x: torch.Tensor, neg: bool, group: Any) -> None:
    # Goldschmidt: relative eps^8 <= 6e-6; input: ENC / x^2
    x = -x if neg else x
    ref = 1 / x
    bound = ref.abs() * 2e-5 + ENC / x**2 + 4 * HI
    assert_within(run(torch.reciprocal, x, group), ref, bound)


def test_reciprocal_saturates(group: Any) -> None:
    got = run(torch.reciprocal, torch.tensor([0.0, 10000.0, -10000.0]), group)
    want = torch.tensor([4096.0, 2.0**-12, -(2.0**-12)], dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-4, atol=4 * HI)


@PROPS
@given(x=values(2.0**-14, 60000.0))
def test_rsqrt_sqrt(x: torch.Tensor, group: Any) -> None:
    # Newton-Raphson: relative 1e-6 after two steps; input: ENC |f'|
    r = torch.rsqrt(x)
    assert_within(run(torch.rsqrt, x, group), r, r * 4e-5 + ENC * r / x + 2**-20)
    s = torch.sqrt(x)
    assert_within(run(torch.sqrt, x, group), s, s * 4e-5 + ENC * r + 2 * U)


def test_sqrt_of_zero_and_rsqrt_saturation(group: Any) -> None:
    assert run(torch.sqrt, torch.tensor([0.0]), group).abs().item() <= U
    assert run(torch.rsqrt, torch.tensor([0.0]), group).item() == pytest.approx(2**7, rel=1e-4)


@PROPS
@given(a=values(-5.0, 5.0), b=values(0.5, 10.0))
def test_division_by_shared(a: torch.Tensor, b: torch.Tensor, group: Any) -> None:
    got = (share(a.float(), group) / share(b.float(), group)).get().double()
    # reciprocal's relative 2e-5 times |a / b|, the inputs' encoding, one truncation
    ref = a / b
    assert_within(got, ref, ref.abs() * 2e-5 + ENC * (1 / b + a.abs() / b**2) + U)


# -- piecewise polynomials ----------------------------------------------------------------

# fit error bound (measured on a fine grid when the bins are fitted) and the derivative's max;
# each is a polynomial per wide bin and saturates outside them
PIECEWISE = [
    ("tanh", torch.tanh, -7.0, 7.0, 2.47e-4, 1.0),  # saturation at +-4.5
]


@pytest.mark.parametrize("name,fn,lo,hi,fit,slope", PIECEWISE, ids=[p[0] for p in PIECEWISE])
def test_piecewise(
    name: str, fn: Any, lo: float, hi: float, fit: float, slope: float, group: Any
) -> None:
    @PROPS
    @given(x=values(lo, hi, 20))
    def prop(x: torch.Tensor) -> None:
        # fit error x 2 (the cubic's fixed-point rounding), input encoding, one unit
        assert_within(run(fn, x, group), fn(x), 2 * fit + ENC * slope + 2 * U)

    prop()


# sigmoid: a Fourier series of x clamped to [-10, 10] (mpc.protocols.fourier.run.sigmoid): the
# series' fit error on [-10, 10] (measured when it is fitted), 1 - sigmoid(10) past the
# clamp, the fixed point (evaluated in float32: harmonics ~k 2^-24 relative times the
# coefficients' sum of ~10, the products' rounding; 2e-5 in all), the input's encoding
# times sigmoid's slope 1/4, and the output unit with the truncation's
SIGMOID_BOUND = (
    trig.SIGMOID_SERIES.max_error
    + (1 - 1 / (1 + math.exp(trig.SIGMOID_CLAMP)))
    + 2e-5
    + ENC / 4
    + 2 * U
)


@PROPS
@given(x=values(-30.0, 30.0, 30))
def test_sigmoid(x: torch.Tensor, group: Any) -> None:
    assert_within(run(torch.sigmoid, x, group), torch.sigmoid(x), torch.full_like(x, SIGMOID_BOUND))


def test_sigmoid_saturates_outside_its_clamp(group: Any) -> None:
    c = trig.SIGMOID_CLAMP
    x = torch.tensor([-1e4, -100.0, -c - U, -c, -c + U, 0.0, c - U, c, c + U, 100.0, 1e4])
    got = run(torch.sigmoid, x, group)
    assert_within(got, torch.sigmoid(x.double()), torch.full_like(got, SIGMOID_BOUND))
    # past the clamp every input reads as +-10: the same value as at the edge, up to the
    # fixed point's noise, never anything of the periodic series' other half-period
    assert (got[:3] - got[3]).abs().max() <= 4 * U and (got[-3:] - got[-4]).abs().max() <= 4 * U
    assert bool((got[:3] < 2e-4).all()) and bool((got[-3:] > 1 - 2e-4).all())


# GELU and SiLU: a Fourier series of x clamped to [-T, T] plus relu(x - T)
# (mpc.protocols.fourier.run.relu_like): the fit error, the function's distance from 0 or x
# past the clamp (GELU: 5 Phi(-5) = 1.4e-6; SiLU: 12 sigmoid(-12) = 7.4e-5), the fixed
# point as sigmoid's (float32 harmonics, coefficients summing to ~7 for GELU, ~16 for
# SiLU: 2e-5 and 4e-5), the input's encoding times the largest slope (1.13, 1.1), the
# output unit
RELU_LIKE = [
    ("gelu", F.gelu, trig.GELU_SERIES, 1.5e-6 + 2e-5),
    ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"), trig.GELU_TANH_SERIES, 1.5e-6 + 2e-5),
    ("silu", F.silu, trig.SILU_SERIES, 7.4e-5 + 4e-5),
]


def _relu_like_bound(series: Any, extra: float) -> float:
    return series.max_error + extra + ENC * 1.13 + 2 * U


@pytest.mark.parametrize("name,fn,series,extra", RELU_LIKE, ids=[g[0] for g in RELU_LIKE])
def test_relu_like(name: str, fn: Any, series: Any, extra: float, group: Any) -> None:
    @PROPS
    @given(x=values(-40.0, 40.0, 30))
    def prop(x: torch.Tensor) -> None:
        assert_within(run(fn, x, group), fn(x), torch.full_like(x, _relu_like_bound(series, extra)))

    prop()


@pytest.mark.parametrize("name,fn,series,extra", RELU_LIKE, ids=[g[0] for g in RELU_LIKE])
def test_relu_like_at_and_past_its_clamp(
    name: str, fn: Any, series: Any, extra: float, group: Any
) -> None:
    """At the clamp's edges and far past them the function is right: 0 far below (never a
    value of the periodic series' other half-period), x far above."""
    c = series.half_width
    x = torch.tensor([-1e4, -100.0, -c - U, -c, -c + U, 0.0, c - U, c, c + U, 100.0, 1e4])
    got = run(fn, x, group)
    bound = _relu_like_bound(series, extra)
    assert_within(got, fn(x.double()), torch.full_like(got, bound))
    # far below: exactly 0, the function's limit (the series' factor [x >= -T] is 0
    # there); far above: the value at T plus x - T exactly (the result reads back as
    # float32)
    assert bool((got[:2] == 0).all())
    far = x[-2:].double()
    assert bool(((got[-2:] - got[7] - (far - c)).abs() <= 4 * U + far * 2.0**-23).all())


def test_softmax_clamps_far_below_the_max(group: Any) -> None:
    # x - max below -16 reads as -16: e^-16 = 1.1e-7 instead of 0, never garbage
    x = torch.tensor([[0.0, -15.0, -17.0, -1000.0, -1e5]])
    got = run(lambda t: torch.softmax(t, -1), x, group)
    assert_within(got, torch.softmax(x.double(), -1), torch.full((1, 5), 1e-6 + 2 * U))


def test_tanh_keeps_the_sign_of_tiny_outputs(group: Any) -> None:
    x = torch.tensor([-3 * U, -U, 0.0, U, 3 * U])
    got = run(torch.tanh, x, group)
    assert (torch.sign(got) == torch.sign(x.double())).all(), got


@PROPS
@given(data=st.data())
def test_softmax_log_softmax(data: st.DataObject, group: Any) -> None:
    k = data.draw(st.integers(1, 40))
    dim = data.draw(st.sampled_from([0, 1, -1]))
    scale = data.draw(st.sampled_from([0.1, 2.0, 8.0]))
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(k)).double() * scale
    x = x.transpose(0, 1) if dim == 0 else x
    # exp on x - max <= 0 by squaring: 32 x 6.3e-7 relative (the polynomial) + a few
    # units of 2^-24 on each term and on the sum, reciprocal 2e-5: about 5e-5 relative, on
    # values <= 1, and e^-16 for terms clamped at -16; the max subtraction is exact
    assert_within(
        run(lambda t: torch.softmax(t, dim), x, group),
        torch.softmax(x, dim),
        torch.full_like(x, 5e-4),
    )
    # ln(sum) off by 2e-4 (relative error of the sum) + 1.5e-4 (log's polynomial)
    assert_within(
        run(lambda t: torch.log_softmax(t, dim), x, group),
        torch.log_softmax(x, dim),
        torch.full_like(x, 5e-4),
    )


# -- pow, abs, sign, clamp, where -----------------------------------------------------------


@PROPS
@given(x=values(-6.0, 6.0))
def test_pow_abs_sign_clamp(x: torch.Tensor, group: Any) -> None:
    x = x.float().double()  # the value shared
    s = share(x.float(), group)
    # x^n from products: the input's error times n |x|^(n-1), one unit per product
    assert_within((s**2).get().double(), x**2, ENC * 2 * x.abs() + 2 * U)
    assert_within((s**3).get().double(), x**3, ENC * 3 * x**2 + 4 * U * (1 + x.abs()))
    assert_within(s.abs().get().double(), x.abs(), torch.full_like(x, ENC))
    # the sign of the encoded value, exactly
    assert torch.equal(s.sign().get().double(), torch.sign(torch.round(x / U)))
    assert_within(s.clamp(-1.5, 2.0).get().double(), x.clamp(-1.5, 2.0), torch.full_like(x, U))
    assert_within(F.hardtanh(s).get().double(), F.hardtanh(x), torch.full_like(x, U))


def test_where_with_shared_condition(group: Any) -> None:
    a, b = torch.randn(5), torch.randn(5)
    sa, sb = share(a, group), share(b, group)
    got = torch.where(sa > sb, sa, sb).get()
    assert torch.allclose(got, torch.maximum(a, b), atol=U)
    got = torch.where(sa > 0, 1.0, -1.0).get()
    assert torch.equal(got, torch.where(a > 0, 1.0, -1.0))


def test_unsupported_exponent_and_attention_errors(group: Any) -> None:
    s = share(torch.tensor([1.0, 2.0]), group)
    with pytest.raises(mpc.UnsupportedOpError, match="exponent"):
        s**1.3
    q = share(torch.randn(1, 1, 2, 4), group)
    with pytest.raises(mpc.UnsupportedOpError):  # dropout in attention: not in inference
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)


# -- statistics and layer norm ---------------------------------------------------------------


def test_mean_var_std_layer_norm(group: Any) -> None:
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1)).double() * 3
    s = share(x.float(), group)
    assert torch.allclose(s.var(dim=1).get().double(), x.var(dim=1), atol=1e-3)
    assert torch.allclose(s.std(dim=0).get().double(), x.std(dim=0), atol=1e-3)
    ln = nn.LayerNorm(16)
    with torch.no_grad():
        ln.weight.mul_(1.5)
        ln.bias.add_(0.25)
        ref = ln(x.float()).double()
    mpc.share(ln, *group[0], crypto_provider=group[1])
    assert torch.allclose(ln(s).get().double(), ref, atol=1e-3)


# -- end to end: both worker kinds (see conftest.BOTH_WORKER_KINDS) -------------------------


def test_logistic_regression(make_worker: Any) -> None:
    torch.manual_seed(0)
    alice, bob, carol = make_worker("alice"), make_worker("bob"), make_worker("carol")
    model = nn.Sequential(nn.Linear(6, 1), nn.Sigmoid())
    x = torch.randn(16, 6) * 2
    with torch.no_grad():
        ref = model(x)
    mpc.share(model, alice, bob, crypto_provider=carol)
    got = model(mpc.share(x, alice, bob, crypto_provider=carol)).get()
    assert torch.allclose(got, ref, atol=5e-4)
    assert torch.equal(got > 0.5, ref > 0.5)


@pytest.mark.virtual_only("about 170 rounds: a minute on loopback network workers")
def test_transformer_encoder_layer(make_worker: Any) -> None:
    torch.manual_seed(0)
    alice, bob, carol = make_worker("alice"), make_worker("bob"), make_worker("carol")
    layer = nn.TransformerEncoderLayer(64, 4, 256, dropout=0.0, batch_first=True).eval()
    x = torch.randn(1, 32, 64)
    with torch.no_grad():
        ref = layer(x)
    mpc.share(layer, alice, bob, crypto_provider=carol)
    got = layer(mpc.share(x, alice, bob, crypto_provider=carol)).get()
    assert (got - ref).abs().max().item() <= 5e-3


def _small_layer() -> tuple[nn.Module, nn.Module]:
    """A small unmodified encoder layer (d_model 16, 2 heads, feed-forward 32) and its
    plaintext copy."""
    torch.manual_seed(1)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True).eval()
    return layer, copy.deepcopy(layer)


def test_small_transformer_encoder_layer(make_worker: Any) -> None:
    alice, bob, carol = make_worker("alice"), make_worker("bob"), make_worker("carol")
    layer, plain = _small_layer()
    x = torch.randn(1, 4, 16)
    with torch.no_grad():
        ref = plain(x)
    mpc.share(layer, alice, bob, crypto_provider=carol)
    got = layer(mpc.share(x, alice, bob, crypto_provider=carol)).get()
    assert (got - ref).abs().max().item() <= 5e-3


def test_transformer_encoder_layer_as_plan(make_worker: Any) -> None:
    """Recorded once on an example, replayed on fresh inputs: each call gives the
    plaintext result, in the rounds the recording counted, with one message per worker."""
    alice, bob, carol = make_worker("alice"), make_worker("bob"), make_worker("carol")
    layer, plain = _small_layer()
    mpc.share(layer, alice, bob, crypto_provider=carol)
    example = mpc.share(torch.randn(1, 4, 16), alice, bob, crypto_provider=carol)
    layer_plan = mpc.plan(layer, example)
    # (94 with the 4-round comparison; 60 with issue 25's fused softmax and layer norm; 40
    # with the products taking the rows' factors after them: attention's softmax @ V, the
    # first layer norm's linear layer, mpc.ops.softmax_product and mpc.ops.row_scaled; 35
    # with comparison runs of at most 2^15 elements in 3 rounds: exp's clamp, the bins of
    # the softmax and of the two layer norms, the ReLU; the max's groups of four keep 4;
    # 32 with the softmax's max and clamp bits by ranks in one run and its series times
    # the bits in one round, 5 where 7 took, and the scores formed in the round that
    # truncates q, k and v, mpc.ops.attention.scores_in_truncation; 28 with the bits
    # alone of at most 2^13 compared values by digit look-ups in 2 rounds: the bins of the
    # softmax and of the two layer norms, the max's ranks; 25 with those bins' selections
    # giving the rows' factors in the comparison's second round, mpc.protocols.
    # inverse_product.DigitRowFactor)
    assert layer_plan.rounds == 25
    gen = torch.Generator().manual_seed(2)
    outs = []
    for _ in range(3):
        x = torch.randn(1, 4, 16, generator=gen)
        shared = mpc.share(x, alice, bob, crypto_provider=carol)
        with mpc.stats() as s:
            out = layer_plan(shared)
        got = out.get()
        with torch.no_grad():
            ref = plain(x)
        assert (got - ref).abs().max().item() <= 5e-3
        assert s.rounds == layer_plan.rounds
        assert s.client_messages <= 5
        outs.append(got)
    assert not torch.allclose(outs[0], outs[1])  # fresh inputs, not a replayed output
