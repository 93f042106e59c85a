"""Tests for data-parallel-profile-handler: one profile, the chosen rank's ip:port in
x-data-parallel-host-port and the targets moved to primaryPort."""

from __future__ import annotations

import pytest

from llm_epp.framework import CycleState, ProfileResult
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.disagg import data_parallel_profile_handler as mod
from tests.unit.builders import FakeHandle, endpoint, request


def test_header_and_port_rewrite() -> None:
    handler = mod.factory("dp", mod.Params(), FakeHandle())
    cycle = CycleState()
    ranks = (endpoint("r1", address="10.0.0.5", port=8001), endpoint("r2", address="10.0.0.5", port=8002))
    out = handler.process_results(cycle, request(), {"default": ProfileResult(ranks)})
    assert out.primary_profile_name == "default"
    assert [(e.metadata.address, e.metadata.port) for e in out.primary.target_endpoints] == [
        ("10.0.0.5", 8000),
        ("10.0.0.5", 8000),
    ]
    assert [e.hostport for e in out.primary.target_endpoints] == ["10.0.0.5:8000", "10.0.0.5:8000"]
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-data-parallel-host-port": "10.0.0.5:8001"}


def test_ipv6_header_is_bracketed_and_port_zero_keeps_ports() -> None:
    handler = mod.factory("dp", mod.Params.model_validate({"primaryPort": 0}), FakeHandle())
    cycle = CycleState()
    out = handler.process_results(
        cycle, request(), {"p": ProfileResult((endpoint("r", address="fd00::1", port=8003),))}
    )
    assert out.primary.target_endpoints[0].metadata.port == 8003
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-data-parallel-host-port": "[fd00::1]:8003"}


def test_failed_profile_sets_no_header() -> None:
    cycle = CycleState()
    out = mod.DataParallelProfileHandler("dp").process_results(cycle, request(), {"p": None})
    assert out.primary is None
    assert cycle.read(REQUEST_HEADERS_KEY) is None


def test_runs_the_single_profile_once_and_declares_one_profile() -> None:
    handler = mod.DataParallelProfileHandler("dp")
    profiles = {"p": type("V", (), {"name": "p"})()}
    assert list(handler.pick_profiles(CycleState(), request(), profiles, {})) == ["p"]
    assert handler.pick_profiles(CycleState(), request(), profiles, {"p": None}) == {}
    assert mod.DataParallelProfileHandler.max_profiles == 1


def test_port_range() -> None:
    with pytest.raises(ValueError):
        mod.Params.model_validate({"primaryPort": 65536})
