"""data-parallel-profile-handler

Scheduling intent:
    Deprecated llm-d handler for data-parallel model servers reached through one port (Istio < 1.28.1;
    use `single-profile-handler` otherwise). Runs the one configured profile; the chosen endpoint's
    `ip:port` goes to the upstream request header `x-data-parallel-host-port` and every target's port is
    replaced by `primaryPort`, so Envoy connects to the primary port and the pod's sidecar forwards to
    the rank named in the header.

Inputs consumed:
    The profile's result.

Configuration:
    primaryPort (int, default 8000): the port Envoy connects to; 1-65535, or 0 to keep the targets'
        own ports (the header is still written).
    Exactly one scheduling profile (rejected by the config loader otherwise).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Handle,
    InferenceRequest,
    PluginParams,
    ProfileResult,
    SchedulingResult,
    TypedName,
)
from llm_epp.framework.scheduling import ProfileView
from llm_epp.plugins.disagg.common import DATA_PARALLEL_ENDPOINT_HEADER, request_headers
from llm_epp.plugins.disagg.ports import first_hostport, with_port

TYPE = "data-parallel-profile-handler"

log = logging.getLogger(__name__)


class Params(PluginParams):
    primary_port: int = Field(default=8000, ge=0, le=65535, alias="primaryPort")


class DataParallelProfileHandler:
    max_profiles = 1

    def __init__(self, name: str = TYPE, primary_port: int = 8000) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.primary_port = primary_port

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]:
        if results:
            return {}
        return profiles

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        name = next(iter(results))
        result = results[name]
        if result is None or not result.target_endpoints:
            return SchedulingResult({name: result}, name)
        request_headers(cycle)[DATA_PARALLEL_ENDPOINT_HEADER] = first_hostport(result)
        if self.primary_port:
            result = with_port(result, self.primary_port)
        return SchedulingResult({name: result}, name)


def factory(name: str, params: Params, handle: Handle) -> DataParallelProfileHandler:
    log.info("plugin_deprecated plugin=%s type=%s replacement=single-profile-handler (Istio >= 1.28.1)", name, TYPE)
    return DataParallelProfileHandler(name, params.primary_port)
