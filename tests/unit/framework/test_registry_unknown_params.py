"""Registry.parse_params with an `unknown` list: unknown keys are reported (with a close match) and left
out, at any depth; other problems still raise; the caller's mapping is not changed."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from llm_epp.framework import PluginParams, Registry
from llm_epp.framework.registry import PluginParamsError, UnknownParam


class Engine(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str
    queue_spec: str = Field(default="", alias="queueSpec")


class Params(PluginParams):
    max_items: int = Field(default=1, ge=1, alias="maxItems")
    engines: list[Engine] = Field(default_factory=list)


def _registry() -> Registry:
    registry = Registry(entry_point_group=None)
    registry.register("thing", Params, lambda name, params, handle: params)
    return registry


def test_unknown_keys_are_reported_and_left_out() -> None:
    raw: dict[str, Any] = {"maxItem": 3, "maxItems": 2, "engines": [{"name": "a", "queueSpc": "q"}], "zzz": 1}
    unknown: list[UnknownParam] = []
    params = _registry().parse_params("thing", raw, unknown)
    assert isinstance(params, Params) and params.max_items == 2 and params.engines[0].name == "a"
    assert sorted(unknown, key=lambda u: u.path) == [
        UnknownParam("engines.0.queueSpc", "queueSpec"),
        UnknownParam("maxItem", "maxItems"),
        UnknownParam("zzz", None),
    ]
    assert str(UnknownParam("maxItem", "maxItems")) == "unknown parameter 'maxItem'; did you mean 'maxItems'?"
    assert raw["engines"][0] == {"name": "a", "queueSpc": "q"}  # the caller's parameters are untouched


def test_without_a_list_unknown_keys_raise() -> None:
    with pytest.raises(PluginParamsError) as info:
        _registry().parse_params("thing", {"maxItem": 3})
    assert info.value.problems == [("maxItem", "unknown parameter")]


def test_other_problems_raise_even_when_unknown_keys_are_collected() -> None:
    unknown: list[UnknownParam] = []
    with pytest.raises(PluginParamsError) as info:
        _registry().parse_params("thing", {"maxItems": 0, "extra": 1}, unknown)
    assert [p for p, _ in info.value.problems] == ["maxItems"]
    assert unknown == [UnknownParam("extra", None)]
