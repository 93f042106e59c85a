"""queue-scorer

Scheduling intent:
    Prefer endpoints with fewer requests waiting in the model server's queue.

Inputs consumed:
    Metrics.waiting_queue_size (vLLM `vllm:num_requests_waiting`, SGLang `sglang:num_queue_reqs`, ...).

Configuration:
    No parameters. Score = (maxQ - q) / (maxQ - minQ) over the candidates; all equal gives 1.0.
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
from llm_epp.framework.normalize import inverse_min_max

TYPE = "queue-scorer"


class Params(PluginParams):
    pass


class QueueScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        return inverse_min_max({e.key: float(e.metrics.waiting_queue_size) for e in endpoints})


def factory(name: str, params: Params, handle: Handle) -> QueueScorer:
    return QueueScorer(name)
