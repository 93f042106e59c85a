"""latency-scorer: headroom tiers, the least/most strategies, the weights, and the composite fallback."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState, ScorerCategory
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo
from llm_epp.plugins.scheduling.latency_scorer import LatencyScorer, Params
from tests.unit.builders import endpoint, key, request


def info(ttft_headroom: float, tpot_headroom: float = 0.0, dispatched: int = 1) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(
        ttft=100.0,
        tpot=10.0,
        ttft_valid=ttft_headroom >= 0,
        tpot_valid=tpot_headroom >= 0,
        ttft_headroom=ttft_headroom,
        tpot_headroom=tpot_headroom,
        dispatched=dispatched,
    )


def scores(
    scorer: LatencyScorer, infos: dict[str, LatencyPredictionInfo], **metrics: dict[str, float]
) -> dict[str, float]:
    eps = [endpoint(n, **metrics.get(n, {})) for n in infos]  # type: ignore[arg-type]
    cycle = CycleState()
    cycle.write(LATENCY_PREDICTIONS_KEY, {key(n): i for n, i in infos.items()})
    return {k.name: v for k, v in scorer.score(cycle, request(), eps).items()}


def test_endpoints_meeting_the_slo_beat_those_missing_it() -> None:
    s = scores(LatencyScorer(), {"meets": info(50), "misses": info(-10)})
    assert s["meets"] > 0 and s["misses"] == 0


def test_least_strategy_packs_onto_the_smallest_positive_headroom() -> None:
    s = scores(LatencyScorer(), {"tight": info(10), "roomy": info(500), "mid": info(200)})
    assert s["tight"] > s["mid"] > s["roomy"]
    assert s["tight"] == 1.0 and s["roomy"] == 0.01


def test_most_strategy_prefers_the_largest_headroom() -> None:
    s = scores(LatencyScorer(params=Params(headroomSelectionStrategy="most")), {"tight": info(10), "roomy": info(500)})
    assert s["roomy"] > s["tight"]


def test_all_missing_idle_first_then_closest_to_the_slo() -> None:
    s = scores(LatencyScorer(), {"busy": info(-5), "idle": info(-400, dispatched=0)})
    assert s["idle"] > 0 and s["busy"] == 0
    s = scores(LatencyScorer(params=Params(headroomSelectionStrategy="most")), {"near": info(-5), "far": info(-400)})
    assert s["near"] > s["far"]  # below the SLO the strategy is always least


def test_missing_only_tpot_ranks_before_missing_ttft() -> None:
    s = scores(LatencyScorer(), {"tpot-miss": info(10, -1), "ttft-miss": info(-10, 1)})
    assert s["tpot-miss"] > 0 and s["ttft-miss"] == 0


def test_weights_choose_which_headroom_decides() -> None:
    infos = {"a": info(10, 100), "b": info(100, 10)}
    ttft_only = scores(LatencyScorer(params=Params(ttftWeight=1, tpotWeight=0)), infos)
    tpot_only = scores(LatencyScorer(params=Params(ttftWeight=0, tpotWeight=1)), infos)
    assert ttft_only["a"] > ttft_only["b"] and tpot_only["b"] > tpot_only["a"]


def test_without_predictions_the_composite_decides() -> None:
    scorer = LatencyScorer()
    eps = [endpoint("empty", kv=0.1, queue=0), endpoint("full", kv=0.9, queue=8)]
    s = {k.name: v for k, v in scorer.score(CycleState(), request(), eps).items()}
    assert s["empty"] > s["full"]
    kv_only = LatencyScorer(params=Params(compositeQueueWeight=0, compositePrefixWeight=0))
    s = {k.name: v for k, v in kv_only.score(CycleState(), request(), eps).items()}
    assert s == {"empty": 0.9, "full": 0.1}


def test_category_and_params() -> None:
    assert LatencyScorer().category is ScorerCategory.BALANCE
    assert Params().ttft_weight == 0.8 and Params().tpot_weight == 0.2
    with pytest.raises(ValidationError, match="least"):
        Params.model_validate({"headroomSelectionStrategy": "random"})
