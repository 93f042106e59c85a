"""Tests for prefix-cache-affinity-filter: keep the endpoints whose prefix score reaches the threshold,
keep everyone when none does, and skip the gate with the exploration probability (seeded rng)."""

from __future__ import annotations

import random
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, Endpoint, EndpointMetadata, Filter, Metrics, TypedName
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo
from llm_epp.plugins.scheduling import prefix_cache_affinity_filter as mod
from llm_epp.plugins.scheduling.prefix_cache_affinity_filter import Params, PrefixCacheAffinityFilter
from tests.unit.builders import FakeHandle, key, names, request


def eps(*names_: str) -> list[Endpoint]:
    return [Endpoint(EndpointMetadata(key(n), f"10.0.4.{i}", 8000), Metrics()) for i, n in enumerate(names_, 1)]


def cycle_with(total: int, **matches: int) -> CycleState:
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch(list(range(total)), {key(n): v for n, v in matches.items()}, 16))
    return cycle


def no_exploration(threshold: float = 0.8) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(affinity_threshold=threshold, exploration_probability=0.0)


@pytest.mark.parametrize(
    ("threshold", "total", "matches", "expected"),
    [
        (0.8, 10, {"a": 10, "b": 8, "c": 7}, ["a", "b"]),
        (0.8, 10, {"a": 7, "b": 1}, ["a", "b", "c"]),  # nobody sticky: keep all
        (0.8, 10, {}, ["a", "b", "c"]),
        (0.8, 0, {}, ["a", "b", "c"]),  # prompt shorter than one block
        (1.0, 4, {"b": 4, "c": 3}, ["b"]),
        (0.5, 4, {"c": 2}, ["c"]),
        (0.0, 4, {"c": 4}, ["a", "b", "c"]),  # threshold <= 0 disables the gate
        (-1.0, 4, {"c": 4}, ["a", "b", "c"]),
    ],
    ids=["two-sticky", "none-sticky", "no-match", "no-blocks", "exact-1.0", "at-threshold", "zero", "negative"],
)
def test_keeps_sticky_endpoints(threshold: float, total: int, matches: dict[str, int], expected: list[str]) -> None:
    kept = no_exploration(threshold).filter(cycle_with(total, **matches), request(), eps("a", "b", "c"))
    assert names(kept) == expected


def test_without_producer_data_keeps_everyone() -> None:
    assert names(no_exploration().filter(CycleState(), request(), eps("a", "b"))) == ["a", "b"]


@pytest.mark.parametrize("candidates", [[], ["a"]], ids=["none", "one"])
def test_zero_or_one_candidate_passes_through(candidates: list[str]) -> None:
    f = PrefixCacheAffinityFilter(exploration_probability=1.0, rng=random.Random(1))
    assert names(f.filter(cycle_with(4, b=4), request(), eps(*candidates))) == candidates


@pytest.mark.parametrize(("probability", "low", "high"), [(0.0, 0, 0), (0.25, 200, 300), (1.0, 1000, 1000)])
def test_exploration_skips_the_gate_with_the_configured_probability(probability: float, low: int, high: int) -> None:
    f = PrefixCacheAffinityFilter(exploration_probability=probability, rng=random.Random(7))
    cycle = cycle_with(4, a=4)
    kept = [names(f.filter(cycle, request(), eps("a", "b", "c"))) for _ in range(1000)]
    assert all(k in (["a"], ["a", "b", "c"]) for k in kept)
    opened = sum(k == ["a", "b", "c"] for k in kept)
    assert low <= opened <= high
    rng = random.Random(7)  # one draw per call, in the same order
    assert opened == sum(rng.random() < probability for _ in range(1000))


def test_ttft_penalty_is_accepted_but_not_applied() -> None:
    f = mod.factory("f", Params.model_validate({"maxTTFTPenaltyMs": 0, "explorationProbability": 0}), FakeHandle())
    assert names(f.filter(cycle_with(4, b=4), request(), eps("a", "b"))) == ["b"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({}, (0.8, 0.01)),
        ({"affinityThreshold": 0.99, "explorationProbability": 0.0, "maxTTFTPenaltyMs": 100}, (0.99, 0.0)),
    ],
)
def test_params(raw: dict[str, Any], expected: tuple[float, float]) -> None:
    f = mod.factory("f", Params.model_validate(raw), FakeHandle())
    assert (f.affinity_threshold, f.exploration_probability) == expected
    assert Params().max_ttft_penalty_ms == 5000


@pytest.mark.parametrize(
    "raw",
    [
        {"affinityThreshold": 1.5},
        {"explorationProbability": -0.1},
        {"explorationProbability": 1.1},
        {"maxTTFTPenaltyMs": -1},
        {"threshold": 0.5},
    ],
    ids=["threshold-above-1", "negative-probability", "probability-above-1", "negative-penalty", "unknown"],
)
def test_invalid_params_are_rejected(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_identity() -> None:
    f = mod.factory("aff", Params(), FakeHandle())
    assert f.typed_name == TypedName("prefix-cache-affinity-filter", "aff")
    assert isinstance(f, Filter)


# --- the TTFT load gate (ttftSource prefillThroughput) ------------------------------------------------------
def loaded(tokens: dict[str, int]) -> list[Endpoint]:
    out = eps(*tokens)
    for e in out:
        e.load.tokens = tokens[e.key.name]
    return out


@pytest.mark.parametrize(
    ("tokens", "penalty_ms", "expected"),
    [
        ({"a": 0, "b": 0, "c": 0}, 5000, ["a", "b"]),
        # sticky best 100k tokens, other best 0: 100000 / 10000 * 1000 = 10000 ms > 5000: break stickiness
        ({"a": 100_000, "b": 120_000, "c": 0}, 5000, ["a", "b", "c"]),
        # 40000 tokens = 4000 ms <= 5000: stay sticky
        ({"a": 40_000, "b": 120_000, "c": 0}, 5000, ["a", "b"]),
        ({"a": 100_000, "b": 120_000, "c": 0}, 0, ["a", "b"]),  # 0 = always stick
        ({"a": 100_000, "b": 120_000, "c": 60_000}, 5000, ["a", "b"]),  # 4000 ms difference
    ],
    ids=["idle", "sticky-overloaded", "within-penalty", "gate-off", "others-busy-too"],
)
def test_ttft_load_gate(tokens: dict[str, int], penalty_ms: float, expected: list[str]) -> None:
    raw = {"explorationProbability": 0, "maxTTFTPenaltyMs": penalty_ms, "peakPrefillThroughput": 10_000}
    f = mod.factory("f", Params.model_validate(raw), FakeHandle())
    assert names(f.filter(cycle_with(10, a=10, b=9), request(), loaded(tokens))) == expected


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"ttftSource": "guess"}, "prefillThroughput"),
        ({"peakPrefillThroughput": 0}, "peakPrefillThroughput must be > 0"),
        ({"peakPrefillThroughput": -1}, "greater than or equal to 0"),
        ({"latencyPredictionInfoProducerName": "my-latency"}, "not supported yet"),
        ({"prefixMatchInfoProducerName": "cpu/prefix"}, "is not a plugin name"),
    ],
    ids=["unknown-source", "zero-throughput", "negative-throughput", "predictor-name", "precise"],
)
def test_gate_parameters_rejected(raw: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError, match=problem):
        Params.model_validate(raw)


def test_gate_parameters_accepted_when_the_gate_is_off() -> None:
    params = Params.model_validate(
        {"maxTTFTPenaltyMs": 0, "ttftSource": "latencyPredictor", "peakPrefillThroughput": 0}
    )
    assert params.ttft_source == "latencyPredictor"
    named = Params.model_validate(
        {"inFlightLoadProducerName": "load", "prefixMatchInfoProducerName": "approx-prefix-cache-producer"}
    )
    assert named.in_flight_load_producer_name == "load"


# --- the TTFT load gate (ttftSource latencyPredictor, GIE v1.5.0) -----------------------------------------


def with_ttft(cycle: CycleState, **ttft: float) -> CycleState:
    cycle.write(
        LATENCY_PREDICTIONS_KEY,
        {key(n): LatencyPredictionInfo(ms, 0.0, True, True, 0.0, 0.0) for n, ms in ttft.items()},
    )
    return cycle


@pytest.mark.parametrize(
    ("ttft", "expected"),
    [
        ({"a": 6000.0, "b": 7000.0, "c": 500.0}, ["a", "b", "c"]),  # sticky best 6000 - 500 > 5000: break
        ({"a": 3000.0, "b": 7000.0, "c": 500.0}, ["a", "b"]),  # 2500 <= 5000: stick
        ({}, ["a", "b"]),  # no predictions: the gate does not break
        ({"c": 100.0}, ["a", "b", "c"]),  # only the non-sticky endpoint is predicted: break, as the reference
        ({"a": 9000.0}, ["a", "b"]),  # nothing to compare with
    ],
)
def test_ttft_load_gate_with_predicted_ttft(ttft: dict[str, float], expected: list[str]) -> None:
    raw = {"explorationProbability": 0, "ttftSource": "latencyPredictor", "peakPrefillThroughput": 0}
    f = mod.factory("f", Params.model_validate(raw), FakeHandle())
    assert "latency-prediction-info" in f.consumes
    eps = loaded({"a": 0, "b": 0, "c": 0})
    assert names(f.filter(with_ttft(cycle_with(10, a=10, b=9), **ttft), request(), eps)) == expected
