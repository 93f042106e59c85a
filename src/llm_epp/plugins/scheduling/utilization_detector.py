"""utilization-detector

Scheduling intent:
    Saturation from the model servers' own metrics, used twice. As the saturation detector it tells
    admission how full the candidates are, so sheddable requests (priority < 0) are refused with 429
    while the pool is saturated. As a filter it removes endpoints that are over their limits or whose
    metrics are stale, so requests are not piled onto full or unobservable servers.

Inputs consumed:
    Metrics.waiting_queue_size, Metrics.kv_cache_usage (fraction 0..1) and Metrics.update_time
    (monotonic seconds of the last scrape, 0 = never), compared with the plugin handle's clock.

Configuration:
    queueDepthThreshold (int > 0, default 5): the ideal waiting-queue length of one endpoint.
    kvCacheUtilThreshold (float in (0, 1], default 0.8): the ideal KV-cache usage of one endpoint.
    metricsStalenessThreshold (duration > 0, default "200ms"): metrics older than this are stale. A Go
        duration string ("200ms", "1.5s", "2m", "1h30m") or a number of seconds.
    headroom (float >= 0, default 0.0): the filter's burst allowance above the ideal thresholds (0.2 =
        20%); saturation always uses the ideal thresholds.

    saturation(endpoints) = mean over endpoints of max(queue / queueDepthThreshold,
        kv / kvCacheUtilThreshold); an endpoint with stale, missing or NaN metrics counts 1.0; no
        endpoints gives 1.0. Values >= 1.0 mean saturated.
    filter keeps endpoints with fresh metrics, queue < queueDepthThreshold * (1 + headroom) and
        kv < kvCacheUtilThreshold * (1 + headroom). If none pass it returns the input unchanged
        (fail-open), so the filter alone never fails a profile.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from typing import Annotated

from pydantic import BeforeValidator, Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, Metrics, PluginParams, TypedName
from llm_epp.framework.durations import parse_go_duration

TYPE = "utilization-detector"

log = logging.getLogger(__name__)


def _duration_seconds(value: object) -> object:
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 200ms, not a boolean")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return parse_go_duration(value)
    return value  # let pydantic report the type


Seconds = Annotated[float, BeforeValidator(_duration_seconds)]


class Params(PluginParams):
    queue_depth_threshold: int = Field(default=5, gt=0, alias="queueDepthThreshold")
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0, le=1.0, alias="kvCacheUtilThreshold")
    metrics_staleness_threshold: Seconds = Field(
        default=0.2, gt=0.0, allow_inf_nan=False, alias="metricsStalenessThreshold"
    )
    headroom: float = Field(default=0.0, ge=0.0, allow_inf_nan=False)


class UtilizationDetector:
    def __init__(
        self,
        name: str = TYPE,
        queue_depth_threshold: int = 5,
        kv_cache_util_threshold: float = 0.8,
        metrics_staleness_threshold: float = 0.2,
        headroom: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.queue_depth_threshold = queue_depth_threshold
        self.kv_cache_util_threshold = kv_cache_util_threshold
        self.metrics_staleness_threshold = metrics_staleness_threshold
        self.headroom = headroom
        self._clock = clock
        self._queue_limit = queue_depth_threshold * (1.0 + headroom)
        self._kv_limit = kv_cache_util_threshold * (1.0 + headroom)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def _fresh(self, m: Metrics, now: float) -> bool:
        return m.update_time > 0 and now - m.update_time <= self.metrics_staleness_threshold

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        if not endpoints:
            return 1.0
        now = self._clock()
        q_threshold, kv_threshold = float(self.queue_depth_threshold), self.kv_cache_util_threshold
        total = 0.0
        for e in endpoints:
            m = e.metrics
            kv = m.kv_cache_usage
            if not self._fresh(m, now) or math.isnan(kv):
                total += 1.0  # unobservable: treat as full
                continue
            total += max(m.waiting_queue_size / q_threshold, kv / kv_threshold)
        return total / len(endpoints)

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        now = self._clock()
        q_limit, kv_limit = self._queue_limit, self._kv_limit
        kept = [
            e
            for e in endpoints
            if self._fresh(e.metrics, now)
            and e.metrics.waiting_queue_size < q_limit
            and e.metrics.kv_cache_usage < kv_limit
        ]
        return kept if kept else endpoints


def factory(name: str, params: Params, handle: Handle) -> UtilizationDetector:
    if params.headroom > 1.0:
        log.warning(
            "utilization_detector_high_headroom plugin=%s headroom=%s: headroom is a fraction (0.2 = 20%%)",
            name,
            params.headroom,
        )
    return UtilizationDetector(
        name,
        params.queue_depth_threshold,
        params.kv_cache_util_threshold,
        params.metrics_staleness_threshold,
        params.headroom,
        clock=handle.now,
    )
