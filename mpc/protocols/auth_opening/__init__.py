"""Opening authenticated values among the parties: all 128 bits of a masked value, each
party recording what the MAC check needs (its residual). The client side is
:mod:`mpc.protocols.auth_opening.run`, the parties' step :mod:`mpc.protocols.auth_opening.steps`."""
