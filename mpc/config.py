"""Configuration of a sharing session: a frozen, validated dataclass."""

from __future__ import annotations

from dataclasses import dataclass

RING_BITS = 64
COMPARISONS = ("default", "fss")
SECURITIES = ("semi-honest", "malicious")


# Tensors that travel in one piece (the last party's input share, a weight instance's F,
# a round's packed openings) are kept under this many bytes: a message to a network
# worker is at most 256 MiB by default, and GPT-2's token embedding is 309 MB.
PIECE_BYTES = 64 << 20

# A protocol run whose largest step would declare more than this many bytes (the most a
# worker allocates for one call: a served worker's limit per client is 4 GiB by default,
# all it stores included) runs on pieces of its operands, one after the other
# (mpc.protocols.pieces): a comparison of more than about 3 million elements, a Fourier
# series of more than about 3 million.
STEP_BYTES = 1 << 30


@dataclass(frozen=True)
class MPCConfig:
    """``frac_bits``: fractional bits of the fixed-point encoding of floats (default 16).
    ``concurrent_from``: operand size (elements) from which in-process parties run an op
    side by side, one thread each (default 2^15; ``None``: always one after the other).

    ``comparison``: how comparisons (lt/gt, ReLU, max, max-pool, the comparisons inside
    the non-linear functions) run: ``"default"`` (any number of parties, 4 rounds; 3 up
    to ``three_round_up_to`` elements) or
    ``"fss"`` (function secret sharing: the dealer deals DCF keys, 1 round for a
    comparison, 2 for ReLU and max; 2 parties only). ``fss_bits``: the low bits of a
    compared ring value the FSS comparison reads (default 64, all of them: exact on the
    whole ring); fewer make the keys smaller and are exact while the value lies in
    [-2^(fss_bits-1), 2^(fss_bits-1)). See docs/secret-sharing.md.

    Products are exact in the ring while |value| < 2^(62 - 2 * frac_bits) before
    truncation (2^30 at 16 bits); see docs/secret-sharing.md for the error bounds.

    ``three_round_up_to``: a default-mode comparison run of at most this many elements
    (default 2^15; ``None``: none) ends in 3 rounds, not 4: its last carry-tree level
    gives additive shares of the bit and of its selections directly, from 22 more dealt
    words an element and 23 more a selected value (larger runs keep the daBit's round,
    with less local work and less of the dealer's traffic). See docs/secret-sharing.md.

    ``two_round_up_to``: a default-mode comparison that selects nothing (the bit alone,
    or the bits of x against public thresholds) of at most this many compared values
    (elements times thresholds; default 2^13; ``None``: none) runs by digit look-ups in
    2 rounds: about 1 KB more of the dealer's a compared value than the carry tree's
    3-round run, and 64 bytes a compared value more of each party's. See
    docs/secret-sharing.md.

    ``security``: ``"semi-honest"`` (the default: the parties follow the protocol) or
    ``"malicious"`` (authenticated shares: a party that deviates is caught before any
    output reaches the client; docs/security.md). With ``comparison="fss"`` (2 parties)
    its comparisons are one round, by DCF keys whose payload carries the bit's MAC.
    """

    frac_bits: int = 16
    # In-process parties (VirtualWorkers) run an op concurrently, one thread each (see
    # pointers.concurrently), when an operand has at least this many elements; None: never.
    concurrent_from: int | None = 1 << 15
    comparison: str = "default"
    fss_bits: int = 64
    security: str = "semi-honest"
    three_round_up_to: int | None = 1 << 15
    two_round_up_to: int | None = 1 << 13

    def __post_init__(self) -> None:
        c = self.concurrent_from
        if c is not None and (not isinstance(c, int) or isinstance(c, bool) or c < 0):
            raise ValueError(f"concurrent_from must be a non-negative int or None, got {c!r}")
        t = self.three_round_up_to
        if t is not None and (type(t) is not int or t < 0):
            raise ValueError(f"three_round_up_to must be a non-negative int or None, got {t!r}")
        t = self.two_round_up_to
        if t is not None and (type(t) is not int or t < 0):
            raise ValueError(f"two_round_up_to must be a non-negative int or None, got {t!r}")
        if not isinstance(self.frac_bits, int) or isinstance(self.frac_bits, bool):
            raise TypeError(f"frac_bits must be an int, got {type(self.frac_bits).__name__}")
        if not 0 <= self.frac_bits <= 28:
            raise ValueError(f"frac_bits must be in [0, 28], got {self.frac_bits}")
        if self.comparison not in COMPARISONS:
            raise ValueError(f"comparison must be one of {COMPARISONS}, got {self.comparison!r}")
        if self.security not in SECURITIES:
            raise ValueError(f"security must be one of {SECURITIES}, got {self.security!r}")
        if self.security == "malicious" and self.comparison == "fss" and self.fss_bits != 64:
            raise ValueError(
                "security='malicious' with comparison='fss' compares all 64 bits: it takes "
                f"fss_bits=64, got {self.fss_bits!r}"
            )
        if type(self.fss_bits) is not int or not 2 <= self.fss_bits <= RING_BITS:
            raise ValueError(f"fss_bits must be an int in [2, {RING_BITS}], got {self.fss_bits!r}")
