"""Attacks on the malicious mode, as a deviating party makes them: at every protocol step a
party changes what it holds or sends (an error e added to its share, its MAC share, its
piece of an opening, its triple or truncation-pair share, the value it opened, its
residual, its output share, its word in the MAC check), or hands on stale material (the
same output of the step's previous instance), for e in {1, 2^16, 2^63, a random word}, at
the first and at the last party. Every deviation is caught: ``get()`` raises
:class:`mpc.MACCheckError` and returns no value, and the session releases nothing after.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from deviations import deviating

import mpc
import pointers as pt
from mpc.protocols.auth_beaver.steps import auth_beaver_combine, auth_beaver_mask
from mpc.protocols.auth_comparison.steps import auth_cmp_leaves, auth_cmp_mask
from mpc.protocols.auth_fss.steps import auth_fss_eval, auth_fss_mask
from mpc.protocols.auth_local.steps import (
    auth_bilinear_public,
    auth_linear,
    auth_scale,
    auth_sum,
    auth_view,
)
from mpc.protocols.auth_opening.steps import auth_open
from mpc.protocols.auth_shares.steps import (
    auth_input,
    auth_key,
    auth_output_mask,
    auth_release,
)
from mpc.protocols.auth_truncation.steps import auth_trunc_finish, auth_trunc_mask
from mpc.protocols.mac_check.steps import (
    mac_check_combine,
    mac_check_commit,
    mac_check_open,
    mac_check_reveal,
)

X = torch.tensor([1.5, 2.0, -0.5, 3.0])
Y = torch.tensor([2.0, 3.0, 1.0, -1.0])
PUB = torch.tensor([[0.5, -1.0], [2.0, 0.25]])
ERRORS = {"1": 1, "2^16": 1 << 16, "2^63": 1 << 63, "random": None}


def session(workers: list[Any], dealer: Any) -> mpc.Session:
    """The session (its workers' functions installed: a deviation replaces one of them)."""
    return mpc.Session(workers, dealer, security="malicious")


def program(s: mpc.Session) -> Any:
    """Every step of the products and local ops: inputs, a product and its truncation, a
    public constant, a second product, a reshape, a product by a public matrix, a sum, an
    integer scale; its output (the MAC check, the release)."""
    x = mpc.share(X, session=s)
    y = mpc.share(Y, session=s)
    z = (x * y + 1.0) * y
    return (z.reshape(2, 2) @ PUB).sum(0) * 3


def expected() -> torch.Tensor:
    z = (X * Y + 1.0) * Y
    return (z.reshape(2, 2) @ PUB).sum(0) * 3


# (step, output, where in it: (limb, value/MAC) of a share, (limb,) of a piece, () of a word)
CASES: list[tuple[Any, int, tuple[int, ...], str]] = [
    (auth_key, 0, (0,), "its share of the MAC key"),
    (auth_input, 0, (0, 0), "its input share"),
    (auth_input, 0, (0, 1), "its input share's MAC"),
    (auth_beaver_mask, 0, (0,), "its piece of [e | f]"),
    (auth_beaver_mask, 1, (0,), "the MAC of its piece of [e | f]"),
    (auth_beaver_mask, 2, (0, 0), "its triple share a"),
    (auth_beaver_mask, 2, (0, 1), "the MAC of its triple share a"),
    (auth_beaver_mask, 3, (0, 0), "its triple share c"),
    (auth_open, 0, (0,), "the value it opened"),
    (auth_open, 1, (0,), "its residual for the check"),
    (auth_beaver_combine, 0, (0, 0), "its product share"),
    (auth_beaver_combine, 0, (0, 1), "its product share's MAC"),
    (auth_trunc_mask, 0, (0,), "its piece of the truncation's c"),
    (auth_trunc_mask, 2, (0, 0, 0), "its share of the truncation pair's U"),
    (auth_trunc_mask, 2, (1, 0, 0), "its share of the truncation pair's H"),
    (auth_trunc_finish, 0, (0, 0), "its truncated share"),
    (auth_linear, 0, (0, 0), "its share of a sum with a constant"),
    (auth_view, 0, (0, 0), "its share after a reshape"),
    (auth_bilinear_public, 0, (0, 0), "its share of a product by a public matrix"),
    (auth_sum, 0, (0, 0), "its share of a sum"),
    (auth_scale, 0, (0, 0), "its share of a product by a public integer"),
    (auth_output_mask, 0, (0,), "its piece of the output"),
    (auth_output_mask, 1, (0,), "its output piece's MAC"),
    (auth_release, 0, (), "the output it releases to the client"),
    (mac_check_commit, 0, (), "its commitment to its coin seed"),
    (mac_check_reveal, 0, (), "its coin seed"),
    (mac_check_combine, 0, (), "its commitment to z"),
    (mac_check_open, 0, (), "its z"),
]


def _error(e: int | None) -> int:
    return int.from_bytes(os.urandom(8), "little") | 1 if e is None else e


@pytest.mark.parametrize("error", list(ERRORS), ids=list(ERRORS))
@pytest.mark.parametrize("who", [0, 1], ids=["first", "last"])
@pytest.mark.parametrize(
    "step,output,part,what", CASES, ids=[f"{c[0].__name__}-{c[3]}" for c in CASES]
)
def test_every_deviation_is_caught(
    step: Any, output: int, part: tuple[int, ...], what: str, who: int, error: str
) -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    dealer = pt.VirtualWorker("carol")
    s = session(workers, dealer)
    e = _error(ERRORS[error])
    if not part:  # (a word of bytes: the check's messages)
        e %= 256 or 1
        e = e or 1
    with deviating(workers[who], step, output, e, part) as count:
        with pytest.raises(mpc.MACCheckError) as caught:
            out = program(s).get()
            pytest.fail(f"no check caught {what} + {e}: the client got {out}")  # (unreached)
    assert count[0] >= 1, f"the program never ran {step.__name__}"
    assert "check failed" in str(caught.value)


@pytest.mark.parametrize("who", [0, 2], ids=["first", "last"])
@pytest.mark.parametrize("step,output,part,what", CASES[1:12:2], ids=[c[3] for c in CASES[1:12:2]])
def test_every_deviation_is_caught_with_three_parties(
    step: Any, output: int, part: tuple[int, ...], what: str, who: int
) -> None:
    workers = [pt.VirtualWorker(n) for n in ("alice", "bob", "dave")]
    s = session(workers, pt.VirtualWorker("carol"))
    with deviating(workers[who], step, output, _error(None), part):
        with pytest.raises(mpc.MACCheckError):
            program(s).get()


STALE = [
    (auth_beaver_mask, 2, "its triple share a of the previous product"),
    (auth_beaver_mask, 3, "its triple share c of the previous product"),
    (auth_trunc_mask, 2, "its truncation pair of the previous truncation"),
    (auth_open, 0, "the value the previous opening opened"),
]


@pytest.mark.parametrize("who", [0, 1], ids=["first", "last"])
@pytest.mark.parametrize("step,output,what", STALE, ids=[c[2] for c in STALE])
def test_stale_material_is_caught(step: Any, output: int, what: str, who: int) -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    s = session(workers, pt.VirtualWorker("carol"))
    with deviating(workers[who], step, output, stale=True) as count:
        with pytest.raises(mpc.MACCheckError):
            program(s).get()
    assert count[0] >= 1


@pytest.mark.parametrize("error", [1 << 64, 1 << 127, 3 << 100], ids=["2^64", "2^127", "3*2^100"])
def test_an_error_above_the_value_bits_is_caught_or_harmless(error: int) -> None:
    """An error in the high 64 bits of a share (mod 2^128) leaves the value (its low 64
    bits) as it is: the check may let it through (it vouches for the low bits), and then
    the output is right."""
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    s = session(workers, pt.VirtualWorker("carol"))
    with deviating(workers[0], auth_beaver_combine, 0, error >> 64, (1, 0)):
        try:
            out = program(s).get()
        except mpc.MACCheckError:
            return
    torch.testing.assert_close(out, expected(), atol=1e-3, rtol=1e-4)


def test_honest_program_is_right() -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    out = program(session(workers, pt.VirtualWorker("carol"))).get()
    torch.testing.assert_close(out, expected(), atol=1e-3, rtol=1e-4)


def test_after_a_failed_check_nothing_is_released() -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    s = session(workers, pt.VirtualWorker("carol"))
    x = mpc.share(X, session=s)
    with deviating(workers[1], auth_beaver_combine, 0, 1 << 16):
        bad = x * x
    with pytest.raises(mpc.MACCheckError):
        bad.get()
    with pytest.raises(mpc.MACCheckError):
        x.get()  # (honest, but the session's check failed: it releases nothing more)


def test_the_attack_of_the_issue_is_caught() -> None:
    """alice adds 2^20 (16.0 in fixed point) to her stored share of x = [1.5, 2.0]; then
    (x * y).get() with y = [2.0, 3.0] (the semi-honest mode returns [35., 54.])."""
    alice, bob, carol = (pt.VirtualWorker(n) for n in ("alice", "bob", "carol"))
    x = mpc.share(torch.tensor([1.5, 2.0]), alice, bob, crypto_provider=carol, security="malicious")
    y = mpc.share(torch.tensor([2.0, 3.0]), alice, bob, crypto_provider=carol, security="malicious")
    stored = alice.store.entry(x.shares[0]._ref.obj_id).value
    stored[0, 0] += 1 << 20  # (in process, the attacker writes its own store)
    with pytest.raises(mpc.MACCheckError, match="check failed"):
        (x * y).get()


# -- the comparison's steps ------------------------------------------------------------------


def compare_program(s: mpc.Session) -> Any:
    """A comparison, a ReLU and a max: every step of the authenticated comparison."""
    x = mpc.share(X, session=s)
    y = mpc.share(Y, session=s)
    return torch.maximum(torch.relu(x), y) + (x < y)


def two_parties(comparison: str) -> tuple[list[Any], mpc.Session]:
    """alice and bob, and their malicious session with the ``comparison`` protocol."""
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    s = mpc.Session(workers, pt.VirtualWorker("carol"), security="malicious", comparison=comparison)
    return workers, s


# (comparison, step, output, where, what): "flips a bit" is an error of 1 in a bit's share
CMP_CASES: list[tuple[str, Any, int, tuple[int, ...], str]] = [
    ("default", auth_cmp_mask, 0, (0,), "its piece of the comparison's c"),
    ("default", auth_cmp_mask, 1, (0,), "the MAC of its piece of c"),
    ("default", auth_cmp_mask, 2, (0, 0), "its share of a dealt bit"),
    ("default", auth_cmp_mask, 2, (0, 1), "the MAC of its share of a dealt bit"),
    ("default", auth_cmp_leaves, 0, (0, 0), "its share of a leaf of the borrow tree"),
    ("default", auth_cmp_leaves, 1, (0, 0), "its share of the top bit's xor"),
    # the FSS comparison (2 parties)
    ("fss", auth_fss_mask, 0, (0,), "its piece of the FSS comparison's c"),
    ("fss", auth_fss_mask, 1, (0,), "the MAC of its piece of the FSS comparison's c"),
    ("fss", auth_fss_mask, 2, (0, 0), "its share of u"),
    ("fss", auth_fss_mask, 2, (0, 1), "the MAC of its share of u"),
    ("fss", auth_fss_eval, 0, (0, 0), "its evaluation of the DCF (the bit)"),
    ("fss", auth_fss_eval, 0, (0, 1), "its evaluation's MAC"),
]


@pytest.mark.parametrize("error", list(ERRORS), ids=list(ERRORS))
@pytest.mark.parametrize("who", [0, 1], ids=["first", "last"])
@pytest.mark.parametrize(
    "comparison,step,output,part,what", CMP_CASES, ids=[c[4] for c in CMP_CASES]
)
def test_every_deviation_in_a_comparison_is_caught(
    comparison: str,
    step: Any,
    output: int,
    part: tuple[int, ...],
    what: str,
    who: int,
    error: str,
) -> None:
    workers, s = two_parties(comparison)
    e = _error(ERRORS[error])
    with deviating(workers[who], step, output, e, part) as count:
        with pytest.raises(mpc.MACCheckError):
            out = compare_program(s).get()
            pytest.fail(f"no check caught {what} + {e}: the client got {out}")
    assert count[0] >= 1


# a selection uses its r only where the opened c's top bit is set (its product with the
# bit, module mpc.protocols.auth_fss.steps): the errors go to every element of 16, so that
# some element's c has it (all but 2^-16 of the runs)
X16 = torch.linspace(-4.0, 4.0, 16)
Y16 = torch.linspace(3.0, -3.0, 16)


def select_program(s: mpc.Session) -> Any:
    """A ReLU and a max with FSS comparisons: the selection that rides on the comparison's
    round (the steps' select mode)."""
    x = mpc.share(X16, session=s)
    y = mpc.share(Y16, session=s)
    return torch.maximum(torch.relu(x), y)


# (step, output, where, what): the kept shares of a selection are (u, r u, r) x (limbs) x
# (value, MAC); the evaluation's outputs the bit and the selected value
SELECT_CASES: list[tuple[Any, int, tuple[int, ...], str]] = [
    (auth_fss_mask, 0, (0,), "its piece of the selection's c"),
    (auth_fss_mask, 2, (0, 0, 0), "its share of u"),
    (auth_fss_mask, 2, (0, 0, 1), "the MAC of its share of u"),
    (auth_fss_mask, 2, (1, 0, 0), "its share of r u"),
    (auth_fss_mask, 2, (1, 0, 1), "the MAC of its share of r u"),
    (auth_fss_mask, 2, (2, 0, 0), "its share of r"),
    (auth_fss_mask, 2, (2, 0, 1), "the MAC of its share of r"),
    (auth_fss_eval, 1, (0, 0), "its share of the selected value"),
    (auth_fss_eval, 1, (0, 1), "the MAC of its share of the selected value"),
]


@pytest.mark.parametrize("error", list(ERRORS), ids=list(ERRORS))
@pytest.mark.parametrize("who", [0, 1], ids=["first", "last"])
@pytest.mark.parametrize("step,output,part,what", SELECT_CASES, ids=[c[3] for c in SELECT_CASES])
def test_every_deviation_in_an_fss_selection_is_caught(
    step: Any, output: int, part: tuple[int, ...], what: str, who: int, error: str
) -> None:
    workers, s = two_parties("fss")
    e = _error(ERRORS[error])
    with deviating(workers[who], step, output, e, part, every=True) as count:
        with pytest.raises(mpc.MACCheckError):
            out = select_program(s).get()
            pytest.fail(f"no check caught {what} + {e}: the client got {out}")
    assert count[0] >= 1


def test_stale_fss_selection_material_is_caught() -> None:
    workers, s = two_parties("fss")
    with deviating(workers[1], auth_fss_mask, 2, stale=True) as count:
        with pytest.raises(mpc.MACCheckError):
            select_program(s).get()
    assert count[0] >= 1


def test_honest_fss_selection_is_right() -> None:
    workers, s = two_parties("fss")
    out = select_program(s).get()
    torch.testing.assert_close(out, torch.maximum(torch.relu(X16), Y16), atol=1e-4, rtol=0)


@pytest.mark.parametrize("comparison,step,output,what", [
    ("default", auth_cmp_mask, 2, "the bits of the previous comparison"),
    ("default", auth_cmp_leaves, 0, "the leaves of the previous comparison"),
    ("fss", auth_fss_mask, 2, "the u of the previous FSS comparison"),
], ids=["bits", "leaves", "fss-u"])  # fmt: skip
def test_stale_comparison_material_is_caught(
    comparison: str, step: Any, output: int, what: str
) -> None:
    workers, s = two_parties(comparison)
    with deviating(workers[1], step, output, stale=True) as count:
        with pytest.raises(mpc.MACCheckError):
            compare_program(s).get()
    assert count[0] >= 1


def test_honest_comparison_program_is_right() -> None:
    workers = [pt.VirtualWorker("alice"), pt.VirtualWorker("bob")]
    out = compare_program(session(workers, pt.VirtualWorker("carol"))).get()
    torch.testing.assert_close(out, torch.maximum(torch.relu(X), Y) + (X < Y), atol=1e-4, rtol=0)


def test_an_fss_selection_in_pieces_is_right_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys past PIECE_BYTES (a network message's limit) go in pieces, opened in one round;
    a deviation in one piece is caught like any."""
    import mpc.protocols.auth_fss.run as afss

    monkeypatch.setattr(afss, "PIECE_BYTES", 5 * 8 * afss.key_words(1, True))  # 5 elements
    workers, s = two_parties("fss")
    x = mpc.share(X16, session=s)
    with mpc.stats() as st:
        r = torch.relu(x).materialize()  # (a ReLU runs at its first read)
    assert st.rounds == 1
    torch.testing.assert_close(r.get(), torch.relu(X16), atol=1e-4, rtol=0)
    torch.testing.assert_close(select_program(s).get(), torch.maximum(torch.relu(X16), Y16))
    with deviating(workers[0], auth_fss_eval, 1, 1 << 16, (0, 0), every=True) as count:
        with pytest.raises(mpc.MACCheckError):
            select_program(s).get()
    assert count[0] >= 4  # (every piece of the ReLU and of the max)


@pytest.mark.parametrize(
    "comparison,step,output,part",
    [("default", auth_cmp_leaves, 0, (0, 0)), ("fss", auth_fss_eval, 1, (0, 0))],
    ids=["default", "fss"],
)
def test_a_deviation_in_a_max_pool_of_a_relu_is_caught(
    comparison: str, step: Any, output: int, part: tuple[int, ...]
) -> None:
    """The ReLU under a max-pool runs after it, on the pooled values (mpc.authenticated.
    deferred): its steps are checked as any."""
    workers, s = two_parties(comparison)
    x = mpc.share(X16.view(1, 1, 4, 4), session=s)
    honest = torch.nn.functional.max_pool2d(torch.relu(x), 2).get()
    want = torch.nn.functional.max_pool2d(torch.relu(X16.view(1, 1, 4, 4)), 2)
    torch.testing.assert_close(honest, want, atol=1e-4, rtol=0)
    with deviating(workers[1], step, output, 1 << 16, part, every=True) as count:
        with pytest.raises(mpc.MACCheckError):
            torch.nn.functional.max_pool2d(torch.relu(x), 2).get()
    assert count[0] >= 3  # (the pool's two levels, then the ReLU)
