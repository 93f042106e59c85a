"""predicted-latency-scorer

Scheduling intent:
    The single-plugin form of SLO-aware routing: it predicts each candidate's TTFT and TPOT (as
    `predicted-latency-producer` does, on the same online predictor, trained from the requests it routes),
    then picks one endpoint and scores it 1 (all others 0). Endpoints predicted to meet both SLOs (headroom
    >= 0) are chosen from with probability 1 - `epsilonExploreNeg`, the others otherwise (or when no endpoint
    meets them). Among the positive endpoints the choice is weighted by blended headroom (TTFT and TPOT
    headroom normalized within the set): `least` favours the tightest fit, packing work and keeping roomy
    endpoints for strict requests, `most` the roomiest. Among the negative endpoints idle ones (nothing in
    flight from this EPP) come first, and the choice is weighted by the blended deficit, smallest first.
    A prefix-affinity gate first narrows the set to endpoints whose prefix-cache match is at least
    `affinityGateTauGlobal` (then, within a tier, `affinityGateTau`), unless that would cost more than
    `affinityMaxTTFTPenaltyMs` of predicted TTFT or an `epsilonExploreSticky` draw skips it. Without
    predictions (nothing observed yet) the choice is weighted by a composite of free KV cache, relative
    queue length and prefix-cache match. Use it with a weight of its own in a profile, typically alone or
    beside a prefix-cache scorer; `latency-scorer` with the producer is the composable equivalent.

Inputs consumed:
    Endpoint metrics (KV-cache utilization, waiting and running requests), the EPP's in-flight load per
    endpoint, `prefix-cache-match-info` (so the default `approx-prefix-cache-producer` is added when none is
    configured), the prompt length, and the SLO headers `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`
    (or the older `x-slo-ttft-ms` / `x-slo-tpot-ms`). It trains on the responses as the producer does
    (TTFT from the first response body bytes, TPOT from usage and duration) and publishes
    `latency-prediction-info`, so `latency-slo-admitter` and `slo-headroom-tier-filter` can use it too.

Configuration:
    streamingMode (bool, default true): predict and check TPOT; false checks TTFT only (TPOT weights 0).
    sloBufferFactor (float > 0, default 1): multiplies the TPOT SLO before the check.
    headroomTTFTWeight / headroomTPOTWeight (float >= 0, default 0.8 / 0.2): blend of the positive tier.
    negHeadroomTTFTWeight / negHeadroomTPOTWeight (float >= 0, default 0.8 / 0.2): blend of the deficits.
    headroomSelectionStrategy (`least` | `most` | `composite-least` | `composite-most` | `composite-only`,
        default `least`): the composite strategies weight by the composite score instead of headroom
        (`composite-only` over all candidates, ignoring the tiers).
    compositeKVWeight, compositeQueueWeight, compositePrefixWeight (float >= 0, default 1 each).
    epsilonExploreNeg (default 0.01) and epsilonExploreSticky (default 0.01), in [0, 1].
    affinityGateTau (default 0.8) and affinityGateTauGlobal (default 0.99), in [0, 1]; 0 disables a gate.
    affinityMaxTTFTPenaltyMs (float >= 0, default 5000; 0 = no limit).
    selectionMode (`linear` | `max`, default `linear`): weighted random draw, or the largest weight.
    contextTTL (duration, default 5m), endpointRoleLabel (string, default ""): as for the producer, and the
        predictor reads the same LATENCY_* environment variables.
    samplingMean (default 1000) and maxSampledTokens (default 0): only the defaults are accepted, as for the
        producer (TPOT is trained on each request's average, not on sampled decode tokens).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    ScorerCategory,
    TypedName,
)
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.latency import LatencyPredictor
from llm_epp.plugins.requestcontrol import predicted_latency_producer as producer
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from llm_epp.plugins.requestcontrol.predicted_latency_producer import LATENCY_PREDICTIONS_KEY, Seconds

TYPE = "predicted-latency-scorer"
_W_MAX = 100
_MIN_WEIGHT = 1
_NEG_RANGE = 80
_EPS = 1e-9

Strategy = Literal["least", "most", "composite-least", "composite-most", "composite-only"]


class Params(PluginParams):
    sampling_mean: float = Field(default=1000.0, alias="samplingMean")
    max_sampled_tokens: int = Field(default=0, alias="maxSampledTokens")
    slo_buffer_factor: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, alias="sloBufferFactor")
    neg_headroom_ttft_weight: float = Field(default=0.8, ge=0.0, allow_inf_nan=False, alias="negHeadroomTTFTWeight")
    neg_headroom_tpot_weight: float = Field(default=0.2, ge=0.0, allow_inf_nan=False, alias="negHeadroomTPOTWeight")
    headroom_ttft_weight: float = Field(default=0.8, ge=0.0, allow_inf_nan=False, alias="headroomTTFTWeight")
    headroom_tpot_weight: float = Field(default=0.2, ge=0.0, allow_inf_nan=False, alias="headroomTPOTWeight")
    headroom_selection_strategy: Strategy = Field(default="least", alias="headroomSelectionStrategy")
    composite_kv_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, alias="compositeKVWeight")
    composite_queue_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, alias="compositeQueueWeight")
    composite_prefix_weight: float = Field(default=1.0, ge=0.0, allow_inf_nan=False, alias="compositePrefixWeight")
    epsilon_explore_sticky: float = Field(default=0.01, ge=0.0, le=1.0, alias="epsilonExploreSticky")
    epsilon_explore_neg: float = Field(default=0.01, ge=0.0, le=1.0, alias="epsilonExploreNeg")
    affinity_gate_tau: float = Field(default=0.8, ge=0.0, le=1.0, alias="affinityGateTau")
    affinity_gate_tau_global: float = Field(default=0.99, ge=0.0, le=1.0, alias="affinityGateTauGlobal")
    affinity_max_ttft_penalty_ms: float = Field(
        default=5000.0, ge=0.0, allow_inf_nan=False, alias="affinityMaxTTFTPenaltyMs"
    )
    context_ttl: Seconds = Field(default=300.0, gt=0.0, allow_inf_nan=False, alias="contextTTL")
    selection_mode: Literal["linear", "max"] = Field(default="linear", alias="selectionMode")
    streaming_mode: bool = Field(default=True, alias="streamingMode")
    endpoint_role_label: str = Field(default="", alias="endpointRoleLabel")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if not self.sampling_mean > 0:
            raise ValueError(f"samplingMean must be > 0, got {self.sampling_mean}")
        if self.max_sampled_tokens < 0:
            raise ValueError(f"maxSampledTokens must be >= 0, got {self.max_sampled_tokens}")
        if self.sampling_mean != 1000.0:
            raise ValueError(
                "samplingMean other than 1000 is not supported yet: llm-epp trains TPOT on each request's "
                "average time per output token, not on sampled decode tokens; leave samplingMean out"
            )
        if self.max_sampled_tokens != 0:
            raise ValueError(
                "maxSampledTokens other than 0 is not supported yet: llm-epp trains TPOT on each request's "
                "average time per output token; leave it out"
            )
        return self

    def producer_params(self) -> producer.Params:
        return producer.Params.model_validate(
            {
                "sloBufferFactor": self.slo_buffer_factor,
                "contextTTL": self.context_ttl,
                "streamingMode": self.streaming_mode,
                "endpointRoleLabel": self.endpoint_role_label,
            }
        )


@dataclass(frozen=True, slots=True)
class _Candidate:
    endpoint: Endpoint
    ttft: float  # predicted, ms (0 without predictions)
    ttft_headroom: float
    tpot_headroom: float
    prefix: float  # prefix-cache match, 0..1
    dispatched: int  # requests this EPP has in flight there


def _normalized(a: float, b: float) -> tuple[float, float]:
    total = a + b
    if total <= 0:
        return 1.0, 0.0
    return a / total, b / total


class PredictedLatencyScorer:
    category = ScorerCategory.BALANCE
    produces = frozenset({LATENCY_PREDICTIONS_KEY.name})
    consumes = frozenset({PREFIX_MATCH_KEY.name})

    def __init__(
        self,
        name: str = TYPE,
        params: Params | None = None,
        handle: Handle | None = None,
        predictor: LatencyPredictor | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params or Params()
        self.producer = producer.PredictedLatencyProducer(name, self.params.producer_params(), handle, predictor)
        self.producer.metrics_owner = self._typed_name
        self.predictor = self.producer.predictor
        self._rng = rng or (handle.rng(name) if handle is not None else random.Random())

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    # --- request control: predictions and training, as the producer ---------------------------------
    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        await self.producer.prepare_data(cycle, request, endpoints)

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        self.producer.pre_request(cycle, request, result)

    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.producer.response_received(cycle, request, response, endpoint)

    def response_first_body(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.producer.response_first_body(cycle, request, response, endpoint)

    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        self.producer.response_complete(cycle, request, response, endpoint)

    def close(self) -> None:
        self.producer.close()

    # --- scoring ---------------------------------------------------------------------------------------
    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        scores = dict.fromkeys((ep.key for ep in endpoints), 0.0)
        if not endpoints:
            return scores
        infos = self.producer.predictions(cycle)
        match = cycle.read(PREFIX_MATCH_KEY)

        def prefix(ep: Endpoint) -> float:
            value = match.score(ep.key) if match is not None else 0.0
            return value if value == value else 0.0  # NaN (no blocks) counts as no match

        if not all(ep.key in infos for ep in endpoints):
            cands = [_Candidate(ep, 0.0, 0.0, 0.0, prefix(ep), ep.load.requests) for ep in endpoints]
            chosen = self._composite(cands, invert=False)
        else:
            cands = []
            for ep in endpoints:
                info = infos[ep.key]
                cands.append(
                    _Candidate(ep, info.ttft, info.ttft_headroom, info.tpot_headroom, prefix(ep), info.dispatched)
                )
            chosen = self._select(cands)
        if chosen is not None:
            scores[chosen.key] = 1.0
        return scores

    def _select(self, cands: list[_Candidate]) -> Endpoint | None:
        p = self.params
        cands, _ = self._affinity_gate(cands, p.affinity_gate_tau_global)
        if p.headroom_selection_strategy == "composite-only":
            return self._composite(cands, invert=False)
        positive = [c for c in cands if c.ttft_headroom >= 0 and c.tpot_headroom >= 0]
        negative = [c for c in cands if not (c.ttft_headroom >= 0 and c.tpot_headroom >= 0)]
        if positive and negative:
            if self._rng.random() < p.epsilon_explore_neg:
                return self._from_negative(negative)
            return self._from_positive(positive)
        if positive:
            return self._from_positive(positive)
        return self._from_negative(negative)

    def _affinity_gate(self, cands: list[_Candidate], tau: float) -> tuple[list[_Candidate], bool]:
        """Keeps the endpoints with a prefix match >= tau, unless none has one, an exploration draw says
        otherwise, or the best of them is predicted slower than the best overall by more than the limit."""
        if tau <= 0:
            return cands, False
        sticky = [c for c in cands if c.prefix >= tau]
        if not sticky:
            return cands, False
        if self._rng.random() < self.params.epsilon_explore_sticky:
            return cands, False
        limit = self.params.affinity_max_ttft_penalty_ms
        if limit > 0:
            best_all = min((c.ttft for c in cands if c.ttft > 0), default=None)
            best_sticky = min((c.ttft for c in sticky if c.ttft > 0), default=None)
            if best_all is not None and best_sticky is not None and best_sticky - best_all > limit:
                return cands, False
        return sticky, True

    def _from_positive(self, cands: list[_Candidate]) -> Endpoint | None:
        if len(cands) == 1:
            return cands[0].endpoint
        cands, sticky = self._affinity_gate(cands, self.params.affinity_gate_tau)
        if sticky and len(cands) == 1:
            return cands[0].endpoint
        strategy = self.params.headroom_selection_strategy
        if strategy in ("composite-most", "composite-least"):
            return self._composite(cands, invert=strategy == "composite-least")
        alpha, beta = self._blend(self.params.headroom_ttft_weight, self.params.headroom_tpot_weight)
        ttft_lo, ttft_hi = min(c.ttft_headroom for c in cands), max(c.ttft_headroom for c in cands)
        tpot_lo, tpot_hi = min(c.tpot_headroom for c in cands), max(c.tpot_headroom for c in cands)
        span = _W_MAX - _MIN_WEIGHT
        weights = []
        for c in cands:
            n_ttft = (c.ttft_headroom - ttft_lo) / (ttft_hi - ttft_lo + _EPS) if ttft_hi - ttft_lo > _EPS else 0.5
            n_tpot = (c.tpot_headroom - tpot_lo) / (tpot_hi - tpot_lo + _EPS) if tpot_hi - tpot_lo > _EPS else 0.5
            combined = alpha * n_ttft + beta * n_tpot
            share = combined if strategy == "most" else 1.0 - combined
            weights.append(int(share * span) + _MIN_WEIGHT + 1)
        return self._draw(cands, weights)

    def _from_negative(self, cands: list[_Candidate]) -> Endpoint | None:
        if len(cands) == 1:
            return cands[0].endpoint
        idle = [c for c in cands if c.dispatched == 0]
        cands = idle or cands
        if len(cands) == 1:
            return cands[0].endpoint
        cands, sticky = self._affinity_gate(cands, self.params.affinity_gate_tau)
        if sticky and len(cands) == 1:
            return cands[0].endpoint
        strategy = self.params.headroom_selection_strategy
        if strategy in ("composite-most", "composite-least"):
            return self._composite(cands, invert=strategy == "composite-least")
        alpha, beta = self._blend(self.params.neg_headroom_ttft_weight, self.params.neg_headroom_tpot_weight)
        # each kind of miss is weighted within its own group; the groups share one draw
        groups: tuple[list[_Candidate], list[_Candidate], list[_Candidate]] = ([], [], [])
        ordered: list[_Candidate] = []
        weights: list[int] = []
        for c in cands:
            if c.ttft_headroom < 0 and c.tpot_headroom < 0:
                groups[0].append(c)
            elif c.ttft_headroom < 0:
                groups[1].append(c)
            elif c.tpot_headroom < 0:
                groups[2].append(c)
            else:
                ordered.append(c)
                weights.append(_MIN_WEIGHT)
        for group in groups:
            if not group:
                continue
            ttft_def = [max(-c.ttft_headroom, 0.0) for c in group]
            tpot_def = [max(-c.tpot_headroom, 0.0) for c in group]
            ttft_lo, ttft_range = min(ttft_def), max(ttft_def) - min(ttft_def)
            tpot_lo, tpot_range = min(tpot_def), max(tpot_def) - min(tpot_def)
            for c, d1, d2 in zip(group, ttft_def, tpot_def, strict=True):
                n_ttft = (d1 - ttft_lo) / (ttft_range + _EPS) if ttft_range > _EPS else 0.0
                n_tpot = (d2 - tpot_lo) / (tpot_range + _EPS) if tpot_range > _EPS else 0.0
                badness = alpha * n_ttft + beta * n_tpot
                ordered.append(c)
                weights.append(int((1.0 - badness) * _NEG_RANGE) + _MIN_WEIGHT + 1)
        return self._draw(ordered, weights)

    def _blend(self, ttft_weight: float, tpot_weight: float) -> tuple[float, float]:
        if not self.params.streaming_mode:
            return 1.0, 0.0
        return _normalized(ttft_weight, tpot_weight)

    def _composite(self, cands: list[_Candidate], invert: bool) -> Endpoint | None:
        p = self.params
        wkv, wq, wpref = p.composite_kv_weight, p.composite_queue_weight, p.composite_prefix_weight
        total = wkv + wq + wpref
        if total <= 0:
            wkv, wq, wpref, total = 1.0, 0.0, 0.0, 1.0
        wkv, wq, wpref = wkv / total, wq / total, wpref / total
        queues = [c.endpoint.metrics.waiting_queue_size for c in cands]
        q_lo, q_hi = min(queues), max(queues)
        weights = []
        for c, q in zip(cands, queues, strict=True):
            rel_queue = (q_hi - q) / (q_hi - q_lo) if q_hi > q_lo else 1.0
            kv_free = 1.0 - c.endpoint.metrics.kv_cache_usage
            composite = wkv * kv_free + wq * rel_queue + wpref * c.prefix
            w = round(_MIN_WEIGHT + (_W_MAX - _MIN_WEIGHT) * composite)
            weights.append(_MIN_WEIGHT + _W_MAX - w if invert else w)
        return self._draw(cands, weights)

    def _draw(self, cands: Sequence[_Candidate], weights: Sequence[int]) -> Endpoint | None:
        if not cands:
            return None
        if self.params.selection_mode == "max":
            best = max(range(len(cands)), key=lambda i: (weights[i], -i))
            return cands[best].endpoint
        total = sum(max(w, 0) for w in weights)
        if total <= 0:
            return cands[0].endpoint
        pick = self._rng.randrange(total)
        for c, w in zip(cands, weights, strict=True):
            w = max(w, 0)
            if pick < w:
                return c.endpoint
            pick -= w
        return cands[0].endpoint


def factory(name: str, params: Params, handle: Handle) -> PredictedLatencyScorer:
    return PredictedLatencyScorer(name, params, handle, producer.predictor_from_env(name, handle))
