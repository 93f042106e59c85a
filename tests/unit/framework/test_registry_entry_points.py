"""Out-of-tree plugins found through the `llm_epp.plugins` entry-point group."""

from __future__ import annotations

import importlib.metadata
import sys
import types
from typing import Any

import pytest

from llm_epp.framework import PluginParams
from llm_epp.framework.registry import PluginLoadError, Registry, UnknownPluginTypeError
from tests.unit.builders import FakeHandle


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = types.ModuleType(name)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


class _Params(PluginParams):
    pass


class _Plugin:
    def __init__(self, name: str) -> None:
        self.name = name


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> dict[str, types.ModuleType]:
    """Modules offered as entry points, by plugin type."""
    offered: dict[str, types.ModuleType] = {}

    def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
        assert group == "llm_epp.plugins"
        eps = []
        for plugin_type, mod in offered.items():
            sys.modules[mod.__name__] = mod
            eps.append(importlib.metadata.EntryPoint(plugin_type, mod.__name__, group))
        return eps

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    yield offered
    for mod in offered.values():
        sys.modules.pop(mod.__name__, None)


def test_an_installed_plugin_is_loaded_by_type_name(installed: dict[str, types.ModuleType]) -> None:
    installed["my-scorer"] = _module(
        "ext_my_scorer", TYPE="my-scorer", Params=_Params, factory=lambda name, p, h: _Plugin(name)
    )
    registry = Registry()
    plugin = registry.build("my-scorer", "mine", None, FakeHandle())
    assert isinstance(plugin, _Plugin) and plugin.name == "mine"
    assert "my-scorer" in registry


def test_unknown_types_list_installed_plugins_too(installed: dict[str, types.ModuleType]) -> None:
    installed["other-scorer"] = _module("ext_other", TYPE="other-scorer", Params=_Params, factory=_Plugin)
    registry = Registry()
    registry.register("queue-scorer", _Params, lambda n, p, h: _Plugin(n))
    with pytest.raises(UnknownPluginTypeError) as err:
        registry.entry("nope")
    assert "other-scorer" in str(err.value) and "queue-scorer" in str(err.value)


@pytest.mark.parametrize(
    ("attrs", "fragment"),
    [
        ({"TYPE": "bad"}, "does not export Params, factory"),
        ({"TYPE": "bad", "Params": dict, "factory": _Plugin}, "must subclass"),
        ({"TYPE": "bad", "Params": _Params, "factory": 3}, "not callable"),
        ({"TYPE": "other-name", "Params": _Params, "factory": _Plugin}, "names must match"),
    ],
    ids=["missing-exports", "params-not-pydantic", "factory-not-callable", "type-mismatch"],
)
def test_broken_plugins_are_reported(
    installed: dict[str, types.ModuleType], attrs: dict[str, Any], fragment: str
) -> None:
    installed["bad"] = _module("ext_bad", **attrs)
    with pytest.raises(PluginLoadError, match=fragment):
        Registry().entry("bad")


def test_an_import_error_is_reported_with_its_source(monkeypatch: pytest.MonkeyPatch) -> None:
    def entry_points(group: str) -> list[importlib.metadata.EntryPoint]:
        return [importlib.metadata.EntryPoint("broken", "no_such_module_anywhere", group)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    with pytest.raises(PluginLoadError, match="no_such_module_anywhere"):
        Registry().entry("broken")


def test_entry_points_can_be_disabled(installed: dict[str, types.ModuleType]) -> None:
    installed["my-scorer"] = _module("ext_x", TYPE="my-scorer", Params=_Params, factory=_Plugin)
    with pytest.raises(UnknownPluginTypeError):
        Registry(entry_point_group=None).entry("my-scorer")
