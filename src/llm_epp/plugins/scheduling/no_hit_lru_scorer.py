"""no-hit-lru-scorer

Scheduling intent:
    Spread requests that hit no prefix cache anywhere ("cold" requests, which create the most new KV
    blocks) evenly, so every endpoint's cache grows at the same pace: a cold request prefers the endpoint
    that least recently received a cold request. Warm requests are left to the other scorers.

    A request is cold when no candidate has a matched prefix block (or no prefix data exists). Warm: every
    candidate scores 0.5. Cold: endpoints that never received a cold request come first, in candidate
    order, then the others from least to most recently used; with N candidates the endpoint of rank r
    scores 1 - r / (N - 1), floored at 0, and a single candidate scores 1.0. As in llm-d, the rank of a
    used endpoint is (number of never-used candidates) + (its position among *all* endpoints in the LRU,
    oldest first), so endpoints outside the candidate set still push scores down.

    PreRequest: for cold requests only, the primary profile's first target (and the first target of a
    profile named `prefill`) becomes the most recently used.

Inputs consumed:
    The request's `PrefixMatch` in the CycleState (from the default prefix producer, or from the one
    `prefixMatchInfoProducerName` names); the SchedulingResult (PreRequest).

Configuration:
    lruSize (int, default 1024; <= 0 means the default): how many endpoints the LRU remembers.
    prefixPluginType, prefixPluginName (strings, default `prefix-cache-scorer`): accepted for llm-d
        compatibility. llm-d's current scorer ignores them as well (it reads the match info endpoint
        attribute); here the match always comes from the CycleState.
    prefixMatchInfoProducerName (string, default ""): the `name` of the declared prefix producer instance
        whose match to read; empty (or `approx-prefix-cache-producer`) reads the default producer's. A name
        no declared prefix producer has is rejected when the configuration loads.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence

from pydantic import Field, field_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    ScorerCategory,
    StateKey,
    TypedName,
)
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFILL_PROFILE,
    PREFIX_MATCH_KEY,
    PrefixMatch,
    check_prefix_producer_name,
    prefix_match_key,
)

TYPE = "no-hit-lru-scorer"
DEFAULT_LRU_SIZE = 1024
WARM_SCORE = 0.5


class Params(PluginParams):
    prefix_plugin_type: str = Field(default="prefix-cache-scorer", alias="prefixPluginType")
    prefix_plugin_name: str = Field(default="prefix-cache-scorer", alias="prefixPluginName")
    lru_size: int = Field(default=DEFAULT_LRU_SIZE, alias="lruSize")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")

    _producer_name = field_validator("prefix_match_info_producer_name")(check_prefix_producer_name)


class NoHitLruScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(
        self, name: str = TYPE, lru_size: int = DEFAULT_LRU_SIZE, match_key: StateKey[PrefixMatch] = PREFIX_MATCH_KEY
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = match_key
        self.consumes = frozenset({match_key.name})
        self.lru_size = lru_size if lru_size > 0 else DEFAULT_LRU_SIZE
        self._lru: OrderedDict[EndpointKey, None] = OrderedDict()  # oldest first
        self._cold_key: StateKey[bool] = StateKey(f"{TYPE}/{name}/cold")

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def lru_order(self) -> list[EndpointKey]:
        """Endpoints that received a cold request, least recently first."""
        return list(self._lru)

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        match = cycle.read(self.match_key)
        cold = match is None or not any(match.matches.get(e.key, 0) > 0 for e in endpoints)
        cycle.write(self._cold_key, cold)
        if not cold:
            return dict.fromkeys((e.key for e in endpoints), WARM_SCORE)
        n = len(endpoints)
        if n == 1:
            return {endpoints[0].key: 1.0}
        if n == 0:
            return {}
        position = {k: i for i, k in enumerate(self._lru)}
        never = [e.key for e in endpoints if e.key not in position]
        span = float(n - 1)
        scores = {k: 1.0 - i / span for i, k in enumerate(never)}
        offset = len(never)
        for e in endpoints:
            pos = position.get(e.key)
            if pos is not None:
                scores[e.key] = max(0.0, 1.0 - (offset + pos) / span)
        return scores

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        if not cycle.read(self._cold_key):
            return
        for name in dict.fromkeys((result.primary_profile_name, PREFILL_PROFILE)):
            profile = result.profile_results.get(name)
            if profile is not None and profile.target_endpoints:
                self._touch(profile.target_endpoints[0].key)

    def _touch(self, key: EndpointKey) -> None:
        lru = self._lru
        if key in lru:
            lru.move_to_end(key)
            return
        lru[key] = None
        while len(lru) > self.lru_size:
            lru.popitem(last=False)


def factory(name: str, params: Params, handle: Handle) -> NoHitLruScorer:
    return NoHitLruScorer(name, params.lru_size, prefix_match_key(params.prefix_match_info_producer_name))
