"""prefix-cache-scorer

Scheduling intent:
    Prefer endpoints that probably hold the request's prompt prefix in their KV cache, so the prefill is
    mostly a cache hit. Score = matched blocks / total blocks, as estimated by `approx-prefix-cache-producer`
    for this request; 0 when the prompt is shorter than one block or when no producer ran.

Inputs consumed:
    The request's `PrefixMatch` in the CycleState (`PREFIX_MATCH_KEY`), written by
    `approx-prefix-cache-producer` in PrepareData.

Configuration:
    The producer's parameters (autoTune, blockSizeTokens, blockSize, maxPrefixBlocksToMatch,
    maxPrefixTokensToMatch, lruCapacityPerServer; see `approx-prefix-cache-producer`). The scorer itself
    uses none of them: as in the reference, when this scorer is configured without a producer, the loader
    creates one named `approx-prefix-cache-producer` with this scorer's parameters (`NEEDS_PRODUCER`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_epp.framework import CycleState, Endpoint, EndpointKey, Handle, InferenceRequest, ScorerCategory, TypedName
from llm_epp.plugins.requestcontrol import approx_prefix_cache_producer as producer
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY

TYPE = "prefix-cache-scorer"

NEEDS_PRODUCER = producer.TYPE
"""The plugin type the loader must add (named after its type, with this scorer's parameters) when a
`prefix-cache-scorer` is configured and no `approx-prefix-cache-producer` is."""


class Params(producer.Params):
    """The producer's parameters, accepted so a scorer-only configuration can pass them on."""


class PrefixCacheScorer:
    category = ScorerCategory.AFFINITY
    consumes = frozenset({PREFIX_MATCH_KEY.name})

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        match = cycle.read(PREFIX_MATCH_KEY)
        if match is None or not match.total_blocks or not match.matches:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        total = match.total_blocks
        get = match.matches.get
        return {e.key: get(e.key, 0) / total for e in endpoints}


def factory(name: str, params: Params, handle: Handle) -> PrefixCacheScorer:
    return PrefixCacheScorer(name)
