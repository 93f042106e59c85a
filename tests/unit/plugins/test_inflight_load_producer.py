"""Tests for inflight-load-producer: accepted for configuration compatibility; the core director does the
in-flight accounting, so the plugin implements no extension point and changes nothing."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from llm_epp.framework import Filter, Picker, ProfileHandler, Scorer, TypedName
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import Admission, PrepareData, PreRequest, ResponseComplete, ResponseReceived
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.requestcontrol import inflight_load_producer as mod
from llm_epp.plugins.requestcontrol.inflight_load_producer import InflightLoadProducer, Params
from tests.unit.builders import FakeHandle

HOOKS = (Filter, Scorer, Picker, ProfileHandler, PrepareData, Admission, PreRequest, ResponseReceived, ResponseComplete)


def test_builds_from_the_reference_config() -> None:
    plugin = mod.factory("inflight-load-producer", Params.model_validate({}), FakeHandle())
    assert plugin.typed_name == TypedName("inflight-load-producer", "inflight-load-producer")


def test_implements_no_extension_point_so_it_costs_nothing_per_request() -> None:
    plugin = InflightLoadProducer("p")
    assert [h.__name__ for h in HOOKS if isinstance(plugin, h)] == []


@pytest.mark.parametrize("raw", [{"noSuchParameter": 1}, {"tokenEstimator": "simple"}], ids=["unknown", "made-up"])
def test_unknown_parameters_are_rejected(raw: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


def test_naming_follows_the_plugin_conventions() -> None:
    assert mod.TYPE == "inflight-load-producer"
    assert mod.__name__.rsplit(".", 1)[1] == mod.TYPE.replace("-", "_")
    assert type(mod.factory("x", Params(), FakeHandle())).__name__ == "InflightLoadProducer"
    for heading in ("Scheduling intent:", "Inputs consumed:", "Configuration:"):
        assert heading in (mod.__doc__ or "")


# --- the reference's parameters: accepted where they describe the core's accounting -------------------------
@pytest.mark.parametrize(
    "raw",
    [
        {"addEstimatedOutputTokens": True},
        {"addEstimatedOutputTokens": True, "outputRatio": 1.5},
        {"syncCrossReplicaState": False},
        {"prefixMatchInfoProducerName": ""},
    ],
    ids=["add-output", "core-ratio", "local-state", "no-discount"],
)
def test_parameters_matching_the_core_are_accepted(raw: dict[str, object]) -> None:
    plugin = builtin_registry().build("inflight-load-producer", "load", raw, FakeHandle())
    assert plugin.typed_name.name == "load"


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ({"addEstimatedOutputTokens": False}, "addEstimatedOutputTokens: false is not supported yet"),
        ({"outputRatio": 2.0}, "outputRatio 2.0 is not supported yet"),
        ({"outputRatio": -1}, "greater than or equal to 0"),
        ({"maxEstimatedOutputTokens": 512}, "maxEstimatedOutputTokens is not supported yet"),
        ({"prefixMatchInfoProducerName": "approx-prefix-cache-producer"}, "not discounted by cached prefixes"),
        ({"syncCrossReplicaState": True}, "syncCrossReplicaState: true is not supported yet"),
    ],
    ids=["input-only", "other-ratio", "negative-ratio", "cap", "discount", "cross-replica"],
)
def test_parameters_the_core_cannot_honour_are_refused(raw: dict[str, object], problem: str) -> None:
    with pytest.raises(PluginParamsError, match=problem):
        builtin_registry().parse_params("inflight-load-producer", raw)
