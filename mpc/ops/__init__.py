"""Secure op implementations; importing this package fills :data:`mpc.registry.OPS`."""

from . import bilinear, inplace, local, nonlinear  # noqa: F401
