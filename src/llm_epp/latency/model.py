"""Ridge regression in plain Python: small dense normal equations (a dozen features), solved by Cholesky.

Features are standardized before fitting so one regularization strength suits them all. The fitted model
also keeps a quantile of its training residuals: `predict` adds it, so predictions are an upper estimate
(by default the 90th percentile, as the reference predictor's quantile models), which is what an SLO check
needs."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RidgeModel:
    means: tuple[float, ...]
    scales: tuple[float, ...]
    weights: tuple[float, ...]
    intercept: float
    residual_offset: float  # added to the mean estimate (the residual quantile)
    samples: int

    def mean(self, x: Sequence[float]) -> float:
        total = self.intercept
        for xi, m, s, w in zip(x, self.means, self.scales, self.weights, strict=True):
            total += w * (xi - m) / s
        return total

    def predict(self, x: Sequence[float]) -> float:
        """The upper estimate (mean + residual quantile), never below 0."""
        return max(self.mean(x) + self.residual_offset, 0.0)


def _cholesky_solve(a: list[list[float]], b: list[float]) -> list[float]:
    n = len(b)
    low = [[0.0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            s = a[i][j] - sum(low[i][k] * low[j][k] for k in range(j))
            if i == j:
                low[i][i] = math.sqrt(max(s, 1e-12))
            else:
                low[i][j] = s / low[j][j]
    y = [0.0] * n
    for i in range(n):
        y[i] = (b[i] - sum(low[i][k] * y[k] for k in range(i))) / low[i][i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (y[i] - sum(low[k][i] * x[k] for k in range(i + 1, n))) / low[i][i]
    return x


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = q * (len(ordered) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def fit_ridge(
    rows: Sequence[Sequence[float]], targets: Sequence[float], alpha: float = 1.0, quantile: float = 0.9
) -> RidgeModel:
    """Fits y ~ intercept + w . standardized(x) with an L2 penalty `alpha` on w. `quantile` in [0.5, 1)
    sets the residual quantile added at prediction (0.5 = the median residual, close to the mean)."""
    n = len(rows)
    if n == 0 or n != len(targets):
        raise ValueError(f"fit_ridge needs as many targets as rows (got {n} rows, {len(targets)} targets)")
    d = len(rows[0])
    means = [sum(r[j] for r in rows) / n for j in range(d)]
    scales = []
    for j in range(d):
        var = sum((r[j] - means[j]) ** 2 for r in rows) / n
        scales.append(math.sqrt(var) if var > 1e-18 else 1.0)
    z = [[(r[j] - means[j]) / scales[j] for j in range(d)] for r in rows]
    y_mean = sum(targets) / n
    yc = [t - y_mean for t in targets]
    gram = [[0.0] * d for _ in range(d)]
    rhs = [0.0] * d
    for zi, yi in zip(z, yc, strict=True):
        for j in range(d):
            zij = zi[j]
            if zij == 0.0:
                continue
            rhs[j] += zij * yi
            row = gram[j]
            for k in range(j + 1):
                row[k] += zij * zi[k]
    for j in range(d):
        for k in range(j + 1, d):
            gram[j][k] = gram[k][j]
        gram[j][j] += alpha
    weights = _cholesky_solve(gram, rhs)
    residuals = [
        t - (y_mean + sum(w * v for w, v in zip(weights, zi, strict=True))) for zi, t in zip(z, targets, strict=True)
    ]
    offset = _quantile(residuals, quantile) if n >= 2 else 0.0
    return RidgeModel(tuple(means), tuple(scales), tuple(weights), y_mean, offset, n)
