"""Comparison of authenticated values with zero (the sign of a fixed-point value, and so
x < y, ReLU and max), from the dealer's authenticated random bits. The client side is
:mod:`mpc.protocols.auth_comparison.run`; the dealer's and the parties' steps are
:mod:`mpc.protocols.auth_comparison.steps`."""
