"""pd-profile-handler

Scheduling intent:
    Deprecated llm-d P/D handler (use `disagg-profile-handler`). The decode profile runs first and is
    primary; then the prefill profile runs when the decider approves for the picked decode endpoint.
    Each decision (decode-only / prefill-decode) is counted with the recorder's `pd_decision`.

    The decider is the plugin named by `deciderPluginName` (default `prefix-based-pd-decider`). When that
    name is not set explicitly and no such plugin is configured, or when the llm-d v0.5 parameters
    `threshold` / `hashBlockSize` are given, the v0.5 rule applies instead: with threshold 0 every request
    is disaggregated; otherwise, with `promptChars` the prompt length in characters and `hit` =
    max(matched blocks of the decode endpoint - 1, 0) x hashBlockSize, decode only when
    promptChars - hit < threshold.

    With `primaryPort` set, the decode pick's `ip:port` goes into `x-data-parallel-host-port` and the
    decode targets' ports become primaryPort (data-parallel pods behind one port).
    PreRequest: writes `x-prefiller-host-port` like `prefill-header-handler`, so the handler works without
    one (configuring both is harmless: they write the same value).

Inputs consumed:
    The profiles' results; the decider's inputs; for the v0.5 rule the request's prefix match
    (`prefix-cache-match-info`, a producer is added when none is configured) and the prompt text.

Configuration:
    decodeProfile (string, default "decode"), prefillProfile (string, default "prefill").
    deciderPluginName (plugin name, default "prefix-based-pd-decider").
    threshold (int >= 0, default 0) and hashBlockSize (int > 0, default 64, characters): the v0.5 rule;
        rejected together with an explicit deciderPluginName.
    primaryPort (int, default 0 = off; 1-65535).
    prefixPluginType, prefixPluginName (strings): accepted for upstream configurations, unused.
    prefixMatchInfoProducerName (string, default ""): the `name` of the declared prefix producer instance
        whose match the v0.5 rule (`threshold` > 0) reads; empty (or `approx-prefix-cache-producer`) reads
        the default producer's. A name no declared prefix producer has is rejected when the configuration
        loads if the rule is in use. A decider reads the default producer's match.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import Field, field_validator, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    Handle,
    InferenceRequest,
    PluginParams,
    ProfileResult,
    Recorder,
    SchedulingResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.scheduling import ProfileView
from llm_epp.plugins.disagg.common import (
    DATA_PARALLEL_ENDPOINT_HEADER,
    DECISION_DECODE_ONLY,
    DECISION_PREFILL_DECODE,
    DEFAULT_DECODE_PROFILE,
    DEFAULT_ENCODE_PROFILE,
    DEFAULT_PREFILL_PROFILE,
    DeciderRef,
    model_label,
    prompt_chars,
    request_headers,
    set_disagg_headers,
)
from llm_epp.plugins.disagg.ports import first_hostport, with_port
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    PrefixMatch,
    check_prefix_producer_name,
    prefix_match_key,
)

TYPE = "pd-profile-handler"
DEFAULT_DECIDER = "prefix-based-pd-decider"
DEFAULT_HASH_BLOCK_SIZE = 64

log = logging.getLogger(__name__)


class Params(PluginParams):
    decode_profile: str = Field(default=DEFAULT_DECODE_PROFILE, min_length=1, alias="decodeProfile")
    prefill_profile: str = Field(default=DEFAULT_PREFILL_PROFILE, min_length=1, alias="prefillProfile")
    decider_plugin_name: str = Field(default=DEFAULT_DECIDER, min_length=1, alias="deciderPluginName")
    threshold: int = Field(default=0, ge=0)
    hash_block_size: int = Field(default=DEFAULT_HASH_BLOCK_SIZE, gt=0, alias="hashBlockSize")
    primary_port: int = Field(default=0, ge=0, le=65535, alias="primaryPort")
    prefix_plugin_type: str = Field(default="prefix-cache-scorer", alias="prefixPluginType")
    prefix_plugin_name: str = Field(default="", alias="prefixPluginName")
    prefix_match_info_producer_name: str = Field(default="", alias="prefixMatchInfoProducerName")

    _producer_name = field_validator("prefix_match_info_producer_name")(check_prefix_producer_name)

    @model_validator(mode="after")
    def _one_rule(self) -> Params:
        legacy = {"threshold", "hash_block_size"} & self.model_fields_set
        if legacy and "decider_plugin_name" in self.model_fields_set:
            raise ValueError(
                "threshold/hashBlockSize (the v0.5 rule) cannot be combined with deciderPluginName; "
                "use a prefix-based-pd-decider with nonCachedTokens instead"
            )
        return self

    @property
    def uses_legacy_rule(self) -> bool:
        return bool({"threshold", "hash_block_size"} & self.model_fields_set)


class PdProfileHandler:
    def __init__(
        self,
        name: str = TYPE,
        recorder: Recorder | None = None,
        decode_profile: str = DEFAULT_DECODE_PROFILE,
        prefill_profile: str = DEFAULT_PREFILL_PROFILE,
        decider: DeciderRef | None = None,
        decider_required: bool = False,
        threshold: int = 0,
        hash_block_size: int = DEFAULT_HASH_BLOCK_SIZE,
        primary_port: int = 0,
        match_key: StateKey[PrefixMatch] = PREFIX_MATCH_KEY,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = match_key
        self._recorder = recorder
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.decider = decider
        self.decider_required = decider_required
        self.threshold = threshold
        self.hash_block_size = hash_block_size
        self.primary_port = primary_port

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def consumes(self) -> frozenset[str]:
        if self.decider is not None:
            required = self.decider.requires()
            if required or self.decider_required:
                return required
        if self.threshold > 0:
            return frozenset({self.match_key.name})
        return frozenset()

    def _legacy_rule(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint) -> bool:
        if self.threshold == 0:
            return True
        chars = prompt_chars(request)
        match = cycle.read(self.match_key)
        matched = match.matched_blocks(endpoint.key) if match is not None else 0
        hit_chars = min(max(matched - 1, 0) * self.hash_block_size, chars)
        return chars - hit_chars >= self.threshold

    def _disaggregate(self, cycle: CycleState, request: InferenceRequest, endpoint: Endpoint) -> bool:
        if self.decider is not None:
            try:
                decider = self.decider.get()
            except LookupError:
                if self.decider_required:
                    raise
                self.decider = None  # no default decider configured: the v0.5 rule applies
            else:
                return decider.disaggregate(cycle, request, endpoint)
        return self._legacy_rule(cycle, request, endpoint)

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]:
        decode = self.decode_profile
        if decode not in results:
            view = profiles.get(decode)
            return {decode: view} if view is not None else {}
        decode_result = results[decode]
        prefill = profiles.get(self.prefill_profile)
        if (
            decode_result is None
            or not decode_result.target_endpoints
            or prefill is None
            or self.prefill_profile in results
        ):
            return {}
        if self._disaggregate(cycle, request, decode_result.target_endpoints[0]):
            self._record(request, DECISION_PREFILL_DECODE)
            return {self.prefill_profile: prefill}
        self._record(request, DECISION_DECODE_ONLY)
        return {}

    def _record(self, request: InferenceRequest, decision: str) -> None:
        if self._recorder is not None:
            self._recorder.pd_decision(self._typed_name, model_label(request), decision)

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        decode = results.get(self.decode_profile)
        if decode is not None and decode.target_endpoints and self.primary_port:
            request_headers(cycle)[DATA_PARALLEL_ENDPOINT_HEADER] = first_hostport(decode)
            decode = with_port(decode, self.primary_port)
        kept: dict[str, ProfileResult | None] = {self.decode_profile: decode}
        prefill = results.get(self.prefill_profile)
        if prefill is not None:
            kept[self.prefill_profile] = prefill
        return SchedulingResult(kept, self.decode_profile)

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        set_disagg_headers(cycle, result.profile_results, self.prefill_profile, DEFAULT_ENCODE_PROFILE)


def factory(name: str, params: Params, handle: Handle) -> PdProfileHandler:
    log.info("plugin_deprecated plugin=%s type=%s replacement=disagg-profile-handler", name, TYPE)
    explicit = "decider_plugin_name" in params.model_fields_set
    decider = None
    if not params.uses_legacy_rule:
        decider = DeciderRef("deciderPluginName", params.decider_plugin_name, handle)
    return PdProfileHandler(
        name,
        handle.recorder,
        params.decode_profile,
        params.prefill_profile,
        decider,
        explicit,
        params.threshold,
        params.hash_block_size,
        params.primary_port,
        prefix_match_key(params.prefix_match_info_producer_name),
    )
