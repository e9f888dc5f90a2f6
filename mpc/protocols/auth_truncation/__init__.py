"""Truncation of authenticated fixed-point values with the dealer's authenticated
truncation pairs (truncation with known MSB). The client side is
:mod:`mpc.protocols.auth_truncation.run`; the dealer's and the parties' steps are
:mod:`mpc.protocols.auth_truncation.steps`."""
