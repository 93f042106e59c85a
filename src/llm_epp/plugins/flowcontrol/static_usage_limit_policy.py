"""static-usage-limit-policy

Scheduling intent:
    One saturation ceiling for every priority band: requests are released while the pool's saturation
    is below `threshold`. The default usage-limit policy (threshold 1.0: dispatch until saturated).
    A lower threshold keeps headroom on the model servers.

Inputs consumed:
    Nothing but its parameter (the controller compares the pool saturation to the ceiling).

Configuration:
    threshold (float >= 0, default 1.0): the ceiling of every band.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import Handle, PluginParams, TypedName

TYPE = "static-usage-limit-policy"


class Params(PluginParams):
    threshold: float = Field(default=1.0, ge=0.0, allow_inf_nan=False)


class StaticUsageLimitPolicy:
    def __init__(self, name: str = TYPE, threshold: float = 1.0) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.threshold = threshold

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def compute_limit(self, saturation: float, priorities: Sequence[int], ceilings: list[float]) -> None:
        for i in range(len(ceilings)):
            ceilings[i] = self.threshold


def factory(name: str, params: Params, handle: Handle) -> StaticUsageLimitPolicy:
    return StaticUsageLimitPolicy(name, params.threshold)
