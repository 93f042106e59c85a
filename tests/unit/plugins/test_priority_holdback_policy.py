from __future__ import annotations

import pytest

from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.flowcontrol.priority_holdback_policy import PriorityHoldbackPolicy
from tests.unit.builders import FakeHandle


def _limits(policy: PriorityHoldbackPolicy, priorities: list[int]) -> list[float]:
    ceilings = [1.0] * len(priorities)
    policy.compute_limit(0.5, priorities, ceilings)
    return [round(c, 6) for c in ceilings]


def test_rank_spreads_ceilings_evenly() -> None:
    p = PriorityHoldbackPolicy("h", min_ceiling=0.4, max_ceiling=1.0)
    assert _limits(p, [100, 1, 0]) == [1.0, 0.7, 0.4]
    assert _limits(p, [3]) == [1.0]


def test_value_spreads_ceilings_by_priority_distance() -> None:
    p = PriorityHoldbackPolicy("h", min_ceiling=0.0, max_ceiling=1.0, domain="value")
    assert _limits(p, [10, 9, 0]) == [1.0, 0.9, 0.0]
    assert _limits(p, [5, 5]) == [1.0, 1.0]


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({}, "minCeiling"),
        ({"minCeiling": 1.0}, "minCeiling"),
        ({"minCeiling": 0.5, "maxCeiling": 0.5}, "strictly less than maxCeiling"),
        ({"minCeiling": 0.1, "domain": "log"}, "domain"),
        ({"minCeiling": 0.1, "shape": "sigmoid"}, "shape"),
    ],
)
def test_bad_parameters_are_refused(params: dict[str, object], fragment: str) -> None:
    with pytest.raises(PluginParamsError) as e:
        builtin_registry().build("priority-holdback-policy", "h", params, FakeHandle())
    assert fragment in str(e.value)
