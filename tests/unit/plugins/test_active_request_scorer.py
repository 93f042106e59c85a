"""Tests for the active-request-scorer plugin (llm-d): idle endpoints 1.0, busy ones scaled against the
busiest candidate, read from the core's in-flight request counts."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from llm_epp.framework import CycleState, Endpoint, InFlightLoad, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import active_request_scorer as mod
from llm_epp.plugins.scheduling.active_request_scorer import ActiveRequestScorer, Params
from tests.unit.builders import FakeHandle, endpoint, key, request


def _eps(counts: dict[str, int]) -> list[Endpoint]:
    return [
        replace(endpoint(n, address=f"10.0.0.{i}"), load=InFlightLoad(requests=c, tokens=0))
        for i, (n, c) in enumerate(counts.items(), 1)
    ]


@pytest.mark.parametrize(
    ("counts", "idle", "gap", "expected"),
    [
        ({}, 0, 1.0, {}),
        ({"a": 0}, 0, 1.0, {"a": 1.0}),
        ({"a": 5}, 0, 1.0, {"a": 0.0}),
        ({"a": 0, "b": 0}, 0, 1.0, {"a": 1.0, "b": 1.0}),
        ({"a": 0, "b": 2, "c": 4}, 0, 1.0, {"a": 1.0, "b": 0.5, "c": 0.0}),
        ({"a": 3, "b": 3}, 0, 1.0, {"a": 0.0, "b": 0.0}),
        ({"a": 1, "b": 2, "c": 4}, 1, 1.0, {"a": 1.0, "b": 0.5, "c": 0.0}),
        ({"a": 0, "b": 2, "c": 4}, 0, 0.5, {"a": 1.0, "b": 0.25, "c": 0.0}),
        ({"a": 2, "b": 2}, 5, 0.5, {"a": 1.0, "b": 1.0}),
        ({"a": 1, "b": 9}, 0, 0.0, {"a": 0.0, "b": 0.0}),
    ],
    ids=[
        "no-candidates",
        "one-idle",
        "one-busy",
        "all-idle",
        "spread",
        "tied-busy",
        "idle-threshold",
        "max-busy-score-gap",
        "all-under-idle-threshold",
        "zero-busy-score",
    ],
)
def test_score(counts: dict[str, int], idle: int, gap: float, expected: dict[str, float]) -> None:
    scorer = ActiveRequestScorer(idle_threshold=idle, max_busy_score=gap)
    scores = scorer.score(CycleState(), request(), _eps(counts))
    assert scores == pytest.approx({key(n): v for n, v in expected.items()})


def test_max_count_is_over_the_candidates_given() -> None:
    scorer = ActiveRequestScorer()
    b = _eps({"b": 2})[0]
    assert scorer.score(CycleState(), request(), [*_eps({"a": 4}), b])[b.key] == 0.5
    assert scorer.score(CycleState(), request(), [b])[b.key] == 0.0


def test_metrics_do_not_matter() -> None:
    eps = [replace(endpoint("a", queue=50, running=50, updated=0.0), load=InFlightLoad(0, 0))]
    assert ActiveRequestScorer().score(CycleState(), request(), eps) == {key("a"): 1.0}


@pytest.mark.parametrize(
    ("raw", "idle", "gap", "warns"),
    [
        (None, 0, 1.0, False),
        ({"idleThreshold": 2, "maxBusyScore": 0.5, "requestTimeout": "2m"}, 2, 0.5, False),
        ({"idle_threshold": 1, "max_busy_score": 0.0}, 1, 0.0, False),
        ({"idleThreshold": -1}, 0, 1.0, True),
        ({"maxBusyScore": 1.5}, 0, 1.0, True),
        ({"maxBusyScore": -0.1}, 0, 1.0, True),
        ({"maxBusyScore": float("nan")}, 0, 1.0, True),
    ],
    ids=["defaults", "llm-d-keys", "snake-case", "negative-idle", "busy-above-one", "busy-negative", "busy-nan"],
)
def test_params(
    raw: dict[str, object] | None, idle: int, gap: float, warns: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = mod.factory("ar", Params.model_validate(raw or {}), FakeHandle())
    assert (scorer.idle_threshold, scorer.max_busy_score) == (idle, gap)
    assert bool(caplog.records) == warns


def test_identity_and_category() -> None:
    scorer = mod.factory("ar", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("active-request-scorer", "ar")
    assert scorer.category is ScorerCategory.DISTRIBUTION


def test_in_flight_load_producer_name_reads_the_core_in_flight_account() -> None:
    """Every producer name refers to the one in-flight account the core keeps: same plugin, same answers."""
    from llm_epp.plugins import builtin_registry
    from tests.unit.builders import FakeHandle as _Handle

    registry = builtin_registry()
    named = registry.build("active-request-scorer", "x", {"inFlightLoadProducerName": "my-load"}, _Handle())
    plain = registry.build("active-request-scorer", "x", None, _Handle())
    assert type(named) is type(plain)
    assert {k: v for k, v in vars(named).items() if k != "_typed_name"} == {
        k: v for k, v in vars(plain).items() if k != "_typed_name"
    }
