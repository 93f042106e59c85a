"""disagg-headers-handler

Scheduling intent:
    Deprecated llm-d PreRequest plugin (`disagg-profile-handler` writes the headers itself): after a
    schedule, tell the decode pod's sidecar where its peers are. `x-prefiller-host-port` = the first
    target of the prefill profile (`ip:port`), `x-encoder-hosts-ports` = every target of the encode
    profile, comma-separated. A header whose profile did not run or found nothing is not sent. The
    request path drops any copy the client sent.

Inputs consumed:
    The SchedulingResult's profile results.

Configuration:
    prefillProfile (string, default "prefill"): the prefill profile's name.
    encodeProfile (string, default "encode"): the encode profile's name.
"""

from __future__ import annotations

from pydantic import Field

from llm_epp.framework import CycleState, Handle, InferenceRequest, PluginParams, SchedulingResult, TypedName
from llm_epp.plugins.disagg.common import DEFAULT_ENCODE_PROFILE, DEFAULT_PREFILL_PROFILE, set_disagg_headers

TYPE = "disagg-headers-handler"


class Params(PluginParams):
    prefill_profile: str = Field(default=DEFAULT_PREFILL_PROFILE, alias="prefillProfile")
    encode_profile: str = Field(default=DEFAULT_ENCODE_PROFILE, alias="encodeProfile")


class HeadersHandler:
    plugin_type = TYPE

    def __init__(
        self, name: str, prefill_profile: str = DEFAULT_PREFILL_PROFILE, encode_profile: str = DEFAULT_ENCODE_PROFILE
    ) -> None:
        self._typed_name = TypedName(self.plugin_type, name)
        self.prefill_profile = prefill_profile
        self.encode_profile = encode_profile

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        set_disagg_headers(cycle, result.profile_results, self.prefill_profile, self.encode_profile)


class DisaggHeadersHandler(HeadersHandler):
    plugin_type = TYPE


def factory(name: str, params: Params, handle: Handle) -> DisaggHeadersHandler:
    return DisaggHeadersHandler(name, params.prefill_profile, params.encode_profile)
