"""Tests for prefix-cache-scorer: matched / total blocks from the producer's per-request PrefixMatch, and
the scorer working with the producer through a loaded configuration."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.config.loader import load_config_text
from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointMetadata,
    InferenceRequest,
    Metrics,
    NullRecorder,
    RequestBody,
    ScorerCategory,
    TypedName,
)
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import approx_prefix_cache_producer as producer_mod
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch
from llm_epp.plugins.scheduling import prefix_cache_scorer as mod
from llm_epp.plugins.scheduling.prefix_cache_scorer import Params, PrefixCacheScorer
from tests.unit.builders import FakeHandle, key


def ep(name: str, i: int = 1) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), f"10.0.2.{i}", 8000), Metrics())


def chat(text: str) -> InferenceRequest:
    payload = {"model": "m", "messages": [{"role": "user", "content": text}]}
    return InferenceRequest("r", "m", "m", RequestBody(ApiKind.CHAT_COMPLETIONS, payload))


def cycle_with(total: int, **matches: int) -> CycleState:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch(list(range(total)), {key(n): v for n, v in matches.items()}, 16))
    return cycle


@pytest.mark.parametrize(
    ("total", "matches", "candidates", "expected"),
    [
        (4, {"a": 4, "b": 1}, ["a", "b", "c"], {"a": 1.0, "b": 0.25, "c": 0.0}),
        (8, {"a": 2}, ["a"], {"a": 0.25}),
        (3, {"a": 3, "z": 3}, ["a", "b"], {"a": 1.0, "b": 0.0}),  # endpoints outside the candidates ignored
        (4, {}, ["a", "b"], {"a": 0.0, "b": 0.0}),
        (0, {}, ["a", "b"], {"a": 0.0, "b": 0.0}),
        (4, {"a": 4}, [], {}),
    ],
    ids=["ratio", "one-candidate", "non-candidate-holder", "no-match", "no-blocks", "no-candidates"],
)
def test_score_is_matched_over_total(
    total: int, matches: dict[str, int], candidates: list[str], expected: dict[str, float]
) -> None:
    eps = [ep(n, i) for i, n in enumerate(candidates, 1)]
    scores = PrefixCacheScorer().score(cycle_with(total, **matches), chat("x"), eps)
    assert scores == pytest.approx({key(n): v for n, v in expected.items()})


def test_without_producer_data_every_candidate_scores_zero() -> None:
    scores = PrefixCacheScorer().score(CycleState(), chat("x"), [ep("a", 1), ep("b", 2)])
    assert scores == {key("a"): 0.0, key("b"): 0.0}


def test_identity_category_and_auto_wiring_contract() -> None:
    scorer = mod.factory("prefix", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("prefix-cache-scorer", "prefix")
    assert scorer.category is ScorerCategory.AFFINITY
    assert mod.NEEDS_PRODUCER == producer_mod.TYPE == "approx-prefix-cache-producer"


@pytest.mark.parametrize(
    "raw",
    [{}, {"blockSizeTokens": 64, "maxPrefixBlocksToMatch": 512, "lruCapacityPerServer": 10_000, "autoTune": False}],
    ids=["defaults", "producer-params"],
)
def test_accepts_the_producer_parameters(raw: dict[str, Any]) -> None:
    params = Params.model_validate(raw)
    assert isinstance(params, producer_mod.Params)
    dumped = {k: v for k, v in params.model_dump(by_alias=True).items() if k not in mod.SCORER_ONLY_PARAMS}
    assert producer_mod.Params.model_validate(dumped) == producer_mod.Params.model_validate(raw)


def test_rejects_what_the_producer_rejects() -> None:
    with pytest.raises(ValidationError):
        Params.model_validate({"autoTune": False, "blockSizeTokens": 0})
    with pytest.raises(ValidationError):
        Params.model_validate({"noSuchParameter": 1})


CONFIG = """\
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: approx-prefix-cache-producer
- type: prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: prefix-cache-scorer
  - pluginRef: max-score-picker
"""


def test_requests_sharing_a_prefix_follow_it_through_a_loaded_config() -> None:
    eps = [ep(f"e{i}", i) for i in range(8)]
    loaded = load_config_text(CONFIG, builtin_registry(), NullRecorder(), lambda: eps)
    system = "You are a helpful assistant. " * 40

    def run(text: str) -> str:
        cycle = CycleState()
        request = chat(text)
        for producer in loaded.prepare_data:
            asyncio.run(producer.prepare_data(cycle, request, eps))
        result = loaded.scheduler.schedule(request, eps, cycle)
        for hook in loaded.pre_request:
            hook.pre_request(cycle, request, result)
        primary = result.primary
        assert primary is not None
        return primary.target_endpoints[0].key.name

    first = run(system + "first question")
    assert all(run(system + f"question {i}") == first for i in range(10))


# --- matchLengthWeight / matchLengthScaleTokens / prefixMatchInfoProducerName -------------------------------
def _cycle(total: int, block_tokens: int, **matches: int) -> CycleState:
    cycle = CycleState()
    cycle.write(
        PREFIX_MATCH_KEY, PrefixMatch(list(range(total)), {key(n): v for n, v in matches.items()}, block_tokens)
    )
    return cycle


def test_match_length_weight_rewards_long_matches() -> None:
    # a: 4 of 4 blocks (64 tokens), b: 100 of 400 blocks (1600 tokens) with 16-token blocks, scale 1600
    scorer = mod.factory("p", Params(match_length_weight=0.5, match_length_scale_tokens=1600), FakeHandle())
    short = scorer.score(_cycle(4, 16, a=4), chat("x"), [ep("a")])
    long = scorer.score(_cycle(400, 16, b=100), chat("x"), [ep("b")])
    assert short[key("a")] == pytest.approx(0.5 * (64 / 1600) ** 2 + 0.5 * 1.0)
    assert long[key("b")] == pytest.approx(0.5 * 1.0 + 0.5 * 0.25)
    assert long[key("b")] > short[key("a")]
    ratio_only = mod.factory("p", Params(), FakeHandle()).score(_cycle(400, 16, b=100), chat("x"), [ep("b")])
    assert ratio_only == {key("b"): 0.25}


def test_match_length_is_capped_at_the_scale() -> None:
    scorer = mod.factory("p", Params(match_length_weight=1.0, match_length_scale_tokens=100), FakeHandle())
    assert scorer.score(_cycle(10, 16, a=10, b=1), chat("x"), [ep("a"), ep("b", 2)]) == {
        key("a"): 1.0,
        key("b"): pytest.approx((16 / 100) ** 2),
    }


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"matchLengthWeight": 1.5}, "less than or equal to 1"),
        ({"matchLengthWeight": -0.1}, "greater than or equal to 0"),
        ({"matchLengthWeight": 0.5, "matchLengthScaleTokens": 0}, "matchLengthScaleTokens must be > 0"),
        ({"prefixMatchInfoProducerName": "cpu/prefix"}, "is not a plugin name"),
    ],
    ids=["weight-above-1", "negative-weight", "zero-scale", "not-a-name"],
)
def test_bad_scorer_parameters(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate(raw)


def test_scorer_parameters_are_not_passed_to_the_auto_created_producer() -> None:
    text = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: prefix-cache-scorer
  parameters:
    blockSizeTokens: 32
    matchLengthWeight: 0.5
    matchLengthScaleTokens: 16384
    prefixMatchInfoProducerName: approx-prefix-cache-producer
"""
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    scorer = loaded.plugins["prefix-cache-scorer"]
    assert isinstance(scorer, PrefixCacheScorer)
    assert (scorer.match_length_weight, scorer.match_length_scale_tokens) == (0.5, 16384)
    assert loaded.plugin_params["approx-prefix-cache-producer"] == {"blockSizeTokens": 32}
