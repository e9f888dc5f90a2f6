"""Secure op implementations; importing this package fills :data:`mpc.registry.OPS`."""

from mpc.ops import backward, bilinear, functions, inplace, local, nonlinear  # noqa: F401
