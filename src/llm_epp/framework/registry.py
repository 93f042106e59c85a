"""Plugin registry: type name -> (factory, Params model). Built explicitly; no import-time registration."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from llm_epp.framework.plugin import Handle, Plugin, PluginParams

P = TypeVar("P", bound=PluginParams)

PluginFactory = Callable[[str, Any, Handle], Plugin]


@dataclass(frozen=True, slots=True)
class RegistryEntry(Generic[P]):
    plugin_type: str
    params_model: type[P]
    factory: Callable[[str, P, Handle], Plugin]


class PluginParamsError(ValueError):
    """Parameters that do not fit a plugin's Params model. `problems` are (path, message) pairs."""

    def __init__(self, plugin_type: str, problems: list[tuple[str, str]]) -> None:
        self.plugin_type = plugin_type
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))


class UnknownPluginTypeError(KeyError):
    def __init__(self, plugin_type: str, known: Iterable[str]) -> None:
        self.plugin_type = plugin_type
        self.known = sorted(known)
        super().__init__(plugin_type)

    def __str__(self) -> str:
        return f"unknown plugin type {self.plugin_type!r}; known types: {', '.join(self.known)}"


def _describe(err: ValidationError) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            out.append((path, "unknown parameter"))
        else:
            out.append((path, e["msg"]))
    return out


class Registry:
    """Maps plugin type names to their factories. Registering a name twice raises."""

    def __init__(self) -> None:
        self._entries: dict[str, RegistryEntry[Any]] = {}

    def register(self, plugin_type: str, params_model: type[P], factory: Callable[[str, P, Handle], Plugin]) -> None:
        if plugin_type in self._entries:
            raise ValueError(f"plugin type {plugin_type!r} is registered twice")
        self._entries[plugin_type] = RegistryEntry(plugin_type, params_model, factory)

    def __contains__(self, plugin_type: object) -> bool:
        return plugin_type in self._entries

    def types(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, plugin_type: str) -> RegistryEntry[Any]:
        try:
            return self._entries[plugin_type]
        except KeyError:
            raise UnknownPluginTypeError(plugin_type, self._entries) from None

    def parse_params(self, plugin_type: str, raw: Mapping[str, Any] | None) -> PluginParams:
        entry = self.entry(plugin_type)
        try:
            params: PluginParams = entry.params_model.model_validate(dict(raw or {}))
        except ValidationError as err:
            raise PluginParamsError(plugin_type, _describe(err)) from None
        return params

    def build(self, plugin_type: str, name: str, raw_params: Mapping[str, Any] | None, handle: Handle) -> Plugin:
        params = self.parse_params(plugin_type, raw_params)
        return self.entry(plugin_type).factory(name, params, handle)
