"""The scheduler: asks the profile handler which profiles to run until it has no more, runs them, and
lets the handler combine the results. Pure and synchronous; runs to completion on one snapshot."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence

from llm_epp.framework import (
    CycleState,
    Endpoint,
    InferenceRequest,
    ProfileHandler,
    ProfileResult,
    Recorder,
    SchedulingResult,
)
from llm_epp.scheduling.profile import SchedulerProfile

log = logging.getLogger(__name__)

_MAX_ROUNDS = 16


class SchedulingFailedError(Exception):
    """No profile produced a target endpoint (e.g. every endpoint was filtered out)."""


class Scheduler:
    def __init__(self, handler: ProfileHandler, profiles: Mapping[str, SchedulerProfile], recorder: Recorder) -> None:
        if not profiles:
            raise ValueError("a scheduler needs at least one profile")
        self.handler = handler
        self.profiles = dict(profiles)
        self._recorder = recorder

    def schedule(
        self, request: InferenceRequest, endpoints: Sequence[Endpoint], cycle: CycleState | None = None
    ) -> SchedulingResult:
        start = time.perf_counter()
        cycle = cycle if cycle is not None else CycleState()
        results: dict[str, ProfileResult | None] = {}
        try:
            for _ in range(_MAX_ROUNDS):
                chosen = self.handler.pick_profiles(cycle, request, self.profiles, results)
                if not chosen:
                    break
                for name in chosen:
                    results[name] = self.profiles[name].run(cycle, request, endpoints)
            else:
                log.warning("profile_handler_loop_limit handler=%s", self.handler.typed_name)
            result = self.handler.process_results(cycle, request, results)
        finally:
            self._recorder.scheduler_duration(time.perf_counter() - start)
        primary = result.primary
        if primary is None or not primary.target_endpoints:
            raise SchedulingFailedError("failed to find a target endpoint: every candidate was filtered out")
        return result
