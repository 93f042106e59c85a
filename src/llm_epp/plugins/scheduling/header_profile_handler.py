"""header-profile-handler

Scheduling intent:
    Run exactly one scheduling profile per request: the one a request header names. One EPP can then
    serve every stage of a disaggregated pipeline (`encode`, `prefill`, `decode`) for a coordinator that
    already knows which stage each call is for and makes one scheduling call per stage.

Inputs consumed:
    The request header `headerName` (its value is matched verbatim against the profile names).
    - With one profile configured, that profile always runs, header or not.
    - Otherwise the named profile runs alone; a missing or blank header runs `defaultProfile`.
    - A value naming no configured profile (or a missing header when `defaultProfile` is not configured)
      runs nothing, and the request fails like any request no profile could place (HTTP 429, as the
      reference answers).

Configuration:
    headerName (string, default `EPP-Profile`; matched case-insensitively).
    defaultProfile (string, default `decode`): the profile for requests without the header.
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

TYPE = "header-profile-handler"
DEFAULT_HEADER = "EPP-Profile"
DEFAULT_PROFILE = "decode"

log = logging.getLogger(__name__)


class Params(PluginParams):
    header_name: str = Field(default=DEFAULT_HEADER, alias="headerName")
    default_profile: str = Field(default=DEFAULT_PROFILE, alias="defaultProfile")


class HeaderProfileHandler:
    def __init__(self, name: str = TYPE, params: Params | None = None) -> None:
        params = params or Params()
        self._typed_name = TypedName(TYPE, name)
        self.header = params.header_name.strip().lower() or DEFAULT_HEADER.lower()
        self.default_profile = params.default_profile.strip() or DEFAULT_PROFILE

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
        if len(profiles) == 1:
            return profiles
        named = request.headers.get(self.header, "").strip()
        chosen = named or self.default_profile
        profile = profiles.get(chosen)
        if profile is None:
            log.info(
                "no_profile_selected header=%s value=%r resolved=%r profiles=%s",
                self.header,
                named,
                chosen,
                sorted(profiles),
            )
            return {}
        return {chosen: profile}

    def process_results(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        results: Mapping[str, ProfileResult | None],
    ) -> SchedulingResult:
        # no profile ran (unknown value): an empty result, which the scheduler reports as "no target"
        name = next(iter(results), "")
        return SchedulingResult(dict(results), name)


def factory(name: str, params: Params, handle: Handle) -> HeaderProfileHandler:
    return HeaderProfileHandler(name, params)
