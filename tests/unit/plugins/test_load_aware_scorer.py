"""Tests for the load-aware-scorer plugin (llm-d): 0.5 when idle, falling linearly to 0 at `threshold`."""

from __future__ import annotations

import logging

import pytest

from llm_epp.framework import CycleState, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import load_aware_scorer as mod
from llm_epp.plugins.scheduling.load_aware_scorer import DEFAULT_THRESHOLD, LoadAwareScorer, Params
from tests.unit.builders import FakeHandle, endpoint, key, request


@pytest.mark.parametrize(
    ("threshold", "queue", "expected"),
    [
        (128, 0, 0.5),
        (128, 64, 0.25),
        (128, 1, 0.5 * (1 - 1 / 128)),
        (128, 128, 0.0),
        (128, 1000, 0.0),
        (10, 5, 0.25),
        (1, 1, 0.0),
        (10, -3, 0.5),
    ],
    ids=["idle", "half", "one-waiting", "at-threshold", "over-threshold", "small-threshold", "threshold-one", "neg"],
)
def test_score(threshold: int, queue: int, expected: float) -> None:
    scores = LoadAwareScorer(threshold=threshold).score(CycleState(), request(), [endpoint("a", queue=queue)])
    assert scores == {key("a"): pytest.approx(expected)}


def test_no_candidates() -> None:
    assert LoadAwareScorer().score(CycleState(), request(), []) == {}


def test_scores_are_absolute_not_relative() -> None:
    eps = [endpoint("a", queue=64, address="10.0.0.1"), endpoint("b", queue=64, address="10.0.0.2")]
    assert LoadAwareScorer().score(CycleState(), request(), eps) == {key("a"): 0.25, key("b"): 0.25}


def test_missing_metrics_score_as_idle() -> None:
    """A never-scraped endpoint reports an empty queue; llm-d scores it like an idle one."""
    assert LoadAwareScorer().score(CycleState(), request(), [endpoint("a", updated=0.0)]) == {key("a"): 0.5}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, DEFAULT_THRESHOLD), ({"threshold": 32}, 32), ({"threshold": 0}, DEFAULT_THRESHOLD)],
    ids=["default", "set", "zero-falls-back"],
)
def test_params(raw: dict[str, int] | None, expected: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = mod.factory("la", Params.model_validate(raw or {}), FakeHandle())
    assert scorer.threshold == expected
    assert ("load_aware_threshold_invalid" in caplog.text) == (raw == {"threshold": 0})


def test_identity_and_category() -> None:
    scorer = mod.factory("la", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("load-aware-scorer", "la")
    assert scorer.category is ScorerCategory.DISTRIBUTION
