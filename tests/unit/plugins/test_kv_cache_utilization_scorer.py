"""Tests for the kv-cache-utilization-scorer plugin: 1 - usage, clamped to [0, 1]."""

from __future__ import annotations

import math

import pytest

from llm_epp.framework import CycleState, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import kv_cache_utilization_scorer as mod
from llm_epp.plugins.scheduling.kv_cache_utilization_scorer import KvCacheUtilizationScorer, Params
from tests.unit.builders import FakeHandle, endpoint, key, request


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (0.0, 1.0),
        (0.25, 0.75),
        (0.9, 0.1),
        (1.0, 0.0),
        (1.2, 0.0),
        (-0.5, 1.0),
        (math.nan, 0.0),
        (math.inf, 0.0),
        (-math.inf, 1.0),
    ],
    ids=["empty-cache", "quarter", "nearly-full", "full", "over-full", "negative", "nan", "inf", "minus-inf"],
)
def test_score(usage: float, expected: float) -> None:
    scores = KvCacheUtilizationScorer().score(CycleState(), request(), [endpoint("a", kv=usage)])
    assert scores == {key("a"): pytest.approx(expected)}


def test_no_candidates() -> None:
    assert KvCacheUtilizationScorer().score(CycleState(), request(), []) == {}


def test_each_candidate_is_scored_on_its_own_usage() -> None:
    eps = [endpoint("a", kv=0.1), endpoint("b", kv=0.6, queue=0), endpoint("c", kv=0.6, queue=9)]
    scores = KvCacheUtilizationScorer().score(CycleState(), request(), eps)
    assert scores == pytest.approx({key("a"): 0.9, key("b"): 0.4, key("c"): 0.4})


def test_identity_and_category() -> None:
    scorer = mod.factory("kv", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("kv-cache-utilization-scorer", "kv")
    assert scorer.category is ScorerCategory.DISTRIBUTION
