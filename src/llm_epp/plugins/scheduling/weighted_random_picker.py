"""weighted-random-picker

Scheduling intent:
    Choose endpoints at random in proportion to their scores, so better endpoints get more traffic while
    every positively scored endpoint still gets some (load spreads instead of piling onto the single best).

Inputs consumed:
    The summed weighted scores of the profile's scorers.

Configuration:
    maxNumOfEndpoints (int, default 1): how many distinct endpoints to return, in order of preference.

    Weighted sampling without replacement (A-Res, Efraimidis-Spirakis): each candidate with score s > 0
    draws U ~ Uniform[0, 1) (U = 0 is replaced by 1e-10) and gets key U^(1/s); the largest keys win.
    Keys are compared as ln(U)/s, the same order without underflow for tiny scores. Candidates with
    score <= 0 (or NaN) come after every positive one, in random order. If no candidate has a positive
    score the pick is uniform at random (as `random-picker`).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Handle, PluginParams, ProfileResult, ScoredEndpoint, TypedName

TYPE = "weighted-random-picker"
_MIN_U = 1e-10


class Params(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1, alias="maxNumOfEndpoints")


class WeightedRandomPicker:
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
        rng = self._rng
        k = min(self.max_endpoints, len(scored))
        if not any(s.score > 0 for s in scored):  # NaN > 0 is False
            return ProfileResult(tuple(s.endpoint for s in rng.sample(list(scored), k)))
        keyed: list[tuple[float, float, ScoredEndpoint]] = []
        for s in scored:
            if s.score > 0:
                u = rng.random() or _MIN_U
                keyed.append((math.log(u) / s.score, 0.0, s))
            else:  # after every positive score; a second draw orders these among themselves
                keyed.append((-math.inf, rng.random(), s))
        if k == 1:
            best = max(keyed, key=_order)
            return ProfileResult((best[2].endpoint,))
        keyed.sort(key=_order, reverse=True)
        return ProfileResult(tuple(item[2].endpoint for item in keyed[:k]))


def _order(item: tuple[float, float, ScoredEndpoint]) -> tuple[float, float]:
    return item[0], item[1]


def factory(name: str, params: Params, handle: Handle) -> WeightedRandomPicker:
    return WeightedRandomPicker(name, params.max_num_of_endpoints, rng=handle.rng(name))
