"""slo-headroom-tier-filter

Scheduling intent:
    Split the candidates by predicted SLO headroom (from `predicted-latency-producer`): endpoints
    predicted to meet both the TTFT and TPOT SLO (headroom >= 0) form the positive tier, the rest
    (including endpoints without a prediction) the negative tier. When both tiers are non-empty the
    positive tier is kept, except with probability `epsilonExploreNeg`, when the negative tier is kept so
    the predictor keeps seeing how loaded endpoints really behave. With one tier empty the other is kept;
    without any predictions (or one candidate) every candidate is kept.

Inputs consumed:
    `latency-prediction-info` (so the default `predicted-latency-producer` is added when none is
    configured).

Configuration:
    epsilonExploreNeg (float in [0, 1], default 0.01): probability of keeping the negative tier.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY

TYPE = "slo-headroom-tier-filter"


class Params(PluginParams):
    epsilon_explore_neg: float = Field(default=0.01, ge=0.0, le=1.0, alias="epsilonExploreNeg")


class SloHeadroomTierFilter:
    consumes = frozenset({LATENCY_PREDICTIONS_KEY.name})

    def __init__(self, name: str = TYPE, epsilon_explore_neg: float = 0.01, rng: random.Random | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.epsilon_explore_neg = epsilon_explore_neg
        self._rng = rng or random.Random()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        if len(endpoints) <= 1:
            return endpoints
        infos = cycle.read(LATENCY_PREDICTIONS_KEY)
        if not infos:
            return endpoints
        positive: list[Endpoint] = []
        negative: list[Endpoint] = []
        predicted = False
        for ep in endpoints:
            info = infos.get(ep.key)
            if info is not None:
                predicted = True
            if info is not None and info.ttft_headroom >= 0 and info.tpot_headroom >= 0:
                positive.append(ep)
            else:
                negative.append(ep)
        if not predicted:
            return endpoints
        if positive and negative:
            return negative if self._rng.random() < self.epsilon_explore_neg else positive
        return positive or negative


def factory(name: str, params: Params, handle: Handle) -> SloHeadroomTierFilter:
    return SloHeadroomTierFilter(name, params.epsilon_explore_neg, rng=handle.rng(name))
