"""endpoint-attribute-filter

Scheduling intent:
    Keep only the endpoints whose numeric attribute passes a threshold, e.g. GPU utilization <= 0.9 from
    `dcgm-extractor`, or a custom metric of `core-metrics-extractor` below a limit.

Inputs consumed:
    Endpoint.attributes[`<attribute>/<producer>`] (a number).

Configuration:
    attribute (string, required): the attribute, e.g. `num_requests_running` or `GPUUtilization`.
    producer (string, optional): the plugin publishing it. Left out: an attribute containing "/" is the
        whole key (llm-d-router v0.10's spelling, e.g. `GPUUtilization/dcgm-extractor`), one without is a
        custom metric of `core-metrics-extractor`.
    onMissing (`Pass` | `Fail`, default `Pass`): keep or drop endpoints without the attribute.
    fallbackOnEmpty (bool, default false): when every endpoint is dropped, keep them all instead.
    algorithm.type (`threshold`, required) with algorithm.threshold.operator (`LessThan`,
        `LessThanOrEqual`, `GreaterThan`, `GreaterThanOrEqual`, `Equal`, `NotEqual`) and
        algorithm.threshold.value (number): an endpoint passes when `value <op> threshold`.

"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.datalayer._attributes import scalar
from llm_epp.plugins.scheduling._endpoint_attribute import resolve_key

TYPE = "endpoint-attribute-filter"

Operator = Literal["LessThan", "LessThanOrEqual", "GreaterThan", "GreaterThanOrEqual", "Equal", "NotEqual"]
_OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "LessThan": operator.lt,
    "LessThanOrEqual": operator.le,
    "GreaterThan": operator.gt,
    "GreaterThanOrEqual": operator.ge,
    "Equal": operator.eq,
    "NotEqual": operator.ne,
}


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Threshold(_Model):
    operator: Operator
    value: float


class Algorithm(_Model):
    type: Literal["threshold"]
    threshold: Threshold | None = None

    @model_validator(mode="after")
    def _threshold(self) -> Algorithm:
        if self.threshold is None:
            raise ValueError("algorithm.threshold is required when algorithm.type is 'threshold'")
        return self


class Params(PluginParams):
    attribute: str = Field(min_length=1)
    producer: str | None = None
    on_missing: Literal["Pass", "Fail"] = Field(default="Pass", alias="onMissing")
    fallback_on_empty: bool = Field(default=False, alias="fallbackOnEmpty")
    algorithm: Algorithm


class EndpointAttributeFilter:
    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.key = resolve_key(params.attribute, params.producer)
        self.pass_on_missing = params.on_missing == "Pass"
        self.fallback_on_empty = params.fallback_on_empty
        threshold = params.algorithm.threshold
        assert threshold is not None
        self._compare = _OPERATORS[threshold.operator]
        self._limit = threshold.value

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        kept = []
        for e in endpoints:
            value = scalar(e, self.key)
            if value is None:
                if self.pass_on_missing:
                    kept.append(e)
            elif self._compare(value, self._limit):
                kept.append(e)
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept


def factory(name: str, params: Params, handle: Handle) -> EndpointAttributeFilter:
    return EndpointAttributeFilter(name, params)
