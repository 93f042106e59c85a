"""kv-cache-utilization-scorer

Scheduling intent:
    Prefer endpoints whose KV cache has more free room, to avoid preemption and queueing.

Inputs consumed:
    Metrics.kv_cache_usage, a fraction in [0, 1] (vLLM `vllm:kv_cache_usage_perc`).

Configuration:
    No parameters. Score = 1 - usage (clamped to [0, 1]).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
from llm_epp.framework.normalize import clamp01

TYPE = "kv-cache-utilization-scorer"


class Params(PluginParams):
    pass


class KvCacheUtilizationScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        return {e.key: clamp01(1.0 - e.metrics.kv_cache_usage) for e in endpoints}


def factory(name: str, params: Params, handle: Handle) -> KvCacheUtilizationScorer:
    return KvCacheUtilizationScorer(name)
