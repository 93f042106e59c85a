"""Tests for llm_epp.framework.normalize: clamping and the inverse min-max used by distribution scorers."""

from __future__ import annotations

import math

import pytest

from llm_epp.framework.normalize import clamp01, inverse_min_max

NAN = math.nan
INF = math.inf


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0.0, 0.0),
        (0.25, 0.25),
        (1.0, 1.0),
        (-0.1, 0.0),
        (1.5, 1.0),
        (NAN, 0.0),
        (INF, 1.0),
        (-INF, 0.0),
    ],
    ids=["zero", "inside", "one", "negative", "above-one", "nan", "inf", "minus-inf"],
)
def test_clamp01(value: float, expected: float) -> None:
    assert clamp01(value) == expected


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, {}),
        ({"a": 7.0}, {"a": 1.0}),
        ({"a": 3.0, "b": 3.0, "c": 3.0}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        ({"a": 0.0, "b": 5.0, "c": 10.0}, {"a": 1.0, "b": 0.5, "c": 0.0}),
        ({"a": 2.0, "b": 2.0, "c": 6.0}, {"a": 1.0, "b": 1.0, "c": 0.0}),
        ({"a": -4.0, "b": 4.0}, {"a": 1.0, "b": 0.0}),
        ({"a": 0.0, "b": NAN, "c": 10.0}, {"a": 1.0, "b": 0.0, "c": 0.0}),
        ({"a": 0.0, "b": INF, "c": 4.0}, {"a": 1.0, "b": 0.0, "c": 0.0}),
        ({"a": 5.0, "b": NAN}, {"a": 1.0, "b": 0.0}),
        ({"a": NAN, "b": INF, "c": -INF}, {"a": 0.0, "b": 0.0, "c": 0.0}),
    ],
    ids=[
        "empty",
        "single",
        "all-equal",
        "spread",
        "two-tied-best",
        "negative-values",
        "nan-scores-zero-and-is-ignored-for-range",
        "inf-scores-zero-and-is-ignored-for-range",
        "one-finite-one-nan",
        "nothing-finite",
    ],
)
def test_inverse_min_max(values: dict[str, float], expected: dict[str, float]) -> None:
    assert inverse_min_max(values) == pytest.approx(expected)


def test_inverse_min_max_stays_in_unit_interval() -> None:
    out = inverse_min_max({i: float(v) for i, v in enumerate([13, 0, 7, 99, 42, 42, 1])})
    assert all(0.0 <= v <= 1.0 for v in out.values())
    assert out[1] == 1.0
    assert out[3] == 0.0


@pytest.mark.parametrize(
    "values",
    [
        {"a": 1.0, "b": math.inf, "c": 3.0},
        {"a": math.nan, "b": 2.0},
        {"a": math.inf, "b": -math.inf, "c": 0.5},
        {"a": 1e308, "b": 1e308, "c": 1.0},  # finite values whose sum overflows
        {"a": 2.0, "b": 2.0, "c": math.nan},
        {},
    ],
    ids=["inf", "nan", "both-infinities", "sum-overflows", "equal-and-nan", "empty"],
)
def test_inverse_min_max_with_non_finite_values_matches_the_per_value_rule(values: dict[str, float]) -> None:
    finite = [v for v in values.values() if math.isfinite(v)]
    lo, hi = (min(finite), max(finite)) if finite else (0.0, 0.0)
    want = {k: 0.0 if not math.isfinite(v) else (1.0 if hi == lo else (hi - v) / (hi - lo)) for k, v in values.items()}
    assert inverse_min_max(values) == want
