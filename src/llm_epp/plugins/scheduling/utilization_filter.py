"""utilization-filter

Scheduling intent:
    Keep only endpoints under every configured utilization limit (in-flight requests, running requests,
    waiting queue, KV-cache utilization), so a busy endpoint is not chosen while others have room.

Inputs consumed:
    Endpoint.load.requests (the EPP's own in-flight count, for `active-requests`) and the scraped
    running requests, waiting-queue size and KV-cache utilization.

Configuration:
    conditions (list, at least one, required): `{metric, maxValue}` with metric one of
        `active-requests`, `running-requests`, `waiting-queue`, `kv-cache-utilization` and maxValue >= 0
        (at most 1 for `kv-cache-utilization`, a fraction). An endpoint is kept when every value is
        <= its maxValue.
    fallbackOnEmpty (bool, default false): when no endpoint passes, return them all instead of none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName

TYPE = "utilization-filter"

Metric = Literal["active-requests", "running-requests", "waiting-queue", "kv-cache-utilization"]


class Condition(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    metric: Metric
    max_value: float = Field(alias="maxValue", ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _fraction(self) -> Condition:
        if self.metric == "kv-cache-utilization" and self.max_value > 1:
            raise ValueError(
                f"maxValue for kv-cache-utilization is a fraction and must be at most 1, got {self.max_value}"
            )
        return self


class Params(PluginParams):
    conditions: list[Condition] = Field(min_length=1)
    fallback_on_empty: bool = Field(default=False, alias="fallbackOnEmpty")


def _value(endpoint: Endpoint, metric: Metric) -> float:
    if metric == "active-requests":
        return float(endpoint.load.requests)
    m = endpoint.metrics
    if metric == "running-requests":
        return float(m.running_requests)
    if metric == "waiting-queue":
        return float(m.waiting_queue_size)
    return m.kv_cache_usage


class UtilizationFilter:
    def __init__(self, name: str, conditions: Sequence[Condition], fallback_on_empty: bool = False) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.conditions = tuple((c.metric, c.max_value) for c in conditions)
        self.fallback_on_empty = fallback_on_empty

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        kept = [e for e in endpoints if all(_value(e, metric) <= limit for metric, limit in self.conditions)]
        if not kept and self.fallback_on_empty:
            return endpoints
        return kept


def factory(name: str, params: Params, handle: Handle) -> UtilizationFilter:
    return UtilizationFilter(name, params.conditions, params.fallback_on_empty)
