"""The public thresholds of a comparison run: each element of x compared with T public
ring values at once ([T, *x] compared; the carry tree's, the FSS comparison's and the digit
comparison's runs share these checks)."""

from __future__ import annotations

from typing import Any

import torch

#: the most public thresholds one comparison run compares each element with
MAX_THRESHOLDS = 1 << 14


def check_thresholds(shape: list[int], thresholds: Any, selects: bool) -> None:
    """``thresholds`` T: 0, or the leading dimension of ``shape`` ([T, *x]) of a comparison
    that selects nothing."""
    if thresholds == 0 and type(thresholds) is int:
        return
    if not (
        type(thresholds) is int
        and 1 <= thresholds <= MAX_THRESHOLDS
        and isinstance(shape, list)
        and len(shape) >= 1
        and shape[0] == thresholds
        and not selects
    ):
        raise ValueError(
            f"a comparison with thresholds compares [T, *x] (1 <= T <= {MAX_THRESHOLDS}) and "
            f"selects nothing, got {thresholds!r} for {shape!r}"
        )


def threshold_values(thresholds: Any) -> torch.Tensor:
    """The public thresholds of a comparison (ring values, as a tensor), checked."""
    if not (
        isinstance(thresholds, list)
        and 1 <= len(thresholds) <= MAX_THRESHOLDS
        and all(type(t) is int and -(1 << 63) <= t < (1 << 63) for t in thresholds)
    ):
        raise ValueError(f"thresholds are 1 to {MAX_THRESHOLDS} ring values (ints)")
    return torch.tensor(thresholds, dtype=torch.int64)
