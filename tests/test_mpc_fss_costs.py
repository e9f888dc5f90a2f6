"""Rounds and bytes of the FSS comparison mode (``MPCConfig(comparison="fss")``), pinned as
tests/test_mpc_costs.py pins the default mode's, with 2 parties (FSS is 2-party only).

What is counted: a round is one opening among the parties (every party sends its share
of the values the round opens, packed, to its peer); the dealer's deliveries happen
before (offline) and are not rounds. ``lt`` costs one round: the opening of c = x + r,
after which each party evaluates its DCF key locally and holds its share of the bit. A
comparison that selects values (ReLU, max, max-pool) costs two: c (with the selections'
masked values) and then d = msb ^ t (the low bits of the two parties' arithmetic shares,
which XOR to d, packed 64 to a word: one bit an element), as in the default protocol's
fourth round (of a run over ``MPCConfig.three_round_up_to`` elements or of groups of four;
a smaller run's last carry level gives the bit's shares in its third). ReLU of a product: the Beaver round, then one: the opening of
c = z + r, after which each party's local step gives its share of relu(z >> f) (the
truncation rides on the same c; :mod:`mpc.protocols.fss.relu`).

Bytes per party (payload, 8-byte words; the header allowance as in test_mpc_costs.py):
lt 8 an element (c), relu 16 1/8 (c, the product's e, d; 24 while d travelled as a
word), relu of a product 16 + 8 (the Beaver e and f; then c), a 2x2 max pool 80 3/4 a
window (six c, four masked values, six bits of d; 128 before). The dealer ships each party its DCF correction
words, 1,520 bytes an element at 64 bits (190 words: 3 per level of the 63-bit domain and
one), and the last party 8 bytes more (its share of u), 8 more for the daBit and 8 per
selected value: lt 3,048 bytes an element, relu 3,064.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import mpc
import pointers as pt
from mpc.config import MPCConfig
from mpc.protocols.sizes import SLACK

N = 4096
KEY = 1520  # bytes of one element's correction words at 64 bits (mpc.math.dcf.key_bytes(63))

# name: (fn, operand shapes, rounds, payload bytes per party, dealer payload bytes);
# default mode's rounds for comparison: lt 3, relu 3, relu of a product 4, max over 8 4
# (runs within MPCConfig.three_round_up_to: no d round; 4, 4, 5 and 5 with it), max pool 4
# (groups of four keep d's round) (tests/test_mpc_costs.py)
CASES: dict[str, tuple[Callable[..., Any], list[tuple[int, ...]], int, int, int | None]] = {
    "lt": (lambda a, b: a < b, [(N,), (N,)], 1, 8 * N, (2 * KEY + 8) * N),
    "relu": (F.relu, [(N,)], 2, 16 * N + N // 8, (2 * KEY + 8 + 8 + 8) * N),
    # Beaver (e, f), then c = z + r (the truncation rides on it; mpc.protocols.fss.relu);
    # 3 rounds and 48 bytes an element before (c with the truncation's c, then d and e)
    "relu of a product": (lambda a, b: F.relu(a * b), [(N,), (N,)], 2, 24 * N, None),
    # max and argmax over 8 (fss_bits 64): the values and the values packed with their
    # index, two levels of ranked groups (pairs, then the four maxima: 2 rounds each),
    # where the pairwise tree carrying the index took three levels (6 rounds, 86,848
    # bytes); measured 149,041 bytes sent, headers included
    "max over a dim of 8": (lambda a: a.max(dim=1).values, [(N // 8, 8)], 4, 148_700, None),
    # one window: six comparisons (c, and d's bits) and four masked values
    "max pool 2x2": (
        lambda a: F.max_pool2d(a, 2),
        [(1, 1, 64, 64)],
        2,
        8 * 10 * N // 4 + 6 * N // 4 // 8,
        None,
    ),
    # a ReLU then a 2x2 max-pool in one run (mpc/ops/relu_pool.py): ten comparisons a
    # window (the six differences and the four values: c and d's bits) and the four
    # masked values; 4 rounds and 229,376 bytes as a ReLU's run then the max's
    "relu then max pool 2x2": (
        lambda a: F.max_pool2d(F.relu(a), 2),
        [(1, 1, 64, 64)],
        2,
        8 * 14 * N // 4 + 10 * N // 4 // 8,
        None,
    ),
    # of a product: Beaver (e, f), then the run with the truncation's c in its first round
    # and the truncated values' masked opening in its second; 4 rounds before (Beaver, the
    # one-round ReLU of a product, the max's 2)
    "relu of a product then max pool 2x2": (
        lambda a, b: F.max_pool2d(F.relu(a * b), 2),
        [(1, 1, 64, 64), (1, 1, 64, 64)],
        3,
        24 * N + 8 * 14 * N // 4 + 10 * N // 4 // 8,
        None,
    ),
}
HEADER_ALLOWANCE = 96  # bytes of message headers per round (the Beaver round sends two)
DEALER_HEADER_ALLOWANCE = 512


def _measure(fn: Callable[..., Any], shapes: list[tuple[int, ...]], comparison: str) -> Any:
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    dealer = pt.VirtualWorker("dealer")
    gen = torch.Generator().manual_seed(0)
    config = MPCConfig(comparison=comparison)
    xs = [
        mpc.share(torch.randn(s, generator=gen), *parties, crypto_provider=dealer, config=config)
        for s in shapes
    ]
    with mpc.stats() as s:
        out = fn(*xs)
        out.materialize()
    return s


@pytest.mark.parametrize("name", list(CASES))
def test_fss_rounds_and_bytes_per_party(name: str) -> None:
    fn, shapes, rounds, payload, dealer = CASES[name]
    s = _measure(fn, shapes, "fss")
    assert s.rounds == rounds, f"{name}: {s.rounds} rounds, expected {rounds}"
    for party, sent in s.bytes_per_party.items():
        assert payload <= sent <= payload + HEADER_ALLOWANCE * rounds, (
            f"{name}: {party} sent {sent} bytes, expected {payload} of payload"
        )
    if dealer is not None:
        assert dealer <= s.dealer_bytes <= dealer + DEALER_HEADER_ALLOWANCE, (
            f"{name}: the dealer sent {s.dealer_bytes} bytes, expected {dealer}"
        )


@pytest.mark.parametrize("name", ["lt", "relu", "max pool 2x2"])
def test_fss_takes_fewer_rounds_and_bytes_online_than_the_default(name: str) -> None:
    fn, shapes = CASES[name][:2]
    fss, default = _measure(fn, shapes, "fss"), _measure(fn, shapes, "default")
    assert fss.rounds < default.rounds
    assert max(fss.bytes_per_party.values()) < max(default.bytes_per_party.values())
    # (the price: the keys; relu 3,064 bytes an element against the default's 410, whose
    # arithmetic last level deals 22 words an element and 23 a selected value: 7.5 times,
    # lt 13.5 times; over 10 times while the default dealt a daBit and opened d; lt 1.5
    # times the default's digit look-ups, 2,056 bytes an element, and the max-pool's 1.5
    # times its ranks by digits)
    ratio = {"lt": 1.4, "relu": 7, "max pool 2x2": 1.4}[name]
    assert fss.dealer_bytes > ratio * default.dealer_bytes


@pytest.mark.parametrize(
    ("name", "fn", "shape", "rounds", "default_rounds"),
    [
        # max of 32 (groups of four, then a pair: 6), clamp and series (4), division (5);
        # 17 and 28 before the division's products rode in its truncations' rounds
        # (the series' truncation rides in the division's comparison, its opening in the
        # clamp's: 15 and 26 before)
        # (by default its max takes a level of pairs, then ranks over 128 rows of 16: 21
        # rounds where the tree took 24; with FSS two levels of ranked groups, groups of
        # four then the eight maxima: 4 rounds where the tree took 6, so 11)
        # (by default its 128 rows take fine bins: 20)
        # (by default the max's pairs and ranks and the clamp's comparison runs are within
        # MPCConfig.three_round_up_to, 3 rounds each, the bins' run over it keeps 4: 17;
        # 16 where a max's ranks compare by digit look-ups, 2 rounds)
        ("softmax over 32", lambda a: torch.softmax(a, -1), (N // 32, 32), 11, 16),
        # x and the mean truncated with the squares' products riding (1), division (5,
        # the sum's truncation riding in its comparison); 9 and 12 before, then 7 and 10
        # (by default its 64 rows take fine bins: 8; their run of 61,504 comparisons is
        # over MPCConfig.three_round_up_to and keeps 4 rounds)
        ("layer norm over 64", lambda a: F.layer_norm(a, (64,)), (N // 64, 64), 6, 8),
    ],
)
def test_fss_softmax_and_layer_norm_rounds(
    name: str, fn: Callable[..., Any], shape: tuple[int, ...], rounds: int, default_rounds: int
) -> None:
    fss, default = _measure(fn, [shape], "fss"), _measure(fn, [shape], "default")
    assert (fss.rounds, default.rounds) == (rounds, default_rounds), name
    assert max(fss.bytes_per_party.values()) < max(default.bytes_per_party.values())


def test_fss_lenet_batch_1_rounds() -> None:
    """W5 (benchmarks/workloads/protocol.py), batch 1, FSS: per conv block the conv (1)
    and its ReLU and 2x2 max-pool in one run (2), then the linear layers (1 + 1 + 1): 9
    rounds; 11 while the ReLU of a product (1) and the max-pool (2) ran apart (issue 25)."""
    from benchmarks.workloads.protocol import lenet

    model = lenet()
    img = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(img)
    parties = [pt.VirtualWorker(f"p{i}") for i in range(2)]
    config = MPCConfig(comparison="fss")
    x = mpc.share(img, *parties, crypto_provider=pt.VirtualWorker("dealer"), config=config)
    shared = mpc.share(model, session=x.session)
    with mpc.stats() as s, torch.no_grad():
        got = shared(x).get()
    assert s.rounds == 9
    assert torch.allclose(got, want, atol=1e-3)


STEPS = (
    "mpc.dealer_fss",
    "mpc.fss_eval",
    "mpc.fss_unpack",
    "mpc.dealer_fss_relu",
    "mpc.fss_relu_eval",
    "mpc.fss_trunc_select",
)


def measure_fss_steps(n: int = 1 << 16) -> dict[str, Any]:
    """The FSS steps' peak memory (VmHWM, reset before each call) against what they declare
    (the steps' size declarations), over a comparison, a ReLU and a max-pool of ``n`` elements in
    process (as tests/test_limits_memory.py measures the other steps)."""
    import inspect
    from pathlib import Path

    from mpc.protocols.functions import FUNCTIONS
    from pointers.worker.functions import bind_arguments, function_size

    def status(key: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1]) << 10
        raise RuntimeError(key)

    seen: dict[str, list[int]] = {}

    def wrap(name: str, fn: Any) -> Any:
        spec = function_size(fn)
        assert spec is not None, name

        def run(ctx: Any, *args: Any, **kwargs: Any) -> Any:
            peak, _ = spec.bytes(bind_arguments(fn, args, kwargs))
            Path("/proc/self/clear_refs").write_text("5")
            base = status("VmRSS:")
            out = fn(ctx, *args, **kwargs)
            grew = status("VmHWM:") - base
            if name not in seen or grew > seen[name][0]:
                seen[name] = [grew, peak]
            return out

        run.__sealing__ = getattr(fn, "__sealing__", None)  # type: ignore[attr-defined]
        run.__size__ = spec  # type: ignore[attr-defined]
        run.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
        return run

    for name in STEPS:
        FUNCTIONS[name] = wrap(name, FUNCTIONS[name])
    a, b, c = (pt.VirtualWorker(w, concurrent=False) for w in ("a", "b", "c"))
    config = MPCConfig(comparison="fss")
    x = mpc.share(torch.rand(n), a, b, crypto_provider=c, config=config)
    y = mpc.share(torch.rand(n), a, b, crypto_provider=c, config=config)
    (x > y).get()
    F.relu(x * y).get()
    F.gelu(x * y).get()  # values selected truncated (mpc.protocols.fss.trunc_select)
    img = mpc.share(torch.rand(1, 4, 64, n // 256), a, b, crypto_provider=c, config=config)
    F.max_pool2d(img, 2).get()
    F.max_pool2d(F.relu(img * img), 2).get()  # a ReLU and the max in one run ([G, 10])
    # one key a value evaluated at 4 thresholds (mpc.protocols.compare.msb_thresholds), and
    # 1,024 values' keys at 64 (evaluated 4,096 points a call: the keys repeated 4 times)
    from mpc.protocols.compare import msb_thresholds

    for v, count in (
        (x, 4),
        (mpc.share(torch.rand(1024), a, b, crypto_provider=c, config=config), 64),
    ):
        for bit in msb_thresholds(v.session, list(v.shares), list(range(-count, count, 2))):
            bit.get()
    return seen


@pytest.mark.slow
def test_fss_steps_allocate_at_most_what_they_declare() -> None:
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072", MALLOC_TRIM_THRESHOLD_="0")
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parent), env.get("PYTHONPATH", "")])
    code = "import json, test_mpc_fss_costs as t; print(json.dumps(t.measure_fss_steps()))"
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(seen) == set(STEPS)
    over = {k: v for k, v in seen.items() if v[0] > v[1]}
    assert not over, over
    # and what they declare is at most 1.5 times the measured peak (and two SLACKs)
    under = {k: v for k, v in seen.items() if v[1] > 1.5 * v[0] + 2 * SLACK}
    assert not under, under
