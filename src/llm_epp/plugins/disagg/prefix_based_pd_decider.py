"""prefix-based-pd-decider

Scheduling intent:
    A decider for `disagg-profile-handler` (`deciders.prefill`) / `pd-profile-handler`
    (`deciderPluginName`): disaggregate only when the part of the prompt the chosen decode endpoint does
    NOT already hold in its prefix cache is long enough to be worth a separate prefill.

    inputTokens = the request's token ids when it carries them, else prompt characters / 4 (the prompt
    text, or the JSON of chat messages / responses input). cachedTokens = matched blocks of the decode
    endpoint x block size in tokens, from the prefix match of `approx-prefix-cache-producer`.
    Disaggregate iff nonCachedTokens > 0, inputTokens >= promptTokens (when > 0),
    inputTokens >= nonCachedTokens and inputTokens - cachedTokens >= nonCachedTokens.
    No decode endpoint or no prefix match info: no disaggregation.

Inputs consumed:
    InferenceRequest.body (token_ids, payload); the request's prefix match (`prefix-cache-match-info`
    in the CycleState; a producer is added when none is configured); the decode endpoint's key.

Configuration:
    nonCachedTokens (int >= 0, default 0): the minimum number of uncached prompt tokens for a separate
        prefill. 0 disables disaggregation (as upstream: the decider never says yes).
    promptTokens (int >= 0, default 0): when > 0, prompts shorter than this are never disaggregated.
"""

from __future__ import annotations

import logging

from pydantic import Field

from llm_epp.framework import CycleState, Endpoint, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.plugins.disagg.common import prompt_tokens
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY

TYPE = "prefix-based-pd-decider"

log = logging.getLogger(__name__)


class Params(PluginParams):
    non_cached_tokens: int = Field(default=0, ge=0, alias="nonCachedTokens")
    prompt_tokens: int = Field(default=0, ge=0, alias="promptTokens")


class PrefixBasedPdDecider:
    # Data the handler using this decider must have produced (the handler declares it as `consumes`).
    requires = frozenset({PREFIX_MATCH_KEY.name})

    def __init__(self, name: str = TYPE, non_cached_tokens: int = 0, min_prompt_tokens: int = 0) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.non_cached_tokens = non_cached_tokens
        self.min_prompt_tokens = min_prompt_tokens

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint | None) -> bool:
        threshold = self.non_cached_tokens
        if threshold == 0 or endpoint is None:
            return False
        tokens = prompt_tokens(request)
        if self.min_prompt_tokens > 0 and tokens < self.min_prompt_tokens:
            return False
        if tokens < threshold:
            return False
        match = cycle.read(PREFIX_MATCH_KEY)
        if match is None:
            log.debug("prefix_based_pd_decider_no_match_info request=%s", request.request_id)
            return False
        cached = match.matched_blocks(endpoint.key) * match.block_size_tokens
        return tokens - cached >= threshold


def factory(name: str, params: Params, handle: Handle) -> PrefixBasedPdDecider:
    if params.non_cached_tokens == 0:
        log.info("prefix_based_pd_decider_disabled plugin=%s nonCachedTokens=0: requests are never disaggregated", name)
    return PrefixBasedPdDecider(name, params.non_cached_tokens, params.prompt_tokens)
