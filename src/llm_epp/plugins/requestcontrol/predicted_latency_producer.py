"""predicted-latency-producer

Scheduling intent:
    Predict, for every candidate endpoint, the request's time to first token (TTFT) and time per output
    token (TPOT), compare them with the request's SLOs and publish the result, so `latency-scorer`,
    `slo-headroom-tier-filter` and `latency-slo-admitter` can steer requests to endpoints that meet their
    SLOs. The predictor is trained online from the latencies of the requests this EPP routes (a ridge
    regression refitted off the event loop, on the request path's clock; see docs/latency-prediction.md).
    Until it has seen any response nothing is published and the consumers behave as without predictions.

Inputs consumed:
    Endpoint metrics (KV-cache utilization, waiting and running requests), the EPP's in-flight load per
    endpoint (`Endpoint.load`), the uncached prompt tokens it has dispatched to each endpoint whose prefill it
    has not yet seen finish (prefill tokens in flight: until a non-streamed response's headers, a streamed
    response's first body bytes, or, when the EPP does not read response bodies, its end), the prefix-cache
    match (`prefix-cache-match-info`,
    so the default `approx-prefix-cache-producer` is added when none is configured), the prompt length
    (request body bytes / 4, or the token ids), and the SLO headers `x-llm-d-slo-ttft-ms` / `x-llm-d-slo-tpot-ms`
    (milliseconds; the older `x-slo-ttft-ms` / `x-slo-tpot-ms` are read when the new ones are absent).
    Training: TTFT = dispatch to the first response body bytes (`ResponseInfo.first_body_at`, timed by
    the director), else to the response headers (for a non-streamed response either is
    the whole response, as in the reference); TPOT = (end - first body bytes or headers) / (completion
    tokens - 1) of streamed responses that report usage. Only 2xx responses train.

Configuration:
    streamingMode (bool, default false): predict and check TPOT. When false TPOT is neither trained nor
        checked (its headroom is 0 and it is always valid), as in the reference.
    sloBufferFactor (float > 0, default 1): the TPOT SLO is multiplied by it before the check; an
        endpoint's running requests' tightest TPOT SLO also bounds it.
    predictInPrepareData (bool, default true): false trains the predictor but publishes no predictions.
    endpointRoleLabel (string, default ""): endpoints whose label of this name is `prefill` do not
        generate tokens, so their TPOT is not checked.
    The predictor itself reads the reference's LATENCY_* environment variables (refit interval, minimum
    samples, window, objective and quantile; see docs/latency-prediction.md); variables with no in-process
    counterpart are logged at startup as having no effect.
    contextTTL (duration, default 5m): a request that ends later than this after dispatch does not train
        the predictor (the reference drops its context then).
    samplingMean (float > 0, default 1000) and maxDecodeTokenSamplesForPrediction (int >= 0, default 0):
        the reference samples individual decode tokens for TPOT training; llm-epp trains on each
        request's average TPOT, so only the defaults are accepted (other values are "not supported yet").
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated

from pydantic import BeforeValidator, Field, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.durations import parse_go_duration
from llm_epp.framework.latency import LatencyRecorder
from llm_epp.framework.requestcontrol import ResponseInfo
from llm_epp.latency import Features, LatencyPredictor, Prediction, PredictorSettings
from llm_epp.latency.predictor import settings_from_env
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY, prompt_bytes

TYPE = "predicted-latency-producer"
log = logging.getLogger(__name__)

TTFT_SLO_HEADER = "x-llm-d-slo-ttft-ms"
TPOT_SLO_HEADER = "x-llm-d-slo-tpot-ms"
OLD_TTFT_SLO_HEADER = "x-slo-ttft-ms"
OLD_TPOT_SLO_HEADER = "x-slo-tpot-ms"
PREFILL_ROLE = "prefill"
_PROMPT_LIMIT = 1 << 20


@dataclass(frozen=True, slots=True)
class LatencyPredictionInfo:
    """One endpoint's predictions for one request, against the request's SLOs (milliseconds)."""

    ttft: float
    tpot: float
    ttft_valid: bool
    tpot_valid: bool
    ttft_headroom: float  # SLO - predicted; negative = predicted to miss
    tpot_headroom: float
    dispatched: int = 0  # requests this EPP has in flight on the endpoint

    @property
    def valid(self) -> bool:
        return self.ttft_valid and self.tpot_valid


LATENCY_PREDICTIONS_KEY: StateKey[Mapping[EndpointKey, LatencyPredictionInfo]] = StateKey("latency-prediction-info")


def slo_ms(headers: Mapping[str, str], name: str, old_name: str) -> float:
    """The SLO in ms from the header `name` (else `old_name`); 0 when absent, unparsable or not > 0."""
    raw = headers.get(name)
    if raw is None:
        raw = headers.get(old_name)
    if raw is None:
        return 0.0
    try:
        value = float(raw)
    except ValueError:
        return 0.0
    return value if math.isfinite(value) and value > 0 else 0.0


def _duration_seconds(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 5m, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return parse_go_duration(value)
    return value


Seconds = Annotated[float, BeforeValidator(_duration_seconds)]


class Params(PluginParams):
    sampling_mean: float = Field(default=1000.0, alias="samplingMean")
    max_decode_token_samples_for_prediction: int = Field(default=0, alias="maxDecodeTokenSamplesForPrediction")
    slo_buffer_factor: float = Field(default=1.0, gt=0.0, allow_inf_nan=False, alias="sloBufferFactor")
    context_ttl: Seconds = Field(default=300.0, gt=0.0, allow_inf_nan=False, alias="contextTTL")
    streaming_mode: bool = Field(default=False, alias="streamingMode")
    endpoint_role_label: str = Field(default="", alias="endpointRoleLabel")
    predict_in_prepare_data: bool = Field(default=True, alias="predictInPrepareData")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if not self.sampling_mean > 0:
            raise ValueError(f"samplingMean must be > 0, got {self.sampling_mean}")
        if self.max_decode_token_samples_for_prediction < 0:
            raise ValueError(
                f"maxDecodeTokenSamplesForPrediction must be >= 0, got {self.max_decode_token_samples_for_prediction}"
            )
        if self.sampling_mean != 1000.0:
            raise ValueError(
                "samplingMean other than 1000 is not supported yet: llm-epp trains TPOT on each request's "
                "average time per output token, not on sampled decode tokens; leave samplingMean out"
            )
        if self.max_decode_token_samples_for_prediction != 0:
            raise ValueError(
                "maxDecodeTokenSamplesForPrediction other than 0 is not supported yet: llm-epp trains TPOT on "
                "each request's average time per output token; leave it out"
            )
        return self


@dataclass(slots=True)
class _RequestContext:
    ttft_slo: float
    tpot_slo: float
    features: dict[EndpointKey, Features]
    predictions: dict[EndpointKey, Prediction] = field(default_factory=dict)
    infos: dict[EndpointKey, LatencyPredictionInfo] = field(default_factory=dict)
    target: EndpointKey | None = None
    dispatched_at: float = 0.0
    headers_at: float | None = None
    status: int = 0
    ttft_seen: bool = False
    prefill_reserved: int = 0  # uncached prompt tokens counted in the target's prefill tokens in flight


class PredictedLatencyProducer:
    produces = frozenset({LATENCY_PREDICTIONS_KEY.name})
    consumes = frozenset({PREFIX_MATCH_KEY.name})

    def __init__(
        self,
        name: str = TYPE,
        params: Params | None = None,
        handle: Handle | None = None,
        predictor: LatencyPredictor | None = None,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.metrics_owner = self._typed_name  # the plugin named in the llm_d_epp_* metric labels
        self.params = params or Params()
        # per instance, so two producers (or a producer and predicted-latency-scorer) keep apart
        self._context_key: StateKey[_RequestContext] = StateKey(f"{TYPE}.request/{name}")
        self._clock = handle.now if handle is not None else time.monotonic
        self.predictor = predictor or LatencyPredictor(PredictorSettings(), clock=self._clock)
        recorder = handle.recorder if handle is not None else None
        self._metrics: LatencyRecorder | None = recorder if isinstance(recorder, LatencyRecorder) else None
        # endpoint -> request id -> TPOT SLO (ms) of the requests in flight there that carry one
        self._running_tpot_slos: dict[EndpointKey, dict[str, float]] = {}
        # endpoint -> uncached prompt tokens dispatched there whose first token has not come back yet
        self._prefill_tokens: dict[EndpointKey, int] = {}

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    # --- features and predictions ---------------------------------------------------------------
    def features(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> dict[EndpointKey, Features]:
        if request.body.token_ids:
            input_tokens = len(request.body.token_ids)
        elif request.size_bytes > 0:
            input_tokens = max(request.size_bytes // 4, 1)
        else:
            input_tokens = max(len(prompt_bytes(request.body, _PROMPT_LIMIT)) // 4, 1)
        match = cycle.read(PREFIX_MATCH_KEY)
        out = {}
        for ep in endpoints:
            m = ep.metrics
            out[ep.key] = Features(
                kv_cache=m.kv_cache_usage,
                input_tokens=input_tokens,
                waiting=m.waiting_queue_size,
                running=m.running_requests,
                prefix_score=match.score(ep.key) if match is not None else 0.0,
                tokens_in_flight=ep.load.tokens,
                dispatched=ep.load.requests,
                prefill_tokens=self._prefill_tokens.get(ep.key, 0),
            )
        return out

    def _tpot_checked(self, endpoint: Endpoint) -> bool:
        label = self.params.endpoint_role_label
        if not self.params.streaming_mode:
            return False
        return not (label and endpoint.metadata.labels.get(label) == PREFILL_ROLE)

    def _info(self, ctx: _RequestContext, endpoint: Endpoint, pred: Prediction) -> LatencyPredictionInfo:
        ttft_headroom = ctx.ttft_slo - pred.ttft_ms
        ttft_ok = pred.ttft_ms < ctx.ttft_slo
        tpot_ok, tpot_headroom = True, 0.0
        if self._tpot_checked(endpoint):
            buffered = ctx.tpot_slo * self.params.slo_buffer_factor
            running = self._running_tpot_slos.get(endpoint.key)
            if running:
                buffered = min(buffered, min(running.values()) * self.params.slo_buffer_factor)
            tpot_ok = pred.tpot_ms < buffered
            tpot_headroom = buffered - pred.tpot_ms
        return LatencyPredictionInfo(
            ttft=pred.ttft_ms,
            tpot=pred.tpot_ms,
            ttft_valid=ttft_ok,
            tpot_valid=tpot_ok,
            ttft_headroom=ttft_headroom,
            tpot_headroom=tpot_headroom,
            dispatched=endpoint.load.requests,
        )

    # --- PrepareData ---------------------------------------------------------------------------------
    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        headers = request.headers
        ctx = _RequestContext(
            ttft_slo=slo_ms(headers, TTFT_SLO_HEADER, OLD_TTFT_SLO_HEADER),
            tpot_slo=slo_ms(headers, TPOT_SLO_HEADER, OLD_TPOT_SLO_HEADER),
            features=self.features(cycle, request, endpoints),
        )
        cycle.write(self._context_key, ctx)
        if not self.params.predict_in_prepare_data:
            return
        t0 = time.perf_counter()
        infos: dict[EndpointKey, LatencyPredictionInfo] = {}
        for ep in endpoints:
            pred = self.predictor.predict(ctx.features[ep.key])
            if pred is None:
                return  # nothing observed yet: publish nothing, consumers fall back
            ctx.predictions[ep.key] = pred
            infos[ep.key] = self._info(ctx, ep, pred)
        ctx.infos = infos
        if self._metrics is not None and endpoints:
            spent = time.perf_counter() - t0
            self._metrics.latency_observed(
                request.incoming_model, request.target_model, "ttft_prediction_duration", spent, self.metrics_owner
            )
            if self.params.streaming_mode:
                self._metrics.latency_observed(
                    request.incoming_model, request.target_model, "tpot_prediction_duration", spent, self.metrics_owner
                )
        cycle.write(LATENCY_PREDICTIONS_KEY, infos)

    # --- PreRequest ------------------------------------------------------------------------------------
    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        ctx = cycle.read(self._context_key)
        primary = result.primary
        if ctx is None or primary is None or not primary.target_endpoints:
            return
        target = primary.target_endpoints[0].key
        ctx.target = target
        ctx.dispatched_at = self._clock()
        if ctx.tpot_slo > 0:
            self._running_tpot_slos.setdefault(target, {})[request.request_id] = ctx.tpot_slo
        features = ctx.features.get(target)
        if features is not None:
            ctx.prefill_reserved = max(round(features.uncached_tokens), 0)
            self._prefill_tokens[target] = self._prefill_tokens.get(target, 0) + ctx.prefill_reserved
        pred = ctx.predictions.get(target)
        if pred is not None and self._metrics is not None:
            self._metrics.latency_observed(
                request.incoming_model, request.target_model, "predicted_ttft", pred.ttft_ms / 1000, self.metrics_owner
            )
            if self.params.streaming_mode:
                self._metrics.latency_observed(
                    request.incoming_model,
                    request.target_model,
                    "predicted_tpot",
                    pred.tpot_ms / 1000,
                    self.metrics_owner,
                )

    # --- ResponseReceived ------------------------------------------------------------------------------
    def response_received(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        ctx = cycle.read(self._context_key)
        if ctx is None or ctx.target is None or ctx.headers_at is not None:
            return
        ctx.headers_at = self._clock()
        ctx.status = response.status
        if not response.streaming:  # the headers come with the whole answer: that is the TTFT
            self._release_prefill(ctx, ctx.target)
            self._observe_ttft(ctx, request, ctx.target, ctx.headers_at)
        # streamed: the headers may precede the prefill (vLLM sends them on admission); its end is the first
        # body bytes (ResponseFirstBody), or the completion when the EPP does not read response bodies

    # --- ResponseFirstBody -----------------------------------------------------------------------------
    def response_first_body(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        ctx = cycle.read(self._context_key)
        if ctx is not None and ctx.target is not None:
            self._release_prefill(ctx, ctx.target)  # the first token is out: the prefill is done

    def _observe_ttft(self, ctx: _RequestContext, request: InferenceRequest, target: EndpointKey, at: float) -> None:
        if ctx.ttft_seen or not 200 <= ctx.status < 300:
            return
        ctx.ttft_seen = True
        ttft_ms = (at - ctx.dispatched_at) * 1000.0
        if target in ctx.features and at - ctx.dispatched_at <= self.params.context_ttl:
            self.predictor.observe_ttft(ctx.features[target], ttft_ms)
        if self._metrics is not None:
            self._metrics.latency_observed(
                request.incoming_model, request.target_model, "ttft", ttft_ms / 1000, self.metrics_owner
            )
            if ctx.ttft_slo > 0:
                violated = ttft_ms > ctx.ttft_slo
                self._metrics.latency_slo_checked(
                    request.incoming_model, request.target_model, "ttft", violated, self.metrics_owner
                )

    # --- ResponseComplete ------------------------------------------------------------------------------
    def response_complete(
        self, cycle: CycleState, request: InferenceRequest, response: ResponseInfo, endpoint: Endpoint | None
    ) -> None:
        ctx = cycle.read(self._context_key)
        if ctx is None or ctx.target is None:
            return
        self._release_prefill(ctx, ctx.target)
        running = self._running_tpot_slos.get(ctx.target)
        if running is not None:
            running.pop(request.request_id, None)
            if not running:
                del self._running_tpot_slos[ctx.target]
        target, ctx.target = ctx.target, None  # release once
        now = self._clock()
        first = response.first_body_at if response.first_body_at is not None else ctx.headers_at
        if ctx.headers_at is not None and first is not None and response.streaming:
            self._observe_ttft(ctx, request, target, first)
        if (
            not self.params.streaming_mode
            or first is None
            or not response.complete
            or not response.streaming
            or not 200 <= response.status < 300
            or response.usage is None
            or response.usage.completion_tokens < 2
            or now - ctx.dispatched_at > self.params.context_ttl
        ):
            return
        tpot_ms = (now - first) * 1000.0 / (response.usage.completion_tokens - 1)
        if target in ctx.features:
            self.predictor.observe_tpot(ctx.features[target], tpot_ms)
        if self._metrics is not None:
            self._metrics.latency_observed(
                request.incoming_model, request.target_model, "tpot", tpot_ms / 1000, self.metrics_owner
            )
            if ctx.tpot_slo > 0:
                violated = tpot_ms > ctx.tpot_slo
                self._metrics.latency_slo_checked(
                    request.incoming_model, request.target_model, "tpot", violated, self.metrics_owner
                )

    def _release_prefill(self, ctx: _RequestContext, target: EndpointKey) -> None:
        if ctx.prefill_reserved:
            left = self._prefill_tokens.get(target, 0) - ctx.prefill_reserved
            if left > 0:
                self._prefill_tokens[target] = left
            else:
                self._prefill_tokens.pop(target, None)
            ctx.prefill_reserved = 0

    def prefill_tokens(self, key: EndpointKey) -> int:
        """Uncached prompt tokens dispatched to `key` whose first token has not come back yet."""
        return self._prefill_tokens.get(key, 0)

    def predictions(self, cycle: CycleState) -> Mapping[EndpointKey, LatencyPredictionInfo]:
        """This producer's predictions for the request of `cycle` (empty when it published none)."""
        ctx = cycle.read(self._context_key)
        return ctx.infos if ctx is not None else {}

    def running_tpot_slos(self, key: EndpointKey) -> Mapping[str, float]:
        return dict(self._running_tpot_slos.get(key, {}))

    def close(self) -> None:
        self.predictor.close()


def predictor_from_env(plugin: str, handle: Handle) -> LatencyPredictor:
    """A predictor configured from the reference's LATENCY_* environment variables (see
    `llm_epp.latency.predictor.settings_from_env`), refitting on the handle's clock (virtual in the
    simulator); a malformed value is a configuration error."""
    settings, notes = settings_from_env(os.environ, PredictorSettings())
    for note in notes:
        log.warning("latency_predictor_setting_ignored plugin=%s %s", plugin, note)
    return LatencyPredictor(settings, clock=handle.now)


def factory(name: str, params: Params, handle: Handle) -> PredictedLatencyProducer:
    return PredictedLatencyProducer(name, params, handle, predictor_from_env(name, handle))
