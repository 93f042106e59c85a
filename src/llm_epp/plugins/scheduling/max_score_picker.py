"""max-score-picker

Scheduling intent:
    Send the request to the highest-scoring endpoint; ties are broken at random so equal endpoints share
    load. With `maxNumOfEndpoints` > 1 the next best follow as an ordered fallback list.

Inputs consumed:
    The summed weighted scores of the profile's scorers.

Configuration:
    maxNumOfEndpoints (int, default 1): how many endpoints to return, best first.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Handle, PluginParams, ProfileResult, ScoredEndpoint, TypedName

TYPE = "max-score-picker"


class Params(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1, alias="maxNumOfEndpoints")


class MaxScorePicker:
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
        if self.max_endpoints == 1:
            values = [s.score for s in scored]
            try:
                total = math.fsum(values)
            except (ValueError, OverflowError):  # inf - inf, or huge values
                total = math.nan
            if total == total:  # no NaN: compare raw scores (the common, fast path)
                best = max(values)
                if values.count(best) == 1:  # a single best: no tie to break, no list of the tied
                    return ProfileResult((scored[values.index(best)].endpoint,))
                top = [s for s in scored if s.score == best]
            else:
                best = max(_rank(s) for s in scored)
                top = [s for s in scored if _rank(s) == best]
            chosen = top[0] if len(top) == 1 else self._rng.choice(top)
            return ProfileResult((chosen.endpoint,))
        shuffled = list(scored)
        self._rng.shuffle(shuffled)
        shuffled.sort(key=_rank, reverse=True)  # stable: shuffle order breaks ties
        return ProfileResult(tuple(s.endpoint for s in shuffled[: self.max_endpoints]))


def _rank(s: ScoredEndpoint) -> float:
    """The score, with NaN ranked below everything."""
    return s.score if s.score == s.score else -math.inf


def factory(name: str, params: Params, handle: Handle) -> MaxScorePicker:
    return MaxScorePicker(name, params.max_num_of_endpoints, rng=handle.rng(name))
