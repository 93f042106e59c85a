"""Tests for endpoint-attribute-scorer (pure part): linear scores over a numeric endpoint attribute."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, ScorerCategory
from llm_epp.plugins.scheduling.endpoint_attribute_scorer import EndpointAttributeScorer, Params
from tests.unit.builders import endpoint, request

Q = "custom.queue_depth/core-metrics-extractor"
POOL = [
    endpoint("a", address="10.0.0.1", attributes={Q: 2}),
    endpoint("b", address="10.0.0.2", attributes={Q: 10}),
    endpoint("c", address="10.0.0.3", attributes={Q: 6}),
    endpoint("d", address="10.0.0.4"),
]


def _scores(algorithm: dict[str, Any], pool: list[Any] = POOL) -> dict[str, float]:
    scorer = EndpointAttributeScorer(
        "s", Params.model_validate({"attributeKey": "custom.queue_depth", "algorithm": algorithm})
    )
    assert scorer.category is ScorerCategory.DISTRIBUTION
    return {k.name: v for k, v in scorer.score(CycleState(), request(), pool).items()}


def test_adaptive_range() -> None:
    assert _scores({"type": "linear_lower_is_better"}) == {"a": 1.0, "b": 0.0, "c": 0.5, "d": 0.0}
    assert _scores({"type": "linear_higher_is_better"}) == {"a": 0.0, "b": 1.0, "c": 0.5, "d": 0.0}


def test_adaptive_range_all_equal_is_neutral() -> None:
    pool = [endpoint("a", address="10.0.0.1", attributes={Q: 3}), endpoint("b", address="10.0.0.2", attributes={Q: 3})]
    assert _scores({"type": "linear_lower_is_better"}, pool) == {"a": 1.0, "b": 1.0}


def test_fixed_range_clamps() -> None:
    fixed = {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 0, "max": 8}}}
    assert _scores(fixed) == {"a": 0.75, "b": 0.0, "c": 0.25, "d": 0.0}


@pytest.mark.parametrize(
    ("algorithm", "problem"),
    [
        ({"type": "log"}, "linear_lower_is_better"),
        ({"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 1, "max": 1}}}, "min < max"),
        (
            {
                "type": "linear_lower_is_better",
                "normalization": {"fixedRange": {"min": 0, "max": 1}, "adaptiveRange": {}},
            },
            "at most one",
        ),
    ],
    ids=["type", "empty-range", "both"],
)
def test_bad_parameters(algorithm: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate({"attributeKey": "x", "algorithm": algorithm})
