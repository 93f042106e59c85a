"""prefix-cache-affinity-filter

Scheduling intent:
    Keep only the "sticky" endpoints, those that probably hold most of the request's prompt in their prefix
    cache (prefix score >= `affinityThreshold`), so the scorers and picker after it choose among cache hits
    only; paired with a random picker this spreads a hot prefix over its sticky endpoints without losing
    the cache. All candidates are kept when none is sticky, when there is at most one candidate, when
    `affinityThreshold` <= 0, and, for exploration, with probability `explorationProbability` (which lets
    other endpoints warm up over time).

    TTFT load gate (`maxTTFTPenaltyMs` > 0): when the best sticky endpoint's estimated TTFT exceeds the best
    non-sticky one's by more than `maxTTFTPenaltyMs`, stickiness is broken and every candidate is kept, so
    a hot prefix does not pile load onto overloaded sticky endpoints. With `ttftSource: prefillThroughput`
    (the default) an endpoint's TTFT is estimated as in-flight tokens / `peakPrefillThroughput` x 1000 ms.
    With `ttftSource: latencyPredictor` (GIE v1.5.0's only source) it is the TTFT predicted by
    `predicted-latency-producer`; without predictions the gate does not break stickiness, and when only
    the non-sticky endpoints have predictions it does (as the reference).

Inputs consumed:
    The request's `PrefixMatch` in the CycleState (from `approx-prefix-cache-producer`); the prefix score
    of an endpoint is matched blocks / total blocks (0 without prefix data). For the TTFT load gate,
    Endpoint.load.tokens, the EPP's own in-flight token estimate per endpoint, or (`ttftSource:
    latencyPredictor`) `latency-prediction-info`, so the default `predicted-latency-producer` is added
    when none is configured.

Configuration:
    affinityThreshold (float, default 0.80, <= 1): minimum prefix score of a sticky endpoint.
    explorationProbability (float in [0, 1], default 0.01): chance of keeping every candidate.
    maxTTFTPenaltyMs (float >= 0, default 5000, as GIE v1.5.0; llm-d-router uses 18000): 0 = always stick.
    ttftSource (`prefillThroughput` | `latencyPredictor`, default `prefillThroughput`): where the gate's TTFT
        comes from.
    peakPrefillThroughput (float >= 0 tokens/s, default 15928, calibrated upstream for Qwen3-32B on
        2 x H100 TP=2): must be > 0 when the gate uses `prefillThroughput`.
    prefixMatchInfoProducerName (default ""): the `name` of the declared prefix producer instance whose
        match the filter reads; empty (or `approx-prefix-cache-producer`) reads the default producer's. A
        name no declared prefix producer has is rejected when the configuration loads.
    inFlightLoadProducerName (default ""): the `inflight-load-producer` whose tokens the gate reads. It must
        name a declared `inflight-load-producer` (or be `inflight-load-producer`); other names are refused
        when the configuration loads. llm-epp keeps one in-flight account per endpoint (in the core), which
        every inflight-load-producer stands for.
    latencyPredictionInfoProducerName (default ""): "" or `predicted-latency-producer` (the only
        producer of latency predictions); other names are not supported yet.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Literal

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, StateKey, TypedName
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    PrefixMatch,
    check_prefix_producer_name,
    prefix_match_key,
)
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY
from llm_epp.plugins.requestcontrol.predicted_latency_producer import TYPE as LATENCY_PRODUCER

TYPE = "prefix-cache-affinity-filter"
DEFAULT_PEAK_PREFILL_THROUGHPUT = 15928.0


class Params(PluginParams):
    affinity_threshold: float = Field(default=0.80, le=1.0, alias="affinityThreshold")
    exploration_probability: float = Field(default=0.01, ge=0.0, le=1.0, alias="explorationProbability")
    max_ttft_penalty_ms: float = Field(default=5000.0, ge=0.0, alias="maxTTFTPenaltyMs")
    ttft_source: Literal["prefillThroughput", "latencyPredictor"] = Field(
        default="prefillThroughput", alias="ttftSource"
    )
    peak_prefill_throughput: float = Field(
        default=DEFAULT_PEAK_PREFILL_THROUGHPUT, ge=0.0, alias="peakPrefillThroughput"
    )
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")
    latency_prediction_info_producer_name: str = Field(default="", alias="latencyPredictionInfoProducerName")

    _producer_name = field_validator("prefix_match_info_producer_name")(check_prefix_producer_name)

    @model_validator(mode="after")
    def _gate(self) -> Params:
        gate = self.max_ttft_penalty_ms > 0
        if self.latency_prediction_info_producer_name not in ("", LATENCY_PRODUCER):
            raise ValueError(
                f"latencyPredictionInfoProducerName {self.latency_prediction_info_producer_name!r} is not "
                f"supported yet: the only producer of latency predictions is {LATENCY_PRODUCER}; leave it out"
            )
        if gate and self.ttft_source == "prefillThroughput" and self.peak_prefill_throughput <= 0:
            raise ValueError("peakPrefillThroughput must be > 0 when ttftSource is prefillThroughput")
        return self


class PrefixCacheAffinityFilter:
    def __init__(
        self,
        name: str = TYPE,
        affinity_threshold: float = 0.80,
        exploration_probability: float = 0.01,
        rng: random.Random | None = None,
        max_ttft_penalty_ms: float = 0.0,
        peak_prefill_throughput: float = DEFAULT_PEAK_PREFILL_THROUGHPUT,
        ttft_source: str = "prefillThroughput",
        match_key: StateKey[PrefixMatch] = PREFIX_MATCH_KEY,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = match_key
        self.consumes = frozenset({match_key.name})
        self.affinity_threshold = affinity_threshold
        self.exploration_probability = exploration_probability
        self.max_ttft_penalty_ms = max_ttft_penalty_ms
        self.peak_prefill_throughput = peak_prefill_throughput
        self.use_predictions = ttft_source == "latencyPredictor"
        if self.use_predictions and max_ttft_penalty_ms > 0:
            self.consumes = frozenset({match_key.name, LATENCY_PREDICTIONS_KEY.name})
        self._rng = rng or random.Random()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        threshold = self.affinity_threshold
        if len(endpoints) <= 1 or threshold <= 0:
            return endpoints
        if self._rng.random() < self.exploration_probability:
            return endpoints
        match = cycle.read(self.match_key)
        if match is None or not match.total_blocks or not match.matches:
            return endpoints  # every score is 0, below any positive threshold
        total = match.total_blocks
        get = match.matches.get
        sticky = [e for e in endpoints if get(e.key, 0) / total >= threshold]
        if not sticky:
            return endpoints
        if self.max_ttft_penalty_ms > 0 and len(sticky) < len(endpoints) and self.use_predictions:
            sticky_keys = {e.key for e in sticky}
            infos = cycle.read(LATENCY_PREDICTIONS_KEY) or {}
            inf = float("inf")
            best_sticky_ms = min((infos[e.key].ttft for e in sticky if e.key in infos), default=inf)
            best_other_ms = min(
                (infos[e.key].ttft for e in endpoints if e.key not in sticky_keys and e.key in infos), default=inf
            )
            if best_other_ms < inf and best_sticky_ms - best_other_ms > self.max_ttft_penalty_ms:
                return endpoints
        elif self.max_ttft_penalty_ms > 0 and len(sticky) < len(endpoints):
            # TTFT in ms = tokens / throughput x 1000: compare the lightest sticky and non-sticky endpoints
            sticky_keys = {e.key for e in sticky}
            best_sticky = min(e.load.tokens for e in sticky)
            best_other = min(e.load.tokens for e in endpoints if e.key not in sticky_keys)
            if (best_sticky - best_other) / self.peak_prefill_throughput * 1000.0 > self.max_ttft_penalty_ms:
                return endpoints
        return sticky


def factory(name: str, params: Params, handle: Handle) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(
        name,
        params.affinity_threshold,
        params.exploration_probability,
        max_ttft_penalty_ms=params.max_ttft_penalty_ms,
        peak_prefill_throughput=params.peak_prefill_throughput,
        rng=handle.rng(name),
        ttft_source=params.ttft_source,
        match_key=prefix_match_key(params.prefix_match_info_producer_name),
    )
