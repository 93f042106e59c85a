"""active-request-scorer

Scheduling intent:
    llm-d's in-flight request scorer: prefer endpoints with fewer requests this EPP has sent and not yet
    seen finish. Endpoints at or below `idleThreshold` in-flight requests score 1.0; busier ones score
    (maxCount - count) / maxCount * maxBusyScore, where maxCount is the busiest candidate's count, so the
    busiest scores 0 and `maxBusyScore` < 1 opens a gap that strongly prefers idle endpoints.

Inputs consumed:
    Endpoint.load.requests: the EPP's own in-flight request count. llm-d v0.5 kept a private map
    (+1 in PreRequest, -1 at the end of the response, entries expiring after `requestTimeout`); llm-d HEAD
    reads the `inflight-load-producer` counts. Here the core director keeps that count for every endpoint
    (reserved at pick, released exactly once at completion), so this plugin only reads it and needs no
    hooks and no expiry.

Configuration:
    idleThreshold (int, default 0): counts at or below this score 1.0. Negative values fall back to 0.
    maxBusyScore (float in [0, 1], default 1.0): the score ceiling for busy endpoints. Values outside
        [0, 1] fall back to 1.0. Both fallbacks mirror llm-d and log a warning.
    requestTimeout (duration string, e.g. "2m"): accepted for compatibility and ignored; the core's
        accounting is released on completion, so nothing can leak.
    inFlightLoadProducerName (string, default ""): the `inflight-load-producer` whose counts to read. It must
        name a declared `inflight-load-producer` (or be `inflight-load-producer`); other names are refused
        when the configuration loads. llm-epp keeps one in-flight account per endpoint (in the core), which
        every inflight-load-producer stands for.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

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

TYPE = "active-request-scorer"

log = logging.getLogger(__name__)


class Params(PluginParams):
    idle_threshold: int = Field(default=0, alias="idleThreshold")
    max_busy_score: float = Field(default=1.0, alias="maxBusyScore")
    request_timeout: str | None = Field(default=None, alias="requestTimeout")
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")


class ActiveRequestScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE, idle_threshold: int = 0, max_busy_score: float = 1.0) -> None:
        self._typed_name = TypedName(TYPE, name)
        if idle_threshold < 0:
            log.warning(
                "active_request_idle_threshold_invalid plugin=%s idleThreshold=%d; using 0", name, idle_threshold
            )
            idle_threshold = 0
        if not (math.isfinite(max_busy_score) and 0.0 <= max_busy_score <= 1.0):
            log.warning(
                "active_request_max_busy_score_invalid plugin=%s maxBusyScore=%s; using 1.0", name, max_busy_score
            )
            max_busy_score = 1.0
        self.idle_threshold = idle_threshold
        self.max_busy_score = max_busy_score

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        if not endpoints:
            return {}
        counts = [e.load.requests for e in endpoints]
        max_count = max(counts)
        idle, gap = self.idle_threshold, self.max_busy_score
        out: dict[EndpointKey, float] = {}
        for e, count in zip(endpoints, counts, strict=True):
            # count > idle >= 0 implies max_count >= count > 0: no division by zero.
            out[e.key] = 1.0 if count <= idle else (max_count - count) / max_count * gap
        return out


def factory(name: str, params: Params, handle: Handle) -> ActiveRequestScorer:
    return ActiveRequestScorer(name, params.idle_threshold, params.max_busy_score)
