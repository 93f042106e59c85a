"""Tests for llm_epp.scheduling.scheduler: the profile-handler loop, failure to find an endpoint, and
the scheduler timing."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from llm_epp.framework import (
    CycleState,
    InferenceRequest,
    ProfileResult,
    SchedulingResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.scheduling import ProfileView
from llm_epp.plugins.scheduling.single_profile_handler import SingleProfileHandler
from llm_epp.scheduling import Scheduler, SchedulerProfile, SchedulingFailedError, WeightedScorer
from llm_epp.scheduling import scheduler as scheduler_module
from tests.unit.builders import FakeFilter, FakePicker, FakeRecorder, FakeScorer, endpoints, names, request


def _profile(
    name: str, recorder: FakeRecorder, keep: set[str] | None = None, picker: FakePicker | None = None
) -> SchedulerProfile:
    return SchedulerProfile(
        name,
        [FakeFilter(f"{name}-filter", keep=keep)],
        [WeightedScorer(FakeScorer(f"{name}-scorer", {"a": 0.1, "b": 0.9, "c": 0.5}))],
        picker or FakePicker(f"{name}-picker"),
        recorder,
    )


class TwoRoundHandler:
    """Runs `prefill` first, then `decode` once prefill has a result; decode is primary."""

    typed_name = TypedName("two-round-handler", "two-round-handler")

    def __init__(self) -> None:
        self.rounds: list[list[str]] = []

    def pick_profiles(
        self,
        cycle: CycleState,
        request: InferenceRequest,
        profiles: Mapping[str, ProfileView],
        results: Mapping[str, ProfileResult | None],
    ) -> Mapping[str, ProfileView]:
        if not results:
            chosen = {"prefill": profiles["prefill"]}
        elif "decode" not in results:
            chosen = {"decode": profiles["decode"]}
        else:
            chosen = {}
        self.rounds.append(list(chosen))
        return chosen

    def process_results(
        self, cycle: CycleState, request: InferenceRequest, results: Mapping[str, ProfileResult | None]
    ) -> SchedulingResult:
        return SchedulingResult(dict(results), "decode")


class EndlessHandler(TwoRoundHandler):
    def pick_profiles(self, cycle, request, profiles, results):  # type: ignore[no-untyped-def]
        self.rounds.append(list(profiles))
        return profiles

    def process_results(self, cycle, request, results):  # type: ignore[no-untyped-def]
        return SchedulingResult(dict(results), next(iter(results)))


def test_single_profile_picks_the_best_endpoint() -> None:
    recorder = FakeRecorder()
    scheduler = Scheduler(SingleProfileHandler(), {"default": _profile("default", recorder)}, recorder)
    result = scheduler.schedule(request(), endpoints("a", "b", "c"))
    assert result.primary_profile_name == "default"
    assert result.primary is not None
    assert names(result.primary.target_endpoints) == ["b"]
    assert result.primary.scores[result.primary.target_endpoints[0].key]["total"] == pytest.approx(0.9)


def test_the_handler_is_asked_until_it_returns_no_profile() -> None:
    recorder = FakeRecorder()
    handler = TwoRoundHandler()
    profiles = {
        "prefill": _profile("prefill", recorder, keep={"a"}),
        "decode": _profile("decode", recorder, keep={"b", "c"}),
    }
    result = Scheduler(handler, profiles, recorder).schedule(request(), endpoints("a", "b", "c"))
    assert handler.rounds == [["prefill"], ["decode"], []]
    assert set(result.profile_results) == {"prefill", "decode"}
    prefill = result.profile_results["prefill"]
    assert prefill is not None
    assert names(prefill.target_endpoints) == ["a"]
    assert result.primary is not None
    assert names(result.primary.target_endpoints) == ["b"]


def test_every_profile_sees_the_whole_snapshot() -> None:
    recorder = FakeRecorder()
    profiles = {"prefill": _profile("prefill", recorder, keep={"a"}), "decode": _profile("decode", recorder)}
    Scheduler(TwoRoundHandler(), profiles, recorder).schedule(request(), endpoints("a", "b"))
    decode_filter = profiles["decode"].filters[0]
    assert isinstance(decode_filter, FakeFilter)
    assert decode_filter.calls == [["a", "b"]]


def test_a_failed_secondary_profile_is_kept_as_none() -> None:
    recorder = FakeRecorder()
    profiles = {"prefill": _profile("prefill", recorder, keep=set()), "decode": _profile("decode", recorder)}
    result = Scheduler(TwoRoundHandler(), profiles, recorder).schedule(request(), endpoints("a", "b"))
    assert result.profile_results["prefill"] is None
    assert result.primary is not None


def test_filters_leaving_nothing_raise_scheduling_failed() -> None:
    recorder = FakeRecorder()
    scheduler = Scheduler(SingleProfileHandler(), {"default": _profile("default", recorder, keep=set())}, recorder)
    with pytest.raises(SchedulingFailedError):
        scheduler.schedule(request(), endpoints("a", "b"))


def test_no_endpoints_raise_scheduling_failed() -> None:
    recorder = FakeRecorder()
    scheduler = Scheduler(SingleProfileHandler(), {"default": _profile("default", recorder)}, recorder)
    with pytest.raises(SchedulingFailedError):
        scheduler.schedule(request(), [])


def test_a_primary_with_no_target_raises_scheduling_failed() -> None:
    recorder = FakeRecorder()
    empty = FakePicker("empty", result=ProfileResult(()))
    scheduler = Scheduler(SingleProfileHandler(), {"default": _profile("default", recorder, picker=empty)}, recorder)
    with pytest.raises(SchedulingFailedError):
        scheduler.schedule(request(), endpoints("a"))


def test_a_failed_primary_raises_even_when_another_profile_succeeded() -> None:
    recorder = FakeRecorder()
    profiles = {"prefill": _profile("prefill", recorder), "decode": _profile("decode", recorder, keep=set())}
    with pytest.raises(SchedulingFailedError):
        Scheduler(TwoRoundHandler(), profiles, recorder).schedule(request(), endpoints("a"))


@pytest.mark.parametrize("keep", [None, set()], ids=["success", "failure"])
def test_scheduler_duration_is_recorded_once(keep: set[str] | None) -> None:
    recorder = FakeRecorder()
    scheduler = Scheduler(SingleProfileHandler(), {"default": _profile("default", recorder, keep)}, recorder)
    try:
        scheduler.schedule(request(), endpoints("a"))
    except SchedulingFailedError:
        pass
    assert len(recorder.scheduler_durations) == 1


def test_scheduler_duration_is_recorded_when_the_handler_raises() -> None:
    class Broken(TwoRoundHandler):
        def process_results(self, cycle, request, results):  # type: ignore[no-untyped-def]
            raise RuntimeError("handler bug")

    recorder = FakeRecorder()
    profiles = {"prefill": _profile("prefill", recorder), "decode": _profile("decode", recorder)}
    with pytest.raises(RuntimeError, match="handler bug"):
        Scheduler(Broken(), profiles, recorder).schedule(request(), endpoints("a"))
    assert len(recorder.scheduler_durations) == 1


def test_a_handler_that_never_stops_is_cut_off(caplog: pytest.LogCaptureFixture) -> None:
    recorder = FakeRecorder()
    handler = EndlessHandler()
    scheduler = Scheduler(handler, {"default": _profile("default", recorder)}, recorder)
    with caplog.at_level("WARNING", logger="llm_epp.scheduling.scheduler"):
        result = scheduler.schedule(request(), endpoints("a"))
    assert len(handler.rounds) == scheduler_module._MAX_ROUNDS
    assert result.primary is not None
    assert any("profile_handler_loop_limit" in r.getMessage() for r in caplog.records)


def test_the_given_cycle_state_is_used() -> None:
    mark: StateKey[str] = StateKey("mark")

    class Marking(FakeFilter):
        def filter(self, cycle, request, endpoints):  # type: ignore[no-untyped-def]
            cycle.write(mark, "seen")
            return endpoints

    recorder = FakeRecorder()
    profile = SchedulerProfile("default", [Marking("m")], [], FakePicker(), recorder)
    cycle = CycleState()
    Scheduler(SingleProfileHandler(), {"default": profile}, recorder).schedule(request(), endpoints("a"), cycle)
    assert cycle.read(mark) == "seen"


def test_a_scheduler_needs_a_profile() -> None:
    with pytest.raises(ValueError, match="at least one profile"):
        Scheduler(SingleProfileHandler(), {}, FakeRecorder())
