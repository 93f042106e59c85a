"""Plugin registry: type name -> (factory, Params model). Built explicitly; no import-time registration."""

from __future__ import annotations

import copy
import difflib
import importlib.metadata
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

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


@dataclass(frozen=True, slots=True)
class UnknownParam:
    """A parameter key the plugin's Params model does not have. `path` is dotted from the parameters' root
    (`engineConfigs.0.kvUsage`); `suggestion` is the closest known key at that level, if any is close."""

    path: str
    suggestion: str | None

    def __str__(self) -> str:
        hint = f"; did you mean {self.suggestion!r}?" if self.suggestion else ""
        return f"unknown parameter {self.path!r}{hint}"


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside an annotation such as `Model`, `Model | None`, `list[Model]`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


def _keys_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The keys (aliases and field names) accepted at `loc` inside `model`'s input."""
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None:
            return []
        if isinstance(part, int):
            continue
        field = next((f for n, f in current.model_fields.items() if part in (n, f.alias)), None)
        if field is None:
            return []
        current = _model_in(field.annotation)
    if current is None:
        return []
    return [f.alias or n for n, f in current.model_fields.items()]


def _drop(raw: Any, loc: Sequence[int | str]) -> bool:
    """Deletes the key at `loc` from a nested dict/list structure; False when it is not there."""
    node = raw
    for part in loc[:-1]:
        try:
            node = node[part]
        except (KeyError, IndexError, TypeError):
            return False
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


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
        self._default_producers: dict[str, str] = {}

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

    def set_default_producer(self, data_key: str, plugin_type: str) -> None:
        """Names the plugin type the loader creates when a configured plugin consumes `data_key` (a name in
        its `consumes`) and no configured plugin produces it (llm-d-router's `RegisterAsDefaultProducer`)."""
        self._default_producers[data_key] = plugin_type

    def default_producers(self) -> dict[str, str]:
        return dict(self._default_producers)

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

    def parse_params(
        self, plugin_type: str, raw: Mapping[str, Any] | None, unknown: list[UnknownParam] | None = None
    ) -> PluginParams:
        """Validates `raw` against the plugin's Params model. Unknown keys raise PluginParamsError, unless
        `unknown` is a list: then they are left out (GIE v1.5.0 ignores them) and reported into it."""
        entry = self.entry(plugin_type)
        model: type[PluginParams] = entry.params_model
        data: Any = dict(raw or {})
        copied = False
        while True:
            try:
                params: PluginParams = model.model_validate(data)
            except ValidationError as err:
                extra = [e["loc"] for e in err.errors() if e["type"] == "extra_forbidden"]
                if unknown is None or not extra:
                    raise PluginParamsError(plugin_type, _describe(err)) from None
                if not copied:
                    data, copied = copy.deepcopy(data), True
                dropped = False
                for loc in extra:
                    if not _drop(data, loc):
                        continue
                    dropped = True
                    key = str(loc[-1])
                    close = difflib.get_close_matches(key, _keys_at(model, loc[:-1]), n=1, cutoff=0.6)
                    unknown.append(UnknownParam(".".join(str(p) for p in loc), close[0] if close else None))
                if not dropped:  # pragma: no cover - pydantic reports only keys that are present
                    raise PluginParamsError(plugin_type, _describe(err)) from None
                continue
            return params

    def build(
        self,
        plugin_type: str,
        name: str,
        raw_params: Mapping[str, Any] | None,
        handle: Handle,
        unknown: list[UnknownParam] | None = None,
    ) -> Plugin:
        """Builds a plugin. With `unknown` given, unknown parameter keys are reported there, not raised."""
        params = self.parse_params(plugin_type, raw_params, unknown)
        return self.entry(plugin_type).factory(name, params, handle)
