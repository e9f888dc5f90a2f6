"""The steps of authenticated shares (the protocol: :mod:`mpc.protocols.auth_shares.run`):
the dealer's MAC key, inputs, outputs, and the local ops on authenticated shares; and what
every authenticated protocol's steps are built of (the layout of a share, the dealer's
authenticated material, the rules' kinds).

An authenticated share of x at party i is one int64 tensor of shape ``(2, 2, *S)``: limbs
first (low, high: :mod:`mpc.math.ring128`), then value and MAC, then the value's shape.
Over the parties, the values sum to x~ and the MACs to alpha x~ (mod 2^128), x~ in
Z/2^128 with x~ = x mod 2^64; alpha in [0, 2^64) is the dealer's MAC key, which the parties
hold shares of (SPDZ2k: Cramer, Damgard, Escudero, Scholl and Xing, CRYPTO 2018).

Authenticated shares are sealed at the parties (kind :data:`SHARE`, the key's nonce): no
client reads a value or MAC share (which would show it alpha), and a share never leaves
its party. The ops that are local to the shares run here as steps: linear combinations
and public constants (:func:`auth_linear`), products by public operands
(:func:`auth_bilinear_public`), sums (:func:`auth_sum`) and layout ops (:func:`auth_view`).

Dealt material: for each authenticated value the dealer deals, every party derives its
value and MAC shares from its seed (one stream, :func:`derive_vm`); the dealer derives
all of them, and sends the last party the correction of its MAC share (and of its value
share, where the value is not random: one word, the value matters mod 2^64 only).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch

from mpc.math import ring128 as r128
from mpc.protocols.rules import dealer_seeds, kept, nonce_of, party_seed
from mpc.protocols.sizes import SLACK, WORD, numel, stream_records
from mpc.protocols.step import step
from mpc.protocols.streams import consume, derive
from pointers.worker.sealing import Label, ProtocolCall, seal

# -- kinds and tags ----------------------------------------------------------------------

SHARE = "auth.share"  # an authenticated share (nonce: its MAC key's)
KEY = "auth.key"  # a party's share of alpha
KEY_CORR = "auth.key_corr"  # the dealer's share of alpha for the last party
ALPHA = "auth.alpha"  # the dealer's alpha
PIECE = "auth.piece:"  # a party's piece of a value to open: "auth.piece:<what>"
PIECE_MAC = "auth.pmac:"  # its MAC share, kept for the opening
OPENED = "auth.opened:"  # an opened value
RESIDUAL = "auth.residual"  # what the MAC check takes of an opening
STATE = "mpc.auth"  # the key of a party's state in its function state

# stream tags of the authenticated mode (mpc.protocols.streams has 0-11)
(
    TAG_KEY,
    TAG_IN,
    TAG_OUT,
    TAG_TRIPLE_A,
    TAG_TRIPLE_B,
    TAG_TRIPLE_C,
    TAG_TRUNC_R,
    TAG_TRUNC_U,
    TAG_TRUNC_H,
    TAG_CMP_BITS,
    TAG_CMP_R,
    TAG_AFSS_R,
    TAG_AFSS_U,
    TAG_AFSS_ROOT,
    TAG_AFSS_RU,
    TAG_AW_B,
    TAG_AW_A,
    TAG_AW_C,
) = range(100, 118)

W128 = 2 * WORD  # bytes of a 128-bit ring element
VM = 4 * WORD  # bytes of an authenticated share's element (value and MAC)


# -- what the rules check ----------------------------------------------------------------


def party_state(state: dict[str, Any]) -> dict[str, Any]:
    """A party's record of its openings and checks (see :mod:`mpc.protocols.mac_check`)."""
    st: dict[str, Any] = state.setdefault(
        STATE, {"epoch": 0, "pending": {}, "checked": 0, "failed": None}
    )
    return st


def key_of(call: ProtocolCall) -> Label:
    """The party's share of the MAC key (parameter ``key``), made here."""
    label = call.material("key", KEY, local=True)
    assert label is not None
    return label


def share_of(call: ProtocolCall, name: str, key: int | None = None) -> Label:
    """Parameter ``name`` is an authenticated share made here (under MAC key ``key``)."""
    label = call.material(name, SHARE, key, local=True)
    assert label is not None
    return label


def shares_of(call: ProtocolCall, name: str) -> int:
    """Parameter ``name`` is a share or a list of shares made here, all under one MAC
    key; that key's nonce."""
    a = call.args.get(name)
    if a is not None and a.entries is not None:
        labels = call.materials(name, SHARE, "authenticated shares", local=True)
    else:
        labels = [share_of(call, name)]
    keys = {lb.nonce for lb in labels}
    if len(keys) != 1:
        raise call.refuse(f"the shares of {name!r} are authenticated under different keys")
    return keys.pop()


def public_of(call: ProtocolCall, name: str, optional: bool = False) -> None:
    """Parameter ``name`` is a public value: an int64 tensor the client sent (inline or
    stored), never protocol material."""
    a = call.args.get(name)
    if a is None or (a.entry is None and a.value is None):
        if optional:
            return
        raise call.refuse(f"parameter {name!r} takes a public value")
    if a.entry is not None and a.entry.sealed:
        raise call.refuse(f"parameter {name!r} takes a public value, not protocol material")
    if not isinstance(a.value, torch.Tensor) or a.value.dtype != torch.int64:
        raise call.refuse(f"parameter {name!r} takes an int64 tensor")


def masked_opening_rule(
    what: str,
    corr: str,
    keeps: str,
    check: Callable[[ProtocolCall], Any] | None = None,
    extra: Callable[[ProtocolCall], tuple[Any, ...]] = lambda call: (),
) -> Callable[[ProtocolCall], Any]:
    """The rule of a party's first step of an opening of z + r (truncation, comparison):
    it takes the party's seed and MAC key, a share ``z`` made here under that key and, at
    the last party, the dealer's corrections (kind ``corr``, consumed); it makes the piece
    to open (``auth.piece:<what>``), its MAC share (kept) and the party's dealt material
    for its finish (kind ``keeps``, kept, bound to the key and ``extra(call)``).
    ``check``: what else the step checks of its parameters."""

    def rule(call: ProtocolCall) -> Any:
        nonce = nonce_of(call)
        party_seed(call, "corr")
        key = key_of(call)
        share_of(call, "z", key.nonce)
        if check is not None:
            check(call)
        call.material("corr", corr, nonce, local=False, optional=True, consume=True)
        return [
            seal(PIECE + what, nonce),
            seal(PIECE_MAC + what, nonce, deliveries=0),
            kept(keeps, nonce, extra=(key.nonce, *extra(call))),
        ]

    return rule


def alpha_of(call: ProtocolCall) -> None:
    """A dealer's step runs on its own alpha (parameter ``alpha``)."""
    call.material("alpha", ALPHA, local=True)


def kept_share(key: int) -> list[Any]:
    """The label of an authenticated share made here under MAC key ``key``."""
    return seal(SHARE, key, deliveries=0)


# -- dealt material ----------------------------------------------------------------------


def derive_vm(seed: torch.Tensor, nonce: int, tag: int, shape: list[int]) -> torch.Tensor:
    """A party's derived value and MAC shares of one dealt value: ``(2, 2, *shape)``."""
    return derive(seed, nonce, tag, [2, 2, *shape])


def alpha_scalar(alpha: torch.Tensor) -> torch.Tensor:
    """The dealer's alpha as a 0-dim int64 tensor (its bits: an unsigned 64-bit word)."""
    return alpha.reshape(())


def deal_value(
    seeds: list[torch.Tensor],
    nonce: int,
    tag: int,
    shape: list[int],
    alpha: torch.Tensor,
    target: torch.Tensor | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The dealer's part of one authenticated value: the last party's corrections, and
    the value (128 bits, ``(2, *shape)``).

    Every party derives its shares (:func:`derive_vm`). With no ``target`` the value is
    their sum (uniform in Z/2^128) and the correction is the last party's MAC share
    ``(2, *shape)``. With ``target`` (int64, the value's low 64 bits) the value is the sum
    plus ``lift(target - sum mod 2^64)`` at the last party: the corrections are that word
    ``(*shape)`` and the MAC share."""
    shares = [derive_vm(s, nonce, tag, shape) for s in seeds]
    value = shares[0][:, 0].clone()
    for s in shares[1:]:
        r128.add_(value, s[:, 0])
    out = []
    if target is not None:
        word = target - value[0]
        r128.add_(value, r128.lift(word))
        out.append(word)
    mac = r128.mul64(value, alpha_scalar(alpha))
    for s in shares[:-1]:
        mac = r128.sub(mac, s[:, 1])
    out.append(mac)
    return out, value


def party_value(
    seed: torch.Tensor,
    nonce: int,
    tag: int,
    shape: list[int],
    word: torch.Tensor | None = None,
    mac: torch.Tensor | None = None,
) -> torch.Tensor:
    """A party's authenticated share ``(2, 2, *shape)`` of one dealt value: derived, with
    the dealer's corrections at the last party (see :func:`deal_value`)."""
    t = derive_vm(seed, nonce, tag, shape)
    if word is not None:
        r128.add_(t[:, 0], r128.lift(word.reshape(shape)))
    if mac is not None:
        t[:, 1] = mac.reshape(2, *shape)
    return t


def pack(parts: list[torch.Tensor]) -> torch.Tensor:
    """The dealer's corrections for one instance as one flat int64 tensor (one delivery)."""
    return torch.cat([p.reshape(-1) for p in parts])


def unpack(packed: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """The parts :func:`pack` joined, by their element counts."""
    if packed.dim() != 1 or packed.dtype != torch.int64 or packed.numel() != sum(sizes):
        raise ValueError(
            f"a correction of {sum(sizes)} int64 words, got {packed.dtype} {list(packed.shape)}"
        )
    return list(packed.split(sizes))


def with_public(
    x: torch.Tensor, key: torch.Tensor, first: bool, value: torch.Tensor
) -> torch.Tensor:
    """x + value (public, 128-bit ``(2, *S)``) as an authenticated share: the first party
    adds it to its value share, every party its share of alpha value to its MAC share."""
    out = x.clone()
    if first:
        r128.add_(out[:, 0], value)
    r128.add_(out[:, 1], r128.mul(key.view(2, *([1] * (value.dim() - 1))), value))
    return out


def residual(key: torch.Tensor, mac: torch.Tensor, opened: torch.Tensor) -> torch.Tensor:
    """What the MAC check takes of an opening at this party: its MAC share of the opened
    value minus its share of alpha times the value."""
    return r128.sub(mac, r128.mul(key.view(2, *([1] * (opened.dim() - 1))), opened))


def bilinear_vm(
    op: str, params: dict[str, Any], public: torch.Tensor, x: torch.Tensor, public_first: bool
) -> torch.Tensor:
    """op(public, x) (``public_first``) or op(x, public) for a public 128-bit operand
    ``(2, *P)`` and an authenticated share ``(2, 2, *S)``: ``(2, 2, *out)``."""
    if op == "mul":
        return r128.mul(public.unsqueeze(1), x)
    if op == "matmul":
        if public_first:
            return r128.bilinear("matmul", params, public, x)
        return r128.bilinear("matmul", params, x, public)
    if op == "conv2d":
        halves = [
            r128.bilinear("conv2d", params, public, x[:, k])
            if public_first
            else r128.bilinear("conv2d", params, x[:, k], public)
            for k in (0, 1)
        ]
        return torch.stack(halves, dim=1)
    raise ValueError(f"unknown bilinear op {op!r}")


# -- sizes ---------------------------------------------------------------------------------


def share_elems(p: dict[str, Any], name: str) -> int:
    """Elements of a share argument's value (its numel over 4), lists summed."""
    v = p.get(name)
    ts = v if isinstance(v, list | tuple) else [v]
    return sum(t.numel() // 4 if isinstance(t, torch.Tensor) else 1 for t in ts)


def vm_peak(k: int, name: str) -> Any:
    """``k`` authenticated tensors of the size of argument ``name`` (value and MAC)."""

    def peak(p: dict[str, Any]) -> int:
        return k * VM * share_elems(p, name) + SLACK

    return peak


def shape_peak(k: int) -> Any:
    """``k`` authenticated tensors of the shape parameter ``shape``."""

    def peak(p: dict[str, Any]) -> int:
        return k * VM * numel(p.get("shape")) + SLACK

    return peak


# -- the MAC key ---------------------------------------------------------------------------


def _key_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    nonce = nonce_of(call)
    return [seal(ALPHA, nonce, deliveries=0), seal(KEY_CORR, nonce, deliveries=1)]


@step(rule=_key_rule, size=lambda p: SLACK, keeps=stream_records(1), makes_material=True)
def dealer_auth_key(ctx: Any, seeds: list[torch.Tensor], nonce: int) -> list[torch.Tensor]:
    """The dealer's MAC key alpha, uniform in [0, 2^64) (kept here), and the last party's
    share of it: alpha minus the shares the other parties derive (in Z/2^128)."""
    consume(ctx, seeds, nonce, TAG_KEY)
    alpha = torch.tensor([int.from_bytes(os.urandom(8), "little", signed=True)])
    share = r128.lift_unsigned(alpha).reshape(2)
    for s in seeds[:-1]:
        share = r128.sub(share, derive(s, nonce, TAG_KEY, [2]))
    return [alpha, share]


def _party_key_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corr")
    call.material("corr", KEY_CORR, nonce, local=False, optional=True, consume=True)
    return [seal(KEY, nonce, deliveries=0)]


@step(rule=_party_key_rule, size=lambda p: SLACK, keeps=stream_records(1), makes_material=True)
def auth_key(ctx: Any, seed: torch.Tensor, nonce: int, corr: torch.Tensor | None) -> torch.Tensor:
    """This party's share of alpha (derived; the dealer's at the last party)."""
    consume(ctx, [seed], nonce, TAG_KEY)
    return derive(seed, nonce, TAG_KEY, [2]) if corr is None else corr.clone()


# -- inputs --------------------------------------------------------------------------------


def _mask_rule(kind: str) -> Any:
    def rule(call: ProtocolCall) -> Any:
        dealer_seeds(call)
        alpha_of(call)
        numel(call.value("shape"))
        return [seal(kind, nonce_of(call), deliveries=1), None]

    return rule


@step(
    rule=_mask_rule("auth.in_corr"),
    size=shape_peak(3),
    keeps=stream_records(1),
    makes_material=True,
)
def dealer_input_mask(
    ctx: Any, seeds: list[torch.Tensor], alpha: torch.Tensor, nonce: int, shape: list[int]
) -> list[torch.Tensor]:
    """An authenticated random r for an input: the last party's MAC share of it, and r's
    low 64 bits for the input's owner (an ordinary output: the client's own mask)."""
    consume(ctx, seeds, nonce, TAG_IN)
    (mac,), r = deal_value(seeds, nonce, TAG_IN, shape, alpha)
    return [mac, r[0].clone()]


def _input_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corr")
    key = key_of(call)
    call.material("corr", "auth.in_corr", nonce, local=False, optional=True, consume=True)
    d = call.share("d")
    if not isinstance(d, torch.Tensor) or d.dtype != torch.int64:
        raise call.refuse("parameter 'd' takes the int64 tensor the input's owner sent")
    return [kept_share(key.nonce)]


@step(rule=_input_rule, size=vm_peak(4, "d"), keeps=stream_records(1), makes_material=True)
def auth_input(
    ctx: Any,
    seed: torch.Tensor,
    key: torch.Tensor,
    nonce: int,
    first: bool,
    d: torch.Tensor,
    corr: torch.Tensor | None,
) -> torch.Tensor:
    """This party's authenticated share of an input x = d + r: its share of the dealer's
    authenticated r, plus d (x - r mod 2^64, which the input's owner sent every party) at
    the first party and alpha_i d at every party."""
    consume(ctx, [seed], nonce, TAG_IN)
    shape = list(d.shape)
    r = party_value(seed, nonce, TAG_IN, shape, mac=corr)
    return with_public(r, key, first, r128.lift_unsigned(d))


# -- outputs -------------------------------------------------------------------------------


@step(
    rule=_mask_rule("auth.out_corr"),
    size=shape_peak(3),
    keeps=stream_records(1),
    makes_material=True,
)
def dealer_output_mask(
    ctx: Any, seeds: list[torch.Tensor], alpha: torch.Tensor, nonce: int, shape: list[int]
) -> list[torch.Tensor]:
    """An authenticated random r for an output: the last party's MAC share of it, and r's
    low 64 bits for the client (who alone learns y - r, the output)."""
    consume(ctx, seeds, nonce, TAG_OUT)
    (mac,), r = deal_value(seeds, nonce, TAG_OUT, shape, alpha)
    return [mac, r[0].clone()]


def _output_mask_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "corr")
    share_of(call, "x")
    call.material("corr", "auth.out_corr", nonce, local=False, optional=True, consume=True)
    return [seal(PIECE + "out", nonce), seal(PIECE_MAC + "out", nonce, deliveries=0)]


@step(
    rule=_output_mask_rule,
    size=vm_peak(4, "x"),
    keeps=stream_records(1),
    makes_material=True,
)
def auth_output_mask(
    ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor, corr: torch.Tensor | None
) -> list[torch.Tensor]:
    """This party's piece of y = x + r (the value share, to open among the parties) and
    its MAC share; r is the dealer's authenticated mask whose low bits only the client
    knows."""
    consume(ctx, [seed], nonce, TAG_OUT)
    shape = list(x.shape[2:])
    y = r128.add(x, party_value(seed, nonce, TAG_OUT, shape, mac=corr))
    return [y[:, 0].contiguous(), y[:, 1].contiguous()]


def _release_rule(call: ProtocolCall) -> Any:
    label = call.material("y", OPENED + "out", local=True, consume=True)
    assert label is not None
    st = party_state(call.state)
    if st["failed"]:
        raise call.refuse(
            f"a MAC check failed in this session ({st['failed']}): nothing is released"
        )
    epoch = label.extra[0] if label.extra and type(label.extra[0]) is int else None
    if epoch is None or epoch > st["checked"]:
        raise call.refuse(
            "an output is released only after a MAC check that covers its opening "
            "(mpc.protocols.mac_check)"
        )
    return None


@step(rule=_release_rule, size=lambda p: WORD * shape_elems(p.get("y")) + SLACK)
def auth_release(ctx: Any, y: torch.Tensor) -> torch.Tensor:
    """The low 64 bits of an opened output y = x + r, for the client, once a MAC check
    covered its opening and every opening before it."""
    return y[0].clone()


def shape_elems(t: Any) -> int:
    return t.numel() if isinstance(t, torch.Tensor) else 1
