"""Means over seeds with 95% confidence intervals (Student's t over per-seed values), for benchmark reports.

A figure measured on n seeds is reported as ``mean ± h``: ``h = t(0.975, n - 1) * s / sqrt(n)``, with ``s`` the
sample standard deviation of the n per-seed values.  Paired comparisons (two routers on the same seeded trace)
take the interval of the per-seed differences or ratios, which is narrower than comparing two intervals.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["T975", "fmt_interval", "t_interval"]

T975 = {
    1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
    11: 2.201, 12: 2.179, 13: 2.160, 14: 2.145, 15: 2.131, 16: 2.120, 17: 2.110, 18: 2.101, 19: 2.093, 20: 2.086,
    25: 2.060, 30: 2.042,
}  # fmt: skip
"""Two-sided 95% quantiles of Student's t by degrees of freedom (beyond 30: 1.96)."""


def _t(df: int) -> float:
    if df in T975:
        return T975[df]
    if df > 30:
        return 1.96
    return T975[min(k for k in T975 if k >= df)]  # conservative between table rows


def t_interval(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% interval); the half-width is NaN for fewer than two finite values."""
    xs = [v for v in values if not math.isnan(v)]
    if not xs:
        return math.nan, math.nan
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, math.nan
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return mean, _t(len(xs) - 1) * math.sqrt(var / len(xs))


def fmt_interval(values: Sequence[float], digits: int = 2, scale: float = 1.0, percent: bool = False) -> str:
    """``mean ± h`` (``mean`` alone for one value; ``-`` for none), values multiplied by ``scale`` first;
    ``percent`` shows signed percentages (values are fractions)."""
    mean, half = t_interval([v * scale for v in values])
    if math.isnan(mean):
        return "-"
    if percent:
        text = f"{mean * 100:+.{digits}f}%"
        return text if math.isnan(half) else f"{text} ± {half * 100:.{digits}f}"
    text = f"{mean:,.{digits}f}"
    return text if math.isnan(half) else f"{text} ± {half:,.{digits}f}"
