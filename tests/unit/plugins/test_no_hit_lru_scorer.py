"""Tests for no-hit-lru-scorer: warm requests score 0.5 everywhere; cold ones prefer endpoints that never
(or least recently) received a cold request; only cold requests update the LRU."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointMetadata,
    Metrics,
    ProfileResult,
    SchedulingResult,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.requestcontrol import PreRequest
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch
from llm_epp.plugins.scheduling import no_hit_lru_scorer as mod
from llm_epp.plugins.scheduling.no_hit_lru_scorer import NoHitLruScorer, Params
from tests.unit.builders import FakeHandle, key, request


def ep(name: str) -> Endpoint:
    return Endpoint(EndpointMetadata(key(name), f"10.0.3.{sum(map(ord, name)) % 250}", 8000), Metrics())


def eps(*names: str) -> list[Endpoint]:
    return [ep(n) for n in names]


def cycle_with(**matches: int) -> CycleState:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch([1, 2, 3, 4], {key(n): v for n, v in matches.items()}, 16))
    return cycle


def result(primary: str, prefill: str | None = None, primary_name: str = "decode") -> SchedulingResult:
    profiles: dict[str, ProfileResult | None] = {primary_name: ProfileResult((ep(primary),))}
    if prefill is not None:
        profiles["prefill"] = ProfileResult((ep(prefill),))
    return SchedulingResult(profiles, primary_name)


def cold_request(scorer: NoHitLruScorer, candidates: list[Endpoint], to: str, prefill: str | None = None) -> None:
    cycle = CycleState()
    scorer.score(cycle, request(), candidates)
    scorer.pre_request(cycle, request(), result(to, prefill))


def scores_by_name(scores: Any) -> dict[str, float]:
    return {k.name: v for k, v in scores.items()}


def test_warm_request_scores_every_candidate_half() -> None:
    scorer = NoHitLruScorer()
    scores = scorer.score(cycle_with(b=2), request(), eps("a", "b", "c"))
    assert scores_by_name(scores) == {"a": 0.5, "b": 0.5, "c": 0.5}


def test_a_match_outside_the_candidates_does_not_make_the_request_warm() -> None:
    scores = NoHitLruScorer().score(cycle_with(z=4), request(), eps("a", "b", "c"))
    assert scores_by_name(scores) == {"a": 1.0, "b": 0.5, "c": 0.0}


@pytest.mark.parametrize("cycle", [CycleState(), cycle_with(), cycle_with(a=0)], ids=["no-producer", "no-hit", "zero"])
def test_cold_request_with_an_empty_lru_ranks_in_candidate_order(cycle: CycleState) -> None:
    scores = NoHitLruScorer().score(cycle, request(), eps("a", "b", "c", "d", "e"))
    assert scores_by_name(scores) == pytest.approx({"a": 1.0, "b": 0.75, "c": 0.5, "d": 0.25, "e": 0.0})


@pytest.mark.parametrize(
    ("history", "candidates", "expected"),
    [
        (["a"], ["a", "b", "c"], {"b": 1.0, "c": 0.5, "a": 0.0}),
        (["a", "b"], ["a", "b", "c"], {"c": 1.0, "a": 0.5, "b": 0.0}),
        (["a", "b", "c"], ["a", "b", "c"], {"a": 1.0, "b": 0.5, "c": 0.0}),
        (["a", "b", "c", "a"], ["a", "b", "c"], {"b": 1.0, "c": 0.5, "a": 0.0}),
        # positions count every endpoint in the LRU, candidates or not (llm-d's arithmetic)
        (["x", "y", "a"], ["a", "b", "c"], {"b": 1.0, "c": 0.5, "a": 0.0}),
        (["x", "a", "y", "b"], ["a", "b"], {"a": 0.0, "b": 0.0}),
    ],
    ids=["one-used", "two-used", "all-used-oldest-first", "reused-moves-to-back", "others-in-lru", "floored"],
)
def test_cold_request_ranks_never_used_then_least_recently_used(
    history: list[str], candidates: list[str], expected: dict[str, float]
) -> None:
    scorer = NoHitLruScorer()
    everyone = eps(*sorted(set(history) | set(candidates)))
    for name in history:
        cold_request(scorer, everyone, name)
    assert [k.name for k in scorer.lru_order()] == list(dict.fromkeys(reversed(history)))[::-1]
    scores = scorer.score(CycleState(), request(), eps(*candidates))
    assert scores_by_name(scores) == pytest.approx(expected)


@pytest.mark.parametrize(("cycle", "expected"), [(CycleState(), 1.0), (cycle_with(a=3), 0.5)], ids=["cold", "warm"])
def test_single_and_no_candidate(cycle: CycleState, expected: float) -> None:
    scorer = NoHitLruScorer()
    assert scores_by_name(scorer.score(cycle, request(), eps("a"))) == {"a": expected}
    assert scorer.score(CycleState(), request(), []) == {}


def test_warm_requests_do_not_touch_the_lru() -> None:
    scorer = NoHitLruScorer()
    cycle = cycle_with(a=1)
    scorer.score(cycle, request(), eps("a", "b"))
    scorer.pre_request(cycle, request(), result("b"))
    assert scorer.lru_order() == []


def test_pre_request_without_score_does_nothing() -> None:
    scorer = NoHitLruScorer()
    scorer.pre_request(CycleState(), request(), result("a"))
    assert scorer.lru_order() == []


def test_cold_request_touches_primary_and_prefill_targets() -> None:
    scorer = NoHitLruScorer()
    cold_request(scorer, eps("a", "b"), "a", prefill="b")
    assert [k.name for k in scorer.lru_order()] == ["a", "b"]
    cold_request(scorer, eps("a", "b"), "a")
    assert [k.name for k in scorer.lru_order()] == ["b", "a"]


def test_prefill_as_primary_profile_is_touched_once() -> None:
    scorer = NoHitLruScorer()
    cycle = CycleState()
    scorer.score(cycle, request(), eps("a"))
    scorer.pre_request(cycle, request(), result("a", primary_name="prefill"))
    assert [k.name for k in scorer.lru_order()] == ["a"]


def test_lru_size_bounds_the_memory() -> None:
    scorer = NoHitLruScorer(lru_size=2)
    for name in "abc":
        cold_request(scorer, eps("a", "b", "c"), name)
    assert [k.name for k in scorer.lru_order()] == ["b", "c"]


def test_two_instances_keep_separate_cold_flags() -> None:
    one, two = NoHitLruScorer("one"), NoHitLruScorer("two")
    cycle = CycleState()
    one.score(cycle, request(), eps("a", "b"))
    two.pre_request(cycle, request(), result("a"))
    assert two.lru_order() == []


@pytest.mark.parametrize(
    ("raw", "size"), [({}, 1024), ({"lruSize": 8}, 8), ({"lruSize": 0}, 1024), ({"lruSize": -3}, 1024)]
)
def test_params(raw: dict[str, Any], size: int) -> None:
    full = {"prefixPluginType": "prefix-cache-scorer", "prefixPluginName": "my-prefix", **raw}
    scorer = mod.factory("lru", Params.model_validate(full), FakeHandle())
    assert scorer.lru_size == size


def test_unknown_params_are_rejected() -> None:
    with pytest.raises(ValidationError):
        Params.model_validate({"lru": 3})


def test_identity_category_and_hooks() -> None:
    scorer = mod.factory("x", Params(), FakeHandle())
    assert scorer.typed_name == TypedName("no-hit-lru-scorer", "x")
    assert scorer.category is ScorerCategory.DISTRIBUTION
    assert isinstance(scorer, PreRequest)


def test_prefix_match_info_producer_name_must_be_a_plugin_name() -> None:
    from llm_epp.framework.registry import PluginParamsError
    from llm_epp.plugins import builtin_registry

    registry = builtin_registry()
    params = registry.parse_params("no-hit-lru-scorer", {"prefixMatchInfoProducerName": "approx-prefix-cache-producer"})
    assert params.prefix_match_info_producer_name == "approx-prefix-cache-producer"
    named = registry.parse_params("no-hit-lru-scorer", {"prefixMatchInfoProducerName": "my-prefix-producer"})
    assert named.prefix_match_info_producer_name == "my-prefix-producer"  # checked against `plugins` on load
    with pytest.raises(PluginParamsError, match="is not a plugin name"):
        registry.parse_params("no-hit-lru-scorer", {"prefixMatchInfoProducerName": "cpu/prefix"})
