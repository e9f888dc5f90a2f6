"""The low bits of a shared value, exactly: [z mod 2^m] for any shared ring element z, in
one round, for any number of parties, with a dealt lookup table of 2^m words an element.
The client side is :mod:`mpc.protocols.low_bits.run`; the dealer's and the parties' steps
are :mod:`mpc.protocols.low_bits.steps`."""
