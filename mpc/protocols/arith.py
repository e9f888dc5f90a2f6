"""Arithmetic protocols over additive shares in Z/2^64.

Notation: [x] is an additive sharing, x = sum_i x_i mod 2^64, party i holding x_i.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

import pointers as pt
from mpc import accounting, config
from mpc.material.dealer import trunc_correction_words
from mpc.session import Session

Shares = list[pt.PointerTensor]
I64 = torch.int64


Out = list[tuple[Any, torch.dtype]]


def call(worker: Any, name: str, args: list[Any], out: Out) -> Shares:
    return pt.call_function(worker, name, args, out=out)  # type: ignore[return-value]


def at_parties(
    session: Session, name: str, args: Callable[[int], list[Any]], out: Out
) -> list[Shares]:
    """Run the step ``name`` at every party, party i with ``args(i)``; per output of the
    step, its shares (one pointer per party): ``e, f, a = at_parties(...)``."""
    per_party = [call(p, name, args(i), out) for i, p in enumerate(session.parties)]
    return [list(col) for col in zip(*per_party)]


def last_only(session: Session, value: Any) -> Callable[[int], Any]:
    """``value`` at the last party (the dealer's corrections go there), None elsewhere."""
    last = session.n - 1
    return lambda i: value if i == last else None


class Round:
    """Values to open among the parties together, in one round: ``add`` each (it returns
    a handle), ``open`` once, then read each handle's ``.value`` (per party, a pointer to
    the opened value there)."""

    def __init__(self, session: Session, xor: bool = False) -> None:
        self.session, self.xor = session, xor
        self._values: list[Shares] = []
        self._handles: list[Opened] = []

    def add(self, shares: Shares) -> Opened:
        handle = Opened()
        self._values.append(shares)
        self._handles.append(handle)
        return handle

    def open(self, count: bool = True) -> None:
        """``count=False``: the values ride in a round already counted."""
        if self._values:
            for h, v in zip(self._handles, open_among(self.session, self._values, self.xor, count)):
                h.value = v
        elif count:
            accounting.count_round()
        self._values, self._handles = [], []


class Opened:
    """A value opened in a :class:`Round` (set when the round opens)."""

    value: Shares


def deal(
    session: Session, what: str, name: str, args: list[Any], out: list[tuple[Any, torch.dtype]]
) -> Shares:
    """Run the dealer function ``name`` (its first argument: the dealer's copies of the
    party seeds) and deliver its outputs, the last party's corrections, dealer -> last
    party. The other parties derive their material from their seeds."""
    dealer = session.require_dealer(what)
    corr = call(dealer, name, [session.dealer_seeds, *args], out=out)
    last_party = session.parties[-1]
    return [c.move(last_party) for c in corr]


def open_among(
    session: Session, values: list[Shares], xor: bool = False, count: bool = True
) -> list[Shares]:
    """Open each [v] among the parties in one round: party i sends v_i to every other
    party, then each party sums (``xor``: XORs) what it holds. Returns, per value, a
    pointer to the opened value at each party. The client never sees an opened value.
    ``count=False``: the values travel in a round already counted (same messages batch).
    Several values of one dtype travel packed (``mpc.pack``/``mpc.unpack``): one delivery
    per peer per round (per :data:`~mpc.config.PIECE_BYTES` of values), so a round costs
    one latency, not one per value."""
    if count:
        accounting.count_round()
    dtypes = {s.dtype for shares in values for s in shares}
    if len(values) > 1 and len(dtypes) == 1:
        # one delivery per peer for the whole round (one latency, not one per value), in
        # packs of at most mpc.config.PIECE_BYTES (a network message is at most 256 MiB by default)
        out: list[Shares] = []
        for group in _packs(values):
            out += (
                _open_packed(session, group, xor)
                if len(group) > 1
                else [_open_one(session, group[0], xor)]
            )
        return out
    return [_open_one(session, shares, xor) for shares in values]


def _packs(values: list[Shares]) -> list[list[Shares]]:
    """Consecutive groups of ``values`` of at most :data:`~mpc.config.PIECE_BYTES` each (a larger
    value alone)."""
    groups: list[list[Shares]] = []
    size = 0
    for shares in values:
        n = shares[0].numel() * shares[0].element_size()
        if groups and size + n <= config.PIECE_BYTES:
            groups[-1].append(shares)
            size += n
        else:
            groups.append([shares])
            size = n
    return groups


def _open_packed(session: Session, values: list[Shares], xor: bool) -> list[Shares]:
    """Each party packs its shares of ``values`` (one dtype), the packed sums are opened
    (each party sums or XORs the pieces and splits the sum in one step)."""
    parties = session.parties
    dtype = values[0][0].dtype
    shapes = [[int(d) for d in shares[0].shape] for shares in values]
    total = sum(math.prod(s) for s in shapes)
    packed = [
        call(p, "mpc.pack", [[shares[i] for shares in values]], out=[((total,), dtype)])[0]
        for i, p in enumerate(parties)
    ]
    pieces = exchange(session, packed, count=False)
    metas: Out = [(tuple(s), dtype) for s in shapes]
    per_party = [
        call(p, "mpc.open_unpack", [pieces[j], shapes, xor], out=metas)
        for j, p in enumerate(parties)
    ]
    return [list(col) for col in zip(*per_party)]


def _open_one(session: Session, shares: Shares, xor: bool) -> Shares:
    """Each party opens the value from its share and its peers' (one step: the workers
    check that these are the pieces of one value to open, used once)."""
    pieces = exchange(session, shares, count=False)
    meta: Out = [(tuple(shares[0].shape), shares[0].dtype)]
    shape = [[int(d) for d in shares[0].shape]]
    return [
        call(p, "mpc.open_unpack", [pieces[j], shape, xor], out=meta)[0]
        for j, p in enumerate(session.parties)
    ]


def exchange(session: Session, shares: Shares, count: bool = True) -> list[Shares]:
    """One round in which each party sends its share of [v] to every other party, without
    the sums: per party j, [v_j, then v_i from each other party i], for a step that opens
    v itself (adds or XORs the pieces) as it uses it, one message per party fewer than
    :func:`open_among`. The client never sees a piece."""
    if count:
        accounting.count_round()
    pieces: list[Shares] = [[s] for s in shares]
    for i, s in enumerate(shares):
        for j, pj in enumerate(session.parties):
            if i != j:
                pieces[j].append(s.copy_to(pj, lend=True))  # only read at both ends
    return pieces


class BeaverRun:
    """A Beaver product split in phases so its opening can share a round with others."""

    def __init__(
        self,
        session: Session,
        x: Shares,
        y: Shares,
        op: str,
        params: dict[str, Any],
        out_shape: tuple[int, ...],
    ) -> None:
        self.session, self.op, self.params, self.out_shape = session, op, params, out_shape
        self.y = y
        self.nonce = nonce = session.next_nonce()
        x_shape, y_shape = list(x[0].shape), list(y[0].shape)
        seed = session.party_seeds
        # offline: the dealer's correction c to the last party
        (self.c_last,) = deal(
            session,
            f"{op} of two secret values",
            "mpc.dealer_triple",
            [nonce, x_shape, y_shape, op, params],
            out=[(out_shape, I64)],
        )
        # [e | f] = [x] - [a] | [y] - [b] packed flat (opened as one value), and [a]
        self.ef, self.a = at_parties(
            session,
            "mpc.beaver_mask",
            lambda i: [seed[i], nonce, x[i], y[i]],
            out=[((math.prod(x_shape) + math.prod(y_shape),), I64), (x_shape, I64)],
        )

    def open_in(self, round: Round) -> Opened:
        """Schedule the opening of e and f (one packed value) in ``round``."""
        return round.add(self.ef)

    def finish_opened(self, opened: Opened) -> Shares:
        return self.finish(opened.value)

    def finish(self, ef: Shares) -> Shares:
        """[z] = [c] + op(e, [y]) + op([a], f), from the opened [e | f]."""
        seed, nonce, y, a = self.session.party_seeds, self.nonce, self.y, self.a
        c = last_only(self.session, self.c_last)
        (z,) = at_parties(
            self.session,
            "mpc.beaver_combine",
            lambda i: [seed[i], nonce, c(i), y[i], a[i], ef[i], self.op, self.params],
            out=[(self.out_shape, I64)],
        )
        self.ef, self.a, self.y = [], [], []
        return z


def beaver(
    session: Session,
    x: Shares,
    y: Shares,
    op: str,
    params: dict[str, Any],
    out_shape: tuple[int, ...],
) -> Shares:
    """[op(x, y)] for a bilinear ``op`` (mul, matmul, conv2d) with a Beaver triple.

    Offline: the dealer expands every party's seed to a = sum a_i, b = sum b_i, computes
    c = op(a, b) and ships c_{n-1} = c - sum_{i<n-1} c_i to the last party only.
    Online (one round): open e = x - a and f = y - b together; then
    [z] = [c] + op(e, [y]) + op([a], f), which sums to op(a + e, b + f).
    Beaver, "Efficient multiparty protocols using circuit randomization", CRYPTO 1991.
    """
    run = BeaverRun(session, x, y, op, params, out_shape)
    one = Round(session)
    opened = run.open_in(one)
    one.open()
    return run.finish_opened(opened)


class TruncRun:
    """Truncation with known MSB, split in phases (see :func:`truncate`)."""

    def __init__(self, session: Session, z: Shares, bits: int) -> None:
        self.session, self.bits = session, bits
        self.nonce = nonce = session.next_nonce()
        self.shape = shape = list(z[0].shape)
        seed = session.party_seeds
        # offline: the last party's [U] (int64) and its share of s, [D] = 2^(64-bits) [s]
        # (``bits`` bits, in the narrowest dtype that holds them: int16 at 16 bits)
        (self.corr,) = deal(
            session,
            "truncation of a fixed-point product",
            "mpc.dealer_trunc",
            [nonce, shape, bits],
            out=[([trunc_correction_words(math.prod(shape), bits)], I64)],
        )
        # [c] = [z] + [r]
        (self.masked,) = at_parties(
            session, "mpc.trunc_mask", lambda i: [seed[i], nonce, z[i]], [(shape, I64)]
        )

    def open_in(self, round: Round) -> Opened:
        return round.add(self.masked)

    def finish(self, c: Shares) -> Shares:
        """[z >> bits] = [U] + ([D] & (c >> 63)) (+ c >> bits at party 0)."""
        seed, nonce, bits = self.session.party_seeds, self.nonce, self.bits
        corr = last_only(self.session, self.corr)
        (out,) = at_parties(
            self.session,
            "mpc.trunc_finish",
            lambda i: [seed[i], nonce, i == 0, corr(i), c[i], bits],
            [(self.shape, I64)],
        )
        return out


def truncate(session: Session, z: Shares, bits: int) -> Shares:
    """[z >> bits] for |z| < 2^62, exact up to one unit in the last place, any n.

    Dealer: r uniform, shared; with r' = r - 2^62 and h = msb(r') it deals
    [U] = [-(r' >> bits) - 2^(62-bits)] and [D] = [2^(64-bits) (1 - h)], D shared as
    2^(64-bits) [s] with s = 1 - h in Z/2^bits, so the last party's correction for it is
    ``bits`` bits (2 bytes an element at 16 bits, not 8; see ``dealer_trunc``). Parties open
    c = z + r = (z + 2^62) + r' (one round). With b = msb(c) xor h, the carry out of the
    low 63 bits, z + 2^62 = (c mod 2^63) - (r' mod 2^63) + 2^63 b; given the public msb(c)
    this is linear in h: each party keeps [U] + [D] where msb(c) = 1 and [U] elsewhere,
    and party 0 adds c >> bits (three local passes). Rounding error: the result is
    floor(z / 2^bits) or one more; there is no wrap-around failure (unlike local
    truncation), because the mask's top bit is known in shared form ("truncation with
    known MSB", cf. Escudero et al., CRYPTO 2020; Dalskov et al., PoPETs 2020).
    """
    if bits == 0:
        return z
    run = TruncRun(session, z, bits)
    one = Round(session)
    c = run.open_in(one)
    one.open()
    return run.finish(c.value)
