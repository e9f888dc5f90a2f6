"""Non-linear ops: comparisons, ReLU, max/argmax, pooling (comparison protocol)."""

from __future__ import annotations
