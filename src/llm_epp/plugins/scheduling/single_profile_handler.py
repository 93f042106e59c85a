"""single-profile-handler

Scheduling intent:
    Run the one configured scheduling profile once; its result is the primary result.

Inputs consumed:
    None beyond the profile's own plugins.

Configuration:
    No parameters. Rejected by the config loader when more than one profile is configured.
"""

from __future__ import annotations

from collections.abc import Mapping

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

TYPE = "single-profile-handler"


class Params(PluginParams):
    pass


class SingleProfileHandler:
    max_profiles = 1

    def __init__(self, name: str = TYPE) -> None:
        self._typed_name = TypedName(TYPE, name)

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
        return SchedulingResult(dict(results), name)


def factory(name: str, params: Params, handle: Handle) -> SingleProfileHandler:
    return SingleProfileHandler(name)
