"""Truncation with known MSB: [z >> f] for a shared |z| < 2^62 in one round, for any
number of parties. The client side is :mod:`mpc.protocols.truncation.run`; the dealer's
and the parties' steps are :mod:`mpc.protocols.truncation.steps`."""
