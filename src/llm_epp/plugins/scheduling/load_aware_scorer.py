"""load-aware-scorer

Scheduling intent:
    llm-d's queue-based load scorer: an endpoint with an empty waiting queue scores 0.5, and the score
    falls linearly to 0 as the queue approaches `threshold`. Unlike `queue-scorer` the score is absolute
    (not relative to the other candidates) and never exceeds 0.5, leaving room above it for endpoints with
    spare capacity.

Inputs consumed:
    Metrics.waiting_queue_size (vLLM `vllm:num_requests_waiting`, ...).

Configuration:
    threshold (int, default 128): the queue length that scores 0. As in llm-d, a value <= 0 falls back to
    128 (with a warning). Score = 0.5 for an empty queue, else 0.5 * (1 - min(q, threshold) / threshold).
"""

from __future__ import annotations

import logging
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

TYPE = "load-aware-scorer"
DEFAULT_THRESHOLD = 128
IDLE_SCORE = 0.5

log = logging.getLogger(__name__)


class Params(PluginParams):
    threshold: int = Field(default=DEFAULT_THRESHOLD)


class LoadAwareScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE, threshold: int = DEFAULT_THRESHOLD) -> None:
        self._typed_name = TypedName(TYPE, name)
        if threshold <= 0:
            log.warning(
                "load_aware_threshold_invalid plugin=%s threshold=%d; using the default %d",
                name,
                threshold,
                DEFAULT_THRESHOLD,
            )
            threshold = DEFAULT_THRESHOLD
        self.threshold = threshold

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        threshold = float(self.threshold)
        out: dict[EndpointKey, float] = {}
        for e in endpoints:
            waiting = e.metrics.waiting_queue_size
            if waiting <= 0:
                out[e.key] = IDLE_SCORE
            else:
                out[e.key] = IDLE_SCORE * (1.0 - min(waiting, threshold) / threshold)
        return out


def factory(name: str, params: Params, handle: Handle) -> LoadAwareScorer:
    return LoadAwareScorer(name, params.threshold)
