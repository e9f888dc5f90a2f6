"""Beaver products of authenticated values (mul, matmul, conv2d) with the dealer's
authenticated triples. The client side is :mod:`mpc.protocols.auth_beaver.run`; the
dealer's and the parties' steps are :mod:`mpc.protocols.auth_beaver.steps`."""
