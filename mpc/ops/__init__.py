"""Secure op implementations; importing this package fills :data:`mpc.registry.OPS`."""

from . import bilinear, local, nonlinear  # noqa: F401
