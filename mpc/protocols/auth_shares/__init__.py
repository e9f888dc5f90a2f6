"""Authenticated shares (the malicious mode, SPDZ2k-style): the dealer's MAC key, inputs
shared with the dealer's authenticated mask, the linear ops and layout ops on
authenticated shares, and outputs opened to the client only after the MAC check. The
client side is :mod:`mpc.protocols.auth_shares.run`; the dealer's and the parties' steps
are :mod:`mpc.protocols.auth_shares.steps`."""
