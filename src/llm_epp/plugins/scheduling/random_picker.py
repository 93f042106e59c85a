"""random-picker

Scheduling intent:
    Choose uniformly at random among the candidates that survived the filters, ignoring scores.

Inputs consumed:
    Only the candidate list.

Configuration:
    maxNumOfEndpoints (int, default 1): how many distinct endpoints to return.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Handle, PluginParams, ProfileResult, ScoredEndpoint, TypedName

TYPE = "random-picker"


class Params(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1, alias="maxNumOfEndpoints")


class RandomPicker:
    def __init__(self, name: str = TYPE, max_endpoints: int = 1, rng: random.Random | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.max_endpoints = max_endpoints
        self._rng = rng or random.Random()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def pick(self, cycle: CycleState, scored: Sequence[ScoredEndpoint]) -> ProfileResult:
        if not scored:
            return ProfileResult(())
        k = min(self.max_endpoints, len(scored))
        return ProfileResult(tuple(s.endpoint for s in self._rng.sample(list(scored), k)))


def factory(name: str, params: Params, handle: Handle) -> RandomPicker:
    return RandomPicker(name, params.max_num_of_endpoints, rng=handle.rng(name))
