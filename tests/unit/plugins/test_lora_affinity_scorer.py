"""Tests for the lora-affinity-scorer plugin: 1.0 active, 0.8 free slot, 0.6 waiting, else 0."""

from __future__ import annotations

from dataclasses import replace

import pytest

from llm_epp.framework import CycleState, Endpoint, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import lora_affinity_scorer as mod
from llm_epp.plugins.scheduling.lora_affinity_scorer import LoraAffinityScorer, Params
from tests.unit.builders import FakeHandle, endpoint, key, request


def _lora(name: str, active: set[str], waiting: set[str], max_lora: int, updated: float = 1.0) -> Endpoint:
    ep = endpoint(name, updated=updated)
    metrics = replace(
        ep.metrics, active_models=frozenset(active), waiting_models=frozenset(waiting), max_active_models=max_lora
    )
    return replace(ep, metrics=metrics)


@pytest.mark.parametrize(
    ("active", "waiting", "max_lora", "expected"),
    [
        ({"sql"}, set(), 2, 1.0),
        ({"sql", "x", "y"}, {"z"}, 2, 1.0),
        ({"sql"}, {"sql"}, 1, 1.0),
        ({"x"}, set(), 2, 0.8),
        (set(), set(), 1, 0.8),
        ({"x"}, {"sql"}, 3, 0.8),
        ({"x"}, {"sql"}, 2, 0.6),
        ({"x", "y"}, set(), 2, 0.0),
        ({"x"}, {"y"}, 2, 0.0),
        (set(), set(), 0, 0.0),
    ],
    ids=[
        "active",
        "active-even-when-over-capacity",
        "active-and-waiting",
        "free-slot",
        "free-slot-empty",
        "free-slot-beats-waiting",
        "waiting-no-slot",
        "full-other-adapters",
        "full-other-waiting",
        "no-lora-metrics",
    ],
)
def test_score(active: set[str], waiting: set[str], max_lora: int, expected: float) -> None:
    scores = LoraAffinityScorer().score(CycleState(), request(model="sql"), [_lora("a", active, waiting, max_lora)])
    assert scores == {key("a"): expected}


def test_no_candidates() -> None:
    assert LoraAffinityScorer().score(CycleState(), request(), []) == {}


def test_uses_the_target_model_after_rewrite() -> None:
    ep = _lora("a", {"sql-v2"}, set(), 1)
    scores = LoraAffinityScorer().score(CycleState(), request(model="sql", target_model="sql-v2"), [ep])
    assert scores == {key("a"): 1.0}


def test_missing_metrics_score_zero() -> None:
    assert LoraAffinityScorer().score(CycleState(), request(model="sql"), [endpoint("a", updated=0.0)]) == {
        key("a"): 0.0
    }


def test_each_candidate_on_its_own() -> None:
    eps = [
        _lora("a", {"sql"}, set(), 4),
        _lora("b", set(), set(), 4),
        _lora("c", {"x"}, {"sql"}, 2),
        _lora("d", {"x", "y"}, set(), 2),
    ]
    scores = LoraAffinityScorer().score(CycleState(), request(model="sql"), eps)
    assert scores == {key("a"): 1.0, key("b"): 0.8, key("c"): 0.6, key("d"): 0.0}


def test_identity_and_category() -> None:
    scorer = mod.factory("lora", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("lora-affinity-scorer", "lora")
    assert scorer.category is ScorerCategory.AFFINITY
