"""Shared score normalisation, so each scorer's arithmetic has one tested home."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import TypeVar

K = TypeVar("K")


def clamp01(value: float) -> float:
    """Clamp to [0, 1]; NaN becomes 0."""
    if value != value:  # NaN
        return 0.0
    if value < 0.0:
        return 0.0
    if value > 1.0:
        return 1.0
    return value


def inverse_min_max(values: Mapping[K, float]) -> dict[K, float]:
    """Lower is better: (max - v) / (max - min); all equal (or one value) gives 1.0 to everyone.
    Non-finite values score 0."""
    if _all_finite(values.values()):  # the usual case: no per-value finiteness test
        if not values:
            return {}
        lo, hi = min(values.values()), max(values.values())
        span = hi - lo
        if span == 0:
            return dict.fromkeys(values, 1.0)
        return {k: (hi - v) / span for k, v in values.items()}
    finite = [v for v in values.values() if math.isfinite(v)]
    if not finite:
        return {k: 0.0 for k in values}
    lo, hi = min(finite), max(finite)
    span = hi - lo
    if span == 0:
        return {k: (1.0 if math.isfinite(v) else 0.0) for k, v in values.items()}
    return {k: ((hi - v) / span if math.isfinite(v) else 0.0) for k, v in values.items()}


def _all_finite(values: Iterable[float]) -> bool:
    """Whether every value is finite, in one C pass: a sum of finite values is finite, or overflows (fsum
    raises); an infinity or NaN makes it infinite, NaN, or raises (inf - inf)."""
    try:
        return math.isfinite(math.fsum(values))
    except (OverflowError, ValueError):
        return False
