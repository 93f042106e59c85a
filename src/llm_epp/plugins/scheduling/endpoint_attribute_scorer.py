"""endpoint-attribute-scorer

Scheduling intent:
    Rank endpoints by a numeric attribute, linearly: `linear_lower_is_better` gives the lowest value 1.0
    and the highest 0.0 (`linear_higher_is_better` the reverse), e.g. to prefer endpoints with idle GPUs
    (`GPUUtilization` from `dcgm-extractor`) or a low custom queue metric.

Inputs consumed:
    Endpoint.attributes[`<attributeKey>/<producer>`] (a number). An endpoint without it scores 0.

Configuration:
    attributeKey (string, required); producer (optional). Left out: an attributeKey containing "/" is the
        whole key (llm-d-router v0.10's spelling, e.g. `GPUUtilization/dcgm-extractor`), one without is a
        custom metric of `core-metrics-extractor`.
    algorithm.type (`linear_lower_is_better` | `linear_higher_is_better`, required).
    algorithm.normalization: at most one of
        adaptiveRange ({}; the default): min and max over the candidates that have the attribute; when all
            share one value each scores 1.0.
        fixedRange ({min, max}, min < max): the configured bounds; values outside are clamped.

"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

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
from llm_epp.plugins.datalayer._attributes import scalar
from llm_epp.plugins.scheduling._endpoint_attribute import resolve_key

TYPE = "endpoint-attribute-scorer"


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class FixedRange(_Model):
    min: float = 0.0
    max: float = 0.0

    @model_validator(mode="after")
    def _ordered(self) -> FixedRange:
        if self.min >= self.max:
            raise ValueError(f"fixedRange requires min < max, got min {self.min}, max {self.max}")
        return self


class AdaptiveRange(_Model):
    pass


class Normalization(_Model):
    fixed_range: FixedRange | None = Field(default=None, alias="fixedRange")
    adaptive_range: AdaptiveRange | None = Field(default=None, alias="adaptiveRange")

    @model_validator(mode="after")
    def _one(self) -> Normalization:
        if self.fixed_range is not None and self.adaptive_range is not None:
            raise ValueError("at most one normalization strategy: got both fixedRange and adaptiveRange")
        return self


class Algorithm(_Model):
    type: Literal["linear_lower_is_better", "linear_higher_is_better"]
    normalization: Normalization = Field(default_factory=Normalization)


class Params(PluginParams):
    attribute_key: str = Field(alias="attributeKey", min_length=1)
    producer: str | None = None
    algorithm: Algorithm


class EndpointAttributeScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.key = resolve_key(params.attribute_key, params.producer)
        self.lower_is_better = params.algorithm.type == "linear_lower_is_better"
        self.fixed = params.algorithm.normalization.fixed_range

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        values = {e.key: scalar(e, self.key) for e in endpoints}
        present = [v for v in values.values() if v is not None]
        if self.fixed is not None:
            low, high = self.fixed.min, self.fixed.max
        elif present:
            low, high = min(present), max(present)
        out: dict[EndpointKey, float] = {}
        for k, v in values.items():
            if v is None:
                out[k] = 0.0
            elif self.fixed is None and high == low:
                out[k] = 1.0
            else:
                norm = min(1.0, max(0.0, (v - low) / (high - low)))
                out[k] = 1.0 - norm if self.lower_is_better else norm
        return out


def factory(name: str, params: Params, handle: Handle) -> EndpointAttributeScorer:
    return EndpointAttributeScorer(name, params)
