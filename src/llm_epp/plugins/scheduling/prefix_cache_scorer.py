"""prefix-cache-scorer

Scheduling intent:
    Prefer endpoints that probably hold the request's prompt prefix in their KV cache, so the prefill is
    mostly a cache hit. Score = matched blocks / total blocks, as estimated by `approx-prefix-cache-producer`
    for this request; 0 when the prompt is shorter than one block or when no producer ran.
    With `matchLengthWeight` w > 0 the absolute length of the match counts too:
    score = w x min(1, matched blocks x block size tokens / matchLengthScaleTokens)^2 + (1 - w) x ratio,
    so a long cached prefix beats a short prompt that happens to match completely.

Inputs consumed:
    The request's `PrefixMatch` in the CycleState, written by a prefix producer in PrepareData: the shared
    `PREFIX_MATCH_KEY` (the default `approx-prefix-cache-producer`, or a `precise-prefix-cache-producer`),
    or, with `prefixMatchInfoProducerName`, the named producer's own key.

Configuration:
    The producer's parameters (autoTune, blockSizeTokens, blockSize, maxPrefixBlocksToMatch,
    maxPrefixTokensToMatch, lruCapacityPerServer; see `approx-prefix-cache-producer`). The scorer itself
    uses none of them: as in the reference, when this scorer is configured without a producer, the loader
    creates one named `approx-prefix-cache-producer` with this scorer's parameters (`NEEDS_PRODUCER`).
    The scorer's own:
    matchLengthWeight (float in [0, 1], default 0): weight of the absolute match length (0: ratio only).
    matchLengthScaleTokens (int, default 8192; > 0 when matchLengthWeight > 0): the match length, in
        tokens, that counts as fully long.
    prefixMatchInfoProducerName (string, default ""): the `name` of the declared prefix producer instance
        (`approx-prefix-cache-producer` or `precise-prefix-cache-producer` type) whose match to read. Empty
        or `approx-prefix-cache-producer` reads the default producer's (created when missing); any other
        name must be declared under `plugins`, else the configuration is rejected. Two scorers naming two
        approximate producers of different capacities score against two independent indexes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    ScorerCategory,
    StateKey,
    TypedName,
)
from llm_epp.plugins.requestcontrol import approx_prefix_cache_producer as producer
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    PrefixMatch,
    check_prefix_producer_name,
    prefix_match_key,
)

TYPE = "prefix-cache-scorer"

NEEDS_PRODUCER = producer.TYPE
"""The plugin type the loader must add (named after its type, with this scorer's parameters) when a
`prefix-cache-scorer` is configured and no `approx-prefix-cache-producer` is."""


DEFAULT_MATCH_LENGTH_SCALE_TOKENS = 8192
SCORER_ONLY_PARAMS = ("prefixMatchInfoProducerName", "matchLengthWeight", "matchLengthScaleTokens")
"""Parameters of the scorer itself, not passed on to an auto-created producer."""


class Params(producer.Params):
    """The producer's parameters, accepted so a scorer-only configuration can pass them on, and the
    scorer's own."""

    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")
    match_length_weight: float = Field(default=0.0, ge=0.0, le=1.0, alias="matchLengthWeight")
    match_length_scale_tokens: int = Field(default=DEFAULT_MATCH_LENGTH_SCALE_TOKENS, alias="matchLengthScaleTokens")

    _producer_name = field_validator("prefix_match_info_producer_name")(check_prefix_producer_name)

    @model_validator(mode="after")
    def _scale(self) -> Params:
        if self.match_length_weight > 0 and self.match_length_scale_tokens <= 0:
            raise ValueError(
                "matchLengthScaleTokens must be > 0 when matchLengthWeight is > 0, "
                f"got {self.match_length_scale_tokens}"
            )
        return self


class PrefixCacheScorer:
    category = ScorerCategory.AFFINITY

    def __init__(
        self,
        name: str = TYPE,
        match_length_weight: float = 0.0,
        match_length_scale_tokens: int = DEFAULT_MATCH_LENGTH_SCALE_TOKENS,
        match_key: StateKey[PrefixMatch] = PREFIX_MATCH_KEY,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = match_key
        self.consumes = frozenset({match_key.name})
        self.match_length_weight = match_length_weight
        self.match_length_scale_tokens = match_length_scale_tokens

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        match = cycle.read(self.match_key)
        if match is None or not match.total_blocks or not match.matches:
            return dict.fromkeys((e.key for e in endpoints), 0.0)
        total = match.total_blocks
        get = match.matches.get
        weight = self.match_length_weight
        if weight <= 0 or match.block_size_tokens <= 0:
            return {e.key: get(e.key, 0) / total for e in endpoints}
        per_block = match.block_size_tokens / self.match_length_scale_tokens
        out: dict[EndpointKey, float] = {}
        for e in endpoints:
            blocks = get(e.key, 0)
            length = min(1.0, blocks * per_block)
            out[e.key] = weight * length * length + (1.0 - weight) * blocks / total
        return out


def factory(name: str, params: Params, handle: Handle) -> PrefixCacheScorer:
    return PrefixCacheScorer(
        name,
        params.match_length_weight,
        params.match_length_scale_tokens,
        prefix_match_key(params.prefix_match_info_producer_name),
    )
