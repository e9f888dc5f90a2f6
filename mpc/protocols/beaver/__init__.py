"""Beaver products of two shared values (mul, matmul, conv2d: the bilinear op is a
parameter), and products of a share by a public value. The client side is
:mod:`mpc.protocols.beaver.run`; the dealer's and the parties' steps are
:mod:`mpc.protocols.beaver.steps`."""
