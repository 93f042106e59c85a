from __future__ import annotations

import pytest

from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.flowcontrol.static_usage_limit_policy import StaticUsageLimitPolicy
from tests.unit.builders import FakeHandle


def test_every_band_gets_the_threshold() -> None:
    ceilings = [1.0, 1.0, 1.0]
    StaticUsageLimitPolicy("s", 0.8).compute_limit(0.5, [5, 0, -1], ceilings)
    assert ceilings == [0.8, 0.8, 0.8]


def test_default_threshold_is_one_and_negative_is_refused() -> None:
    reg = builtin_registry()
    built = reg.build("static-usage-limit-policy", "s", None, FakeHandle())
    assert isinstance(built, StaticUsageLimitPolicy) and built.threshold == 1.0
    with pytest.raises(PluginParamsError):
        reg.build("static-usage-limit-policy", "s", {"threshold": -0.1}, FakeHandle())
