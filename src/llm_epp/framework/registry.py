"""Plugin registry: type name -> (factory, Params model). Built explicitly; no import-time registration."""

from __future__ import annotations

import importlib.metadata
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


class UnsupportedPluginTypeError(UnknownPluginTypeError):
    """A plugin type the reference EPP has and llm-epp does not support yet; `reason` says what it is."""

    def __init__(self, plugin_type: str, reason: str, known: Iterable[str]) -> None:
        super().__init__(plugin_type, known)
        self.reason = reason

    def __str__(self) -> str:
        return f"plugin type {self.plugin_type!r} is not supported yet by llm-epp ({self.reason})"


def _describe(err: ValidationError) -> list[tuple[str, str]]:
    out = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        if e["type"] == "extra_forbidden":
            out.append((path, "unknown parameter"))
        else:
            out.append((path, e["msg"]))
    return out


class PluginLoadError(ValueError):
    """An out-of-tree plugin that was found but could not be loaded; the message says why."""


ENTRY_POINT_GROUP = "llm_epp.plugins"


class Registry:
    """Maps plugin type names to their factories. Registering a name twice raises.

    Types not registered in-tree are looked up, on first use only, among the installed packages' entry
    points of the group `llm_epp.plugins`: the entry point's name is the plugin type and its value a
    module that exports `TYPE`, `Params` and `factory`, the same shape as the built-in plugin modules."""

    def __init__(self, entry_point_group: str | None = ENTRY_POINT_GROUP) -> None:
        self._entries: dict[str, RegistryEntry[Any]] = {}
        self._unsupported: dict[str, str] = {}
        self._group = entry_point_group

    def register_module(self, module: Any, source: str = "") -> None:
        """Registers a plugin module (`TYPE`, `Params`, `factory`)."""
        where = f" ({source})" if source else ""
        missing = [a for a in ("TYPE", "Params", "factory") if not hasattr(module, a)]
        if missing:
            raise PluginLoadError(f"plugin module {module.__name__}{where} does not export {', '.join(missing)}")
        params = module.Params
        if not (isinstance(params, type) and issubclass(params, PluginParams)):
            raise PluginLoadError(f"{module.__name__}.Params{where} must subclass llm_epp.framework.PluginParams")
        if not callable(module.factory):
            raise PluginLoadError(f"{module.__name__}.factory{where} is not callable")
        self.register(module.TYPE, params, module.factory)

    def _load_entry_point(self, plugin_type: str) -> bool:
        if self._group is None:
            return False
        found = [ep for ep in importlib.metadata.entry_points(group=self._group) if ep.name == plugin_type]
        if not found:
            return False
        ep = found[0]
        source = f"entry point {ep.name} = {ep.value} of {ep.dist.name if ep.dist else 'unknown package'}"
        try:
            module = ep.load()
        except Exception as e:
            raise PluginLoadError(f"plugin type {plugin_type!r}: loading {source} failed: {e!r}") from e
        if getattr(module, "TYPE", plugin_type) != plugin_type:
            raise PluginLoadError(
                f"plugin type {plugin_type!r}: {source} exports TYPE = {module.TYPE!r}; the names must match"
            )
        self.register_module(module, source)
        return True

    def register(self, plugin_type: str, params_model: type[P], factory: Callable[[str, P, Handle], Plugin]) -> None:
        if plugin_type in self._entries:
            raise ValueError(f"plugin type {plugin_type!r} is registered twice")
        self._entries[plugin_type] = RegistryEntry(plugin_type, params_model, factory)

    def mark_unsupported(self, plugin_type: str, reason: str) -> None:
        """Names a reference plugin type that is not available, so asking for it says so (with `reason`)
        instead of calling it unknown. A registered type (in-tree or from an entry point) wins."""
        self._unsupported[plugin_type] = reason

    def unsupported_types(self) -> dict[str, str]:
        return dict(self._unsupported)

    def __contains__(self, plugin_type: object) -> bool:
        return plugin_type in self._entries

    def external_types(self) -> list[str]:
        """Plugin types offered by installed packages (not loaded)."""
        if self._group is None:
            return []
        return sorted(ep.name for ep in importlib.metadata.entry_points(group=self._group))

    def types(self) -> list[str]:
        return sorted(self._entries)

    def entry(self, plugin_type: str) -> RegistryEntry[Any]:
        found = self._entries.get(plugin_type)
        if found is None and self._load_entry_point(plugin_type):
            found = self._entries.get(plugin_type)
        if found is None:
            known = [*self._entries, *self.external_types()]
            reason = self._unsupported.get(plugin_type)
            if reason is not None:
                raise UnsupportedPluginTypeError(plugin_type, reason, known)
            raise UnknownPluginTypeError(plugin_type, known)
        return found

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
