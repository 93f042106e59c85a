"""running-requests-size-scorer

Scheduling intent:
    Prefer endpoints that are running fewer requests right now (the model server's batch is smaller).

Inputs consumed:
    Metrics.running_requests (vLLM `vllm:num_requests_running`, SGLang `sglang:num_running_reqs`, ...).

Configuration:
    No parameters. Score = (maxR - r) / (maxR - minR) over the candidates; all equal (or a single
    candidate) gives 1.0. The score is relative: the least busy candidate always scores 1.0.
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

TYPE = "running-requests-size-scorer"


class Params(PluginParams):
    pass


class RunningRequestsSizeScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        return inverse_min_max({e.key: float(e.metrics.running_requests) for e in endpoints})


def factory(name: str, params: Params, handle: Handle) -> RunningRequestsSizeScorer:
    return RunningRequestsSizeScorer(name)
