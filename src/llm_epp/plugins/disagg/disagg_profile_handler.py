"""disagg-profile-handler

Scheduling intent:
    Run prefill/decode (P/D), encode/decode (E/D) or encode/prefill/decode (E/P/D) disaggregation. The
    decode profile always runs and its result is primary (it is where Envoy sends the request).

    stageOrder `decode-first` (default): decode runs first; then, when an encode profile is configured
    and `deciders.encode` approves for the picked decode endpoint, the encode profile; then, when a
    prefill profile is configured and `deciders.prefill` approves, the prefill profile. The decode pick
    is published in the CycleState (`peer-endpoint`) for the prefill profile's plugins.
    stageOrder `prefill-first`: the prefill profile runs whenever it is configured (no prefill decider
    allowed), then encode if its decider approves (endpoint unknown: None), then decode; the prefill pick
    is published as `peer-endpoint` for the decode profile's plugins.
    A stage without a decider is disabled. Each decider is asked at most once per request. When the
    stages are done the decision (decode-only, prefill-decode, encode-decode, encode-prefill-decode) is
    counted with the recorder's `disagg_decision`.

    PreRequest: writes `x-prefiller-host-port` (the first prefill target's ip:port) and
    `x-encoder-hosts-ports` (every encode target, comma-separated) into the upstream request headers
    (`REQUEST_HEADERS_KEY`); the decode pod's sidecar reads them. The request path drops client copies.

Inputs consumed:
    The profiles' results; whatever its deciders read (e.g. `prefix-based-pd-decider` needs the prefix
    match, so the handler declares that data as consumed and a producer is added when missing).

Configuration:
    stageOrder (string, default "decode-first"): `decode-first` or `prefill-first` (also accepted:
        `decode`, `prefill`, any case, with `-`/`_` ignored).
    profiles.decode / profiles.prefill / profiles.encode (strings, defaults "decode", "prefill",
        "encode"): the scheduling profile names of the stages.
    deciders.prefill / deciders.encode (plugin names, default unset = stage disabled).
    Deprecated flat form (use one form only): decodeProfile, prefillProfile, encodeProfile,
        prefillDeciderPluginName, encodeDeciderPluginName, deciderPluginName (alias of
        prefillDeciderPluginName).
    A prefill decider together with `prefill-first` is rejected.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import (
    CycleState,
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
    DEFAULT_DECODE_PROFILE,
    DEFAULT_ENCODE_PROFILE,
    DEFAULT_PREFILL_PROFILE,
    PEER_ENDPOINT_KEY,
    DeciderRef,
    decision_type,
    model_label,
    set_disagg_headers,
)

TYPE = "disagg-profile-handler"

DECODE_FIRST = "decode-first"
PREFILL_FIRST = "prefill-first"

log = logging.getLogger(__name__)


def parse_stage_order(value: str) -> str:
    folded = value.replace("-", "").replace("_", "").lower()
    if folded in ("", "decodefirst", "decode"):
        return DECODE_FIRST
    if folded in ("prefillfirst", "prefill"):
        return PREFILL_FIRST
    raise ValueError(f"invalid stageOrder {value!r}: use {DECODE_FIRST!r} or {PREFILL_FIRST!r}")


class _Profiles(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    decode: str = ""
    prefill: str = ""
    encode: str = ""


class _Deciders(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    prefill: str = ""
    encode: str = ""


_LEGACY = {
    "decode_profile": "decodeProfile",
    "prefill_profile": "prefillProfile",
    "encode_profile": "encodeProfile",
    "prefill_decider_plugin_name": "prefillDeciderPluginName",
    "encode_decider_plugin_name": "encodeDeciderPluginName",
    "decider_plugin_name": "deciderPluginName",
}


class Params(PluginParams):
    stage_order: str = Field(default="", alias="stageOrder")
    profiles: _Profiles = _Profiles()
    deciders: _Deciders = _Deciders()
    decode_profile: str = Field(default="", alias="decodeProfile")
    prefill_profile: str = Field(default="", alias="prefillProfile")
    encode_profile: str = Field(default="", alias="encodeProfile")
    prefill_decider_plugin_name: str = Field(default="", alias="prefillDeciderPluginName")
    encode_decider_plugin_name: str = Field(default="", alias="encodeDeciderPluginName")
    decider_plugin_name: str = Field(default="", alias="deciderPluginName")

    @model_validator(mode="after")
    def _one_form(self) -> Params:
        parse_stage_order(self.stage_order)
        legacy = [alias for field, alias in _LEGACY.items() if getattr(self, field)]
        nested = [k for k in ("profiles", "deciders") if k in self.model_fields_set]
        if legacy and nested:
            raise ValueError(
                f"mixes the nested form ({', '.join(nested)}) with deprecated flat fields ({', '.join(legacy)}); "
                "use profiles/deciders only"
            )
        if self.resolved()[4] == PREFILL_FIRST and self.resolved()[3]:
            raise ValueError(f"a prefill decider is not supported with stageOrder {PREFILL_FIRST!r}")
        return self

    def resolved(self) -> tuple[str, str, str, str, str, str]:
        """(decode, prefill, encode profile names, prefill decider, stage order, encode decider)."""
        decode = self.profiles.decode or self.decode_profile or DEFAULT_DECODE_PROFILE
        prefill = self.profiles.prefill or self.prefill_profile or DEFAULT_PREFILL_PROFILE
        encode = self.profiles.encode or self.encode_profile or DEFAULT_ENCODE_PROFILE
        prefill_decider = self.deciders.prefill or self.prefill_decider_plugin_name or self.decider_plugin_name
        encode_decider = self.deciders.encode or self.encode_decider_plugin_name
        return decode, prefill, encode, prefill_decider, parse_stage_order(self.stage_order), encode_decider


class DisaggProfileHandler:
    def __init__(
        self,
        name: str = TYPE,
        recorder: Recorder | None = None,
        decode_profile: str = DEFAULT_DECODE_PROFILE,
        prefill_profile: str = DEFAULT_PREFILL_PROFILE,
        encode_profile: str = DEFAULT_ENCODE_PROFILE,
        prefill_decider: DeciderRef | None = None,
        encode_decider: DeciderRef | None = None,
        stage_order: str = DECODE_FIRST,
    ) -> None:
        self._typed_name = TypedName(TYPE, name)
        self._recorder = recorder
        self.decode_profile = decode_profile
        self.prefill_profile = prefill_profile
        self.encode_profile = encode_profile
        self.prefill_decider = prefill_decider
        self.encode_decider = encode_decider
        self.stage_order = stage_order
        # stages a decider declined in this request (a declined stage is not asked again)
        self._declined: StateKey[set[str]] = StateKey(f"disagg-declined/{name}")

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    @property
    def consumes(self) -> frozenset[str]:
        out: frozenset[str] = frozenset()
        for ref in (self.prefill_decider, self.encode_decider):
            if ref is not None:
                out |= ref.requires()
        return out

    def _declined_stages(self, cycle: CycleState) -> set[str]:
        declined = cycle.read(self._declined)
        if declined is None:
            declined = set()
            cycle.write(self._declined, declined)
        return declined

    def _stage(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profile: str,
        ref: DeciderRef | None,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
        decode_result: ProfileResult | None,
    ) -> ProfileView | None:
        """The stage's profile when it should run now, else None (recording a decline)."""
        view = profiles.get(profile)
        if view is None or profile in results:
            return None
        declined = self._declined_stages(cycle)
        if profile in declined:
            return None
        endpoint = decode_result.target_endpoints[0] if decode_result is not None else None
        if ref is not None and ref.get().disaggregate(cycle, request, endpoint):
            return view
        declined.add(profile)
        return None

    def _finish(self, request: InferenceRequest, results: Mapping[str, ProfileResult | None]) -> None:
        decision = decision_type(
            results.get(self.encode_profile) is not None, results.get(self.prefill_profile) is not None
        )
        if self._recorder is not None:
            self._recorder.disagg_decision(self._typed_name, model_label(request), decision)

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]:
        if self.stage_order == PREFILL_FIRST:
            return self._pick_prefill_first(cycle, request, profiles, results)
        decode = self.decode_profile
        if decode not in results:
            view = profiles.get(decode)
            return {decode: view} if view is not None else {}
        decode_result = results[decode]
        if decode_result is None or not decode_result.target_endpoints:
            return {}
        for profile, ref in ((self.encode_profile, self.encode_decider), (self.prefill_profile, self.prefill_decider)):
            view = self._stage(cycle, request, profile, ref, profiles, results, decode_result)
            if view is not None:
                if profile == self.prefill_profile:
                    cycle.write(PEER_ENDPOINT_KEY, decode_result.target_endpoints[0])
                return {profile: view}
        self._finish(request, results)
        return {}

    def _pick_prefill_first(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]:
        decode = self.decode_profile
        if decode in results:
            decode_result = results[decode]
            if decode_result is not None and decode_result.target_endpoints:
                self._finish(request, results)
            return {}
        prefill = self.prefill_profile
        if prefill in profiles and prefill not in results:
            return {prefill: profiles[prefill]}
        view = self._stage(cycle, request, self.encode_profile, self.encode_decider, profiles, results, None)
        if view is not None:
            return {self.encode_profile: view}
        decode_view = profiles.get(decode)
        if decode_view is None:
            return {}
        prefill_result = results.get(prefill)
        if prefill_result is not None and prefill_result.target_endpoints:
            cycle.write(PEER_ENDPOINT_KEY, prefill_result.target_endpoints[0])
        return {decode: decode_view}

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        kept: dict[str, ProfileResult | None] = {self.decode_profile: results.get(self.decode_profile)}
        for profile in (self.prefill_profile, self.encode_profile):
            result = results.get(profile)
            if result is not None:
                kept[profile] = result
        return SchedulingResult(kept, self.decode_profile)

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        set_disagg_headers(cycle, result.profile_results, self.prefill_profile, self.encode_profile)


def factory(name: str, params: Params, handle: Handle) -> DisaggProfileHandler:
    decode, prefill, encode, prefill_decider, order, encode_decider = params.resolved()
    legacy = [alias for field, alias in _LEGACY.items() if getattr(params, field)]
    if legacy:
        log.info("config_field_deprecated plugin=%s fields=%s replacement=profiles/deciders", name, ",".join(legacy))
    if not prefill_decider:
        log.info("disagg_stage_disabled plugin=%s stage=prefill reason=no deciders.prefill", name)
    if not encode_decider:
        log.info("disagg_stage_disabled plugin=%s stage=encode reason=no deciders.encode", name)
    return DisaggProfileHandler(
        name,
        handle.recorder,
        decode,
        prefill,
        encode,
        DeciderRef("deciders.prefill", prefill_decider, handle) if prefill_decider else None,
        DeciderRef("deciders.encode", encode_decider, handle) if encode_decider else None,
        order,
    )
