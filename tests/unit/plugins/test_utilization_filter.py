from __future__ import annotations

import pytest

from llm_epp.framework import CycleState
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.scheduling.utilization_filter import UtilizationFilter
from tests.unit.builders import FakeHandle, endpoint, names, request


def _filter(conditions: list[dict[str, object]], fallback: bool = False) -> UtilizationFilter:
    params = {"conditions": conditions, "fallbackOnEmpty": fallback}
    built = builtin_registry().build("utilization-filter", "u", params, FakeHandle())
    assert isinstance(built, UtilizationFilter)
    return built


def test_endpoints_over_any_limit_are_dropped() -> None:
    eps = [
        endpoint("a", queue=1, kv=0.2, running=2, address="10.0.0.1"),
        endpoint("b", queue=9, kv=0.2, running=2, address="10.0.0.2"),
        endpoint("c", queue=1, kv=0.95, running=2, address="10.0.0.3"),
        endpoint("d", queue=1, kv=0.2, running=20, address="10.0.0.4"),
    ]
    eps[0].load.requests = 3
    f = _filter(
        [
            {"metric": "waiting-queue", "maxValue": 4},
            {"metric": "kv-cache-utilization", "maxValue": 0.9},
            {"metric": "running-requests", "maxValue": 10},
        ]
    )
    assert names(f.filter(CycleState(), request(), eps)) == ["a"]
    busy = _filter([{"metric": "active-requests", "maxValue": 2}])
    assert names(busy.filter(CycleState(), request(), eps)) == ["b", "c", "d"], "a has 3 in flight"


def test_fallback_on_empty_returns_every_endpoint() -> None:
    eps = [endpoint("a", queue=9)]
    assert _filter([{"metric": "waiting-queue", "maxValue": 1}]).filter(CycleState(), request(), eps) == []
    kept = _filter([{"metric": "waiting-queue", "maxValue": 1}], fallback=True).filter(CycleState(), request(), eps)
    assert names(kept) == ["a"]


@pytest.mark.parametrize(
    "conditions",
    [
        [],
        [{"metric": "gpu", "maxValue": 1}],
        [{"metric": "waiting-queue"}],
        [{"metric": "kv-cache-utilization", "maxValue": 2}],
    ],
)
def test_bad_conditions_are_refused(conditions: list[dict[str, object]]) -> None:
    with pytest.raises(PluginParamsError):
        builtin_registry().build("utilization-filter", "u", {"conditions": conditions}, FakeHandle())
