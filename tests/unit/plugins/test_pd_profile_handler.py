"""Tests for pd-profile-handler: decode first and primary, prefill when the decider (or the v0.5 threshold
rule) approves, pd decisions counted, primaryPort rewriting and the prefill header."""

from __future__ import annotations

from typing import Any

import pytest

from llm_epp.framework import CycleState, InferenceRequest, TypedName
from llm_epp.framework.requestcontrol import REQUEST_HEADERS_KEY
from llm_epp.plugins.disagg import pd_profile_handler as mod
from llm_epp.plugins.disagg.always_disagg_pd_decider import AlwaysDisaggPdDecider
from llm_epp.plugins.disagg.prefix_based_pd_decider import PrefixBasedPdDecider
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PREFIX_MATCH_KEY
from tests.unit.builders import FakeHandle, key, names, request
from tests.unit.plugins.disagg_support import match, pool, prompt_request, scheduler


def _handler(params: dict[str, Any], plugins: dict[str, Any] | None = None) -> tuple[mod.PdProfileHandler, FakeHandle]:
    handle = FakeHandle(plugins=dict(plugins or {}))
    return mod.factory("pd", mod.Params.model_validate(params), handle), handle


def _run(
    handler: mod.PdProfileHandler, handle: FakeHandle, req: InferenceRequest, cycle: CycleState | None = None
) -> tuple[Any, CycleState]:
    cycle = cycle or CycleState()
    result = scheduler(handler, handle.recorder).schedule(req, pool(), cycle)
    handler.pre_request(cycle, req, result)
    return result, cycle


def test_named_decider_drives_the_prefill_stage() -> None:
    handler, handle = _handler({"deciderPluginName": "always"}, {"always": AlwaysDisaggPdDecider("always")})
    result, cycle = _run(handler, handle, request())
    assert result.primary_profile_name == "decode"
    assert names(result.primary.target_endpoints) == ["dec"]
    assert names(result.profile_results["prefill"].target_endpoints) == ["pre"]
    assert cycle.read(REQUEST_HEADERS_KEY) == {"x-prefiller-host-port": "10.0.0.2:8200"}
    assert handle.recorder.pd_decisions == [(TypedName(mod.TYPE, "pd"), "m", "prefill-decode")]


def test_default_decider_name_is_used_when_configured() -> None:
    decider = PrefixBasedPdDecider("prefix-based-pd-decider", 16)
    handler, handle = _handler({}, {"prefix-based-pd-decider": decider})
    assert handler.consumes == {PREFIX_MATCH_KEY.name}
    warm = CycleState()
    warm.write(PREFIX_MATCH_KEY, match({key("dec"): 6}))
    result, _ = _run(handler, handle, prompt_request(400), warm)
    assert list(result.profile_results) == ["decode"]
    assert handle.recorder.pd_decisions[-1][2] == "decode-only"


def test_without_any_decider_threshold_zero_disaggregates_everything() -> None:
    handler, handle = _handler({})
    result, _ = _run(handler, handle, prompt_request(8))
    assert sorted(result.profile_results) == ["decode", "prefill"]


@pytest.mark.parametrize(
    ("prompt_chars", "matched_blocks", "expected"),
    [
        (1000, 0, True),  # 1000 uncached characters >= 500
        (400, 0, False),  # shorter than the threshold
        (1000, 8, True),  # hit = (8 - 1) x 64 = 448: 552 uncached
        (1000, 9, False),  # hit = (9 - 1) x 64 = 512: 488 uncached
        (1000, 1, True),  # the first matched block does not count
    ],
)
def test_v05_threshold_rule(prompt_chars: int, matched_blocks: int, expected: bool) -> None:
    handler, handle = _handler({"threshold": 500, "hashBlockSize": 64})
    cycle = CycleState()
    cycle.write(PREFIX_MATCH_KEY, match({key("dec"): matched_blocks}))
    result, _ = _run(handler, handle, prompt_request(prompt_chars), cycle)
    assert ("prefill" in result.profile_results) is expected
    assert handle.recorder.pd_decisions[-1][2] == ("prefill-decode" if expected else "decode-only")


def test_primary_port_rewrites_decode_targets_and_sets_the_data_parallel_header() -> None:
    handler, handle = _handler({"primaryPort": 9000, "deciderPluginName": "a"}, {"a": AlwaysDisaggPdDecider("a")})
    result, cycle = _run(handler, handle, request())
    assert [e.metadata.port for e in result.primary.target_endpoints] == [9000]
    assert result.profile_results["prefill"].target_endpoints[0].metadata.port == 8200
    assert cycle.read(REQUEST_HEADERS_KEY) == {
        "x-data-parallel-host-port": "10.0.0.1:8000",
        "x-prefiller-host-port": "10.0.0.2:8200",
    }


def test_explicit_decider_that_is_missing_fails_by_name() -> None:
    handler, handle = _handler({"deciderPluginName": "missing"})
    with pytest.raises(LookupError, match="missing"):
        scheduler(handler, handle.recorder).schedule(request(), pool())


def test_v05_rule_and_decider_name_together_are_rejected() -> None:
    with pytest.raises(ValueError, match="threshold"):
        mod.Params.model_validate({"threshold": 10, "deciderPluginName": "x"})
    with pytest.raises(ValueError):
        mod.Params.model_validate({"primaryPort": 70000})
