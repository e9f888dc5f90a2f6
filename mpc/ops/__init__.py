"""Secure op implementations; importing this package fills :data:`mpc.registry.OPS`."""

from mpc.ops import (  # noqa: F401
    attention,
    backward,
    bilinear,
    functions,
    inplace,
    local,
    nonlinear,
    norms,
    transformer,
)
