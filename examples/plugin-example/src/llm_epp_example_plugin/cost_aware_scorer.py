"""cost-aware-scorer (example out-of-tree plugin)

Scheduling intent:
    Prefer endpoints that are cheaper to run, e.g. older GPUs or reserved capacity, so expensive
    endpoints take traffic only when the cheap ones are busy (the other scorers still weigh load).

Inputs consumed:
    The endpoint label named by `labelKey` (a number: the relative cost). Endpoints without the label
    count as `defaultCost`.

Configuration:
    labelKey (string, default "example.com/cost"): the label holding the cost.
    defaultCost (float, default 1.0): the cost of endpoints without the label.
"""

from __future__ import annotations

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

TYPE = "cost-aware-scorer"


class Params(PluginParams):
    label_key: str = Field(default="example.com/cost", alias="labelKey", min_length=1)
    default_cost: float = Field(default=1.0, alias="defaultCost", ge=0)


class CostAwareScorer:
    category = ScorerCategory.BALANCE

    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def _cost(self, endpoint: Endpoint) -> float:
        raw = endpoint.metadata.labels.get(self.params.label_key)
        try:
            return max(float(raw), 0.0) if raw is not None else self.params.default_cost
        except ValueError:
            return self.params.default_cost

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        costs = {e.key: self._cost(e) for e in endpoints}
        highest = max(costs.values(), default=0.0)
        if highest <= 0:
            return dict.fromkeys(costs, 1.0)
        return {key: 1.0 - cost / highest for key, cost in costs.items()}


def factory(name: str, params: Params, handle: Handle) -> CostAwareScorer:
    return CostAwareScorer(name, params)
