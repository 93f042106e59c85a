"""precise-prefix-cache-scorer

Scheduling intent:
    Send a request where its prompt prefix is known to be in the KV cache, as reported by the model
    servers' KV events. Score = min(1, weighted leading blocks held / prompt blocks), where each block
    counts with the weight of the best medium holding it (gpu 1.0, cpu 0.8 by default); 0 for endpoints
    holding none, for prompts shorter than one block, or when the producer found nothing.

Inputs consumed:
    The request's `PreciseMatch` in the CycleState (`PRECISE_MATCH_KEY`), written by
    `precise-prefix-cache-producer` in PrepareData.

Configuration:
    The producer's parameters (tokenProcessorConfig, indexerConfig, kvEventsConfig, speculativeIndexing,
    speculativeTTL; see `precise-prefix-cache-producer`). As in llm-d, where this type combines producer
    and scorer: when no `precise-prefix-cache-producer` is configured, the loader creates one with this
    scorer's parameters; when one is, it is used and this scorer's parameters are not.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from llm_epp.framework import CycleState, Endpoint, EndpointKey, Handle, InferenceRequest, ScorerCategory, TypedName
from llm_epp.plugins.requestcontrol import precise_prefix_cache_producer as producer
from llm_epp.plugins.requestcontrol.precise_prefix_cache_producer import PRECISE_MATCH_KEY

TYPE = "precise-prefix-cache-scorer"


class Params(producer.Params):
    """The producer's parameters, passed on to the producer the loader creates for this scorer."""


class PrecisePrefixCacheScorer:
    category = ScorerCategory.AFFINITY
    consumes = frozenset({PRECISE_MATCH_KEY.name})

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        match = cycle.read(PRECISE_MATCH_KEY)
        if match is None or not match.weighted:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        return {e.key: match.score(e.key) for e in endpoints}


def factory(name: str, params: Params, handle: Handle) -> PrecisePrefixCacheScorer:
    return PrecisePrefixCacheScorer(name)
