"""Tests for llm_epp.framework.registry: registration, unknown types, parameter parsing and building."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from pydantic import Field, ValidationError

from llm_epp.framework import Handle, PluginParams, Registry, TypedName
from llm_epp.framework.registry import PluginParamsError, UnknownPluginTypeError
from tests.unit.builders import FakeHandle


class _Params(PluginParams):
    max_num_of_endpoints: int = Field(default=1, ge=1, alias="maxNumOfEndpoints")
    mode: str = "fast"


@dataclass
class _Plugin:
    typed_name: TypedName
    params: _Params
    handle: Handle


def _factory(name: str, params: _Params, handle: Handle) -> _Plugin:
    return _Plugin(TypedName("fake-picker", name), params, handle)


def _registry(*types: str) -> Registry:
    registry = Registry(entry_point_group=None)
    for t in types or ("fake-picker",):
        registry.register(t, _Params, _factory)
    return registry


def test_registered_types_are_listed_sorted_and_contained() -> None:
    registry = _registry("b-scorer", "a-filter")
    assert registry.types() == ["a-filter", "b-scorer"]
    assert "a-filter" in registry
    assert "c-picker" not in registry


def test_registering_a_type_twice_raises() -> None:
    registry = _registry("fake-picker")
    with pytest.raises(ValueError, match="'fake-picker' is registered twice"):
        registry.register("fake-picker", _Params, _factory)


def test_unknown_type_lists_the_known_types() -> None:
    registry = _registry("b-scorer", "a-filter")
    with pytest.raises(UnknownPluginTypeError) as info:
        registry.entry("no-such")
    assert isinstance(info.value, KeyError)
    assert info.value.plugin_type == "no-such"
    assert str(info.value) == "unknown plugin type 'no-such'; known types: a-filter, b-scorer"


def test_a_type_marked_unsupported_says_so_and_a_registered_type_wins() -> None:
    from llm_epp.framework.registry import UnsupportedPluginTypeError

    registry = _registry("a-filter")
    registry.mark_unsupported("decode-filter", "prefill/decode disaggregation")
    registry.mark_unsupported("a-filter", "stale entry")
    with pytest.raises(UnsupportedPluginTypeError) as info:
        registry.build("decode-filter", "d", None, FakeHandle())
    assert isinstance(info.value, UnknownPluginTypeError)  # callers that catch unknown types still do
    assert str(info.value) == (
        "plugin type 'decode-filter' is not supported yet by llm-epp (prefill/decode disaggregation)"
    )
    assert "decode-filter" not in registry
    assert registry.entry("a-filter").plugin_type == "a-filter"
    assert registry.unsupported_types() == {"decode-filter": "prefill/decode disaggregation", "a-filter": "stale entry"}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, (1, "fast")),
        ({}, (1, "fast")),
        ({"maxNumOfEndpoints": 3}, (3, "fast")),
        ({"max_num_of_endpoints": 4, "mode": "slow"}, (4, "slow")),
        ({"maxNumOfEndpoints": "2"}, (2, "fast")),
    ],
    ids=["none", "empty", "camel-case", "snake-case", "numeric-string"],
)
def test_parse_params(raw: dict[str, object] | None, expected: tuple[int, str]) -> None:
    params = _registry().parse_params("fake-picker", raw)
    assert isinstance(params, _Params)
    assert (params.max_num_of_endpoints, params.mode) == expected


@pytest.mark.parametrize(
    ("raw", "path", "message"),
    [
        ({"maxNumOfEndpoint": 2}, "maxNumOfEndpoint", "unknown parameter"),
        ({"maxNumOfEndpoints": 0}, "maxNumOfEndpoints", "greater than or equal to 1"),
        ({"maxNumOfEndpoints": "many"}, "maxNumOfEndpoints", "valid integer"),
    ],
    ids=["unknown-key", "out-of-range", "wrong-type"],
)
def test_bad_params_name_the_key(raw: dict[str, object], path: str, message: str) -> None:
    with pytest.raises(PluginParamsError) as info:
        _registry().parse_params("fake-picker", raw)
    assert info.value.plugin_type == "fake-picker"
    assert len(info.value.problems) == 1
    got_path, got_message = info.value.problems[0]
    assert got_path == path
    assert message in got_message
    assert path in str(info.value)


def test_every_bad_param_is_reported() -> None:
    with pytest.raises(PluginParamsError) as info:
        _registry().parse_params("fake-picker", {"maxNumOfEndpoints": 0, "extra": 1})
    assert {p for p, _ in info.value.problems} == {"maxNumOfEndpoints", "extra"}


def test_parse_params_of_an_unknown_type_raises() -> None:
    with pytest.raises(UnknownPluginTypeError):
        _registry().parse_params("no-such", None)


def test_params_are_frozen() -> None:
    params = _registry().parse_params("fake-picker", None)
    with pytest.raises(ValidationError):
        params.mode = "slow"  # type: ignore[attr-defined]


def test_build_passes_name_params_and_handle_to_the_factory() -> None:
    handle = FakeHandle()
    plugin = _registry().build("fake-picker", "top2", {"maxNumOfEndpoints": 2}, handle)
    assert isinstance(plugin, _Plugin)
    assert plugin.typed_name == TypedName("fake-picker", "top2")
    assert plugin.params.max_num_of_endpoints == 2
    assert plugin.handle is handle


def test_build_with_bad_params_does_not_call_the_factory() -> None:
    calls: list[str] = []

    def factory(name: str, params: _Params, handle: Handle) -> _Plugin:
        calls.append(name)
        return _factory(name, params, handle)

    registry = Registry()
    registry.register("fake-picker", _Params, factory)
    with pytest.raises(PluginParamsError):
        registry.build("fake-picker", "p", {"bogus": True}, FakeHandle())
    assert calls == []
