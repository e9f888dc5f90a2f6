"""The steps of the authenticated FSS comparison (the protocol:
:func:`mpc.protocols.auth_fss.run.auth_fss_ltz`; the DCF: :mod:`mpc.math.dcf128`).

As the semi-honest FSS comparison (:mod:`mpc.protocols.fss.steps`), on the value's low
64 bits z: the dealer deals an authenticated uniform r (in Z/2^128; write r for its low
64 bits, r' for their low 63 and u = r_63) and the parties open c = z + r (all 128 bits,
checked); then, with c' the low 63 bits of c,

    msb(z) = c_63 xor u xor [c' < r'],    [u xor [c' < r']] = [u] + (1 - 2u) [c' < r'].

The dealer's DCF keys are for alpha = r' and beta = ((1 - 2u), alpha_mac (1 - 2u)) in
(Z/2^128)^2, alpha_mac its MAC key: each party's evaluation at the public c' is its
share of the value (1 - 2u) [c' < r'] *and* of its MAC, so the result is an
authenticated share like any other, with [u] (dealt, authenticated); c_63 being public,
[msb(z)] = c_63 + (1 - 2 c_63) [u xor [c' < r']] is local. One round (the opening of c);
exact for every z (its low 64 bits read in two's complement).

Why a cheating party is caught: its key and its roots come from the honest dealer and
its own seed; what it can change is its piece of c (the opening's MAC check catches
that), its share of u (a dealt authenticated value) and its output share: an error
(e, e') added to a share (value, MAC) passes the check only if e' = alpha e mod 2^128,
which needs alpha. A wrong evaluation is such an error.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import dcf128
from mpc.math import ring128 as r128
from mpc.protocols.auth_shares.steps import (
    OPENED,
    TAG_AFSS_R,
    TAG_AFSS_ROOT,
    TAG_AFSS_U,
    VM,
    alpha_of,
    alpha_scalar,
    deal_value,
    kept_share,
    key_of,
    masked_opening_rule,
    pack,
    party_value,
    share_elems,
    unpack,
    with_public,
)
from mpc.protocols.rules import SEED, dealer_seeds, nonce_of, party_seed
from mpc.protocols.sizes import SLACK, WORD, numel, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume, derive
from pointers.worker.sealing import ProtocolCall, seal

BITS = 63  # the DCF's domain: the low 63 bits of c
CW = "dealer.afss.cw"  # the correction words (one object, delivered to both parties)
CORR = "dealer.afss"  # the last party's corrections
U = "afss.u"  # a party's share of u, kept for its evaluation
_LOW63 = (1 << 63) - 1


def key_words(n: int) -> int:
    """int64 words of the correction words of ``n`` elements."""
    return dcf128.key_words(BITS) * n


def correction_words(n: int) -> int:
    """int64 words of the last party's corrections (r's MAC, u's word and MAC)."""
    return 5 * n


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    if len(call.materials("seeds", SEED, "the dealer's seeds")) != 2:
        raise call.refuse("the FSS comparison is for 2 parties")
    numel(call.value("shape"))
    nonce = nonce_of(call)
    return [seal(CW, nonce, deliveries=2), seal(CORR, nonce, deliveries=1)]


def _dealer_size(p: dict[str, Any]) -> int:
    n = numel(p.get("shape"))
    return WORD * (2 * key_words(n) + 40 * n) + (1 << 22) + SLACK


@step(rule=_dealer_rule, size=_dealer_size, keeps=stream_records(3), makes_material=True)
def dealer_auth_fss(
    ctx: Any, seeds: list[torch.Tensor], alpha: torch.Tensor, nonce: int, shape: list[int]
) -> list[torch.Tensor]:
    """The DCF keys' correction words (both parties) and the last party's corrections
    (see the module docstring)."""
    if len(seeds) != 2:
        raise ValueError("the FSS comparison is for 2 parties")
    consume(ctx, seeds, nonce, TAG_AFSS_R, TAG_AFSS_U, TAG_AFSS_ROOT)
    n = numel(shape)
    (r_mac,), r = deal_value(seeds, nonce, TAG_AFSS_R, shape, alpha)
    low = r[0].reshape(-1)
    u = (low < 0).to(torch.int64)
    u_parts, _ = deal_value(seeds, nonce, TAG_AFSS_U, shape, alpha, u.view(shape))
    sign = r128.lift(1 - 2 * u)  # (2, n): 1 - 2u in Z/2^128
    beta = torch.cat([sign, r128.mul64(sign, alpha_scalar(alpha))])  # value, then MAC
    roots = (derive(s, nonce, TAG_AFSS_ROOT, [n, 2]) for s in seeds)
    cw = dcf128.gen(low & _LOW63, beta, BITS, tuple(roots))  # type: ignore[arg-type]
    return [cw.reshape(-1), pack([r_mac, *u_parts])]


# -- the parties ---------------------------------------------------------------------------


_mask_rule = masked_opening_rule("afss", CORR, U)


@step(rule=_mask_rule, size=lambda p: 12 * VM * share_elems(p, "z") + SLACK,
      keeps=stream_records(2), makes_material=True)  # fmt: skip
def auth_fss_mask(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    z: torch.Tensor,
    corr: torch.Tensor | None,
) -> list[torch.Tensor]:
    """Party i's piece of c = z + r (to open) and its MAC share, and its authenticated
    share of u (kept for its evaluation)."""
    consume(ctx, [seed], nonce, TAG_AFSS_R, TAG_AFSS_U)
    shape = list(z.shape[2:])
    n = z.numel() // 4
    r_mac = u_word = u_mac = None
    if corr is not None:
        r_mac, u_word, u_mac = unpack(corr, [2 * n, n, 2 * n])
    r = party_value(seed, nonce, TAG_AFSS_R, shape, mac=r_mac)
    u = party_value(seed, nonce, TAG_AFSS_U, shape, word=u_word, mac=u_mac)
    c = r128.add(z, r)
    return [c[:, 0].contiguous(), c[:, 1].contiguous(), u]


def _eval_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    key = key_of(call)
    call.material("cw", CW, nonce, local=False, consume=True)
    u = call.material("u", U, nonce, local=True, consume=True)
    call.material("c", OPENED + "afss", nonce, local=True, consume=True)
    assert u is not None
    if u.extra != (key.nonce,):
        raise call.refuse("the comparison's u was made for another key")
    return [kept_share(key.nonce)]


@step(rule=_eval_rule, size=lambda p: 24 * VM * share_elems(p, "u") + (1 << 22) + SLACK,
      keeps=stream_records(1), makes_material=True)  # fmt: skip
def auth_fss_eval(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    cw: torch.Tensor,
    u: torch.Tensor,
    c: torch.Tensor,
) -> torch.Tensor:
    """Party i's authenticated share of msb(z) (see the module docstring)."""
    consume(ctx, [seed], nonce, TAG_AFSS_ROOT)
    shape = list(u.shape[2:])
    n = u.numel() // 4
    if cw.dim() != 1 or cw.numel() != key_words(n) or tuple(c.shape) != (2, *shape):
        raise ValueError(f"the keys or the opened c do not fit {n} elements")
    root = derive(seed, nonce, TAG_AFSS_ROOT, [n, 2])
    low = c[0].reshape(-1)
    y = dcf128.evaluate(0 if first else 1, root, cw.view(-1, n), low & _LOW63, BITS)
    # y: the value's limbs, then the MAC's; a share lays out limbs first, then value/MAC
    w = r128.add(y.view(2, 2, *shape).transpose(0, 1), u)
    top = ((low < 0).to(torch.int64)).view(shape)  # c_63, public
    flipped = torch.where(top.bool(), r128.neg(w), w)
    return with_public(flipped, key, first, r128.lift(top))
