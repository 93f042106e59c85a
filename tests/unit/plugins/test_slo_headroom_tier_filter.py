"""slo-headroom-tier-filter: the positive-headroom tier, exploration of the negative tier, no predictions."""

from __future__ import annotations

import random

import pytest
from pydantic import ValidationError

from llm_epp.framework import CycleState
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo
from llm_epp.plugins.scheduling.slo_headroom_tier_filter import Params, SloHeadroomTierFilter
from tests.unit.builders import endpoints, key, names, request


def info(ttft_headroom: float, tpot_headroom: float = 0.0) -> LatencyPredictionInfo:
    return LatencyPredictionInfo(100.0, 10.0, ttft_headroom >= 0, tpot_headroom >= 0, ttft_headroom, tpot_headroom)


def cycle_with(**infos: LatencyPredictionInfo) -> CycleState:
    cycle = CycleState()
    cycle.write(LATENCY_PREDICTIONS_KEY, {key(n): i for n, i in infos.items()})
    return cycle


def test_keeps_the_positive_tier() -> None:
    f = SloHeadroomTierFilter(rng=random.Random(0))
    eps = endpoints("a", "b", "c", "unknown")
    kept = f.filter(cycle_with(a=info(10), b=info(-1), c=info(5, -2)), request(), eps)
    assert names(kept) == ["a"]


def test_explores_the_negative_tier_with_epsilon() -> None:
    eps = endpoints("a", "b", "c")
    cycle = cycle_with(a=info(10), b=info(-1), c=info(-3))
    always = SloHeadroomTierFilter(epsilon_explore_neg=1.0)
    assert names(always.filter(cycle, request(), eps)) == ["b", "c"]
    f = SloHeadroomTierFilter(epsilon_explore_neg=0.25, rng=random.Random(4))
    negative = sum(names(f.filter(cycle, request(), eps)) == ["b", "c"] for _ in range(2000))
    assert 400 < negative < 600


def test_one_tier_or_no_predictions_keeps_what_there_is() -> None:
    f = SloHeadroomTierFilter()
    eps = endpoints("a", "b")
    assert names(f.filter(cycle_with(a=info(-1), b=info(-2)), request(), eps)) == ["a", "b"]
    assert names(f.filter(CycleState(), request(), eps)) == ["a", "b"]
    assert names(f.filter(cycle_with(x=info(1)), request(), eps)) == ["a", "b"]


def test_epsilon_range() -> None:
    assert Params().epsilon_explore_neg == 0.01
    for bad in (-0.1, 1.5):
        with pytest.raises(ValidationError):
            Params.model_validate({"epsilonExploreNeg": bad})
