"""Tests for the single-profile-handler plugin: run the one profile once; its result is primary."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, ProfileResult, TypedName
from llm_epp.plugins.scheduling import single_profile_handler as mod
from llm_epp.plugins.scheduling.single_profile_handler import Params, SingleProfileHandler
from llm_epp.scheduling import Scheduler, SchedulerProfile
from tests.unit.builders import FakeFilter, FakeHandle, FakePicker, FakeRecorder, endpoint, endpoints, request


class _View:
    def __init__(self, name: str) -> None:
        self.name = name


def test_first_call_runs_the_profile() -> None:
    profiles = {"default": _View("default")}
    chosen = SingleProfileHandler().pick_profiles(CycleState(), request(), profiles, {})
    assert list(chosen) == ["default"]


@pytest.mark.parametrize(
    "result",
    [ProfileResult((endpoint("a"),)), None],
    ids=["succeeded", "failed"],
)
def test_once_the_profile_ran_nothing_more_runs(result: ProfileResult | None) -> None:
    profiles = {"default": _View("default")}
    chosen = SingleProfileHandler().pick_profiles(CycleState(), request(), profiles, {"default": result})
    assert dict(chosen) == {}


@pytest.mark.parametrize(
    "result",
    [ProfileResult((endpoint("a"),)), None],
    ids=["succeeded", "failed"],
)
def test_the_profile_result_is_primary(result: ProfileResult | None) -> None:
    out = SingleProfileHandler().process_results(CycleState(), request(), {"only": result})
    assert out.primary_profile_name == "only"
    assert dict(out.profile_results) == {"only": result}
    assert out.primary is result


def test_it_declares_one_profile_for_the_loader() -> None:
    assert SingleProfileHandler.max_profiles == 1


def test_scheduler_runs_the_profile_exactly_once() -> None:
    recorder = FakeRecorder()
    spy = FakeFilter("spy")
    profile = SchedulerProfile("default", [spy], [], FakePicker(), recorder)
    result = Scheduler(SingleProfileHandler(), {"default": profile}, recorder).schedule(request(), endpoints("a", "b"))
    assert spy.calls == [["a", "b"]]
    assert result.primary_profile_name == "default"


def test_identity() -> None:
    handler = mod.factory("handler", Params(), FakeHandle())
    assert handler.typed_name == TypedName("single-profile-handler", "handler")
