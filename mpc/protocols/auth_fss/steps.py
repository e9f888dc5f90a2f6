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

The selection (ReLU, the max of two: z msb(z) for the compared z itself) rides on the
same round: z = c - r exactly in Z/2^128 (c is opened with all 128 bits), so

    z msb(z) = c [msb(z)] - r msb(z),   r msb(z) = c_63 [r] + (1 - 2 c_63) [r b],

b = u xor [c' < r']; and [r b] = [r u] + r (1 - 2u) [c' < r'], with [r u] dealt
authenticated and r (1 - 2u) (and its MAC) two more elements of the DCF's payload
(:mod:`mpc.math.dcf128` with four elements). So a ReLU or a max of two costs the one
opening of c, with no Beaver product after it; its keys are 10 words a level instead of 6.

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
    TAG_AFSS_RU,
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


def elements(select: bool) -> int:
    """The DCF payload's elements of Z/2^128: the bit and its MAC, and for a selection
    the mask's product with the bit and its MAC."""
    return 4 if select else 2


def key_words(n: int, select: bool = False) -> int:
    """int64 words of the correction words of ``n`` elements."""
    return dcf128.key_words(BITS, elements(select)) * n


def correction_words(n: int, select: bool = False) -> int:
    """int64 words of the last party's corrections (r's MAC, u's word and MAC, and for a
    selection r u's word and MAC)."""
    return (8 if select else 5) * n


def _select_of(call: ProtocolCall) -> bool:
    select = call.value("select")
    if type(select) is not bool:
        raise call.refuse("parameter 'select' is a bool")
    return select


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    alpha_of(call)
    if len(call.materials("seeds", SEED, "the dealer's seeds")) != 2:
        raise call.refuse("the FSS comparison is for 2 parties")
    numel(call.value("shape"))
    select = _select_of(call)
    nonce = nonce_of(call)
    return [
        seal(CW, nonce, deliveries=2, extra=(select,)),
        seal(CORR, nonce, deliveries=1, extra=(select,)),
    ]


def _dealer_size(p: dict[str, Any]) -> int:
    n = numel(p.get("shape"))
    select = p.get("select") is True
    return WORD * (2 * key_words(n, select) + (56 if select else 40) * n) + (1 << 22) + SLACK


def _tags(select: bool) -> tuple[int, ...]:
    return (TAG_AFSS_R, TAG_AFSS_U) + ((TAG_AFSS_RU,) if select else ())


def _dealer_keeps(p: dict[str, Any]) -> int:
    return stream_records(4 if p.get("select") is True else 3)(p)


@step(rule=_dealer_rule, size=_dealer_size, keeps=_dealer_keeps, makes_material=True)
def dealer_auth_fss(
    ctx: Any,
    seeds: list[torch.Tensor],
    alpha: torch.Tensor,
    nonce: int,
    shape: list[int],
    select: bool = False,
) -> list[torch.Tensor]:
    """The DCF keys' correction words (both parties) and the last party's corrections
    (see the module docstring)."""
    if len(seeds) != 2:
        raise ValueError("the FSS comparison is for 2 parties")
    consume(ctx, seeds, nonce, *_tags(select), TAG_AFSS_ROOT)
    n = numel(shape)
    (r_mac,), r = deal_value(seeds, nonce, TAG_AFSS_R, shape, alpha)
    low = r[0].reshape(-1)
    u = (low < 0).to(torch.int64)
    parts = [r_mac]
    u_parts, _ = deal_value(seeds, nonce, TAG_AFSS_U, shape, alpha, u.view(shape))
    parts += u_parts
    a = alpha_scalar(alpha)
    sign = r128.lift(1 - 2 * u)  # (2, n): 1 - 2u in Z/2^128
    beta = [sign, r128.mul64(sign, a)]  # value, then MAC
    if select:
        ru_parts, _ = deal_value(seeds, nonce, TAG_AFSS_RU, shape, alpha, (low * u).view(shape))
        parts += ru_parts
        r_sign = r128.mul(r.reshape(2, n), sign)  # r (1 - 2u), all 128 bits of r
        beta += [r_sign, r128.mul64(r_sign, a)]
    roots = (derive(s, nonce, TAG_AFSS_ROOT, [n, 2]) for s in seeds)
    cw = dcf128.gen(low & _LOW63, torch.cat(beta), BITS, tuple(roots))  # type: ignore[arg-type]
    return [cw.reshape(-1), pack(parts)]


# -- the parties ---------------------------------------------------------------------------


# (the corrections need no kind check: their size differs, and the evaluation checks the
# keys' kind against the kept shares')
_mask_rule = masked_opening_rule("afss", CORR, U, extra=lambda call: (_select_of(call),))


def _mask_size(p: dict[str, Any]) -> int:
    return (18 if p.get("select") is True else 12) * VM * share_elems(p, "z") + SLACK


def _mask_keeps(p: dict[str, Any]) -> int:
    return stream_records(3 if p.get("select") is True else 2)(p)


@step(rule=_mask_rule, size=_mask_size, keeps=_mask_keeps, makes_material=True)
def auth_fss_mask(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    z: torch.Tensor,
    corr: torch.Tensor | None,
    select: bool = False,
) -> list[torch.Tensor]:
    """Party i's piece of c = z + r (to open) and its MAC share, and what it keeps for
    its evaluation: its authenticated share of u, and for a selection ``(3, 2, 2, *S)``
    its shares of u, r u and r."""
    consume(ctx, [seed], nonce, *_tags(select))
    shape = list(z.shape[2:])
    n = z.numel() // 4
    r_mac = u_word = u_mac = ru_word = ru_mac = None
    if corr is not None:
        sizes = [2 * n, n, 2 * n] + ([n, 2 * n] if select else [])
        r_mac, u_word, u_mac, *rest = unpack(corr, sizes)
        if select:
            ru_word, ru_mac = rest
    r = party_value(seed, nonce, TAG_AFSS_R, shape, mac=r_mac)
    u = party_value(seed, nonce, TAG_AFSS_U, shape, word=u_word, mac=u_mac)
    c = r128.add(z, r)
    if select:
        ru = party_value(seed, nonce, TAG_AFSS_RU, shape, word=ru_word, mac=ru_mac)
        u = torch.stack([u, ru, r])
    return [c[:, 0].contiguous(), c[:, 1].contiguous(), u]


def _eval_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call)
    key = key_of(call)
    select = _select_of(call)
    cw = call.material("cw", CW, nonce, local=False, consume=True)
    u = call.material("u", U, nonce, local=True, consume=True)
    call.material("c", OPENED + "afss", nonce, local=True, consume=True)
    assert u is not None and cw is not None
    if u.extra != (key.nonce, select):
        raise call.refuse("the comparison's u was made for another key or kind")
    if cw.extra != (select,):
        raise call.refuse("the DCF keys are for the other kind of comparison")
    return [kept_share(key.nonce)] * (2 if select else 1)


def _eval_size(p: dict[str, Any]) -> int:
    return (40 if p.get("select") is True else 24) * VM * share_elems(p, "u") + (1 << 22) + SLACK


@step(rule=_eval_rule, size=_eval_size, keeps=stream_records(1), makes_material=True)
def auth_fss_eval(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    cw: torch.Tensor,
    u: torch.Tensor,
    c: torch.Tensor,
    select: bool = False,
) -> Any:
    """Party i's authenticated share of msb(z), and for a selection also of z msb(z) (see
    the module docstring)."""
    consume(ctx, [seed], nonce, TAG_AFSS_ROOT)
    parts = u.unbind(0) if select else (u,)
    if len(parts) != (3 if select else 1) or any(t.dim() < 2 for t in parts):
        raise ValueError("a selection's kept shares are u, r u and r")
    shape = list(parts[0].shape[2:])
    n = parts[0].numel() // 4
    if cw.dim() != 1 or cw.numel() != key_words(n, select) or tuple(c.shape) != (2, *shape):
        raise ValueError(f"the keys or the opened c do not fit {n} elements")
    root = derive(seed, nonce, TAG_AFSS_ROOT, [n, 2])
    low = c[0].reshape(-1)
    y = dcf128.evaluate(0 if first else 1, root, cw.view(-1, n), low & _LOW63, BITS)
    # y: per element of the payload its value's limbs, then its MAC's; a share lays out
    # limbs first, then value/MAC
    y = y.view(-1, 2, 2, *shape).transpose(1, 2)
    w = r128.add(y[0], parts[0])  # u xor [c' < r']
    top = ((low < 0).to(torch.int64)).view(shape)  # c_63, public
    flipped = torch.where(top.bool(), r128.neg(w), w)
    bit = with_public(flipped, key, first, r128.lift(top))
    if not select:
        return bit
    rb = r128.add(y[1], parts[1])  # r (u xor [c' < r'])
    r_bit = torch.where(top.bool(), r128.sub(parts[2], rb), rb)  # r msb(z)
    return [bit, r128.sub(r128.mul(c.unsqueeze(1), bit), r_bit)]  # c msb - r msb = z msb
