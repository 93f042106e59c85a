"""Nothing accepted silently does nothing.

Every field of the EndpointPickerConfig schema (walked from the pydantic models, so a new field is
found here) must either change what the loader resolves or how a request is routed, or be rejected with
a "not supported yet" message. Every plugin type of `builtin_registry()` (iterated, so types added later
are covered) must be wired into something that runs when configured where it belongs."""

from __future__ import annotations

import random
import typing
from typing import Any, Literal

import pytest
from pydantic import BaseModel

from llm_epp.config import ConfigError, LoadedConfig, load_config_text
from llm_epp.config.schema import EndpointPickerConfigSpec
from llm_epp.framework import Filter, NullRecorder, Picker, ProfileHandler, Registry, Scorer
from llm_epp.framework.datalayer import (
    PAYLOAD_JSON,
    BodyExtractor,
    DataSource,
    EndpointDiscovery,
    EndpointEventExtractor,
    EndpointEventSource,
    Extractor,
    ObjectEventSource,
    PageAttributeExtractor,
    source_payload,
)
from llm_epp.framework.flowcontrol import SaturationDetector
from llm_epp.framework.flowpolicy import (
    EvictionFilterPolicy,
    EvictionOrderingPolicy,
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
)
from llm_epp.framework.parsing import Parser
from llm_epp.framework.requestcontrol import PrepareData
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.disagg.common import Decider, DeciderRef
from tests.compat.plugins import compat_registry
from tests.contract.test_builtin_plugins import REFERENCE_PARAMS
from tests.unit.builders import endpoint, request


def _field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    out = []
    for name, f in model.model_fields.items():
        path = f"{prefix}{f.alias or name}"
        out.append(path)
        inner = _model_in(f.annotation)
        if inner is not None:
            is_list = typing.get_origin(f.annotation) is list or any(
                typing.get_origin(a) is list for a in typing.get_args(f.annotation)
            )
            out += _field_paths(inner, f"{path}[]." if is_list else f"{path}.")
    return out


def _model_in(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _model_in(arg)
        if found is not None:
            return found
    return None


FIELDS = _field_paths(EndpointPickerConfigSpec)

GIE = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
BASE = GIE + "plugins:\n- type: queue-scorer\n- type: kv-cache-utilization-scorer\n"
PROFILE = "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n"
PARSERS = GIE + "plugins:\n- {name: a, type: test-json-parser}\n- {name: b, type: test-json-parser}\n"
SOURCES = GIE + "plugins:\n- {name: src, type: metrics-data-source}\n- {name: ex, type: core-metrics-extractor}\n"
DISCOVERY = BASE + "- {name: fd, type: file-discovery, parameters: {path: /etc/epp/endpoints.yaml}}\n"
SATURATION = BASE + "- {name: c, type: concurrency-detector}\n"
GATED = (
    BASE
    + "- {name: f, type: round-robin-fairness-policy}\n- {name: o, type: edf-ordering-policy}\n"
    + "- {name: u, type: static-usage-limit-policy, parameters: {threshold: 0.5}}\nfeatureGates: [flowControl]\n"
)
FLOW = GATED + "flowControl:\n"
BAND = FLOW + "  priorityBands:\n  - "
DEFAULT_BAND = FLOW + "  defaultPriorityBand: "

# field path -> (a config without the field's effect, the same config using the field)
CASES: dict[str, tuple[str, str]] = {
    "apiVersion": (
        BASE + "dataLayer: {}\n",
        BASE.replace(GIE.split("\n")[0], "apiVersion: llm-d.ai/v1") + "dataLayer: {}\n",
    ),
    "featureGates": (BASE, BASE + "featureGates: [dataLayer]\n"),
    "plugins": (GIE, BASE),
    "plugins[].type": (BASE, BASE.replace("kv-cache-utilization-scorer", "running-requests-size-scorer")),
    "plugins[].name": (
        BASE + PROFILE,
        BASE.replace("- type: queue-scorer", "- {type: queue-scorer, name: q}") + PROFILE.replace("queue-scorer", "q"),
    ),
    "plugins[].parameters": (BASE, BASE + "- type: max-score-picker\n  parameters: {maxNumOfEndpoints: 2}\n"),
    "schedulingProfiles": (BASE, BASE + PROFILE),
    "schedulingProfiles[].name": (BASE + PROFILE, BASE + PROFILE.replace("name: default", "name: main")),
    "schedulingProfiles[].plugins": (BASE + PROFILE, BASE + PROFILE + "  - pluginRef: kv-cache-utilization-scorer\n"),
    "schedulingProfiles[].plugins[].pluginRef": (
        BASE + PROFILE,
        BASE + PROFILE.replace("pluginRef: queue-scorer", "pluginRef: kv-cache-utilization-scorer"),
    ),
    "schedulingProfiles[].plugins[].weight": (BASE + PROFILE, BASE + PROFILE + "    weight: 3\n"),
    "saturationDetector": (SATURATION, SATURATION + "saturationDetector: {pluginRef: c}\n"),
    "saturationDetector.pluginRef": (
        SATURATION + "saturationDetector: {}\n",
        SATURATION + "saturationDetector: {pluginRef: c}\n",
    ),
    "dataLayer": (BASE, BASE + "dataLayer: {}\n"),
    "dataLayer.injectDefaults": (BASE + "dataLayer: {}\n", BASE + "dataLayer: {injectDefaults: true}\n"),
    "dataLayer.sources": (
        SOURCES + "dataLayer: {}\n",
        SOURCES + "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex}]}]}\n",
    ),
    "dataLayer.sources[].pluginRef": (
        SOURCES + "dataLayer: {}\n",
        SOURCES + "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex}]}]}\n",
    ),
    "dataLayer.sources[].extractors": (
        SOURCES + "- {name: gpu, type: dcgm-extractor}\n"
        "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex}]}]}\n",
        SOURCES + "- {name: gpu, type: dcgm-extractor}\n"
        "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex}, {pluginRef: gpu}]}]}\n",
    ),
    "dataLayer.sources[].extractors[].pluginRef": (
        SOURCES + "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex}]}]}\n",
        SOURCES
        + "- {name: ex2, type: core-metrics-extractor}\n"
        + "dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: ex2}]}]}\n",
    ),
    "dataLayer.discovery": (DISCOVERY, DISCOVERY + "dataLayer: {discovery: {pluginRef: fd}}\n"),
    "dataLayer.discovery.pluginRef": (DISCOVERY, DISCOVERY + "dataLayer: {discovery: {pluginRef: fd}}\n"),
    "dataLayer.crossReplicaSyncerPluginRef": (BASE, BASE + "dataLayer: {crossReplicaSyncerPluginRef: x}\n"),
    "dataLayer.crossReplicaSyncInterval": (BASE, BASE + "dataLayer: {crossReplicaSyncInterval: 1s}\n"),
    "flowControl": (GATED, FLOW + "  maxRequests: 10\n"),
    "flowControl.maxBytes": (GATED, FLOW + "  maxBytes: 1Gi\n"),
    "flowControl.maxRequests": (GATED, FLOW + "  maxRequests: 1k\n"),
    "flowControl.defaultRequestTTL": (GATED, FLOW + "  defaultRequestTTL: 30s\n"),
    "flowControl.noEndpointRequestTTL": (GATED, FLOW + "  noEndpointRequestTTL: 2m\n"),
    "flowControl.defaultPriorityBand": (GATED, DEFAULT_BAND + "{maxRequests: 5}\n"),
    "flowControl.defaultPriorityBand.priority": (GATED, DEFAULT_BAND + "{priority: 1}\n"),
    "flowControl.defaultPriorityBand.maxBytes": (GATED, DEFAULT_BAND + "{maxBytes: 1Mi}\n"),
    "flowControl.defaultPriorityBand.maxRequests": (GATED, DEFAULT_BAND + "{maxRequests: 5}\n"),
    "flowControl.defaultPriorityBand.fairnessPolicyRef": (GATED, DEFAULT_BAND + "{fairnessPolicyRef: f}\n"),
    "flowControl.defaultPriorityBand.orderingPolicyRef": (GATED, DEFAULT_BAND + "{orderingPolicyRef: o}\n"),
    "flowControl.defaultNegativePriorityBand": (GATED, FLOW + "  defaultNegativePriorityBand: {}\n"),
    "flowControl.defaultNegativePriorityBand.priority": (
        GATED,
        FLOW + "  defaultNegativePriorityBand: {priority: -1}\n",
    ),
    "flowControl.defaultNegativePriorityBand.maxBytes": (
        GATED,
        FLOW + "  defaultNegativePriorityBand: {maxBytes: 1}\n",
    ),
    "flowControl.defaultNegativePriorityBand.maxRequests": (
        GATED,
        FLOW + "  defaultNegativePriorityBand: {maxRequests: 1}\n",
    ),
    "flowControl.defaultNegativePriorityBand.fairnessPolicyRef": (
        GATED,
        FLOW + "  defaultNegativePriorityBand: {fairnessPolicyRef: f}\n",
    ),
    "flowControl.defaultNegativePriorityBand.orderingPolicyRef": (
        GATED,
        FLOW + "  defaultNegativePriorityBand: {orderingPolicyRef: o}\n",
    ),
    "flowControl.priorityBands": (GATED, BAND + "{priority: 5}\n"),
    "flowControl.priorityBands[].priority": (GATED, BAND + "{priority: 5}\n"),
    "flowControl.priorityBands[].maxBytes": (GATED, BAND + "{maxBytes: 1k}\n"),
    "flowControl.priorityBands[].maxRequests": (GATED, BAND + "{maxRequests: 1k}\n"),
    "flowControl.priorityBands[].fairnessPolicyRef": (GATED, BAND + "{fairnessPolicyRef: f}\n"),
    "flowControl.priorityBands[].orderingPolicyRef": (GATED, BAND + "{orderingPolicyRef: o}\n"),
    "flowControl.usageLimitPolicyPluginRef": (GATED, FLOW + "  usageLimitPolicyPluginRef: u\n"),
    "flowControl.saturationDetector": (SATURATION, SATURATION + "flowControl: {saturationDetector: {pluginRef: c}}\n"),
    "flowControl.saturationDetector.pluginRef": (
        SATURATION + "flowControl: {saturationDetector: {}}\n",
        SATURATION + "flowControl: {saturationDetector: {pluginRef: c}}\n",
    ),
    "flowControl.enableEviction": (GATED, FLOW + "  enableEviction: true\n"),
    "requestHandler": (PARSERS, PARSERS + "requestHandler: {parsers: [{pluginRef: a}]}\n"),
    "requestHandler.parsers": (
        PARSERS + "requestHandler: {}\n",
        PARSERS + "requestHandler: {parsers: [{pluginRef: a}]}\n",
    ),
    "requestHandler.parsers[].pluginRef": (
        PARSERS + "requestHandler: {parsers: [{pluginRef: a}]}\n",
        PARSERS + "requestHandler: {parsers: [{pluginRef: b}]}\n",
    ),
    "parser": (PARSERS, PARSERS + "parser: {pluginRef: a}\n"),
    "parser.pluginRef": (PARSERS + "parser: {pluginRef: a}\n", PARSERS + "parser: {pluginRef: b}\n"),
}


def _only_value(path: str) -> bool:
    """A field whose type admits one value (`kind`): it cannot change anything, nor be set to do so."""
    model: type[BaseModel] = EndpointPickerConfigSpec
    f = model.model_fields[next(n for n, f in model.model_fields.items() if (f.alias or n) == path)]
    return typing.get_origin(f.annotation) is Literal and len(typing.get_args(f.annotation)) == 1


EPS = [
    endpoint("a", queue=1, kv=0.9, running=0, address="10.0.0.1"),
    endpoint("b", queue=6, kv=0.1, running=9, address="10.0.0.2"),
    endpoint("c", queue=3, kv=0.3, running=3, address="10.0.0.3"),
]


def _fingerprint(loaded: LoadedConfig) -> dict[str, Any]:
    """What a config resolves to, and how it routes one request."""
    result = loaded.scheduler.schedule(request(), EPS)
    routed = {
        name: ([e.key.name for e in r.target_endpoints], sorted((k.name, v) for k, v in (r.scores or {}).items()))
        for name, r in result.profile_results.items()
        if r is not None
    }
    return {
        "plugins": loaded.plugin_types,
        "params": loaded.plugin_params,
        "profiles": [(p.name, p.filters, p.scorers, p.picker) for p in loaded.profiles],
        "handler": loaded.handler_name,
        "saturation": str(loaded.saturation.typed_name) if loaded.saturation else None,
        "flow_control": loaded.describe().split("flow control:")[1].split("parsers:")[0]
        if loaded.flow_control
        else None,
        "data": [(str(b.source.typed_name), [str(e.typed_name) for e in b.extractors]) for b in loaded.data_sources],
        "discovery": str(loaded.discovery.typed_name) if loaded.discovery else None,
        "parsers": [str(p.typed_name) for p in loaded.parsers],
        "gates": loaded.feature_gates,
        "hooks": [str(p.typed_name) for p in loaded.prepare_data + loaded.pre_request],  # type: ignore[operator]
        "routed": routed,
    }


def _outcome(text: str, registry: Registry) -> dict[str, Any] | list[str]:
    try:
        return _fingerprint(load_config_text(text, registry, NullRecorder()))
    except ConfigError as e:
        return e.problems


def test_every_schema_field_has_a_case() -> None:
    missing = [p for p in FIELDS if p not in CASES and not _only_value(p)]
    assert not missing, f"schema fields without a case here (show their effect, or reject them): {missing}"
    assert not set(CASES) - set(FIELDS), "cases for fields the schema no longer has"


@pytest.mark.parametrize("path", sorted(CASES))
def test_each_field_has_an_effect_or_is_rejected_as_not_supported_yet(path: str) -> None:
    without, with_field = CASES[path]
    registry = compat_registry()
    before = _outcome(without, registry)
    after = _outcome(with_field, registry)
    assert isinstance(before, dict), f"the reference config of {path} must load: {before}"
    if isinstance(after, list):
        assert any("not supported yet" in p for p in after), (
            f"{path}: rejected, but not as 'not supported yet': {after}"
        )
    else:
        assert after != before, f"{path}: accepted and changes nothing"


# ----------------------------------------------------------------------------------------- plugin types

REGISTRY = builtin_registry()
EFFECT_IN_CORE = {
    "inflight-load-producer": "the director counts every request's in-flight load itself (Endpoint.load)",
}
"""Types accepted for compatibility whose upstream effect llm-epp's core provides whether or not they are
configured. Each must implement no extension point (else it belongs in the walk below)."""


def _placement(plugin_type: str) -> str:
    """A config that declares `plugin_type` as `p` and puts it where its kind of plugin is used."""
    params = REFERENCE_PARAMS.get(plugin_type)
    spec = f"- name: p\n  type: {plugin_type}\n" + (f"  parameters: {params!r}\n" if params else "")
    probe = REGISTRY.build(plugin_type, "p", params, _Handle())
    base = GIE + "plugins:\n- type: queue-scorer\n" + spec
    sections = []
    if isinstance(probe, (Filter, Scorer, Picker)):
        sections.append(
            "schedulingProfiles:\n- name: default\n  plugins:\n  - pluginRef: queue-scorer\n  - pluginRef: p\n"
        )
    if isinstance(probe, SaturationDetector):
        sections.append("saturationDetector: {pluginRef: p}\n")
    if isinstance(probe, DataSource):
        json = source_payload(probe) == PAYLOAD_JSON
        base += f"- {{name: ex, type: {'models-data-extractor' if json else 'core-metrics-extractor'}}}\n"
        sections.append("dataLayer: {sources: [{pluginRef: p, extractors: [{pluginRef: ex}]}]}\n")
    if isinstance(probe, Extractor | PageAttributeExtractor | BodyExtractor):
        json = isinstance(probe, BodyExtractor)
        base += f"- {{name: src, type: {'models-data-source' if json else 'metrics-data-source'}}}\n"
        sections.append("dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: p}]}]}\n")
    if isinstance(probe, EndpointEventSource):
        base += "- {name: ex, type: precise-prefix-cache-producer}\n"
        sections.append("dataLayer: {sources: [{pluginRef: p, extractors: [{pluginRef: ex}]}]}\n")
    if isinstance(probe, EndpointEventExtractor) and not isinstance(probe, PrepareData):
        base += "- {name: src, type: endpoint-notification-source}\n"
        sections.append("dataLayer: {sources: [{pluginRef: src, extractors: [{pluginRef: p}]}]}\n")
    if isinstance(probe, ObjectEventSource):  # topology-extractor binds its Pod handler to a Pod source
        base += "- {name: topo, type: topology-extractor}\n"
        sections.append("dataLayer: {sources: [{pluginRef: p}]}\n")
    if isinstance(probe, EndpointDiscovery):
        sections.append("dataLayer: {discovery: {pluginRef: p}}\n")
    if isinstance(probe, Parser):
        sections.append("requestHandler: {parsers: [{pluginRef: p}]}\n")
    if isinstance(probe, Decider):  # referenced by name from a disaggregation profile handler
        base += "- {name: h, type: disagg-profile-handler, parameters: {deciders: {prefill: p}}}\n"
        sections.append(
            "schedulingProfiles:\n"
            "- {name: decode, plugins: [{pluginRef: queue-scorer}]}\n"
            "- {name: prefill, plugins: [{pluginRef: queue-scorer}]}\n"
        )
    if isinstance(probe, FairnessPolicy):
        sections.append("featureGates: [flowControl]\nflowControl: {defaultPriorityBand: {fairnessPolicyRef: p}}\n")
    if isinstance(probe, OrderingPolicy):
        sections.append("featureGates: [flowControl]\nflowControl: {defaultPriorityBand: {orderingPolicyRef: p}}\n")
    if isinstance(probe, UsageLimitPolicy):
        sections.append("featureGates: [flowControl]\nflowControl: {usageLimitPolicyPluginRef: p}\n")
    if isinstance(probe, (EvictionOrderingPolicy, EvictionFilterPolicy)):
        sections.append("featureGates: [flowControl]\nflowControl: {enableEviction: true}\n")
    return base + "".join(sections)


class _Handle:
    def plugin(self, name: str) -> None:
        return None

    def endpoints(self) -> tuple[()]:
        return ()

    def now(self) -> float:
        return 0.0

    @property
    def recorder(self) -> Any:
        return NullRecorder()

    def rng(self, name: str) -> random.Random:
        return random.Random(name)


def _runs(loaded: LoadedConfig, plugin: object) -> list[str]:
    """Where a loaded config runs `plugin`."""
    places = []
    if plugin is loaded.scheduler.handler:
        places.append("profile handler")
    for ref in (getattr(loaded.scheduler.handler, f, None) for f in ("prefill_decider", "encode_decider", "decider")):
        if isinstance(ref, DeciderRef) and loaded.plugins.get(ref.name) is plugin:
            places.append("decider of the profile handler")
    for profile in loaded.scheduler.profiles.values():
        if plugin in profile.filters or plugin is profile.picker or any(s.scorer is plugin for s in profile.scorers):
            places.append(f"profile {profile.name}")
    for hook in ("prepare_data", "admission", "pre_request", "response_received", "response_complete", "parsers"):
        if any(p is plugin for p in getattr(loaded, hook)):
            places.append(hook)
    if plugin is loaded.saturation:
        places.append("saturation detector")
    if any(plugin is b.source or plugin in b.extractors for b in loaded.data_sources):
        places.append("data layer")
    if plugin is loaded.discovery:
        places.append("endpoint discovery")
    fc = loaded.flow_control
    if fc is not None:
        bands = [fc.default_band, *fc.bands.values()]
        if plugin is fc.usage_limit or any(plugin is b.fairness or plugin is b.ordering for b in bands):
            places.append("flow control")
        if fc.eviction is not None and (plugin is fc.eviction.ordering or plugin is fc.eviction.filter):
            places.append("flow-control eviction")
    return places


@pytest.mark.parametrize("plugin_type", REGISTRY.types())
def test_each_plugin_type_runs_where_it_is_configured(plugin_type: str) -> None:
    text = _placement(plugin_type)
    loaded = load_config_text(text, REGISTRY, NullRecorder())
    plugin = loaded.plugins["p"]
    places = _runs(loaded, plugin)
    if plugin_type in EFFECT_IN_CORE:
        assert not places, f"{plugin_type} now runs ({places}): remove it from EFFECT_IN_CORE"
        return
    assert places, f"{plugin_type} loads but nothing runs it: wire it or reject it as not supported yet\n{text}"
    assert not [w for w in loaded.warnings if "'p'" in w], loaded.warnings


def test_a_handler_type_changes_who_runs_the_profiles() -> None:
    # the profile-handler branch above is taken by single-profile-handler only; show the handler is the one used
    loaded = load_config_text(_placement("single-profile-handler"), REGISTRY, NullRecorder())
    assert isinstance(loaded.plugins["p"], ProfileHandler)
    assert loaded.handler_name == "p"
