"""Tests for the token-load-scorer plugin: 1 - min(1, in-flight tokens / queueThresholdTokens)."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from llm_epp.framework import CycleState, Endpoint, InFlightLoad, ScorerCategory, TypedName
from llm_epp.plugins.scheduling import token_load_scorer as mod
from llm_epp.plugins.scheduling.token_load_scorer import DEFAULT_QUEUE_THRESHOLD_TOKENS, Params, TokenLoadScorer
from tests.unit.builders import FakeHandle, endpoint, key, request


def _loaded(name: str, tokens: int, i: int = 1) -> Endpoint:
    return replace(endpoint(name, address=f"10.0.0.{i}"), load=InFlightLoad(requests=1, tokens=tokens))


@pytest.mark.parametrize(
    ("threshold", "tokens", "expected"),
    [
        (1000, 0, 1.0),
        (1000, -5, 1.0),
        (1000, 250, 0.75),
        (1000, 999, 0.001),
        (1000, 1000, 0.0),
        (1000, 5000, 0.0),
        (DEFAULT_QUEUE_THRESHOLD_TOKENS, DEFAULT_QUEUE_THRESHOLD_TOKENS // 2, 0.5),
    ],
    ids=["idle", "negative-load", "quarter", "nearly-full", "at-threshold", "over-threshold", "default-half"],
)
def test_score(threshold: int, tokens: int, expected: float) -> None:
    scores = TokenLoadScorer(queue_threshold_tokens=threshold).score(CycleState(), request(), [_loaded("a", tokens)])
    assert scores == {key("a"): pytest.approx(expected)}


def test_no_candidates() -> None:
    assert TokenLoadScorer().score(CycleState(), request(), []) == {}


def test_each_candidate_is_scored_on_its_own_load_not_relative() -> None:
    scorer = TokenLoadScorer(queue_threshold_tokens=100)
    eps = [_loaded("a", 10, 1), _loaded("b", 10, 2), _loaded("c", 60, 3)]
    assert scorer.score(CycleState(), request(), eps) == pytest.approx({key("a"): 0.9, key("b"): 0.9, key("c"): 0.4})


def test_metrics_do_not_matter() -> None:
    eps = [replace(endpoint("a", queue=99, kv=1.0, updated=0.0), load=InFlightLoad(0, 0))]
    assert TokenLoadScorer().score(CycleState(), request(), eps) == {key("a"): 1.0}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, DEFAULT_QUEUE_THRESHOLD_TOKENS),
        ({"queueThresholdTokens": 2048}, 2048),
        ({"queue_threshold_tokens": 7}, 7),
    ],
    ids=["default", "camel-case", "snake-case"],
)
def test_params(raw: dict[str, int] | None, expected: int) -> None:
    scorer = mod.factory("t", Params.model_validate(raw or {}), FakeHandle())
    assert scorer.queue_threshold_tokens == expected


@pytest.mark.parametrize("value", [0, -1], ids=["zero", "negative"])
def test_non_positive_threshold_falls_back_to_the_default(value: int, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        scorer = mod.factory("t", Params.model_validate({"queueThresholdTokens": value}), FakeHandle())
    assert scorer.queue_threshold_tokens == DEFAULT_QUEUE_THRESHOLD_TOKENS
    assert "token_load_threshold_invalid" in caplog.text


def test_identity_and_category() -> None:
    scorer = mod.factory("tl", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("token-load-scorer", "tl")
    assert scorer.category is ScorerCategory.DISTRIBUTION


def test_in_flight_load_producer_name_reads_the_core_in_flight_account() -> None:
    """Every producer name refers to the one in-flight account the core keeps: same plugin, same answers."""
    from llm_epp.plugins import builtin_registry
    from tests.unit.builders import FakeHandle as _Handle

    registry = builtin_registry()
    named = registry.build("token-load-scorer", "x", {"inFlightLoadProducerName": "my-load"}, _Handle())
    plain = registry.build("token-load-scorer", "x", None, _Handle())
    assert type(named) is type(plain)
    assert {k: v for k, v in vars(named).items() if k != "_typed_name"} == {
        k: v for k, v in vars(plain).items() if k != "_typed_name"
    }
