"""The steps of the comparison by digit look-ups (the protocol:
:class:`mpc.protocols.digit_compare.run.DigitRun`; the math:
:mod:`mpc.math.digit_compare`): the dealer's tables, each party's mask of x, its zero
tests' masked operands and its bit.

Dealer, for the mask r (the sum of the parties' derived words, one an element of x):
one-hot tables of the 8 digits of R = the low 63 bits of ~r, shared modulo 16 (two
entries a byte: 1,024 bytes an element); h = msb(~r), shared additively; and per
compared value (an element and one of its T public thresholds) and digit, the one-hot
table of the zero test's mask rho modulo the digit's modulus (16 for the four lowest
digits, then 8, 8, 4, 2: above the digit's largest w) times (1 - 2h), shared additively
(86 words).
The parties before the last derive their shares; the last party's come in two
deliveries, one for each step that reads them.

Round 1 opens c = x + r (one word an element). Round 2 opens u = w + rho mod 256 (a byte) for each
compared value and digit (w linear in the tables' shares at c's digits, rho each party's
derived word: u is uniform), and each party's share of the bit is then local:
msb(x - theta) = b + (1 - 2b) (h + (1 - 2h) sum_i [w_i = 0]), with b = msb(c - theta)
public and (1 - 2h) [w_i = 0] the entry of the dealt table at u_i mod M_i.

Instance: one nonce for r, the tables, h, the masks rho and their tables. Each
threshold's comparisons of an element share its r (one opening of c an element), each
has its own rho and tables.
"""

from __future__ import annotations

from typing import Any

import torch

from mpc.math import digit_compare as dm
from mpc.protocols.comparison.thresholds import MAX_THRESHOLDS, threshold_values
from mpc.protocols.rules import OPENED, dealer_seeds, kept, nonce_of, party_seed
from mpc.protocols.sizes import WORD, declared, elementwise, numel, stream_records, tensor_elems
from mpc.protocols.step import SUM, step
from mpc.protocols.streams import (
    TAG_A,
    TAG_B,
    TAG_C,
    TAG_D,
    TAG_R,
    TAG_TABLE,
    TAG_U,
    consume,
    derive,
    last_share,
    sum_derived,
)
from pointers.worker.sealing import ProtocolCall, seal

#: the opened values and the dealer's two deliveries (the tables of R's digits; h and
#: the zero tests' tables)
DIGIT_C, DIGIT_U = "digits.c", "digits.u"
DEALER_TABLES, DEALER_TESTS = "dealer.digits.tables", "dealer.digits.tests"
#: one compared value's zero tests: a table a digit, 86 words in all (mpc.math.digit_compare.MODULI)
TEST_WORDS = dm.TEST_ENTRIES
#: selections: the opened masked values, each party's kept mask
DIGIT_E, DIGIT_M = "digits.e", "digits.m"
#: one selected value's material an element: h m and the picked zero tests' tables times m
SELECT_WORDS = 1 + TEST_WORDS
#: the most values one run selects
MAX_SELECTED = 1 << 14


def _count(thresholds: Any) -> int:
    """T, the thresholds compared with each element (1 without)."""
    if thresholds is None:
        return 1
    if not isinstance(thresholds, list) or not 1 <= len(thresholds) <= MAX_THRESHOLDS:
        raise ValueError(f"thresholds are a list of 1 to {MAX_THRESHOLDS} ring values")
    return len(thresholds)


def _t(p: dict[str, Any]) -> int:
    t = p.get("thresholds")
    return min(len(t), MAX_THRESHOLDS) if isinstance(t, list) and t else 1


def _picks(picks: Any, count: int) -> int:
    """S, the values selected (0 without): each picks one of the T compared values of an
    element (an index into the thresholds; 0 without)."""
    if picks is None:
        return 0
    if not (
        isinstance(picks, list)
        and 1 <= len(picks) <= MAX_SELECTED
        and all(type(k) is int and 0 <= k < count for k in picks)
    ):
        raise ValueError(
            f"picks are a list of 1 to {MAX_SELECTED} indices of the {count} compared values"
        )
    return len(picks)


def _s(p: dict[str, Any]) -> int:
    picks = p.get("picks")
    return min(len(picks), MAX_SELECTED) if isinstance(picks, list) else 0


# -- the dealer ----------------------------------------------------------------------------


def _dealer_rule(call: ProtocolCall) -> Any:
    dealer_seeds(call)
    nonce = nonce_of(call)
    count = _count(call.value("thresholds"))
    shape = call.value("shape")
    picks = call.value("picks")
    selected = _picks(picks, count)
    return [
        seal(DEALER_TABLES, nonce, deliveries=1, extra=(numel(shape),)),
        seal(DEALER_TESTS, nonce, count, deliveries=1, extra=tuple(picks) if selected else ()),
    ]


def _dealer_size(p: dict[str, Any]) -> int:
    """The tables and a derived share unpacked (3 KB an element at the peak) and the zero
    tests' tables with one derived share (2.2 KB a compared value): 4.9 KB an element
    measured with one threshold, at 2^13 elements; the selections' products and a derived
    share (2 words each: 49.3 MiB in all measured for 64 of 512 against 16 thresholds)."""
    n = numel(p.get("shape"))
    tests = 2.2 * TEST_WORDS * WORD * n * _t(p)
    return declared(3072 * n + tests + 2.0 * SELECT_WORDS * WORD * n * _s(p))


def _dealer_keeps(p: dict[str, Any]) -> int:
    return stream_records(7 if _s(p) else 5)(p)


@step(rule=_dealer_rule, size=_dealer_size, keeps=_dealer_keeps, makes_material=True)
def dealer_digit_compare(
    ctx: Any,
    seeds: list[torch.Tensor],
    nonce: int,
    shape: list[int],
    thresholds: list[int] | None,
    picks: list[int] | None = None,
) -> list[torch.Tensor]:
    """The last party's shares: the prefix tables of R's digits ([n, PACKED_WORDS],
    4-bit entries: :func:`mpc.math.digit_compare.prefix_tables`), then h and the zero tests' tables (flat: n words, then [T, n, 86]: per
    digit, a one-hot table of rho mod its modulus, times 1 - 2h); with ``picks``, after
    them (the same delivery) per selected value s and element, h m_s and the tables of
    compared value picks[s] times m_s ([S, n, SELECT_WORDS]), m_s the parties' derived
    mask of value s."""
    count = _count(thresholds)
    selected = _picks(picks, count)
    consume(ctx, seeds, nonce, TAG_R, TAG_A, TAG_B, TAG_C, TAG_TABLE)
    if selected:
        consume(ctx, seeds, nonce, TAG_U, TAG_D)
    n = numel(shape)
    r = sum_derived(seeds, nonce, TAG_R, [n])
    packed = dm.packed_prefix_tables(dm.secret_digits(r))
    for s in seeds[:-1]:
        dm.sub_packed_(packed, derive(s, nonce, TAG_A, [n, dm.PACKED_WORDS]))
    h = (r >> 63).bitwise_and_(1).bitwise_xor_(1)  # msb(~r)
    del r
    at = dm.test_index(sum_derived(seeds, nonce, TAG_C, [count, n, dm.DIGITS]))
    end = n + count * n * TEST_WORDS
    out = torch.zeros(end + selected * n * SELECT_WORDS, dtype=torch.int64)
    tests = out[n:end].view(count, n, TEST_WORDS)
    tests.scatter_(-1, at, (1 - 2 * h).view(1, n, 1).expand(count, n, dm.DIGITS))
    del at
    if picks is not None and selected:
        m = sum_derived(seeds, nonce, TAG_U, [selected, n])
        sel = out[end:].view(selected, n, SELECT_WORDS)
        torch.mul(h, m, out=sel[..., 0])
        torch.mul(tests[picks], m.unsqueeze(-1), out=sel[..., 1:])
        del m
        last_share(sel, seeds, nonce, TAG_D)
    last_share(tests, seeds, nonce, TAG_TABLE)
    out[:n] = last_share(h, seeds, nonce, TAG_B)
    return [packed, out]


# -- the parties ---------------------------------------------------------------------------


def _mask_rule(call: ProtocolCall) -> Any:
    party_seed(call)
    call.share("x")
    return [seal(DIGIT_C, nonce_of(call))]


@step(
    rule=_mask_rule,
    size=elementwise(2, "x"),
    keeps=stream_records(1),
    makes_material=True,
    opens={DIGIT_C: SUM},
)
def digit_mask(ctx: Any, seed: torch.Tensor, nonce: int, x: torch.Tensor) -> torch.Tensor:
    """Party i: c_i = x_i + r_i."""
    consume(ctx, [seed], nonce, TAG_R)
    return derive(seed, nonce, TAG_R, list(x.shape)).add_(x)


def _compared(c: torch.Tensor, thresholds: list[int] | None) -> torch.Tensor:
    """The opened c compared with each threshold: c - theta_k, [T, n]."""
    flat = c.reshape(1, -1)
    if thresholds is None:
        return flat
    return flat - threshold_values(thresholds).view(-1, 1)


def _select_mask_rule(call: ProtocolCall) -> Any:
    party_seed(call)
    call.share("values")
    nonce = nonce_of(call)
    return [seal(DIGIT_E, nonce), kept(DIGIT_M, nonce)]


@step(
    rule=_select_mask_rule,
    size=elementwise(2, "values"),
    keeps=stream_records(1),
    makes_material=True,
    opens={DIGIT_E: SUM},
)
def digit_select_mask(
    ctx: Any, seed: torch.Tensor, nonce: int, values: torch.Tensor
) -> list[torch.Tensor]:
    """Party i: e_i = v_i + m_i for the selected values [S, *x] (opened in the zero
    tests' round) and m_i (kept for the finish), m_i derived."""
    consume(ctx, [seed], nonce, TAG_U)
    m = derive(seed, nonce, TAG_U, list(values.shape))
    return [values + m, m]


def _test_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "tables")
    call.material("tables", DEALER_TABLES, nonce, local=False, optional=True, consume=True)
    call.material("c", OPENED + DIGIT_C, nonce, local=True)
    return [seal(DIGIT_U, nonce)]


def _test_size(p: dict[str, Any]) -> int:
    """The packed tables derived (1 KB an element); per compared value, C's digits and
    the entries read at them (10 words a digit): 13.3 MiB measured for 2^13 elements,
    3.8 for 64 against 128 thresholds."""
    n = tensor_elems(p, "c")
    return declared(1024 * n + 10 * dm.DIGITS * WORD * n * _t(p))


@step(
    rule=_test_rule,
    size=_test_size,
    keeps=stream_records(2),
    makes_material=True,
    opens={DIGIT_U: SUM},
)
def digit_test(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    tables: torch.Tensor | None,
    c: torch.Tensor,
    thresholds: list[int] | None = None,
) -> torch.Tensor:
    """Party i's u_i = w_i + rho_i mod 256 for each compared value and digit, [T, n, 8]
    uint8 (the sum of the parties' bytes, modulo 256, is uniform: rho's sum is): w_i from
    its shares of the tables of R's digits (derived, or the last party's ``tables``) at
    the digits of C = 2^63 - 1 - (c - theta) mod 2^63 (:func:`mpc.math.digit_compare.
    zero_test_operands`: two entries of its packed prefix tables a digit), rho_i
    derived."""
    count = _count(thresholds)
    n = c.numel()
    if tables is not None and list(tables.shape) != [n, dm.PACKED_WORDS]:
        raise ValueError(f"the dealer's tables are {list(tables.shape)} for {n} elements")
    consume(ctx, [seed], nonce, TAG_A, TAG_C)
    words = derive(seed, nonce, TAG_A, [n, dm.PACKED_WORDS]) if tables is None else tables
    w = dm.zero_test_operands(words, dm.public_digits(_compared(c, thresholds)), first)
    w += derive(seed, nonce, TAG_C, [count, n, dm.DIGITS])
    return w.bitwise_and_(255).to(torch.uint8)  # (opened modulo 256: a byte, not a word)


def _finish_rule(call: ProtocolCall) -> Any:
    nonce = nonce_of(call)
    party_seed(call, "tests")
    tests = call.material("tests", DEALER_TESTS, nonce, local=False, optional=True, consume=True)
    if tests is not None and tests.index != _t({"thresholds": call.value("thresholds")}):
        raise call.refuse("the thresholds are not the ones the dealer's tables are for")
    picks = call.value("picks")
    if tests is not None and list(tests.extra) != (picks if isinstance(picks, list) else []):
        raise call.refuse("the selections are not the ones the dealer's tables are for")
    call.material("c", OPENED + DIGIT_C, nonce, local=True, consume=True)
    call.material("u", OPENED + DIGIT_U, nonce, local=True, consume=True)
    e = call.material("e", OPENED + DIGIT_E, nonce, local=True, optional=True, consume=True)
    m = call.material("m", DIGIT_M, nonce, local=True, optional=True, consume=True)
    if (e is None) != (picks is None) or (m is None) != (picks is None):
        raise call.refuse("selections take their opened masked values and their masks")
    return None


def _finish_size(p: dict[str, Any]) -> int:
    """The zero tests' tables (derived or dealt: 86 words a compared value),
    the entries read and the bits: 98 words (measured 89-96 at 2^13 compared values);
    per selected value, its tables and what is read of them (99 words an element)."""
    n = tensor_elems(p, "c")
    return declared((TEST_WORDS + 12) * WORD * n * _t(p) + (SELECT_WORDS + 12) * WORD * n * _s(p))


def _finish_keeps(p: dict[str, Any]) -> int:
    return stream_records(3 if _s(p) else 2)(p)


@step(rule=_finish_rule, size=_finish_size, keeps=_finish_keeps)
def digit_finish(
    ctx: Any,
    seed: torch.Tensor,
    nonce: int,
    first: bool,
    tests: torch.Tensor | None,
    c: torch.Tensor,
    u: torch.Tensor,
    thresholds: list[int] | None = None,
    picks: list[int] | None = None,
    e: torch.Tensor | None = None,
    m: torch.Tensor | None = None,
) -> Any:
    """Party i's share of msb(x - theta_k), [T, *x] ([*x] without thresholds), from the
    opened c and u: b + (1 - 2b) y with y = h + sum_i Q_i[u_i mod M_i], b = msb(c -
    theta_k) public (the constant b at party 0 only), h and the tables Q = (1 - 2h)
    onehot(rho) its shares (derived, or the last party's ``tests``).

    With ``picks``: [bits, selected], selected [S, *x] its shares of msb_k v_s for each
    selected value v_s (k = picks[s]) from the opened e_s = v_s + m_s and its share m_s:
    msb_k e_s - b m_s - (1 - 2b) [y m_s], [y m_s] = [h m_s] + sum_i [Q_i m_s][u_i mod M_i]
    (derived, or the last party's, after its ``tests``)."""
    count = _count(thresholds)
    selected = _picks(picks, count)
    n = c.numel()
    if list(u.shape) != [count, n, dm.DIGITS] or u.dtype != torch.uint8:
        raise ValueError(f"u is {u.dtype} {list(u.shape)}, not uint8 [{count}, {n}, {dm.DIGITS}]")
    end = n + count * n * TEST_WORDS
    if tests is not None and tests.numel() != end + selected * n * SELECT_WORDS:
        raise ValueError(
            f"the dealer's zero tests are {tests.numel()} words, not for {count} x {n}"
            f" and {selected} selected values"
        )
    if selected:
        if e is None or m is None or list(e.shape) != [selected, *c.shape] or e.shape != m.shape:
            raise ValueError(f"the selections' e and m are [{selected}, *x] for {selected} picks")
    consume(ctx, [seed], nonce, TAG_B, TAG_TABLE)
    if selected:
        consume(ctx, [seed], nonce, TAG_D)
    if tests is None:
        h = derive(seed, nonce, TAG_B, [n])
        dealt = None
    else:
        h, dealt = tests[:n], tests[n:end]
    shape = [count, n, TEST_WORDS]
    table = derive(seed, nonce, TAG_TABLE, shape) if dealt is None else dealt.view(shape)
    at = dm.test_index(u)
    y = torch.gather(table, -1, at).sum(-1).add_(h)
    b = (_compared(c, thresholds) >> 63) & 1
    sign = 1 - 2 * b
    out = y.mul_(sign)
    if first:
        out += b
    bits = out.reshape([count, *c.shape] if thresholds is not None else list(c.shape))
    if not selected:
        return bits
    assert picks is not None and e is not None and m is not None
    shape = [selected, n, SELECT_WORDS]
    sel = derive(seed, nonce, TAG_D, shape) if tests is None else tests[end:].view(shape)
    picked = torch.tensor(picks, dtype=torch.int64)
    ym = torch.gather(sel[..., 1:], -1, at[picked]).sum(-1).add_(sel[..., 0])
    flat_e, flat_m = e.reshape(selected, n), m.reshape(selected, n)
    got = out[picked] * flat_e - b[picked] * flat_m - sign[picked] * ym
    return [bits, got.reshape(e.shape)]
