"""mm-embeddings-cache-scorer

Scheduling intent:
    Prefer endpoints that probably hold the request's images (or video, audio) in their encoder cache, so
    the model server skips encoding them again. Score = size of the request's multimodal items the
    endpoint holds / size of all its items (every item has size 1: the share of distinct items), from
    the `EncoderCacheMatch` of `mm-embeddings-cache-producer`. 0 for every endpoint when the request has
    no multimodal items or no producer ran. An affinity scorer.

Inputs consumed:
    The request's `EncoderCacheMatch` in the CycleState, written in PrepareData by the
    `mm-embeddings-cache-producer` named by `producerName` (created by the loader when none is configured).

Configuration:
    producerName (string, default ""): the `name` of the `mm-embeddings-cache-producer` whose matches to
        read; empty reads the one named `mm-embeddings-cache-producer`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field, field_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    ScorerCategory,
    StateKey,
    TypedName,
)
from llm_epp.plugins.requestcontrol.mm_embeddings_cache_producer import EncoderCacheMatch, match_key

TYPE = "mm-embeddings-cache-scorer"


class Params(PluginParams):
    producer_name: str = Field(default="", alias="producerName")

    @field_validator("producer_name")
    @classmethod
    def _name(cls, value: str) -> str:
        if value != value.strip() or "/" in value:
            raise ValueError(
                f"producerName {value!r} is not a plugin name: give the `name` of a declared "
                "mm-embeddings-cache-producer, or leave the parameter out for the default"
            )
        return value


class MmEmbeddingsCacheScorer:
    category = ScorerCategory.AFFINITY

    def __init__(self, name: str = TYPE, key: StateKey[EncoderCacheMatch] | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = key if key is not None else match_key("")
        self.consumes = frozenset({self.match_key.name})

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        match = cycle.read(self.match_key)
        if match is None:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        return {e.key: match.score(e.key) for e in endpoints}


def factory(name: str, params: Params, handle: Handle) -> MmEmbeddingsCacheScorer:
    return MmEmbeddingsCacheScorer(name, match_key(params.producer_name))
