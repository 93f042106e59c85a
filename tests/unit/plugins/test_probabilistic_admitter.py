from __future__ import annotations

import random

import pytest

from llm_epp.framework import CycleState, EppError
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol.probabilistic_admitter import Params, ProbabilisticAdmitter
from tests.unit.builders import FakeHandle, endpoint, request


def _admitter(seed: int = 0, **params: object) -> ProbabilisticAdmitter:
    return ProbabilisticAdmitter("pa", Params.model_validate(params), random.Random(seed))


async def _refusals(a: ProbabilisticAdmitter, eps: list, priority: int, n: int = 400) -> int:
    refused = 0
    for _ in range(n):
        try:
            await a.admit(CycleState(), request(priority=priority), eps)
        except EppError as e:
            assert e.code.http_status == 429 and "sheddable request rejected" in e.message
            refused += 1
    return refused


async def test_refusals_grow_with_saturation_and_spare_non_sheddable_requests() -> None:
    a = _admitter()
    idle = [endpoint("a", queue=0, kv=0.1)]  # saturation 0.125: 0.125^5 x 300 ~ 0.009
    busy = [endpoint("a", queue=3, kv=0.4)]  # 0.6: 0.6^5 x 300 >= 1
    assert a.probability(idle) == pytest.approx(0.125**5 * 300)
    assert a.probability(busy) == 1.0
    assert await _refusals(a, idle, -1) < 20
    assert await _refusals(a, busy, -1) == 400
    assert await _refusals(a, busy, 0) == 0, "priority >= 0 is never refused"


def test_an_endpoint_never_scraped_counts_as_saturated() -> None:
    assert _admitter().saturation([endpoint("a", updated=0.0), endpoint("b", queue=0, kv=0.0)]) == 0.5


def test_loaded_configs_run_it_as_an_admission_hook_and_bad_parameters_are_refused() -> None:
    built = builtin_registry().build("probabilistic-admitter", "pa", {"queueDepthThreshold": 12}, FakeHandle())
    assert isinstance(built, ProbabilisticAdmitter) and built.params.queue_depth_threshold == 12
    with pytest.raises(PluginParamsError):
        builtin_registry().build("probabilistic-admitter", "pa", {"k": 0}, FakeHandle())
