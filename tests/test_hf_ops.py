"""The ops Hugging Face transformer models use, each against plaintext torch (issue 23,
point 6), and the public masks of point 5; 2 and 3 parties. No transformers import."""

from __future__ import annotations

import math
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import mpc
from mpc.ops.masking import MASKED_VALUE, masked_positions

MIN = torch.finfo(torch.float32).min


def share(t: torch.Tensor, group: Any) -> mpc.SharedTensor:
    return mpc.share(t, *group[0], crypto_provider=group[1])


def close(got: torch.Tensor, ref: torch.Tensor, atol: float = 2e-3) -> None:
    err = (got.double() - ref.double()).abs().max().item()
    assert got.shape == ref.shape and err <= atol, (err, got, ref)


@pytest.fixture(autouse=True)
def _range_warnings_are_errors():
    # the suite filters the fixed-point range warning; here a mask must not raise it
    with warnings.catch_warnings():
        warnings.simplefilter("error", mpc.math.encoding.FixedPointRangeWarning)
        yield


def test_embedding_gather_index_select_with_public_indices(group: Any) -> None:
    gen = torch.Generator().manual_seed(1)
    table = torch.randn(11, 6, generator=gen)
    ids = torch.tensor([[3, 0, 10], [7, 7, 1]])
    idx = torch.randint(0, 6, (11, 2), generator=gen)
    w = share(table, group)
    with mpc.stats() as s:
        emb = F.embedding(ids, w)
        gat = torch.gather(w, 1, idx)
        sel = torch.index_select(w, 0, torch.tensor([4, 2]))
        sel1 = w.index_select(1, torch.tensor([0, 5, 5]))
    assert s.rounds == 0  # all local
    # (the fixed-point encoding's rounding only: 2^-17)
    close(emb.get(), F.embedding(ids, table), 8e-6)
    close(gat.get(), torch.gather(table, 1, idx), 8e-6)
    close(sel.get(), table[[4, 2]], 8e-6)
    close(sel1.get(), table[:, [0, 5, 5]], 8e-6)
    # nn.Embedding with padding_idx (forward only: the same lookup)
    e = nn.Embedding(11, 6, padding_idx=0)
    with torch.no_grad():
        ref = e(ids)
    mpc.share(e, *group[0], crypto_provider=group[1])
    close(e(ids).get(), ref, 2e-5)


def test_shared_token_ids_one_hot_lookup(group: Any) -> None:
    """Private ids (shared integers): a one-hot comparison and one product."""
    gen = torch.Generator().manual_seed(2)
    table = torch.randn(13, 4, generator=gen)
    ids = torch.tensor([[0, 12, 5, 5]])
    shared_ids = share(ids, group)
    close(F.embedding(shared_ids, share(table, group)).get(), table[ids], 1e-4)
    close(F.embedding(shared_ids, table).get(), table[ids], 1e-4)


@pytest.mark.parametrize("fill", [MIN, float("-inf"), -1e4, 0.25])
def test_masked_fill_and_where_with_public_masks(fill: float, group: Any) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 5, generator=gen)
    mask = torch.rand(3, 5, generator=gen) > 0.5
    sx = share(x, group)
    with mpc.stats() as s:
        a = sx.masked_fill(mask, fill)
        b = torch.where(mask, sx, fill)  # public branch second
        c = torch.where(mask, torch.tensor(fill), sx)
    assert s.rounds == 0  # a public selection: local
    for got, ref in ((a, x.masked_fill(mask, fill)), (b, torch.where(mask, x, fill))):
        if fill <= MIN:  # masked positions hold the public sentinel, recorded as masked
            assert masked_positions(got) is not None
        got_v, ref_v = got.get(), ref
        if fill <= MIN:
            ref_v = ref_v.masked_fill(ref_v <= MIN, MASKED_VALUE)
        close(got_v, ref_v, 1e-4)
    ref_c = torch.where(mask, torch.tensor(fill), x)
    close(c.get(), ref_c.masked_fill(ref_c <= MIN, MASKED_VALUE) if fill <= MIN else ref_c, 1e-4)


def test_masked_fill_with_shared_value(group: Any) -> None:
    x, v = torch.randn(3, 4), torch.tensor(0.75)
    mask = torch.tensor([True, False, True, False])
    close(share(x, group).masked_fill(mask, share(v, group)).get(), x.masked_fill(mask, v), 1e-4)


@pytest.mark.parametrize("fill", [MIN, float("-inf")])
def test_masked_softmax_weighs_masked_positions_zero(fill: float, group: Any) -> None:
    """HF's additive mask (finfo.min) and masked_fill(-inf): no range warning, the right
    softmax, and masked positions weigh exactly 0 whatever the score they replaced."""
    gen = torch.Generator().manual_seed(4)
    scores = torch.randn(2, 4, 6, generator=gen) * 3
    keep = torch.ones(2, 1, 6, dtype=torch.bool)
    keep[1, :, :2] = False
    keep[0, :, 5] = False
    additive = torch.zeros(keep.shape).masked_fill(~keep, fill)
    ref = torch.softmax(scores + additive, -1)
    big = scores.clone()
    big[~keep.expand_as(big)] = 1e3  # a masked score far above the others changes nothing
    for sc in (scores, big):
        s = share(sc, group)
        got_add = torch.softmax(s + additive, -1).get()
        got_fill = torch.softmax(s.masked_fill(~keep, fill), -1).get()
        for got in (got_add, got_fill):
            close(got, ref, 2e-3)
            assert torch.equal(got[~keep.expand_as(got)], torch.zeros(int((~keep).sum()) * 4))


def test_fully_masked_rows_follow_torch(group: Any) -> None:
    """A row masked entirely: uniform with finfo.min (softmax), zeros in sdpa with a bool
    mask (as torch's CPU kernel), and the other rows unaffected."""
    gen = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 2, 4, 8, generator=gen) for _ in range(3))
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[0] = False
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    got = F.scaled_dot_product_attention(
        share(q, group), share(k, group), share(v, group), attn_mask=mask
    )
    close(got.get(), ref, 2e-3)
    scores = torch.randn(3, 5, generator=gen)
    add = torch.zeros(3, 5)
    add[1] = MIN
    close(torch.softmax(share(scores, group) + add, -1).get(), torch.softmax(scores + add, -1))


@pytest.mark.parametrize(
    "case", ["plain", "causal", "bool mask", "float mask", "gqa", "decode step", "causal lq<lk"]
)
def test_scaled_dot_product_attention(case: str, group: Any) -> None:
    gen = torch.Generator().manual_seed(6)
    b, h, lq, lk, d = 2, 4, 5, 5, 8
    if case == "decode step":
        lq = 1
    if case == "causal lq<lk":
        lq = 3
    q = torch.randn(b, h, lq, d, generator=gen)
    hk = 2 if case == "gqa" else h
    k, v = torch.randn(b, hk, lk, d, generator=gen), torch.randn(b, hk, lk, d, generator=gen)
    kw: dict[str, Any] = {}
    if case in ("causal", "causal lq<lk"):
        kw["is_causal"] = True
    if case == "bool mask":
        kw["attn_mask"] = torch.rand(b, 1, lq, lk, generator=gen) > 0.3
        kw["attn_mask"][..., 0] = True
    if case == "float mask":
        m = torch.randn(b, 1, lq, lk, generator=gen)
        m[1, ..., 3:] = MIN
        kw["attn_mask"] = m
    if case == "gqa":
        kw["enable_gqa"] = True
    ref = F.scaled_dot_product_attention(q, k, v, **kw)
    sq, sk, sv = share(q, group), share(k, group), share(v, group)
    close(F.scaled_dot_product_attention(sq, sk, sv, **kw).get(), ref, 3e-3)
    # public keys and values (a cached prefix the client may know) work too
    if case == "plain":
        close(F.scaled_dot_product_attention(sq, k, v).get(), ref, 3e-3)


def test_baddbmm_addmm_split_chunk(group: Any) -> None:
    gen = torch.Generator().manual_seed(7)
    inp, b1, b2 = (torch.randn(s, generator=gen) for s in ((2, 3, 4), (2, 3, 5), (2, 5, 4)))
    si, s1, s2 = share(inp, group), share(b1, group), share(b2, group)
    close(torch.baddbmm(si, s1, s2).get(), torch.baddbmm(inp, b1, b2))
    close(
        torch.baddbmm(si, s1, s2, beta=0.5, alpha=0.125).get(),
        torch.baddbmm(inp, b1, b2, beta=0.5, alpha=0.125),
    )
    close(torch.baddbmm(inp, s1, b2, beta=0.0).get(), torch.bmm(b1, b2))
    bias, x, w = torch.randn(4, generator=gen), torch.randn(3, 6, generator=gen), torch.randn(6, 4)
    sb, sx, sw = share(bias, group), share(x, group), share(w, group)
    close(torch.addmm(sb, sx, sw).get(), torch.addmm(bias, x, w))  # GPT-2's Conv1D
    close(
        torch.addmm(sb, sx, sw, beta=2, alpha=0.5).get(), torch.addmm(bias, x, w, beta=2, alpha=0.5)
    )
    with mpc.stats() as s:
        parts = sx.split(2, dim=1)
        chunks = torch.chunk(sx, 3, dim=0)
        q, k, v = torch.addmm(sb, sx, sw).repeat(1, 3).split(4, dim=1)
    assert len(parts) == 3 and len(chunks) == 3
    for got, ref in zip(parts + chunks, x.split(2, dim=1) + torch.chunk(x, 3, dim=0)):
        assert torch.allclose(got.get(), ref, atol=2e-5)
    close(v.get(), torch.addmm(bias, x, w))
    assert s.rounds <= 2  # one product; the splits are local


def test_gelu_exact_tanh_and_gelu_new(group: Any) -> None:
    x = torch.linspace(-6, 6, 97)
    sx = share(x, group)
    close(F.gelu(sx).get(), F.gelu(x), 1e-3)
    close(F.gelu(sx, approximate="tanh").get(), F.gelu(x, approximate="tanh"), 1e-3)
    close(torch.tanh(sx).get(), torch.tanh(x), 1e-3)

    def gelu_new(t: torch.Tensor) -> torch.Tensor:  # transformers' NewGELUActivation
        return (
            0.5
            * t
            * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (t + 0.044715 * torch.pow(t, 3.0))))
        )

    y = torch.linspace(-4, 4, 41)
    close(gelu_new(share(y, group)).get(), gelu_new(y), 2e-3)


def test_tanh_pooler_and_layer_norm(group: Any) -> None:
    torch.manual_seed(8)
    pool = nn.Sequential(nn.Linear(16, 16), nn.Tanh())
    ln = nn.LayerNorm(16, eps=1e-12)
    with torch.no_grad():
        ln.weight.mul_(1.5)
        ln.bias.add_(0.1)
    x = torch.randn(2, 7, 16)
    with torch.no_grad():
        ref = pool(ln(x)[:, 0])
    mpc.share(pool, *group[0], crypto_provider=group[1])
    mpc.share(ln, *group[0], crypto_provider=group[1])
    close(pool(ln(share(x, group))[:, 0]).get(), ref, 2e-3)


def test_rms_norm_rotary_and_swiglu(group: Any) -> None:
    """Llama's pieces as transformers writes them: RMSNorm (mean of squares, rsqrt), rotary
    embeddings with public cos/sin (rotate_half: slices, neg, cat), SwiGLU (silu, mul)."""
    torch.manual_seed(9)
    x = torch.randn(1, 6, 16) * 0.5
    w = torch.rand(16) + 0.5

    def rms(t: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return weight * (t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rotate_half(t: torch.Tensor) -> torch.Tensor:
        return torch.cat((-t[..., 8:], t[..., :8]), dim=-1)

    pos = torch.arange(6, dtype=torch.float32)[:, None] / (10000 ** (torch.arange(0, 16, 2) / 16))
    emb = torch.cat((pos, pos), -1)
    cos, sin = emb.cos(), emb.sin()
    gate, up = torch.randn(16, 16) * 0.3, torch.randn(16, 16) * 0.3

    def block(t: torch.Tensor, weight: Any, g: Any, u: Any) -> torch.Tensor:
        h = rms(t, weight)
        h = h * cos + rotate_half(h) * sin
        return F.silu(h @ g) * (h @ u)

    ref = block(x, w, gate, up)
    got = block(share(x, group), share(w, group), share(gate, group), share(up, group))
    close(got.get(), ref, 5e-3)


# -- which tensors of a model are secret (point 2) ------------------------------------------


class _WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("position_ids", torch.arange(8).unsqueeze(0), persistent=False)
        self.register_buffer("causal", torch.ones(8, 8, dtype=torch.bool).tril())
        self.register_buffer("scale", torch.full((4,), 2.0))  # persistent float: secret
        self.register_buffer("inv_freq", torch.rand(2), persistent=False)  # from the config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


def test_buffer_rule_and_overrides(group: Any) -> None:
    m = mpc.share(_WithBuffers(), *group[0], crypto_provider=group[1])
    assert isinstance(m.lin.weight, mpc.SharedTensor) and isinstance(m.scale, mpc.SharedTensor)
    for name in ("position_ids", "causal", "inv_freq"):
        assert not isinstance(getattr(m, name), mpc.SharedTensor), name
    m2 = mpc.share(
        _WithBuffers(),
        *group[0],
        crypto_provider=group[1],
        public_buffers=["scale"],
        shared_buffers=["inv_freq", "position_ids"],
    )
    assert not isinstance(m2.scale, mpc.SharedTensor)
    assert isinstance(m2.inv_freq, mpc.SharedTensor) and isinstance(
        m2.position_ids, mpc.SharedTensor
    )
    assert m2.position_ids.dtype == torch.int64
    with pytest.raises(mpc.MPCError, match="no buffer"):
        mpc.share(_WithBuffers(), *group[0], crypto_provider=group[1], public_buffers=["nope"])
    with pytest.raises(mpc.MPCError, match="both"):
        mpc.share(
            _WithBuffers(),
            *group[0],
            crypto_provider=group[1],
            public_buffers=["scale"],
            shared_buffers=["scale"],
        )
    with pytest.raises(TypeError):
        mpc.share(torch.ones(2), *group[0], crypto_provider=group[1], public_buffers=["x"])


def test_tied_weights_are_shared_once_and_stay_tied(group: Any) -> None:
    emb = nn.Embedding(10, 4)
    head = nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "head": head})
    mpc.share(model, *group[0], crypto_provider=group[1])
    assert model["emb"].weight is model["head"].weight
    mpc.get(model)
    assert model["emb"].weight is model["head"].weight
    assert not isinstance(model["emb"].weight, mpc.SharedTensor)


def test_the_core_library_never_imports_transformers() -> None:
    import subprocess
    import sys

    code = "import sys, mpc, mpc.ops, pointers; assert 'transformers' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_rms_norm_of_small_activations_keeps_its_precision(group: Any) -> None:
    """RMSNorm as transformers writes it, on activations near 0.02 (a trained model's
    embeddings): the mean of squares (4e-4, 26 units at 16 bits) reaches rsqrt with the
    bits of its pending truncation (max error 6.5e-2 before, about 7e-4 now)."""
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(10)) * 0.02

    def rms(t: torch.Tensor) -> torch.Tensor:
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)

    with mpc.stats() as s:
        got = rms(share(x, group))
    close(got.get(), rms(x), 3e-3)
    with mpc.stats() as s2:  # the same rounds as a mean truncated before rsqrt
        rms(share(x * 50, group))
    assert s.rounds == s2.rounds
