"""ReLU of a product with its truncation in one round, by FSS (2 parties): the steps at the
dealer and at the parties, their rules and sizes (the protocol:
:func:`mpc.protocols.fss.run.relu_truncating`).

For a product z not yet truncated by f bits, |z| < 2^62 (the range in which the
truncation itself is exact, :func:`mpc.protocols.truncation.run.truncate`), the parties open
c = z + r (r the dealer's mask, shared from the seeds) and nothing else. With
r' = r - 2^62, h = msb(r'), r'' = r' mod 2^63 and z~ = z + 2^62 in [0, 2^63):

- z~ = (c mod 2^63) - r'' + 2^63 (s ^ h), s = msb(c) (no comparison: the carry out of
  the low 63 bits is s ^ h, as in the truncation with known MSB), so
  T = floor(z / 2^f) (or one more) = Q - R + tau H with the public
  Q = ((c mod 2^63) >> f) - 2^(62-f) + s 2^(63-f), tau = 1 - 2s, and the dealer's
  R = r'' >> f and H = 2^(63-f) h;
- b = [z >= 0] = bit 62 of z~ = s2 ^ kappa ^ l, with the public s2 = bit 62 of c,
  kappa = bit 62 of r'' and l = [c mod 2^62 < r'' mod 2^62], a DCF on 62 bits. With
  sigma = 1 - 2 s2 and lambda = (1 - 2 kappa) l: b = s2 + sigma (kappa + lambda).

So relu(T) = b T = Q b + s2 (tau H - R) + sigma tau (kappa H + mu_H) - sigma (kappa R + mu_R),
where mu_H = (1 - 2 kappa) H l and mu_R = (1 - 2 kappa) R l: a DCF with the three payload
words (1 - 2 kappa, (1 - 2 kappa) H, (1 - 2 kappa) R) (:mod:`mpc.math.dcf`, a payload of three words) gives
shares of lambda, mu_H and mu_R, and the dealer shares kappa, H, R, kappa H and kappa R
(party 0 derives its shares from its seed; the last party gets its five words in a
second delivery). Everything after the opening is local: one round instead of two
(the comparison's opening, then the selection's). The result is floor(z / 2^f) or one
more where z >= 0, and 0 where z < 0, as the default protocol's; exact for z in
[-2^62, 2^62).

Key per element and party: 5 words for each of the 62 levels and 3 final words, 2,504
bytes (the comparison's key: 1,520), plus 40 bytes of the last party's five words.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import dcf
from mpc.protocols.fss.steps import DCF_CHUNK_BYTES
from mpc.protocols.rules import OPENED, dealer_seeds, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, numel, records, stream_records, tensor_elems
from mpc.protocols.step import step
from mpc.protocols.streams import TAG_FSS_ROOT, TAG_R, TAG_U, consume, derive, sum_derived
from pointers.worker.sealing import ProtocolCall, seal

BITS = 62  # the DCF's domain: the low 62 bits of c
WORDS = 3  # payload words: lambda, mu_H, mu_R
CONSTS = 5  # the dealer's shared words: kappa, H, R, kappa H, kappa R
_LOW62 = (1 << 62) - 1
_LOW63 = (1 << 63) - 1


def key_words(n: int) -> int:
    """int64 words of ``n`` elements' correction words."""
    return dcf.key_words(BITS, WORDS) * n


def _check_f(f: Any) -> int:
    if type(f) is not int or not 1 <= f <= 61:
        raise ValueError(f"a truncation of 1 to 61 bits, got {f!r}")
    return f


# -- rules ------------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    """The correction words (one object, a delivery to each of the 2 parties) and the
    last party's five words (index 1: its place)."""
    dealer_seeds(call)
    if len(call.materials("seeds", "seed", "the dealer's seeds")) != 2:
        raise call.refuse("the FSS ReLU is for 2 parties")
    nonce = nonce_of(call)
    extra = (call.value("f"), call.value("shape"))
    return [
        seal("dealer.fssrelu.cw", nonce, deliveries=2, extra=extra),
        seal("dealer.fssrelu", nonce, 1, deliveries=1, extra=extra),
    ]


def _eval_rule(call: ProtocolCall) -> Any:
    """A party evaluates its key once, at the opened c of the same instance, with the
    truncation the dealer dealt for; the last party with its own five words."""
    nonce = nonce_of(call)
    seed = party_seed(call, "consts")
    key = call.material("key", "dealer.fssrelu.cw", nonce, local=False, consume=True)
    assert key is not None
    consts = call.material(
        "consts", "dealer.fssrelu", nonce, local=False, optional=True, consume=True
    )
    if consts is not None and consts.index != seed.index:
        raise call.refuse(f"party {seed.index} takes its own words, not party {consts.index}'s")
    if call.value("f") != key.extra[0]:
        raise call.refuse(f"the key truncates {key.extra[0]} bits")
    call.material("c", OPENED + "cmp.c", nonce, local=True, consume=True)
    return None  # the result: an ordinary share


# -- sizes ------------------------------------------------------------------------------


def _dealer_bytes(p: dict[str, Any]) -> int:
    """The correction words and a tenth more for a chunk's copies on the way (as the
    comparison's), the mask, roots, payloads and the five words (24 words an element)
    and one chunk of the level loop."""
    n = numel(p.get("shape"))
    return declared(WORD * (1.1 * key_words(n) + 24 * n)) + DCF_CHUNK_BYTES


def _dealer_keeps(p: dict[str, Any]) -> int:
    return records(p.get("seeds"), 3)


def _eval_bytes(p: dict[str, Any]) -> int:
    """The root seeds, the input's low bits, the three outputs, the five words and the
    terms (20 words an element) and one chunk of the level loop."""
    return declared(20 * WORD * tensor_elems(p, "c")) + DCF_CHUNK_BYTES


# -- the steps ---------------------------------------------------------------------------


@step(rule=_dealer_rule, size=_dealer_bytes, keeps=_dealer_keeps, makes_material=True)
def dealer_fss_relu(
    ctx: Any, seeds: list[torch.Tensor], nonce: int, shape: list[int], f: int
) -> list[torch.Tensor]:
    """The correction words (for both parties) and the last party's five words, flat."""
    if len(seeds) != 2:
        raise ValueError("the FSS ReLU is for 2 parties")
    _check_f(f)
    consume(ctx, seeds, nonce, TAG_R, TAG_U, TAG_FSS_ROOT)
    n = numel(shape)
    r = sum_derived(seeds, nonce, TAG_R, [n])
    shifted = r - (1 << 62)  # r' (wraps mod 2^64)
    h = (shifted >> 63) & 1
    low = shifted & _LOW63  # r''
    kappa = (low >> 62) & 1
    big_r = low >> f
    big_h = h << (63 - f)
    sign = 1 - 2 * kappa
    roots = (
        derive(seeds[0], nonce, TAG_FSS_ROOT, [n, 2]),
        derive(seeds[1], nonce, TAG_FSS_ROOT, [n, 2]),
    )
    beta = torch.stack([sign, sign * big_h, sign * big_r])
    cw = dcf.gen(low & _LOW62, beta, BITS, roots).reshape(-1)
    consts = torch.stack([kappa, big_h, big_r, kappa * big_h, kappa * big_r])
    last = consts - derive(seeds[0], nonce, TAG_U, [CONSTS, n])
    return [cw, last.reshape(-1)]


@step(rule=_eval_rule, size=_eval_bytes, keeps=stream_records(2))
def fss_relu_eval(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    key: torch.Tensor,
    consts: torch.Tensor | None,
    c: torch.Tensor,
    f: int,
) -> torch.Tensor:
    """The party's share of relu(z >> f) (see the module docstring) from the correction
    words ``key`` (read only), its five words (the last party: dealt, ``consts``; party
    0: derived) and the opened c = z + r."""
    _check_f(f)
    consume(ctx, [seed], nonce, TAG_FSS_ROOT, *([TAG_U] if first else []))
    n = c.numel()
    if key.dim() != 1 or key.numel() != key_words(n):
        raise ValueError(f"correction words of {key.numel()} words for {n} elements")
    if (consts is None) != first or (
        consts is not None and (consts.dim() != 1 or consts.numel() != CONSTS * n)
    ):
        raise ValueError(f"the last party's words are {CONSTS} x {n} (party 0 derives its own)")
    root = derive(seed, nonce, TAG_FSS_ROOT, [n, 2])
    flat = c.reshape(-1)
    lam, mu_h, mu_r = dcf.evaluate(
        0 if first else 1, root, key.view(-1, n), flat & _LOW62, BITS, WORDS
    )
    k = derive(seed, nonce, TAG_U, [CONSTS, n]) if consts is None else consts.view(CONSTS, n)
    kappa, big_h, big_r, kappa_h, kappa_r = k
    s = (flat >> 63) & 1
    s2 = (flat >> 62) & 1
    sigma = 1 - 2 * s2
    tau = 1 - 2 * s
    q = ((flat & _LOW63) >> f) - (1 << (62 - f)) + (s << (63 - f))
    b = sigma * (kappa + lam)
    if first:
        b += s2
    out = q * b + s2 * (tau * big_h - big_r)
    out += sigma * tau * (kappa_h + mu_h) - sigma * (kappa_r + mu_r)
    return out.view(c.shape)


__all__ = ["dealer_fss_relu", "fss_relu_eval", "key_words"]
