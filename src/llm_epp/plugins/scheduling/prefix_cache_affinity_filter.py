"""prefix-cache-affinity-filter

Scheduling intent:
    Keep only the "sticky" endpoints, those that probably hold most of the request's prompt in their prefix
    cache (prefix score >= `affinityThreshold`), so the scorers and picker after it choose among cache hits
    only; paired with a random picker this spreads a hot prefix over its sticky endpoints without losing
    the cache. All candidates are kept when none is sticky, when there is at most one candidate, when
    `affinityThreshold` <= 0, and, for exploration, with probability `explorationProbability` (which lets
    other endpoints warm up over time).

    TTFT load gate: the reference also keeps all candidates when the best sticky endpoint's *predicted*
    TTFT exceeds the best non-sticky one's by more than `maxTTFTPenaltyMs`. Predictions come from the
    reference's latency predictor, which llm-epp does not have, so the gate is not applied (the reference
    skips it too when no endpoint carries a prediction). The parameter is accepted and validated; pair the
    filter with load-aware scorers, or use a threshold below 1, to avoid piling load on sticky endpoints.

Inputs consumed:
    The request's `PrefixMatch` in the CycleState (from `approx-prefix-cache-producer`); the prefix score
    of an endpoint is matched blocks / total blocks (0 without prefix data).

Configuration:
    affinityThreshold (float, default 0.80, <= 1): minimum prefix score of a sticky endpoint.
    explorationProbability (float in [0, 1], default 0.01): chance of keeping every candidate.
    maxTTFTPenaltyMs (float >= 0, default 5000): accepted; not applied (no latency predictor).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY

TYPE = "prefix-cache-affinity-filter"


class Params(PluginParams):
    affinity_threshold: float = Field(default=0.80, le=1.0, alias="affinityThreshold")
    exploration_probability: float = Field(default=0.01, ge=0.0, le=1.0, alias="explorationProbability")
    max_ttft_penalty_ms: float = Field(default=5000.0, ge=0.0, alias="maxTTFTPenaltyMs")


class PrefixCacheAffinityFilter:
    consumes = frozenset({PREFIX_MATCH_KEY.name})

    def __init__(
        self,
        name: str = TYPE,
        affinity_threshold: float = 0.80,
        exploration_probability: float = 0.01,
        rng: random.Random | None = None,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.affinity_threshold = affinity_threshold
        self.exploration_probability = exploration_probability
        self._rng = rng or random.Random()

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def filter(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> Sequence[Endpoint]:
        threshold = self.affinity_threshold
        if len(endpoints) <= 1 or threshold <= 0:
            return endpoints
        if self._rng.random() < self.exploration_probability:
            return endpoints
        match = cycle.read(PREFIX_MATCH_KEY)
        if match is None or not match.total_blocks or not match.matches:
            return endpoints  # every score is 0, below any positive threshold
        total = match.total_blocks
        get = match.matches.get
        sticky = [e for e in endpoints if get(e.key, 0) / total >= threshold]
        return sticky or endpoints


def factory(name: str, params: Params, handle: Handle) -> PrefixCacheAffinityFilter:
    return PrefixCacheAffinityFilter(
        name, params.affinity_threshold, params.exploration_probability, rng=handle.rng(name)
    )
