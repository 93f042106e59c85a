"""YAML -> schema -> plugins -> profiles -> Scheduler. Every problem is collected and reported with its
YAML path (e.g. `plugins[2].parameters.maxNumOfEndpoints: unknown parameter`)."""

from __future__ import annotations

import difflib
import logging
import random
import sys
import time
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from llm_epp.config import graph
from llm_epp.config.defaults import DEFAULT_CONFIG, DEFAULT_PRODUCERS
from llm_epp.config.gates import DEFAULTS as GATE_DEFAULTS
from llm_epp.config.gates import FLOW_CONTROL, resolve_gates
from llm_epp.config.schema import GIE_API_VERSION, EndpointPickerConfigSpec
from llm_epp.config.sections import (
    DataSourceBinding,
    check_in_flight_refs,
    resolve_data_layer,
    resolve_discovery,
    resolve_flow_control,
    resolve_parsers,
    resolve_saturation,
)
from llm_epp.flowcontrol.config import FlowControlConfig
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
from llm_epp.framework.datalayer import DataSource, EndpointDiscovery, Extractor
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.parsing import Parser
from llm_epp.framework.registry import PluginLoadError, PluginParamsError, UnknownParam, UnknownPluginTypeError
from llm_epp.framework.requestcontrol import (
    Admission,
    PrepareData,
    PreRequest,
    ResponseComplete,
    ResponseFirstBody,
    ResponseReceived,
    Screener,
)
from llm_epp.scheduling import Scheduler, SchedulerProfile, WeightedScorer
from llm_epp.scheduling.profile import TOTAL

log = logging.getLogger(__name__)


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
    data_sources: list[DataSourceBinding] = field(default_factory=list)  # empty: no metrics collection
    parsers: list[Parser] = field(default_factory=list)  # empty: the director's default parsers
    feature_gates: dict[str, bool] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # accepted, but worth fixing (`config check --strict` fails)
    screeners: list[Screener] = field(default_factory=list)
    prepare_data: list[PrepareData] = field(default_factory=list)  # producers before their consumers
    admission: list[Admission] = field(default_factory=list)
    pre_request: list[PreRequest] = field(default_factory=list)
    response_received: list[ResponseReceived] = field(default_factory=list)
    response_first_body: list[ResponseFirstBody] = field(default_factory=list)
    response_complete: list[ResponseComplete] = field(default_factory=list)
    flow_control: FlowControlConfig | None = None  # the flowControl gate is on: requests queue in the EPP
    discovery: EndpointDiscovery | None = None  # dataLayer.discovery: endpoints come from this plugin

    @property
    def metrics_binding(self) -> int | None:
        """Index in `data_sources` of the source feeding the metrics extractor, None: no metrics collection."""
        for i, b in enumerate(self.data_sources):
            if any(isinstance(e, Extractor) for e in b.extractors):
                return i
        return None

    @property
    def data_source(self) -> DataSource | None:
        """The polled metrics source, or None: no metrics collection."""
        i = self.metrics_binding
        source = None if i is None else self.data_sources[i].source
        return source if isinstance(source, DataSource) else None

    @property
    def extractor(self) -> Extractor | None:
        i = self.metrics_binding
        if i is None:
            return None
        return next(e for e in self.data_sources[i].extractors if isinstance(e, Extractor))

    def describe(self) -> str:
        """A human-readable summary of the resolved configuration (`llm-epp config check`)."""
        out = [f"profile handler: {self.handler_name} ({self.plugin_types[self.handler_name]})"]
        out.append("plugins:")
        for name, ptype in self.plugin_types.items():
            params = self.plugin_params.get(name) or {}
            shown = ", ".join(f"{k}={v}" for k, v in params.items())
            out.append(f"  {name} ({ptype}){': ' + shown if shown else ''}")
        changed = [f"{g}={str(v).lower()}" for g, v in self.feature_gates.items() if v != GATE_DEFAULTS.get(g)]
        if changed:
            out.append(f"feature gates: {', '.join(changed)}")
        if self.saturation is not None:
            out.append(f"saturation detector: {self.saturation.typed_name}")
        if self.flow_control is not None:
            out.append(_describe_flow_control(self.flow_control))
        if self.parsers:
            out.append(f"parsers: {', '.join(str(p.typed_name) for p in self.parsers)}")
        else:
            out.append("parsers: the built-in OpenAI parsing")
        for i, b in enumerate(self.data_sources):
            role = "metrics" if i == self.metrics_binding else "data source"
            out.append(f"{role}: {b.source.typed_name} -> {', '.join(str(e.typed_name) for e in b.extractors)}")
        if self.metrics_binding is None:
            out.append("metrics: not collected")
        if self.discovery is not None:
            out.append(f"discovery: {self.discovery.typed_name} ({self.discovery.path})")
        if self.prepare_data:
            out.append(f"prepare data: {', '.join(str(p.typed_name) for p in self.prepare_data)}")
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
    strict: bool = False,
    clock: Callable[[], float] = time.monotonic,
    random_source: RandomSource = os_random,
) -> LoadedConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(str(p), [f"cannot read the file: {e.strerror}"]) from None
    return load_config_text(
        text, registry, recorder, endpoints, source=str(p), clock=clock, strict=strict, random_source=random_source
    )


def load_config_text(
    text: str | None,
    registry: Registry,
    recorder: Recorder,
    endpoints: Callable[[], Sequence[Endpoint]] = tuple,
    source: str = "--config-text",
    clock: Callable[[], float] = time.monotonic,
    strict: bool = False,
    random_source: RandomSource = os_random,
) -> LoadedConfig:
    """Parses and builds an EndpointPickerConfig (``None`` or blank: the default configuration).

    ``clock`` is what plugins get from ``handle.now()`` (monotonic seconds, the time base of
    ``Metrics.update_time``); a simulator passes its virtual clock. ``strict``: unknown plugin parameters
    are errors (llm-d-router's rule) instead of warnings (GIE v1.5.0 ignores them). ``random_source`` gives
    the plugins' (``handle.rng(name)``) and the profiles' generators; a reproducible run passes
    ``seeded_random(seed)``."""
    if text is None or not text.strip():
        text, source = DEFAULT_CONFIG, "the default configuration"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(source, [f"not valid YAML{where}: {getattr(e, 'problem', e)}"]) from None
    if raw is None:  # only comments
        return load_config_text(
            None, registry, recorder, endpoints, clock=clock, strict=strict, random_source=random_source
        )
    if not isinstance(raw, dict):
        raise ConfigError(source, ["the document must be a mapping with apiVersion, kind and plugins"])
    try:
        spec = EndpointPickerConfigSpec.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(source, _schema_problems(err)) from None
    return _build(spec, registry, recorder, endpoints, source, clock, strict, random_source)


def _build(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    recorder: Recorder,
    endpoints: Callable[[], Sequence[Endpoint]],
    source: str,
    clock: Callable[[], float],
    strict: bool = False,
    random_source: RandomSource = os_random,
) -> LoadedConfig:
    problems: list[str] = []
    warnings: list[str] = []
    if spec.api_version == GIE_API_VERSION and "api_version" in spec.model_fields_set:
        log.info("config_api_version_deprecated apiVersion=%s replacement=llm-d.ai/v1alpha1", spec.api_version)
    elif spec.api_version != GIE_API_VERSION:  # llm-d-router's deprecations of GIE's section names
        if spec.saturation_detector is not None:
            log.info("config_field_deprecated field=saturationDetector replacement=flowControl.saturationDetector")
        if spec.parser is not None:
            log.info("config_field_deprecated field=parser replacement=requestHandler.parsers")
    gates = resolve_gates(spec.feature_gates)
    problems += gates.problems
    warnings += gates.warnings

    plugins: dict[str, Plugin] = {}
    types: dict[str, str] = {}
    params: dict[str, dict[str, Any]] = {}
    handle = _LoaderHandle(plugins, endpoints, recorder, clock, random_source)
    seen_names: set[str] = set()
    declared = {ps.name or ps.type for ps in spec.plugins}
    for i, ps in enumerate(spec.plugins):
        name = ps.name or ps.type
        if name in seen_names:
            problems.append(f"plugins[{i}].name: plugin name {name!r} is used twice; give each a unique name")
            continue
        seen_names.add(name)
        if name == TOTAL:
            problems.append(f"plugins[{i}].name: {TOTAL!r} is reserved for the summed score; choose another name")
            continue
        unknown: list[UnknownParam] = []
        try:
            plugins[name] = registry.build(ps.type, name, ps.parameters, handle, unknown)
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
        for u in unknown:
            hint = f"; did you mean {u.suggestion!r}?" if u.suggestion else ""
            if strict:
                problems.append(f"plugins[{i}].parameters.{u.path}: unknown parameter of {name!r} ({ps.type}){hint}")
            else:
                warnings.append(
                    f"plugins[{i}].parameters.{u.path}: unknown parameter of {name!r} ({ps.type}), ignored{hint}"
                )
        types[name] = ps.type
        params[name] = dict(ps.parameters or {})

    def build_default(plugin_type: str, raw: Mapping[str, Any] | None) -> tuple[str, Plugin, dict[str, Any]] | str:
        name = _unused_name(plugin_type, seen_names)
        try:  # keys the producer lacks come from the consumer, whose own unknown keys are reported above
            fields = registry.entry(plugin_type).params_model.model_fields
            accepted = {f.alias or n for n, f in fields.items()} | set(fields)
            used = {k: v for k, v in (raw or {}).items() if k in accepted}
            return name, registry.build(plugin_type, name, used or None, handle), used
        except UnknownPluginTypeError:
            return f"plugin type {plugin_type!r} is not implemented yet; configure another producer of the data"
        except (PluginParamsError, ValueError) as e:
            return str(e)

    def params_extend(consumer_type: str, producer_type: str) -> bool:
        try:
            return issubclass(registry.entry(consumer_type).params_model, registry.entry(producer_type).params_model)
        except UnknownPluginTypeError:
            return False

    producers = {**DEFAULT_PRODUCERS, **registry.default_producers()}
    problems += graph.add_missing_producers(plugins, types, params, producers, params_extend, build_default)

    def add_default(plugin_type: str) -> Plugin:
        auto_name = _unused_name(plugin_type, seen_names)
        built = registry.build(plugin_type, auto_name, None, handle)
        plugins[auto_name] = built
        types[auto_name] = plugin_type
        return built

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
                if ref not in declared:
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
            if not used and isinstance(plugin, PrepareData):
                # GIE's chart lists `predicted-latency-producer` in the profile; a data producer runs as
                # request control (before scheduling) wherever it is listed, as in the reference.
                used = True
            if not used:
                # Both reference EPPs skip a plugin of another kind in a profile (a parser, a profile handler):
                # it keeps the role it is declared for and does nothing in the profile.
                warnings.append(
                    f"{where}.plugins[{j}].pluginRef: {ref!r} ({types[ref]}) is not a filter, scorer or picker; "
                    "it does nothing in a profile (as in the reference EPPs): remove it from the profile"
                )
        if len(pickers) > 1:
            names = ", ".join(p.typed_name.name for p in pickers)
            problems.append(f"{where}.plugins: a profile may have only one picker, found {names}")
            continue
        if not pickers:
            existing = [p for p in plugins.values() if isinstance(p, Picker)]
            auto = existing[0] if existing else add_default("max-score-picker")
            assert isinstance(auto, Picker)
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
        built = add_default("single-profile-handler")
        assert isinstance(built, ProfileHandler)
        handler = built
    elif declared - plugins.keys():
        pass  # a declared plugin failed to build (its problem is reported): it may be the handler
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

    parsers = resolve_parsers(spec, registry, plugins, types, add_default, problems, declared)
    saturation = resolve_saturation(spec, registry, plugins, types, add_default, problems, declared)
    data_sources = resolve_data_layer(spec, registry, plugins, types, add_default, problems, declared)
    discovery = resolve_discovery(spec, plugins, types, problems, declared)
    check_in_flight_refs(spec, types, problems)
    flow_control = resolve_flow_control(
        spec,
        gates.values[FLOW_CONTROL],
        registry,
        plugins,
        types,
        add_default,
        problems,
        declared,
        build_internal=lambda plugin_type: registry.build(plugin_type, plugin_type, None, handle),
    )
    order, graph_problems = graph.data_order(plugins, types)
    problems += graph_problems

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
        data_sources=data_sources,
        discovery=discovery,
        parsers=parsers,
        feature_gates=gates.values,
        warnings=warnings,
        flow_control=flow_control,
    )
    for name in order:
        p = plugins[name]
        if isinstance(p, Screener):
            loaded.screeners.append(p)
        if isinstance(p, PrepareData):
            loaded.prepare_data.append(p)
        if isinstance(p, Admission):
            loaded.admission.append(p)
        if isinstance(p, PreRequest):
            loaded.pre_request.append(p)
        if isinstance(p, ResponseReceived):
            loaded.response_received.append(p)
        if isinstance(p, ResponseFirstBody):
            loaded.response_first_body.append(p)
        if isinstance(p, ResponseComplete):
            loaded.response_complete.append(p)
    warnings += _unused(loaded, spec)
    for w in warnings:
        log.warning("config_warning source=%s %s", source, w)
    return loaded


def _unused(loaded: LoadedConfig, spec: EndpointPickerConfigSpec) -> list[str]:
    """Declared plugins that nothing runs: not in a profile, not a hook, not referenced by a section."""
    used: set[int] = {id(loaded.scheduler.handler)}
    for profile in loaded.scheduler.profiles.values():
        used.update(id(f) for f in profile.filters)
        used.update(id(s.scorer) for s in profile.scorers)
        used.add(id(profile.picker))
    hooks: list[Sequence[object]] = [
        loaded.screeners,
        loaded.prepare_data,
        loaded.admission,
        loaded.pre_request,
        loaded.response_received,
        loaded.response_first_body,
        loaded.response_complete,
        loaded.parsers,
    ]
    for group in hooks:
        used.update(id(p) for p in group)
    for b in loaded.data_sources:
        used.add(id(b.source))
        used.update(id(e) for e in b.extractors)
    if loaded.saturation is not None:
        used.add(id(loaded.saturation))
    if loaded.discovery is not None:
        used.add(id(loaded.discovery))
    fc = loaded.flow_control
    if fc is not None:
        used.add(id(fc.usage_limit))
        for band in [
            fc.default_band,
            *fc.bands.values(),
            *([fc.default_negative_band] if fc.default_negative_band else []),
        ]:
            used.update((id(band.fairness), id(band.ordering)))
        if fc.eviction is not None:
            used.update((id(fc.eviction.ordering), id(fc.eviction.filter)))
    named = {v for ps in spec.plugins for v in _strings(ps.parameters)}  # plugins another plugin refers to
    out = []
    for i, ps in enumerate(spec.plugins):
        plugin = loaded.plugins.get(ps.name or ps.type)
        if plugin is None or id(plugin) in used or isinstance(plugin, ProfileHandler):
            continue
        if (ps.name or ps.type) in named:
            continue
        if getattr(sys.modules.get(type(plugin).__module__), "COMPATIBILITY_ONLY", False):
            continue
        out.append(
            f"plugins[{i}]: {ps.name or ps.type!r} ({ps.type}) is declared but no profile, hook or section uses it, "
            "so it has no effect"
        )
    return out


def _describe_flow_control(fc: FlowControlConfig) -> str:
    def limit(n: int, unit: str) -> str:
        return f"{n} {unit}" if n else f"unlimited {unit}"

    def ttl(t: float | None) -> str:
        return f"{t:g}s" if t is not None else "none"

    lines = [
        f"flow control: {limit(fc.max_requests, 'requests')}, {limit(fc.max_bytes, 'bytes')}; "
        f"request TTL {ttl(fc.request_ttl)}, with no endpoints {ttl(fc.no_endpoint_request_ttl)}; "
        f"usage limit {fc.usage_limit.typed_name}"
    ]
    named = [("default band", fc.default_band)]
    if fc.default_negative_band is not None:
        named.append(("default negative band", fc.default_negative_band))
    named += [(f"band {p}", b) for p, b in sorted(fc.bands.items(), reverse=True)]
    for label, b in named:
        lines.append(
            f"  {label}: {limit(b.max_requests, 'requests')}, {limit(b.max_bytes, 'bytes')}, "
            f"fairness {b.fairness.typed_name}, ordering {b.ordering.typed_name}"
        )
    if fc.eviction is not None:
        ev = fc.eviction
        lines.append(
            f"  eviction of dispatched requests: filter {ev.filter.typed_name}, order {ev.ordering.typed_name}"
        )
    return "\n".join(lines)


def _strings(value: object) -> Iterator[str]:
    """Every string inside a parameters value (plugin names other plugins take as parameters)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)
