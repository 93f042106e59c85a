"""priority-holdback-policy

Scheduling intent:
    Hold lower priorities back earlier as the pool fills, keeping headroom for higher ones: the highest
    active priority gets ceiling `maxCeiling`, the lowest `minCeiling`, those between are spread
    linearly. A band is released from only while the pool saturation is below its ceiling.

Inputs consumed:
    The active priority levels (bands with waiting requests), highest first.

Configuration:
    minCeiling (float in [0, 1), required): the ceiling of the lowest active priority.
    maxCeiling (float in (0, 1], default 1.0, > minCeiling): the ceiling of the highest one.
    domain ("rank" | "value", default "rank"): spread by rank (equal steps) or in proportion to the
        numeric priority values.
    shape ("linear", default): the interpolation curve; only linear exists.
    A single active priority gets maxCeiling.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import Field, model_validator

from llm_epp.framework import Handle, PluginParams, TypedName

TYPE = "priority-holdback-policy"


class Params(PluginParams):
    min_ceiling: float = Field(alias="minCeiling", ge=0.0, lt=1.0, allow_inf_nan=False)
    max_ceiling: float = Field(default=1.0, alias="maxCeiling", gt=0.0, le=1.0, allow_inf_nan=False)
    domain: Literal["rank", "value"] = "rank"
    shape: Literal["linear"] = "linear"

    @model_validator(mode="after")
    def _ordered(self) -> Params:
        if self.min_ceiling >= self.max_ceiling:
            raise ValueError(
                f"minCeiling ({self.min_ceiling}) must be strictly less than maxCeiling ({self.max_ceiling})"
            )
        return self


class PriorityHoldbackPolicy:
    def __init__(self, name: str, min_ceiling: float, max_ceiling: float = 1.0, domain: str = "rank") -> None:
        self._typed_name = TypedName(TYPE, name)
        self.min_ceiling = min_ceiling
        self.max_ceiling = max_ceiling
        self.domain = domain

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        n = len(priorities)
        if n == 0:
            return
        lo, hi = self.min_ceiling, self.max_ceiling
        if n == 1:
            ceilings[0] = hi
            return
        if self.domain == "rank":
            for i in range(n):
                ceilings[i] = hi - i * (hi - lo) / (n - 1)
            return
        p_max, p_min = priorities[0], priorities[-1]
        span = p_max - p_min
        for i, p in enumerate(priorities):
            ceilings[i] = hi if span == 0 else lo + (p - p_min) / span * (hi - lo)


def factory(name: str, params: Params, handle: Handle) -> PriorityHoldbackPolicy:
    return PriorityHoldbackPolicy(name, params.min_ceiling, params.max_ceiling, params.domain)
