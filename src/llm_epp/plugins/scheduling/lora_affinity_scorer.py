"""lora-affinity-scorer

Scheduling intent:
    Send a LoRA request where its adapter is already loaded, else where it can be loaded without evicting
    another, so adapters are not swapped in and out on every request.

Inputs consumed:
    The request's target model (after any rewrite) and, per endpoint, Metrics.active_models /
    Metrics.waiting_models / Metrics.max_active_models (vLLM `vllm:lora_requests_info` labels
    `running_lora_adapters`, `waiting_lora_adapters`, `max_lora`).

Configuration:
    No parameters. Score, first rule that applies:
        1.0  the target model is active on the endpoint;
        0.8  len(active) + len(waiting) < max_active_models (a free adapter slot);
        0.6  the target model is waiting on the endpoint;
        0.0  otherwise (including endpoints that report no LoRA metrics).
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

TYPE = "lora-affinity-scorer"
ACTIVE = 1.0
FREE_SLOT = 0.8
WAITING = 0.6


class Params(PluginParams):
    pass


class LoraAffinityScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        model = request.target_model
        out: dict[EndpointKey, float] = {}
        for e in endpoints:
            m = e.metrics
            if model in m.active_models:
                out[e.key] = ACTIVE
            elif len(m.active_models) + len(m.waiting_models) < m.max_active_models:
                out[e.key] = FREE_SLOT
            elif model in m.waiting_models:
                out[e.key] = WAITING
            else:
                out[e.key] = 0.0
        return out


def factory(name: str, params: Params, handle: Handle) -> LoraAffinityScorer:
    return LoraAffinityScorer(name)
