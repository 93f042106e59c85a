"""latency-scorer

Scheduling intent:
    Prefer endpoints by their predicted SLO headroom (SLO - predicted latency), as published by
    `predicted-latency-producer`. Endpoints predicted to meet both SLOs form the first tier; only when
    none does are the others scored, idle endpoints first, then those missing only TPOT, only TTFT, both.
    Within the tier, `least` (the default) prefers the endpoint with the least headroom that still meets
    the SLO, packing work tightly and keeping roomy endpoints free for strict requests; `most` prefers
    the most headroom. Below the first tier the strategy is always `least` (closest to meeting the SLO).
    Without predictions (predictor untrained, or no producer output) it scores a composite of free KV
    cache, relative queue length and prefix-cache match.

Inputs consumed:
    `latency-prediction-info` (so the default `predicted-latency-producer` is added when none is
    configured); for the composite fallback, endpoint metrics (KV-cache utilization, waiting queue) and
    `prefix-cache-match-info` when present.

Configuration:
    ttftWeight (float, default 0.8) and tpotWeight (float, default 0.2): weights of the normalized TTFT
        and TPOT headroom (normalized to sum 1; both <= 0 means TTFT only). When one headroom is equal on
        all endpoints the other alone decides.
    headroomSelectionStrategy (`least` | `most`, default `least`).
    compositeKVWeight, compositeQueueWeight, compositePrefixWeight (float, default 1 each): the fallback
        weights (normalized; all <= 0 means KV only).
    Scores are quantized to 1/100 steps in [0.01, 1] (0 to 1 for the fallback), as in the reference.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    ScorerCategory,
    TypedName,
)
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, LatencyPredictionInfo

TYPE = "latency-scorer"
_W_MAX = 100
_EPS = 1e-9


class Params(PluginParams):
    ttft_weight: float = Field(default=0.8, allow_inf_nan=False, alias="ttftWeight")
    tpot_weight: float = Field(default=0.2, allow_inf_nan=False, alias="tpotWeight")
    headroom_selection_strategy: Literal["least", "most"] = Field(default="least", alias="headroomSelectionStrategy")
    composite_kv_weight: float = Field(default=1.0, allow_inf_nan=False, alias="compositeKVWeight")
    composite_queue_weight: float = Field(default=1.0, allow_inf_nan=False, alias="compositeQueueWeight")
    composite_prefix_weight: float = Field(default=1.0, allow_inf_nan=False, alias="compositePrefixWeight")


def _normalized(a: float, b: float) -> tuple[float, float]:
    total = a + b
    if total <= 0:
        return 1.0, 0.0
    return a / total, b / total


class LatencyScorer:
    category = ScorerCategory.BALANCE
    consumes = frozenset({LATENCY_PREDICTIONS_KEY.name})

    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params or Params()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        infos = cycle.read(LATENCY_PREDICTIONS_KEY) or {}
        scores = dict.fromkeys((ep.key for ep in endpoints), 0.0)
        data = [(ep, infos.get(ep.key)) for ep in endpoints]
        if not any(info is not None for _, info in data):
            return self._composite(cycle, endpoints)
        positive = [(ep, i) for ep, i in data if i is None or (i.ttft_headroom >= 0 and i.tpot_headroom >= 0)]
        if positive:
            self._score_bucket(positive, scores, force_least=False)
            return scores
        negative = [(ep, i) for ep, i in data if i is not None]
        idle = [(ep, i) for ep, i in negative if i.dispatched == 0]
        if idle:
            self._score_bucket(idle, scores, force_least=True)
            return scores
        tpot_only = [(ep, i) for ep, i in negative if i.tpot_headroom < 0 <= i.ttft_headroom]
        ttft_only = [(ep, i) for ep, i in negative if i.ttft_headroom < 0 <= i.tpot_headroom]
        both = [(ep, i) for ep, i in negative if i.ttft_headroom < 0 and i.tpot_headroom < 0]
        for bucket in (tpot_only, ttft_only, both):
            if bucket:
                self._score_bucket(bucket, scores, force_least=True)
                return scores
        self._score_bucket(negative, scores, force_least=True)
        return scores

    def _score_bucket(
        self,
        bucket: Sequence[tuple[Endpoint, LatencyPredictionInfo | None]],
        scores: dict[EndpointKey, float],
        force_least: bool,
    ) -> None:
        alpha, beta = _normalized(self.params.ttft_weight, self.params.tpot_weight)
        ttft = [abs(i.ttft_headroom) if i is not None else 0.0 for _, i in bucket]
        tpot = [abs(i.tpot_headroom) if i is not None else 0.0 for _, i in bucket]
        ttft_min, tpot_min = min(ttft), min(tpot)
        ttft_range, tpot_range = max(ttft) - ttft_min, max(tpot) - tpot_min
        if ttft_range <= _EPS < tpot_range:
            alpha, beta = 0.0, 1.0
        elif tpot_range <= _EPS < ttft_range:
            alpha, beta = 1.0, 0.0
        most = self.params.headroom_selection_strategy == "most" and not force_least
        for (ep, _), h1, h2 in zip(bucket, ttft, tpot, strict=True):
            n_ttft = (h1 - ttft_min) / ttft_range if ttft_range > _EPS else 0.5
            n_tpot = (h2 - tpot_min) / tpot_range if tpot_range > _EPS else 0.5
            combined = alpha * n_ttft + beta * n_tpot
            weight = int((combined if most else 1.0 - combined) * _W_MAX) + 1
            scores[ep.key] = min(weight, _W_MAX) / _W_MAX

    def _composite(self, cycle: CycleState, endpoints: Sequence[Endpoint]) -> dict[EndpointKey, float]:
        p = self.params
        wkv, wq, wpref = p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
        total = wkv + wq + wpref
        if total <= 0:
            wkv, wq, wpref, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wpref = wkv / total, wq / total, wpref / total
        max_q = max((ep.metrics.waiting_queue_size for ep in endpoints), default=0)
        match = cycle.read(PREFIX_MATCH_KEY)
        out = {}
        for ep in endpoints:
            q = ep.metrics.waiting_queue_size
            rel_queue = (max_q - q) / max_q if max_q > 0 else 1.0
            kv_free = 1.0 - ep.metrics.kv_cache_usage
            prefix = match.score(ep.key) if match is not None else 0.0
            if math.isnan(prefix):
                prefix = 0.0
            composite = wkv * kv_free + wq * rel_queue + wpref * prefix
            out[ep.key] = round(_W_MAX * composite) / _W_MAX
        return out


def factory(name: str, params: Params, handle: Handle) -> LatencyScorer:
    return LatencyScorer(name, params)
