"""probabilistic-admitter

Scheduling intent:
    Shed sheddable traffic (priority < 0) gradually instead of all at once: the fuller the candidate
    endpoints, the likelier a sheddable request is refused with 429, so load tapers before the pool is
    saturated. Requests with priority >= 0 are always admitted.

Inputs consumed:
    Each candidate endpoint's scraped waiting-queue size and KV-cache utilization (an endpoint never
    scraped counts as saturated); the request's priority.

Configuration:
    queueDepthThreshold (int > 0, default 5): the queue length that counts as full.
    kvCacheUtilThreshold (float > 0, default 0.8): the KV-cache utilization that counts as full.
    power (float > 0, default 5.0), k (float > 0, default 300.0): the refusal probability is
    min(saturation ^ power x k, 1), where saturation is the mean over the candidates of
    max(queue / queueDepthThreshold, kv / kvCacheUtilThreshold).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EppError,
    ErrorCode,
    Handle,
    InferenceRequest,
    PluginParams,
    TypedName,
)

TYPE = "probabilistic-admitter"


class Params(PluginParams):
    queue_depth_threshold: int = Field(default=5, gt=0, alias="queueDepthThreshold")
    kv_cache_util_threshold: float = Field(default=0.8, gt=0.0, alias="kvCacheUtilThreshold", allow_inf_nan=False)
    power: float = Field(default=5.0, gt=0.0, allow_inf_nan=False)
    k: float = Field(default=300.0, gt=0.0, allow_inf_nan=False)


class ProbabilisticAdmitter:
    def __init__(self, name: str, params: Params, rng: random.Random | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params
        self._rng = rng or random.Random()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def saturation(self, endpoints: Sequence[Endpoint]) -> float:
        p = self.params
        total = 0.0
        for e in endpoints:
            m = e.metrics
            if m.update_time == 0:  # never scraped
                total += 1.0
                continue
            total += max(m.waiting_queue_size / p.queue_depth_threshold, m.kv_cache_usage / p.kv_cache_util_threshold)
        return total / len(endpoints)

    def probability(self, endpoints: Sequence[Endpoint]) -> float:
        return min(float(self.saturation(endpoints) ** self.params.power) * self.params.k, 1.0)

    async def admit(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> str | None:
        if request.priority >= 0 or not endpoints:
            return None
        saturation = self.saturation(endpoints)
        prob = self.probability(endpoints)
        if self._rng.random() < prob:
            raise EppError(
                ErrorCode.RESOURCE_EXHAUSTED,
                f"probabilistic-admitter: sheddable request rejected (saturation={saturation:.3f}, "
                f"probability={prob:.2f}); retry later or send it with a priority >= 0",
            )
        return None


def factory(name: str, params: Params, handle: Handle) -> ProbabilisticAdmitter:
    return ProbabilisticAdmitter(name, params)
