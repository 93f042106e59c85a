"""The sections that name plugins by reference: parsers (`requestHandler.parsers`, `parser`), the
saturation detector (`flowControl.saturationDetector`, `saturationDetector`), the data layer
(`dataLayer`) and flow control (`flowControl`). Each resolves its references against the built plugins,
creating upstream's defaults where upstream does, and reports problems with their YAML paths. A reference to
a declared plugin that failed to build is not reported again (its own problem is)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from llm_epp.config.gates import FLOW_CONTROL_WITHOUT_GATE
from llm_epp.config.schema import LLM_D_API_VERSIONS, EndpointPickerConfigSpec, PriorityBandSpec
from llm_epp.flowcontrol.config import (
    BAND_MAX_BYTES,
    ROUTER_BAND_MAX_REQUESTS,
    ROUTER_REQUEST_TTL,
    BandConfig,
    EvictionPolicies,
    FlowControlConfig,
)
from llm_epp.framework import Plugin, Registry
from llm_epp.framework.datalayer import (
    PAYLOAD_JSON,
    BodyExtractor,
    DataDependency,
    DataLayerRegistrant,
    DataSource,
    EndpointDiscovery,
    EndpointEventExtractor,
    EndpointEventSource,
    Extractor,
    GroupVersionKind,
    ObjectEventExtractor,
    ObjectEventSource,
    PageAttributeExtractor,
    source_payload,
)
from llm_epp.framework.durations import parse_go_duration
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.flowpolicy import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)
from llm_epp.framework.parsing import Parser
from llm_epp.framework.registry import PluginParamsError

_EXTRACTORS = (Extractor, PageAttributeExtractor, BodyExtractor, EndpointEventExtractor, ObjectEventExtractor)
DEFAULT_PARSER = "openai-parser"  # GIE's default; the director's built-in parsing until it is a plugin
DEFAULT_SATURATION_DETECTOR = "utilization-detector"
DEFAULT_DATA_SOURCE = "metrics-data-source"
DEFAULT_EXTRACTOR = "core-metrics-extractor"  # the reference instantiates it when none is configured
DEFAULT_FAIRNESS_POLICY = "global-strict-fairness-policy"
DEFAULT_ORDERING_POLICY = "fcfs-ordering-policy"
DEFAULT_USAGE_LIMIT_POLICY = "static-usage-limit-policy"
DEFAULT_EVICTION_ORDERING = "priority-then-time-eviction-order-policy"
DEFAULT_EVICTION_FILTER = "sheddable-eviction-filter"


@dataclass(frozen=True, slots=True)
class DataSourceBinding:
    """One `dataLayer.sources[]` entry: a source and the extractors fed from it, in order (a metrics
    `Extractor`, `PageAttributeExtractor`s or `BodyExtractor`s)."""

    source: Plugin  # a DataSource (polled), EndpointEventSource or ObjectEventSource
    extractors: tuple[Plugin, ...]


def resolve_parsers(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    add_default: Callable[[str], Plugin],
    problems: list[str],
    declared: set[str],
) -> list[Parser]:
    """`requestHandler.parsers` (llm-d-router), else GIE's `parser`. A reference to no declared plugin
    creates a plugin of that type, as upstream does for its default parsers; `openai-parser` stands for
    the director's built-in OpenAI parsing until it is a registered plugin."""
    if spec.request_handler is not None and spec.request_handler.parsers:
        refs = [(f"requestHandler.parsers[{i}]", r.plugin_ref) for i, r in enumerate(spec.request_handler.parsers)]
    elif spec.parser is not None:
        refs = [("parser", spec.parser.plugin_ref)]
    else:
        return []
    out: list[Parser] = []
    for where, ref in refs:
        plugin = plugins.get(ref)
        if plugin is None and ref in declared:
            continue  # declared but failed to build: its own problem is reported
        if plugin is None and ref in registry:
            try:
                plugin = add_default(ref)
            except (PluginParamsError, ValueError) as e:
                problems.append(f"{where}.pluginRef: {ref!r} needs parameters; declare it under plugins ({e})")
                continue
        if plugin is None:
            if ref == DEFAULT_PARSER:
                continue  # the director's built-in OpenAI parsing
            problems.append(
                f"{where}.pluginRef: no plugin named {ref!r} is defined and it is not a parser type; declare it "
                "under plugins"
            )
        elif not isinstance(plugin, Parser):
            problems.append(f"{where}.pluginRef: {ref!r} ({types[plugin.typed_name.name]}) is not a parser")
        else:
            out.append(plugin)
    return out


def resolve_saturation(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    add_default: Callable[[str], Plugin],
    problems: list[str],
    declared: set[str],
) -> SaturationDetector | None:
    """`flowControl.saturationDetector` (llm-d-router), else `saturationDetector` (GIE); unset or empty means
    `utilization-detector`, which is created when no plugin of that name is declared."""
    fc = spec.flow_control
    if fc is not None and fc.saturation_detector is not None:
        where, ref = "flowControl.saturationDetector", fc.saturation_detector.plugin_ref
    elif spec.saturation_detector is not None:
        where, ref = "saturationDetector", spec.saturation_detector.plugin_ref
    else:
        where, ref = "saturationDetector", ""
    ref = ref or DEFAULT_SATURATION_DETECTOR
    detector = plugins.get(ref)
    if detector is None and ref == DEFAULT_SATURATION_DETECTOR and ref in registry:
        detector = add_default(ref)
    if detector is None:
        if ref not in declared:
            problems.append(f"{where}.pluginRef: no plugin named {ref!r} is defined")
        return None
    if not isinstance(detector, SaturationDetector):
        problems.append(f"{where}.pluginRef: {ref!r} ({types[ref]}) is not a saturation detector")
        return None
    return detector


def resolve_data_layer(
    spec: EndpointPickerConfigSpec,
    registry: Registry,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    add_default: Callable[[str], Plugin],
    problems: list[str],
    declared: set[str],
) -> list[DataSourceBinding]:
    """`dataLayer`. Omitted: the default metrics source and extractor. Given: its sources, plus (llm-d-router,
    `injectDefaults` unset or true) the default metrics source when none of that name is listed; with a
    GIE apiVersion and `injectDefaults` unset, exactly the sources listed (none: no metrics collection)."""
    dl = spec.data_layer
    out: list[DataSourceBinding] = []
    unbuilt: set[str] = set()  # sources with a listed extractor that failed to build
    if dl is None:
        inject = True
    else:
        if dl.cross_replica_syncer_plugin_ref or dl.cross_replica_sync_interval:
            problems.append(
                "dataLayer.crossReplicaSyncerPluginRef: syncing endpoint data across EPP replicas is not "
                "supported yet; remove crossReplicaSyncerPluginRef and crossReplicaSyncInterval"
            )
        for i, src in enumerate(dl.sources):
            where = f"dataLayer.sources[{i}]"
            source_plugin = plugins.get(src.plugin_ref)
            extractors: list[Plugin] = []
            for j, ex in enumerate(src.extractors):
                ex_plugin = plugins.get(ex.plugin_ref)
                if ex_plugin is None and ex.plugin_ref in declared:
                    unbuilt.add(src.plugin_ref)  # its own problem is reported
                    continue
                if ex_plugin is None:
                    problems.append(f"{where}.extractors[{j}].pluginRef: no plugin named {ex.plugin_ref!r} is defined")
                elif not isinstance(ex_plugin, _EXTRACTORS):
                    problems.append(
                        f"{where}.extractors[{j}].pluginRef: {ex.plugin_ref!r} ({types[ex.plugin_ref]}) is not an "
                        "extractor"
                    )
                else:
                    extractors.append(ex_plugin)
            if source_plugin is None:
                if src.plugin_ref not in declared:
                    problems.append(f"{where}.pluginRef: no plugin named {src.plugin_ref!r} is defined")
            elif not isinstance(source_plugin, DataSource | EndpointEventSource | ObjectEventSource):
                problems.append(f"{where}.pluginRef: {src.plugin_ref!r} ({types[src.plugin_ref]}) is not a data source")
            elif not src.extractors and isinstance(source_plugin, DataSource):
                problems.append(f"{where}.extractors: a data source needs at least one extractor")
            elif _check_extractors(where, source_plugin, extractors, types, problems):
                out.append(DataSourceBinding(source_plugin, tuple(extractors)))
        if dl.inject_defaults is not None:
            inject = dl.inject_defaults
        else:
            inject = spec.api_version in LLM_D_API_VERSIONS
        if any(s.plugin_ref == DEFAULT_DATA_SOURCE for s in dl.sources):
            inject = False
    if inject and DEFAULT_DATA_SOURCE in registry and DEFAULT_EXTRACTOR in registry:
        default_source = plugins.get(DEFAULT_DATA_SOURCE) or add_default(DEFAULT_DATA_SOURCE)
        default_extractor = plugins.get(DEFAULT_EXTRACTOR) or add_default(DEFAULT_EXTRACTOR)
        if isinstance(default_source, DataSource) and isinstance(default_extractor, Extractor):
            out.append(DataSourceBinding(default_source, (default_extractor,)))
    for plugin in list(plugins.values()):
        if isinstance(plugin, DataLayerRegistrant):
            for dep in plugin.data_dependencies():
                _bind(out, dep, types)
    for b in out:
        if not b.extractors and b.source.typed_name.name not in unbuilt:
            problems.append(
                f"dataLayer.sources: no extractor reads the events of {b.source.typed_name.name!r}; list one under it "
                "(or remove the source)"
            )
    kinds: dict[GroupVersionKind, str] = {}
    for b in out:
        if isinstance(b.source, ObjectEventSource):
            other = kinds.setdefault(b.source.gvk, b.source.typed_name.name)
            if other != b.source.typed_name.name:
                problems.append(
                    f"dataLayer.sources: {b.source.typed_name.name!r} watches {b.source.gvk} as {other!r} does; one "
                    "notification source per kind"
                )
    feeding = [b for b in out if any(isinstance(e, Extractor) for e in b.extractors)]
    if len(feeding) > 1:
        problems.append(
            f"dataLayer.sources: {len(feeding)} sources feed a metrics extractor "
            f"({', '.join(b.source.typed_name.name for b in feeding)}); more than one is not supported yet"
        )
    return out


def resolve_discovery(
    spec: EndpointPickerConfigSpec,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    problems: list[str],
    declared: set[str],
) -> EndpointDiscovery | None:
    """`dataLayer.discovery.pluginRef`: a declared endpoint-discovery plugin (`file-discovery`)."""
    dl = spec.data_layer
    if dl is None or dl.discovery is None:
        return None
    ref = dl.discovery.plugin_ref
    plugin = plugins.get(ref)
    if plugin is None:
        if ref not in declared:
            problems.append(
                f"dataLayer.discovery.pluginRef: no plugin named {ref!r} is defined; declare it under plugins "
                "(e.g. type file-discovery with parameters.path)"
            )
        return None
    if not isinstance(plugin, EndpointDiscovery):
        problems.append(f"dataLayer.discovery.pluginRef: {ref!r} ({types[ref]}) is not an endpoint discovery plugin")
        return None
    return plugin


IN_FLIGHT_PRODUCER = "inflight-load-producer"
IN_FLIGHT_REF = "inFlightLoadProducerName"


def check_in_flight_refs(spec: EndpointPickerConfigSpec, types: dict[str, str], problems: list[str]) -> None:
    """`inFlightLoadProducerName` must name an `inflight-load-producer`: one declared under that name, or the
    type's own name (the producer upstream creates when none is declared). llm-epp keeps one in-flight
    account per endpoint, in the core, which every inflight-load-producer stands for."""
    for i, ps in enumerate(spec.plugins):
        value = (ps.parameters or {}).get(IN_FLIGHT_REF)
        if not isinstance(value, str) or not value:
            continue
        declared = types.get(value)
        if declared == IN_FLIGHT_PRODUCER or (declared is None and value == IN_FLIGHT_PRODUCER):
            continue
        what = f"is a {declared}" if declared is not None else "names no plugin"
        problems.append(
            f"plugins[{i}].parameters.{IN_FLIGHT_REF}: {value!r} {what}; name an {IN_FLIGHT_PRODUCER} (declare "
            f"`- type: {IN_FLIGHT_PRODUCER}` with name {value!r}) or leave the parameter out"
        )


def _bind(out: list[DataSourceBinding], dep: DataDependency, types: dict[str, str]) -> None:
    """A plugin's own data dependency: its extractor joins the configured source of the type (and kind), or
    the plugin's default source is added (as the reference resolves pending registrations)."""
    for i, b in enumerate(out):
        src = b.source
        if types.get(src.typed_name.name, src.typed_name.type) != dep.source_type:
            continue
        if dep.gvk is not None and not (isinstance(src, ObjectEventSource) and src.gvk == dep.gvk):
            continue
        if any(e is dep.extractor for e in b.extractors):
            return
        out[i] = DataSourceBinding(src, (*b.extractors, dep.extractor))
        return
    out.append(DataSourceBinding(dep.default_source, (dep.extractor,)))


def _check_extractors(
    where: str, source: Plugin, extractors: list[Plugin], types: dict[str, str], problems: list[str]
) -> bool:
    """Each extractor must read what the source hands it (a Prometheus page, a JSON body, endpoint events or
    object events of the source's kind), and no type twice on one source (as upstream)."""
    ok = True
    src_name = source.typed_name.name
    src_desc = f"{src_name!r} ({types.get(src_name, source.typed_name.type)})"
    seen: set[str] = set()
    for ex in extractors:
        name = ex.typed_name.name
        ex_type = types.get(name, ex.typed_name.type)
        if ex_type in seen:
            problems.append(f"{where}.extractors: extractor type {ex_type!r} is listed twice for this source")
            ok = False
        seen.add(ex_type)
        what = ""
        if isinstance(source, EndpointEventSource):
            if not isinstance(ex, EndpointEventExtractor):
                what = "endpoint events"
        elif isinstance(source, ObjectEventSource):
            if not isinstance(ex, ObjectEventExtractor):
                what = f"{source.gvk} events"
            elif ex.gvk != source.gvk:
                problems.append(
                    f"{where}.extractors: {name!r} ({ex_type}) reads {ex.gvk} events, {src_desc} watches {source.gvk}"
                )
                ok = False
        elif isinstance(source, DataSource):
            json = source_payload(source) == PAYLOAD_JSON
            reads = isinstance(ex, BodyExtractor) if json else isinstance(ex, Extractor | PageAttributeExtractor)
            if not reads:
                what = "a JSON answer" if json else "a Prometheus metrics page"
        if what:
            problems.append(f"{where}.extractors: {name!r} ({ex_type}) cannot read what {src_desc} hands it ({what})")
            ok = False
    return ok


def resolve_flow_control(
    spec: EndpointPickerConfigSpec,
    enabled: bool,
    registry: Registry,
    plugins: dict[str, Plugin],
    types: dict[str, str],
    add_default: Callable[[str], Plugin],
    problems: list[str],
    declared: set[str],
    build_internal: Callable[[str], Plugin] | None = None,
) -> FlowControlConfig | None:
    """`flowControl` with the `flowControl` gate on: the bands with their policies (references to declared
    plugins; upstream's default policies are created when not declared), limits and TTLs. Defaults follow
    the apiVersion: llm-d-router's (band maxRequests 5000, TTLs 60s) for `llm-d.ai/*`, GIE v1.5.0's (no band
    request limit, no TTL) otherwise."""
    fc = spec.flow_control
    if not enabled:
        if fc is not None and fc.settings():
            problems.append(f"flowControl ({', '.join(fc.settings())}): {FLOW_CONTROL_WITHOUT_GATE}")
        return None
    router = spec.api_version in LLM_D_API_VERSIONS
    ok = True

    def policy(where: str, ref: str | None, default: str, kind: type[Any], what: str) -> Any:
        nonlocal ok
        name = ref or default
        plugin = plugins.get(name)
        if plugin is None and name in declared:
            ok = False  # declared but failed to build: its own problem is reported
            return None
        if plugin is None and not ref and name in registry:  # upstream's default, by its type name
            plugin = add_default(name)
        if plugin is None:
            ok = False
            problems.append(
                f"{where}: no plugin named {name!r} is defined; declare a {what} under plugins "
                f"(e.g. `- type: {default}`) and refer to it by name"
            )
            return None
        if not isinstance(plugin, kind):
            ok = False
            problems.append(f"{where}: {name!r} ({types.get(name, plugin.typed_name.type)}) is not a {what}")
            return None
        return plugin

    band_max_requests = ROUTER_BAND_MAX_REQUESTS if router else 0

    def band(where: str, b: PriorityBandSpec | None, priority: int | None = None) -> BandConfig | None:
        fairness = policy(
            f"{where}.fairnessPolicyRef",
            b.fairness_policy_ref if b else None,
            DEFAULT_FAIRNESS_POLICY,
            FairnessPolicy,
            "fairness policy",
        )
        ordering = policy(
            f"{where}.orderingPolicyRef",
            b.ordering_policy_ref if b else None,
            DEFAULT_ORDERING_POLICY,
            OrderingPolicy,
            "ordering policy",
        )
        if fairness is None or ordering is None:
            return None
        return BandConfig(
            priority=(b.priority if b else 0) if priority is None else priority,
            fairness=fairness,
            ordering=ordering,
            max_bytes=(b.max_bytes if b and b.max_bytes else None) or BAND_MAX_BYTES,
            max_requests=(b.max_requests if b and b.max_requests else None) or band_max_requests,
        )

    def ttl(where: str, raw: str | None) -> float | None:
        nonlocal ok
        if raw is None:
            return ROUTER_REQUEST_TTL if router else None
        try:
            seconds = parse_go_duration(raw)
        except ValueError as e:
            ok = False
            problems.append(f"flowControl.{where}: {e}")
            return None
        if seconds < 0:
            ok = False
            problems.append(f"flowControl.{where}: must not be negative, got {raw!r} (0s: no time limit)")
        return seconds or None

    for where, value in (("maxBytes", fc.max_bytes if fc else None), ("maxRequests", fc.max_requests if fc else None)):
        if value is not None and value < 0:
            ok = False
            problems.append(f"flowControl.{where}: must not be negative, got {value}")
    eviction = None
    if fc is not None and fc.enable_eviction:
        eviction = _eviction_policies(plugins, build_internal or add_default)
    for where, template in (
        ("defaultPriorityBand", fc.default_priority_band if fc else None),
        ("defaultNegativePriorityBand", fc.default_negative_priority_band if fc else None),
    ):
        if template is not None and template.priority != 0:
            ok = False
            problems.append(
                f"flowControl.{where}.priority: a priority on a band template is not supported yet (upstream "
                "ignores it: each provisioned band takes the priority of its requests); remove it, or configure "
                "that priority under priorityBands"
            )
    default_band = band("flowControl.defaultPriorityBand", fc.default_priority_band if fc else None, 0)
    negative = None
    if fc is not None and fc.default_negative_priority_band is not None:
        negative = band("flowControl.defaultNegativePriorityBand", fc.default_negative_priority_band, -1)
    bands: dict[int, BandConfig] = {}
    for i, b in enumerate(fc.priority_bands if fc else []):
        where = f"flowControl.priorityBands[{i}]"
        if b.priority in bands:
            ok = False
            problems.append(f"{where}.priority: priority {b.priority} is configured twice; give each band its own")
            continue
        built = band(where, b)
        if built is not None:
            bands[b.priority] = built
    usage = policy(
        "flowControl.usageLimitPolicyPluginRef",
        fc.usage_limit_policy_plugin_ref if fc else None,
        DEFAULT_USAGE_LIMIT_POLICY,
        UsageLimitPolicy,
        "usage limit policy",
    )
    request_ttl = ttl("defaultRequestTTL", fc.default_request_ttl if fc else None)
    if fc is not None and fc.no_endpoint_request_ttl is not None:
        no_endpoint_ttl = ttl("noEndpointRequestTTL", fc.no_endpoint_request_ttl)
    elif fc is not None and fc.default_request_ttl is not None:
        no_endpoint_ttl = request_ttl
    else:
        no_endpoint_ttl = ttl("noEndpointRequestTTL", None)
    if not ok or default_band is None or usage is None:
        return None
    if 0 not in bands:  # priority 0 always exists, from the default band template
        bands[0] = default_band.at(0)
    return FlowControlConfig(
        default_band=default_band,
        usage_limit=usage,
        bands=bands,
        default_negative_band=negative,
        max_bytes=(fc.max_bytes or 0) if fc else 0,
        max_requests=(fc.max_requests or 0) if fc else 0,
        request_ttl=request_ttl,
        no_endpoint_request_ttl=no_endpoint_ttl,
        eviction=eviction,
    )


def _eviction_policies(plugins: dict[str, Plugin], build: Callable[[str], Plugin]) -> EvictionPolicies:
    """The eviction order and filter: a declared plugin of each kind (a Python plugin may provide its own),
    else llm-d-router's built-ins, which it always uses. The built-ins are part of the eviction machinery, not
    declared plugins (as upstream, enabling eviction needs no --allow-experimental-plugins)."""
    ordering: Plugin | None = next((p for p in plugins.values() if isinstance(p, EvictionOrderingPolicy)), None)
    filter_: Plugin | None = next((p for p in plugins.values() if isinstance(p, EvictionFilterPolicy)), None)
    if ordering is None:
        ordering = build(DEFAULT_EVICTION_ORDERING)
    if filter_ is None:
        filter_ = build(DEFAULT_EVICTION_FILTER)
    assert isinstance(ordering, EvictionOrderingPolicy) and isinstance(filter_, EvictionFilterPolicy)
    return EvictionPolicies(ordering, filter_)
