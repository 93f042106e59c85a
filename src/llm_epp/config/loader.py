"""YAML -> schema -> plugins -> profiles -> Scheduler. Every problem is collected and reported with its
YAML path (e.g. `plugins[2].parameters.maxNumOfEndpoints: unknown parameter`)."""

from __future__ import annotations

import difflib
import logging
import random
import time
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llm_epp.config.defaults import DEFAULT_CONFIG
from llm_epp.config.schema import FEATURE_GATES, EndpointPickerConfigSpec
from llm_epp.framework import (
    Endpoint,
    Filter,
    Picker,
    Plugin,
    ProfileHandler,
    RandomSource,
    Recorder,
    Registry,
    Scorer,
    os_random,
)
from llm_epp.framework.datalayer import DataSource, Extractor
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.registry import PluginLoadError, PluginParamsError, UnknownPluginTypeError
from llm_epp.framework.requestcontrol import (
    Admission,
    PrepareData,
    PreRequest,
    ResponseComplete,
    ResponseReceived,
)
from llm_epp.scheduling import Scheduler, SchedulerProfile, WeightedScorer
from llm_epp.scheduling.profile import TOTAL

log = logging.getLogger(__name__)

_SUPPORTED_PARSERS = ("openai-parser",)
DEFAULT_SATURATION_DETECTOR = "utilization-detector"
DEFAULT_DATA_SOURCE = "metrics-data-source"
DEFAULT_EXTRACTOR = "core-metrics-extractor"  # the reference instantiates it when none is configured


class ConfigError(ValueError):
    """An invalid EndpointPickerConfig. `problems` lists every problem found, each with its YAML path."""

    def __init__(self, source: str, problems: Sequence[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid EndpointPickerConfig in {source}:\n{lines}")


@dataclass
class ProfileDescription:
    name: str
    filters: list[str]
    scorers: list[tuple[str, float]]
    picker: str


@dataclass
class LoadedConfig:
    spec: EndpointPickerConfigSpec
    scheduler: Scheduler
    plugins: dict[str, Plugin]
    plugin_types: dict[str, str]
    plugin_params: dict[str, dict[str, Any]]
    profiles: list[ProfileDescription]
    handler_name: str
    saturation: SaturationDetector | None = None
    data_source: DataSource | None = None  # None: no metrics collection
    extractor: Extractor | None = None
    prepare_data: list[PrepareData] = field(default_factory=list)
    admission: list[Admission] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)

    def describe(self) -> str:
        """A human-readable summary of the resolved configuration (`llm-epp config check`)."""
        out = [f"profile handler: {self.handler_name} ({self.plugin_types[self.handler_name]})"]
        out.append("plugins:")
        for name, ptype in self.plugin_types.items():
            params = self.plugin_params.get(name) or {}
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            out.append(f"  {name} ({ptype}){': ' + shown if shown else ''}")
        if self.saturation is not None:
            out.append(f"saturation detector: {self.saturation.typed_name}")
        if self.data_source is not None and self.extractor is not None:
            out.append(f"metrics: {self.data_source.typed_name} -> {self.extractor.typed_name}")
        else:
            out.append("metrics: not collected")
        for p in self.profiles:
            out.append(f"profile {p.name}:")
            for f in p.filters:
                out.append(f"  filter {f}")
            for s, w in p.scorers:
                out.append(f"  scorer {s} weight {w:g}")
            out.append(f"  picker {p.picker}")
        return "\n".join(out)


class _LoaderHandle:
    def __init__(
        self,
        plugins: dict[str, Plugin],
        endpoints: Callable[[], Sequence[Endpoint]],
        recorder: Recorder,
        clock: Callable[[], float],
        random_source: RandomSource,
    ) -> None:
        self._plugins = plugins
        self._endpoints = endpoints
        self._recorder = recorder
        self._clock = clock
        self._random_source = random_source

    @property
    def recorder(self) -> Recorder:
        return self._recorder

    def plugin(self, name: str) -> Plugin | None:
        return self._plugins.get(name)

    def endpoints(self) -> Sequence[Endpoint]:
        return self._endpoints()

    def now(self) -> float:
        return self._clock()

    def rng(self, name: str) -> random.Random:
        return self._random_source(f"plugin/{name}")


def _loc(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def _known_keys() -> list[str]:
    keys: set[str] = set()
    pending: list[type[BaseModel]] = [EndpointPickerConfigSpec]
    while pending:
        model = pending.pop()
        for name, f in model.model_fields.items():
            keys.add(f.alias or name)
            for arg in typing.get_args(f.annotation) or (f.annotation,):
                for inner in typing.get_args(arg) or (arg,):
                    if isinstance(inner, type) and issubclass(inner, BaseModel):
                        pending.append(inner)
    return sorted(keys)


def _did_you_mean(key: str) -> str:
    if key == "data":
        return "; the data layer section is called dataLayer"
    close = difflib.get_close_matches(key, _known_keys(), n=1, cutoff=0.6)
    if close:
        return f"; did you mean {close[0]!r}?"
    return "; keys are camelCase as in the reference EPP (e.g. pluginRef, schedulingProfiles)"


def _schema_problems(err: ValidationError) -> list[str]:
    problems = []
    for e in err.errors():
        where = _loc(e["loc"])
        if e["type"] == "extra_forbidden":
            problems.append(f"{where}: unknown field{_did_you_mean(str(e['loc'][-1]))}")
        elif e["type"] == "literal_error":
            problems.append(f"{where}: {e['msg']}")
        else:
            problems.append(f"{where}: {e['msg']}")
    return problems


PREFIX_SCORER = "prefix-cache-scorer"
PREFIX_CONSUMERS = frozenset({PREFIX_SCORER, "prefix-cache-affinity-filter", "no-hit-lru-scorer"})
PREFIX_PRODUCER = "approx-prefix-cache-producer"


def _add_prefix_producer(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    handle: _LoaderHandle,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    params: dict[str, dict[str, Any]],
    seen_names: set[str],
    problems: list[str],
) -> None:
    """As the reference: a prefix-cache-scorer without an approx-prefix-cache-producer gets one, built with
    the (last) scorer's parameters, which both plugins accept.  The other plugins that read the producer's
    prefix match (prefix-cache-affinity-filter, no-hit-lru-scorer) would silently see "no prefix data" without
    it, so configured without any prefix-cache-scorer they get one with the default parameters."""
    consumers = [t for t in types.values() if t in PREFIX_CONSUMERS]
    if PREFIX_PRODUCER in types.values() or not consumers or PREFIX_PRODUCER not in registry:
        return
    scorer_params = [params[name] for name, t in types.items() if t == PREFIX_SCORER]
    producer_params = scorer_params[-1] if scorer_params else {}
    for_whom = PREFIX_SCORER if scorer_params else consumers[0]
    name = _unused_name(PREFIX_PRODUCER, seen_names)
    try:
        plugins[name] = registry.build(PREFIX_PRODUCER, name, producer_params or None, handle)
    except (PluginParamsError, ValueError) as e:
        problems.append(f"plugins: the {PREFIX_PRODUCER} created for {for_whom} failed: {e}")
        return
    types[name] = PREFIX_PRODUCER
    params[name] = dict(producer_params)


def _unused_name(base: str, taken: set[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def load_config(
    path: str | Path,
    registry: Registry,
    recorder: Recorder,
    endpoints: Callable[[], Sequence[Endpoint]] = tuple,
    clock: Callable[[], float] = time.monotonic,
    random_source: RandomSource = os_random,
) -> LoadedConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(str(p), [f"cannot read the file: {e.strerror}"]) from None
    return load_config_text(
        text, registry, recorder, endpoints, source=str(p), clock=clock, random_source=random_source
    )


def load_config_text(
    text: str | None,
    registry: Registry,
    recorder: Recorder,
    endpoints: Callable[[], Sequence[Endpoint]] = tuple,
    source: str = "--config-text",
    clock: Callable[[], float] = time.monotonic,
    random_source: RandomSource = os_random,
) -> LoadedConfig:
    """Parses and builds an EndpointPickerConfig (``None`` or blank: the default configuration).

    ``clock`` is what plugins get from ``handle.now()`` (monotonic seconds, the time base of
    ``Metrics.update_time``); a simulator passes its virtual clock.  ``random_source`` gives the plugins'
    (``handle.rng(name)``) and the profiles' generators; a reproducible run passes ``seeded_random(seed)``."""
    if text is None or not text.strip():
        text, source = DEFAULT_CONFIG, "the default configuration"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, [f"not valid YAML{where}: {getattr(e, 'problem', e)}"]) from None
    if raw is None:  # only comments
        return load_config_text(None, registry, recorder, endpoints, clock=clock, random_source=random_source)
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the document must be a mapping with apiVersion, kind and plugins"])
    try:
        spec = EndpointPickerConfigSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(source, _schema_problems(err)) from None
    return _build(spec, registry, recorder, endpoints, source, clock, random_source)


def _build(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    recorder: Recorder,
    endpoints: Callable[[], Sequence[Endpoint]],
    source: str,
    clock: Callable[[], float],
    random_source: RandomSource,
) -> LoadedConfig:
    problems: list[str] = []
    for i, gate in enumerate(spec.feature_gates):
        if gate not in FEATURE_GATES:
            problems.append(f"featureGates[{i}]: unknown feature gate {gate!r}; known: {', '.join(FEATURE_GATES)}")

    plugins: dict[str, Plugin] = {}
    types: dict[str, str] = {}
    params: dict[str, dict[str, Any]] = {}
    handle = _LoaderHandle(plugins, endpoints, recorder, clock, random_source)
    seen_names: set[str] = set()
    for i, ps in enumerate(spec.plugins):
        name = ps.name or ps.type
        if name in seen_names:
            problems.append(f"plugins[{i}].name: plugin name {name!r} is used twice; give each a unique name")
            continue
        seen_names.add(name)
        if name == TOTAL:
            problems.append(f"plugins[{i}].name: {TOTAL!r} is reserved for the summed score; choose another name")
            continue
        try:
            plugins[name] = registry.build(ps.type, name, ps.parameters, handle)
        except (UnknownPluginTypeError, PluginLoadError) as e:
            problems.append(f"plugins[{i}].type: {e}")
            continue
        except PluginParamsError as e:
            for path, msg in e.problems:
                problems.append(f"plugins[{i}].parameters{'.' + path if path else ''}: {msg}")
            continue
        except Exception as e:  # a plugin's own factory failed: report it with the others
            problems.append(f"plugins[{i}]: creating {name!r} ({ps.type}) failed: {e!r}")
            continue
        types[name] = ps.type
        params[name] = dict(ps.parameters or {})

    _add_prefix_producer(spec, registry, handle, plugins, types, params, seen_names, problems)

    profile_specs = [(p.name, [(r.plugin_ref, r.weight) for r in p.plugins]) for p in spec.scheduling_profiles]
    if not profile_specs:
        refs: list[tuple[str, float | None]] = [
            (n, None) for n, p in plugins.items() if isinstance(p, (Filter, Scorer, Picker))
        ]
        profile_specs = [("default", refs)]

    profiles: dict[str, SchedulerProfile] = {}
    descriptions: list[ProfileDescription] = []
    seen_profiles: set[str] = set()
    for i, (pname, prefs) in enumerate(profile_specs):
        where = f"schedulingProfiles[{i}]"
        if pname in seen_profiles:
            problems.append(f"{where}.name: profile name {pname!r} is used twice")
            continue
        seen_profiles.add(pname)
        filters: list[Filter] = []
        scorers: list[WeightedScorer] = []
        pickers: list[Picker] = []
        for j, (ref, weight) in enumerate(prefs):
            plugin = plugins.get(ref)
            if plugin is None:
                if ref not in {s.name or s.type for s in spec.plugins}:
                    problems.append(f"{where}.plugins[{j}].pluginRef: no plugin named {ref!r} is defined under plugins")
                continue
            used = False
            if isinstance(plugin, Filter):
                filters.append(plugin)
                used = True
            if isinstance(plugin, Scorer):
                scorers.append(WeightedScorer(plugin, 1.0 if weight is None else weight))
                used = True
            if isinstance(plugin, Picker):
                pickers.append(plugin)
                used = True
            if not used:
                problems.append(
                    f"{where}.plugins[{j}].pluginRef: {ref!r} ({types[ref]}) is not a filter, scorer or picker"
                )
        if len(pickers) > 1:
            names = ", ".join(p.typed_name.name for p in pickers)
            problems.append(f"{where}.plugins: a profile may have only one picker, found {names}")
            continue
        if not pickers:
            existing = [p for p in plugins.values() if isinstance(p, Picker)]
            if existing:
                pickers = existing[:1]
            else:
                auto_name = _unused_name("max-score-picker", seen_names)
                auto = registry.build("max-score-picker", auto_name, None, handle)
                assert isinstance(auto, Picker)
                plugins[auto_name] = auto
                types[auto_name] = "max-score-picker"
                pickers = [auto]
        picker = pickers[0]
        profiles[pname] = SchedulerProfile(pname, filters, scorers, picker, recorder, random_source(f"profile/{pname}"))
        descriptions.append(
            ProfileDescription(
                pname,
                [f.typed_name.name for f in filters],
                [(s.scorer.typed_name.name, s.weight) for s in scorers],
                picker.typed_name.name,
            )
        )

    handlers = [p for p in plugins.values() if isinstance(p, ProfileHandler)]
    handler: ProfileHandler | None = None
    if len(handlers) > 1:
        names = ", ".join(h.typed_name.name for h in handlers)
        problems.append(f"plugins: only one profile handler may be configured, found {names}")
    elif handlers:
        handler = handlers[0]
    elif len(profile_specs) == 1:
        auto_name = _unused_name("single-profile-handler", seen_names)
        built = registry.build("single-profile-handler", auto_name, None, handle)
        assert isinstance(built, ProfileHandler)
        handler = built
        plugins[auto_name] = built
        types[auto_name] = "single-profile-handler"
    else:
        problems.append(
            f"schedulingProfiles: {len(profile_specs)} profiles need a profile handler plugin that can run them"
        )
    max_profiles = getattr(handler, "max_profiles", None)
    if handler is not None and max_profiles is not None and len(profile_specs) > max_profiles:
        problems.append(
            f"schedulingProfiles: {handler.typed_name.type} runs exactly {max_profiles} profile, "
            f"but {len(profile_specs)} are configured"
        )

    if spec.parser is not None and spec.parser.plugin_ref not in _SUPPORTED_PARSERS:
        ref = spec.parser.plugin_ref
        if types.get(ref) not in _SUPPORTED_PARSERS:
            problems.append(f"parser.pluginRef: {ref!r} is not supported; use one of {', '.join(_SUPPORTED_PARSERS)}")
    saturation: SaturationDetector | None = None
    if spec.saturation_detector is not None:
        ref = spec.saturation_detector.plugin_ref
        detector = plugins.get(ref)
        if detector is None:
            problems.append(f"saturationDetector.pluginRef: no plugin named {ref!r} is defined")
        elif not isinstance(detector, SaturationDetector):
            problems.append(f"saturationDetector.pluginRef: {ref!r} ({types[ref]}) is not a saturation detector")
        else:
            saturation = detector
    elif DEFAULT_SATURATION_DETECTOR in registry:
        auto_name = _unused_name(DEFAULT_SATURATION_DETECTOR, seen_names)
        built = registry.build(DEFAULT_SATURATION_DETECTOR, auto_name, None, handle)
        if isinstance(built, SaturationDetector):
            saturation = built
    data_source: DataSource | None = None
    extractor: Extractor | None = None
    if spec.data_layer is not None:
        if len(spec.data_layer.sources) > 1:
            problems.append("dataLayer.sources: only one metrics source is supported")
        for i, src in enumerate(spec.data_layer.sources):
            where = f"dataLayer.sources[{i}]"
            source_plugin = plugins.get(src.plugin_ref)
            if source_plugin is None:
                problems.append(f"{where}.pluginRef: no plugin named {src.plugin_ref!r} is defined")
            elif not isinstance(source_plugin, DataSource):
                problems.append(f"{where}.pluginRef: {src.plugin_ref!r} ({types[src.plugin_ref]}) is not a data source")
            else:
                data_source = source_plugin
            if len(src.extractors) != 1:
                problems.append(f"{where}.extractors: exactly one extractor is supported per source")
            for j, ex in enumerate(src.extractors):
                ex_plugin = plugins.get(ex.plugin_ref)
                if ex_plugin is None:
                    problems.append(f"{where}.extractors[{j}].pluginRef: no plugin named {ex.plugin_ref!r} is defined")
                elif not isinstance(ex_plugin, Extractor):
                    problems.append(
                        f"{where}.extractors[{j}].pluginRef: {ex.plugin_ref!r} ({types[ex.plugin_ref]}) is not an "
                        "extractor"
                    )
                elif extractor is None:
                    extractor = ex_plugin
        collect = bool(spec.data_layer.sources)
    else:  # omitted: the default source and extractor (plugins named like their types are reused)
        collect = True
        for default_type in (DEFAULT_DATA_SOURCE, DEFAULT_EXTRACTOR):
            default_plugin = plugins.get(default_type)
            if default_plugin is None and default_type in registry:
                default_plugin = registry.build(default_type, _unused_name(default_type, seen_names), None, handle)
            if isinstance(default_plugin, DataSource):
                data_source = default_plugin
            elif isinstance(default_plugin, Extractor):
                extractor = default_plugin

    if problems:
        raise ConfigError(source, problems)
    assert handler is not None
    loaded = LoadedConfig(
        spec=spec,
        scheduler=Scheduler(handler, profiles, recorder),
        plugins=plugins,
        plugin_types=types,
        plugin_params=params,
        profiles=descriptions,
        handler_name=handler.typed_name.name,
        saturation=saturation,
        data_source=data_source if collect else None,
        extractor=extractor if collect else None,
    )
    for p in plugins.values():
        if isinstance(p, PrepareData):
            loaded.prepare_data.append(p)
        if isinstance(p, Admission):
            loaded.admission.append(p)
        if isinstance(p, PreRequest):
            loaded.pre_request.append(p)
        if isinstance(p, ResponseReceived):
            loaded.response_received.append(p)
        if isinstance(p, ResponseComplete):
            loaded.response_complete.append(p)
    return loaded
