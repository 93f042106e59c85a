"""predicted-latency-scorer: tiered choice by SLO headroom, idle-first among misses, the affinity gate, the
composite fallback, selection modes, training through its own hooks, parameters and loading."""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from typing import Any

import pytest
from pydantic import ValidationError

from llm_epp.config.loader import load_config_text
from llm_epp.framework import CycleState, Endpoint, InFlightLoad, NullRecorder, ProfileResult, SchedulingResult
from llm_epp.framework.requestcontrol import ResponseInfo, Usage
from llm_epp.latency import Features, LatencyPredictor, Prediction, PredictorSettings
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, PrefixMatch
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY
from llm_epp.plugins.scheduling.predicted_latency_scorer import Params, PredictedLatencyScorer
from tests.unit.builders import FakeHandle, endpoint, key, request


class Seeded(LatencyPredictor):
    """TTFT = 1000 ms x KV utilization, TPOT = 100 ms x KV utilization."""

    def __init__(self) -> None:
        super().__init__(PredictorSettings())

    def predict(self, features: Features) -> Prediction | None:
        return Prediction(1000 * features.kv_cache, 100 * features.kv_cache, True, True)


def loaded(name: str, kv: float, requests: int = 0, queue: int = 0) -> Endpoint:
    ep = endpoint(name, kv=kv, queue=queue, address=f"10.0.0.{abs(hash(name)) % 200 + 1}")
    return Endpoint(ep.metadata, ep.metrics, InFlightLoad(requests, 0))


def scorer(seed: int = 1, **params: Any) -> PredictedLatencyScorer:
    return PredictedLatencyScorer(params=Params.model_validate(params), predictor=Seeded(), rng=random.Random(seed))


async def picks(s: PredictedLatencyScorer, eps: list[Endpoint], n: int = 400, **headers: str) -> Counter[str]:
    out: Counter[str] = Counter()
    req = request(headers=headers)
    for _ in range(n):
        cycle = CycleState()
        await s.prepare_data(cycle, req, eps)
        scores = s.score(cycle, req, eps)
        chosen = [k.name for k, v in scores.items() if v == 1.0]
        assert len(chosen) == 1 and sum(scores.values()) == 1.0
        out[chosen[0]] += 1
    return out


async def test_endpoints_predicted_to_meet_the_slo_win_and_least_headroom_is_favoured() -> None:
    eps = [loaded("tight", 0.25), loaded("roomy", 0.05), loaded("miss", 0.9)]
    got = await picks(scorer(epsilonExploreNeg=0.0), eps, **{"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "50"})
    assert got["miss"] == 0
    assert got["tight"] > 2 * got["roomy"] > 0  # weights 100 vs ~2: least headroom first
    most = await picks(
        scorer(epsilonExploreNeg=0.0, headroomSelectionStrategy="most"),
        eps,
        **{"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "50"},
    )
    assert most["roomy"] > 2 * most["tight"] and most["miss"] == 0


async def test_exploration_sends_a_share_to_the_negative_tier() -> None:
    eps = [loaded("ok", 0.1), loaded("miss", 0.9)]
    got = await picks(scorer(epsilonExploreNeg=0.5), eps, n=600, **{"x-llm-d-slo-ttft-ms": "300"})
    assert 200 < got["miss"] < 400


async def test_among_misses_idle_endpoints_come_first_then_the_smallest_deficit() -> None:
    headers = {"x-slo-ttft-ms": "100"}
    busy_close, busy_far, idle_far = loaded("close", 0.2, requests=3), loaded("far", 0.9, 2), loaded("idle", 0.95, 0)
    got = await picks(scorer(), [busy_close, busy_far, idle_far], **headers)
    assert got == Counter({"idle": 400})
    got = await picks(scorer(), [busy_close, busy_far], **headers)
    assert got["close"] > 10 * got["far"] and got["far"] > 0  # weights 82 vs 2


async def test_selection_mode_max_is_deterministic() -> None:
    eps = [loaded("tight", 0.25), loaded("roomy", 0.05)]
    slos = {"x-slo-ttft-ms": "300", "x-slo-tpot-ms": "50"}
    got = await picks(scorer(selectionMode="max", epsilonExploreNeg=0.0), eps, n=50, **slos)
    assert got == Counter({"tight": 50})
    # streamingMode (the default) with no TPOT SLO: every endpoint misses TPOT, the smallest deficit wins
    got = await picks(scorer(selectionMode="max"), eps, n=20, **{"x-slo-ttft-ms": "300"})
    assert got == Counter({"roomy": 20})


async def test_without_streaming_mode_tpot_does_not_count() -> None:
    # TPOT SLO 1 ms is missed everywhere when checked; with streamingMode false only TTFT decides
    eps = [loaded("a", 0.2), loaded("b", 0.9)]
    headers = {"x-slo-ttft-ms": "500", "x-slo-tpot-ms": "1"}
    off = await picks(scorer(streamingMode=False, selectionMode="max", epsilonExploreNeg=0.0), eps, n=20, **headers)
    assert off == Counter({"a": 20})
    s = scorer(streamingMode=True)
    cycle = CycleState()
    await s.prepare_data(cycle, request(headers=headers), eps)
    infos = cycle.read(LATENCY_PREDICTIONS_KEY) or {}
    assert not infos[key("a")].tpot_valid  # published for the admitter and the tier filter


def _with_prefix(cycle: CycleState, matches: dict[str, int]) -> None:
    cycle.write(PREFIX_MATCH_KEY, PrefixMatch(list(range(10)), {key(k): v for k, v in matches.items()}, 16))


async def test_affinity_gate_keeps_the_cached_endpoint_unless_it_is_much_slower() -> None:
    s = scorer(epsilonExploreSticky=0.0, epsilonExploreNeg=0.0, selectionMode="max")
    eps = [loaded("cached", 0.3), loaded("cold", 0.29)]
    req = request(headers={"x-slo-ttft-ms": "800"})
    cycle = CycleState()
    _with_prefix(cycle, {"cached": 10})
    await s.prepare_data(cycle, req, eps)
    assert s.score(cycle, req, eps)[key("cached")] == 1.0  # without the gate, least headroom = "cached" too
    eps = [loaded("cached", 0.05), loaded("cold", 0.3)]  # the gate must override least-headroom ("cold")
    cycle = CycleState()
    _with_prefix(cycle, {"cached": 10})
    await s.prepare_data(cycle, req, eps)
    assert s.score(cycle, req, eps)[key("cached")] == 1.0
    # the cached endpoint predicted 600 ms slower than the best: over a 500 ms penalty limit, gate broken
    s = scorer(epsilonExploreSticky=0.0, epsilonExploreNeg=0.0, selectionMode="max", affinityMaxTTFTPenaltyMs=500)
    eps = [loaded("cached", 0.7), loaded("cold", 0.1)]
    cycle = CycleState()
    _with_prefix(cycle, {"cached": 10})
    await s.prepare_data(cycle, req, eps)
    assert s.score(cycle, req, eps)[key("cold")] == 1.0
    s = scorer(epsilonExploreSticky=0.0, epsilonExploreNeg=0.0, selectionMode="max", affinityMaxTTFTPenaltyMs=700)
    cycle = CycleState()
    _with_prefix(cycle, {"cached": 10})
    await s.prepare_data(cycle, req, eps)
    assert s.score(cycle, req, eps)[key("cached")] == 1.0


async def test_without_predictions_the_composite_decides() -> None:
    s = PredictedLatencyScorer(params=Params(selectionMode="max"), predictor=LatencyPredictor(), rng=random.Random(3))
    eps = [loaded("full", 0.9, queue=5), loaded("free", 0.1, queue=0)]
    req = request(headers={"x-slo-ttft-ms": "100"})
    cycle = CycleState()
    await s.prepare_data(cycle, req, eps)
    assert cycle.read(LATENCY_PREDICTIONS_KEY) is None
    assert s.score(cycle, req, eps) == {key("full"): 0.0, key("free"): 1.0}
    least = PredictedLatencyScorer(
        params=Params.model_validate({"selectionMode": "max", "headroomSelectionStrategy": "composite-least"}),
        predictor=Seeded(),
    )
    cycle = CycleState()
    await least.prepare_data(cycle, req, eps)  # both miss 100 ms: composite-least favours the low composite
    assert least.score(cycle, req, eps)[key("full")] == 1.0
    s.close()


async def test_trains_through_its_own_hooks_and_then_steers() -> None:
    handle = FakeHandle()
    predictor = LatencyPredictor(PredictorSettings(min_samples=5, min_interval_s=0.01))
    s = PredictedLatencyScorer(params=Params(epsilonExploreNeg=0.0), handle=handle, predictor=predictor)
    eps = [endpoint("fast", kv=0.1, running=1), endpoint("slow", kv=0.8, running=12, address="10.0.0.2")]
    for i in range(40):
        target = eps[i % 2]
        cycle, req = CycleState(), request(request_id=f"r{i}", stream=True)
        await s.prepare_data(cycle, req, eps)
        s.pre_request(cycle, req, SchedulingResult({"default": ProfileResult((target,))}, "default"))
        handle.clock += 0.4 if target.key.name == "slow" else 0.1
        s.response_received(cycle, req, ResponseInfo(status=200, streaming=True), target)
        first = handle.clock
        assert s.producer.prefill_tokens(target.key) > 0, "a streamed response's headers do not end its prefill"
        s.response_first_body(cycle, req, ResponseInfo(status=200, streaming=True, first_body_at=first), target)
        assert s.producer.prefill_tokens(target.key) == 0
        handle.clock += 0.2
        done = ResponseInfo(200, streaming=True, complete=True, usage=Usage(5, 11, 16), first_body_at=first)
        s.response_complete(cycle, req, done, target)
    assert await asyncio.to_thread(predictor.wait_fitted, 10.0)
    got = await picks(s, eps, n=50, **{"x-slo-ttft-ms": "250", "x-slo-tpot-ms": "100"})
    assert got == Counter({"fast": 50})
    s.close()


def test_parameters_and_defaults() -> None:
    p = Params()
    assert (p.streaming_mode, p.headroom_selection_strategy, p.selection_mode) == (True, "least", "linear")
    assert (p.affinity_gate_tau, p.affinity_gate_tau_global, p.affinity_max_ttft_penalty_ms) == (0.8, 0.99, 5000)
    assert Params.model_validate({"contextTTL": "2m"}).context_ttl == 120
    for bad, msg in (
        ({"samplingMean": 50}, "not supported yet"),
        ({"maxSampledTokens": 3}, "not supported yet"),
        ({"maxSampledTokens": -1}, "maxSampledTokens must be >= 0"),
        ({"headroomTTFTWeight": -1}, "greater than or equal to 0"),
        ({"epsilonExploreNeg": 1.5}, "less than or equal to 1"),
        ({"affinityGateTauGlobal": 2}, "less than or equal to 1"),
        ({"headroomSelectionStrategy": "fastest"}, "least"),
        ({"selectionMode": "random"}, "linear"),
    ):
        with pytest.raises(ValidationError, match=msg):
            Params.model_validate(bad)


def test_loads_alone_with_its_hooks_and_the_prefix_producer() -> None:
    loaded_cfg = load_config_text(
        """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: predicted-latency-scorer
  parameters:
    streamingMode: true
    headroomSelectionStrategy: least
- type: latency-slo-admitter
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins:
  - pluginRef: predicted-latency-scorer
  - pluginRef: max-score-picker
""",
        builtin_registry(),
        NullRecorder(),
    )
    kinds = [type(p).__name__ for p in loaded_cfg.prepare_data]
    assert kinds.index("ApproxPrefixCacheProducer") < kinds.index("PredictedLatencyScorer")
    assert "PredictedLatencyProducer" not in kinds  # it publishes the predictions the admitter reads
    assert [type(p).__name__ for p in loaded_cfg.response_complete] == ["PredictedLatencyScorer"]
    assert [type(p).__name__ for p in loaded_cfg.response_first_body] == ["PredictedLatencyScorer"]
