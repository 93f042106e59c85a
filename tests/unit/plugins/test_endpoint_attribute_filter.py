"""Tests for endpoint-attribute-filter (pure part): threshold over a numeric endpoint attribute."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState
from llm_epp.plugins.scheduling.endpoint_attribute_filter import EndpointAttributeFilter, Params
from tests.unit.builders import endpoint, names, request

GPU = "GPUUtilization/dcgm-extractor"
POOL = [
    endpoint("a", address="10.0.0.1", attributes={GPU: 0.95}),
    endpoint("b", address="10.0.0.2", attributes={GPU: 0.40}),
    endpoint("c", address="10.0.0.3"),
    endpoint("d", address="10.0.0.4", attributes={GPU: "busy"}),
]


def _filter(**extra: Any) -> EndpointAttributeFilter:
    raw = {
        "attribute": "GPUUtilization",
        "producer": "dcgm-extractor",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.9}},
        **extra,
    }
    return EndpointAttributeFilter("f", Params.model_validate(raw))


@pytest.mark.parametrize(
    ("extra", "kept"),
    [
        ({}, ["b", "c", "d"]),
        ({"onMissing": "Fail"}, ["b"]),
        ({"algorithm": {"type": "threshold", "threshold": {"operator": "GreaterThan", "value": 0.9}}}, ["a", "c", "d"]),
        ({"algorithm": {"type": "threshold", "threshold": {"operator": "Equal", "value": 0.4}}}, ["b", "c", "d"]),
    ],
    ids=["pass-missing", "fail-missing", "greater", "equal"],
)
def test_threshold(extra: dict[str, Any], kept: list[str]) -> None:
    assert names(_filter(**extra).filter(CycleState(), request(), POOL)) == kept


def test_fallback_on_empty() -> None:
    strict = {
        "onMissing": "Fail",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 0}},
    }
    assert names(_filter(**strict).filter(CycleState(), request(), POOL)) == []
    assert names(_filter(fallbackOnEmpty=True, **strict).filter(CycleState(), request(), POOL)) == ["a", "b", "c", "d"]


def test_without_producer_the_core_metrics_extractor_is_meant() -> None:
    f = EndpointAttributeFilter(
        "f",
        Params.model_validate(
            {
                "attribute": "num_requests_running",
                "algorithm": {"type": "threshold", "threshold": {"operator": "LessThan", "value": 10}},
            }
        ),
    )
    assert f.key == "num_requests_running/core-metrics-extractor"


def test_the_combined_spelling_of_llm_d_router_v0_10_names_the_whole_key() -> None:
    raw = {
        "attribute": GPU,
        "onMissing": "Fail",
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.9}},
    }
    f = EndpointAttributeFilter("f", Params.model_validate(raw))
    assert f.key == GPU
    assert names(f.filter(CycleState(), request(), POOL)) == ["b"]
    agnostic = EndpointAttributeFilter(
        "f", Params.model_validate({**raw, "attribute": "llm-d.ai/queue", "producer": ""})
    )
    assert agnostic.key == "llm-d.ai/queue"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"attribute": "x", "algorithm": {"type": "percentile"}}, "threshold"),
        ({"attribute": "x", "algorithm": {"type": "threshold"}}, "algorithm.threshold is required"),
        (
            {
                "attribute": "x",
                "onMissing": "Drop",
                "algorithm": {"type": "threshold", "threshold": {"operator": "Equal", "value": 1}},
            },
            "Pass",
        ),
        (
            {"attribute": "x", "algorithm": {"type": "threshold", "threshold": {"operator": "Around", "value": 1}}},
            "LessThan",
        ),
    ],
    ids=["algorithm", "no-threshold", "on-missing", "operator"],
)
def test_bad_parameters(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate(raw)
