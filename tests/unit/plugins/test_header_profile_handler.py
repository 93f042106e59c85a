"""Tests for header-profile-handler: exactly one profile runs, the one the request header names."""

from __future__ import annotations

import pytest

from llm_epp.config.loader import load_config_text
from llm_epp.framework import CycleState, ProfileResult
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.scheduling.header_profile_handler import HeaderProfileHandler, Params
from tests.unit.builders import FakeRecorder, endpoints, request


class _Profile:
    def __init__(self, name: str) -> None:
        self.name = name


PROFILES = {n: _Profile(n) for n in ("encode", "prefill", "decode")}


@pytest.mark.parametrize(
    ("headers", "chosen"),
    [
        ({"epp-profile": "prefill"}, ["prefill"]),
        ({"epp-profile": " encode "}, ["encode"]),
        ({}, ["decode"]),
        ({"epp-profile": "  "}, ["decode"]),
        ({"epp-profile": "Prefill"}, []),
        ({"epp-profile": "nope"}, []),
    ],
    ids=["named", "trimmed", "missing-uses-default", "blank-uses-default", "case-sensitive-value", "unknown"],
)
def test_pick(headers: dict[str, str], chosen: list[str]) -> None:
    picked = HeaderProfileHandler().pick_profiles(CycleState(), request(headers=headers), PROFILES, {})
    assert list(picked) == chosen


def test_runs_once() -> None:
    results = {"decode": ProfileResult(tuple(endpoints("a")))}
    assert HeaderProfileHandler().pick_profiles(CycleState(), request(), PROFILES, results) == {}


def test_a_single_profile_always_runs() -> None:
    only = {"main": _Profile("main")}
    picked = HeaderProfileHandler().pick_profiles(CycleState(), request(headers={"epp-profile": "x"}), only, {})
    assert list(picked) == ["main"]


def test_custom_header_and_default() -> None:
    handler = HeaderProfileHandler(params=Params(header_name="X-Stage", default_profile="prefill"))
    assert list(handler.pick_profiles(CycleState(), request(), PROFILES, {})) == ["prefill"]
    picked = handler.pick_profiles(CycleState(), request(headers={"x-stage": "encode"}), PROFILES, {})
    assert list(picked) == ["encode"]
    no_default = HeaderProfileHandler(params=Params(default_profile="missing"))
    assert no_default.pick_profiles(CycleState(), request(), PROFILES, {}) == {}


CONFIG = """
apiVersion: inference.networking.x-k8s.io/v1alpha1
kind: EndpointPickerConfig
plugins:
- type: label-selector-filter
  name: prefill-only
  parameters: {matchLabels: {llm-d.ai/role: prefill}}
- type: label-selector-filter
  name: decode-only
  parameters: {matchLabels: {llm-d.ai/role: decode}}
- type: header-profile-handler
schedulingProfiles:
- name: prefill
  plugins: [{pluginRef: prefill-only}]
- name: decode
  plugins: [{pluginRef: decode-only}]
"""


def test_through_the_scheduler_the_header_picks_the_stage_and_unknown_fails() -> None:
    from llm_epp.framework import Endpoint, EndpointMetadata
    from llm_epp.scheduling.scheduler import SchedulingFailedError

    pool = [
        Endpoint(EndpointMetadata(e.key, e.metadata.address, 8000, labels={"llm-d.ai/role": role}))
        for e, role in zip(endpoints("p", "d"), ("prefill", "decode"), strict=True)
    ]
    scheduler = load_config_text(CONFIG, builtin_registry(), FakeRecorder()).scheduler
    result = scheduler.schedule(request(headers={"epp-profile": "prefill"}), pool)
    assert result.primary_profile_name == "prefill"
    assert result.primary is not None and result.primary.target_endpoints[0].key.name == "p"
    result = scheduler.schedule(request(), pool)
    assert result.primary_profile_name == "decode"
    assert result.primary is not None and result.primary.target_endpoints[0].key.name == "d"
    with pytest.raises(SchedulingFailedError):
        scheduler.schedule(request(headers={"epp-profile": "encode"}), pool)
