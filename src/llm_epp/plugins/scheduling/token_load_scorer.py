"""token-load-scorer

Scheduling intent:
    Prefer endpoints with fewer estimated tokens in flight from this EPP, a load signal that is fresh
    between metric scrapes and weighs long prompts more than short ones.

Inputs consumed:
    Endpoint.load.tokens: the EPP's own in-flight token estimate per endpoint (input = max(body bytes / 4,
    1), plus 1.5x that for the output), reserved when a request is scheduled and released when it ends.
    The reference needs `inflight-load-producer` for this; here the core always keeps the count.

Configuration:
    queueThresholdTokens (int, default 4194304 = 128 requests of 32K tokens): the load that scores 0.
    Score = 1 - min(1, tokens / queueThresholdTokens); no load scores 1.0. As in the reference, a value
    <= 0 falls back to the default (with a warning).
    inFlightLoadProducerName (string, default ""): the `inflight-load-producer` whose counts to read. It must
        name a declared `inflight-load-producer` (or be `inflight-load-producer`); other names are refused
        when the configuration loads. llm-epp keeps one in-flight account per endpoint (in the core), which
        every inflight-load-producer stands for.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    ScorerCategory,
    TypedName,
)

TYPE = "token-load-scorer"
DEFAULT_QUEUE_THRESHOLD_TOKENS = 4194304

log = logging.getLogger(__name__)


class Params(PluginParams):
    queue_threshold_tokens: int = Field(default=DEFAULT_QUEUE_THRESHOLD_TOKENS, alias="queueThresholdTokens")
    in_flight_load_producer_name: str = Field(default="", alias="inFlightLoadProducerName")


class TokenLoadScorer:
    category = ScorerCategory.DISTRIBUTION

    def __init__(self, name: str = TYPE, queue_threshold_tokens: int = DEFAULT_QUEUE_THRESHOLD_TOKENS) -> None:
        self._typed_name = TypedName(TYPE, name)
        if queue_threshold_tokens <= 0:
            log.warning(
                "token_load_threshold_invalid plugin=%s queueThresholdTokens=%d; using the default %d",
                name,
                queue_threshold_tokens,
                DEFAULT_QUEUE_THRESHOLD_TOKENS,
            )
            queue_threshold_tokens = DEFAULT_QUEUE_THRESHOLD_TOKENS
        self.queue_threshold_tokens = queue_threshold_tokens

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def score(
        self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]
    ) -> Mapping[EndpointKey, float]:
        threshold = float(self.queue_threshold_tokens)
        out: dict[EndpointKey, float] = {}
        for e in endpoints:
            tokens = e.load.tokens
            out[e.key] = 1.0 if tokens <= 0 else 1.0 - min(tokens, threshold) / threshold
        return out


def factory(name: str, params: Params, handle: Handle) -> TokenLoadScorer:
    return TokenLoadScorer(name, params.queue_threshold_tokens)
