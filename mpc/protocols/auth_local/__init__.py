"""The ops local to authenticated shares: linear combinations, public constants and
operands, sums and layout ops. The client side is :mod:`mpc.protocols.auth_local.run`, the
parties' steps :mod:`mpc.protocols.auth_local.steps`."""
