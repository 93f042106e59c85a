"""Tests for the running-requests-size-scorer plugin: inverse min-max over the candidates' running requests."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import running_requests_size_scorer as mod
from llm_epp.plugins.scheduling.running_requests_size_scorer import Params, RunningRequestsSizeScorer
from tests.unit.builders import FakeHandle, endpoint, key, request


@pytest.mark.parametrize(
    ("running", "expected"),
    [
        ({}, {}),
        ({"a": 12}, {"a": 1.0}),
        ({"a": 0, "b": 0}, {"a": 1.0, "b": 1.0}),
        ({"a": 3, "b": 3, "c": 3}, {"a": 1.0, "b": 1.0, "c": 1.0}),
        ({"a": 0, "b": 4, "c": 8}, {"a": 1.0, "b": 0.5, "c": 0.0}),
        ({"a": 2, "b": 2, "c": 10}, {"a": 1.0, "b": 1.0, "c": 0.0}),
        ({"a": 40, "b": 10}, {"a": 0.0, "b": 1.0}),
    ],
    ids=["no-candidates", "one", "all-idle", "all-equal", "spread", "two-tied-least", "reversed"],
)
def test_score(running: dict[str, int], expected: dict[str, float]) -> None:
    eps = [endpoint(n, running=r, address=f"10.0.0.{i}") for i, (n, r) in enumerate(running.items(), 1)]
    scores = RunningRequestsSizeScorer().score(CycleState(), request(), eps)
    assert scores == pytest.approx({key(n): v for n, v in expected.items()})


def test_missing_metrics_read_as_zero_running() -> None:
    eps = [endpoint("never-scraped", running=0, updated=0.0), endpoint("busy", running=6)]
    scores = RunningRequestsSizeScorer().score(CycleState(), request(), eps)
    assert scores == {key("never-scraped"): 1.0, key("busy"): 0.0}


def test_other_metrics_do_not_matter() -> None:
    eps = [endpoint("a", running=1, queue=50, kv=0.99), endpoint("b", running=5, queue=0, kv=0.0)]
    assert RunningRequestsSizeScorer().score(CycleState(), request(), eps) == {key("a"): 1.0, key("b"): 0.0}


def test_identity_and_category() -> None:
    scorer = mod.factory("rr", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("running-requests-size-scorer", "rr")
    assert scorer.category is ScorerCategory.DISTRIBUTION
