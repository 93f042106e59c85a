"""The loader rules of GIE v1.5.0 and llm-d-router v0.10, one test (or table) per rule. The configs are
written for these tests after the upstream loaders' own cases (`pkg/epp/config/loader/*_test.go`)."""

from __future__ import annotations

import logging
import textwrap

import pytest

from llm_epp.config import ConfigError, LoadedConfig, load_config_text
from llm_epp.config.gates import FLOW_CONTROL_WITHOUT_GATE
from llm_epp.framework import NullRecorder, Registry
from llm_epp.plugins import builtin_registry
from tests.compat.plugins import ColourProducer, JsonParser, compat_registry

GIE = "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
LLMD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def _load(text: str, registry: Registry | None = None, strict: bool = False) -> LoadedConfig:
    head, body = (text.split("\n", 2)[:2], text.split("\n", 2)[2]) if text.startswith("apiVersion") else ([], text)
    text = "".join(f"{line}\n" for line in head) + textwrap.dedent(body)
    return load_config_text(text, registry or builtin_registry(), NullRecorder(), strict=strict)


def _problems(text: str, registry: Registry | None = None, strict: bool = False) -> list[str]:
    with pytest.raises(ConfigError) as info:
        _load(text, registry, strict)
    return info.value.problems


# ------------------------------------------------------------------------------------------ apiVersion


@pytest.mark.parametrize("api_version", ["inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1", "llm-d.ai/v1"])
def test_every_upstream_api_version_loads(api_version: str) -> None:
    loaded = _load(f"apiVersion: {api_version}\nkind: EndpointPickerConfig\nplugins:\n- type: queue-scorer\n")
    assert loaded.profiles[0].scorers == [("queue-scorer", 1.0)]


def test_the_old_api_group_is_logged_as_deprecated(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="llm_epp.config"):
        _load(GIE + "plugins:\n- type: queue-scorer\n")
        _load(LLMD + "plugins:\n- type: queue-scorer\n")
    deprecations = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert deprecations == [
        "config_api_version_deprecated apiVersion=inference.networking.x-k8s.io/v1alpha1 replacement=llm-d.ai/v1alpha1"
    ]


def test_an_unknown_api_version_is_rejected_with_the_accepted_ones() -> None:
    [problem] = _problems("apiVersion: config.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n")
    assert problem.startswith("apiVersion:")
    assert "'llm-d.ai/v1'" in problem and "'inference.networking.x-k8s.io/v1alpha1'" in problem


# ---------------------------------------------------------------------------------------- featureGates

GATE_CASES = [
    # (gates, resolved values that differ from the defaults, problem fragment or None)
    pytest.param(["dataLayer"], {"dataLayer": True}, None, id="gie-deprecated-dataLayer"),
    pytest.param(["flowControl=false"], {}, None, id="llm-d-syntax-false"),
    pytest.param(["flowControl=False"], {}, None, id="go-bool-capitalised"),
    pytest.param(["haPopulateNonLeaderDatastore=true"], {}, None, id="llm-d-gate-at-its-default"),
    pytest.param(["dataLayer=0"], {}, None, id="go-bool-zero"),
    pytest.param(["flowControl"], {"flowControl": True}, None, id="flowControl-on"),
    pytest.param(["flowControl=true"], {"flowControl": True}, None, id="flowControl-true"),
    pytest.param(["enableLegacyMetrics"], None, "enableLegacyMetrics is not supported", id="legacy-metrics"),
    pytest.param(
        ["haPopulateNonLeaderDatastore=false"], None, "haPopulateNonLeaderDatastore=false is not supported yet", id="ha"
    ),
    pytest.param(["flowControl=maybe"], None, "'maybe' is not a valid value for flowControl", id="bad-value"),
    pytest.param(
        ["prepareDataPlugins"],
        None,
        "unknown feature gate 'prepareDataPlugins'; known: dataLayer, enableLegacyMetrics, flowControl, "
        "haPopulateNonLeaderDatastore",
        id="unknown-gate-lists-the-known",
    ),
]


@pytest.mark.parametrize(("gates", "changed", "problem"), GATE_CASES)
def test_feature_gates(gates: list[str], changed: dict[str, bool] | None, problem: str | None) -> None:
    text = GIE + f"featureGates: {gates!r}\nplugins:\n- type: queue-scorer\n"
    if problem is not None:
        [found] = _problems(text)
        assert found.startswith("featureGates[0]: ") and problem in found
        return
    loaded = _load(text)
    defaults = {"dataLayer": False, "enableLegacyMetrics": False, "flowControl": False}
    assert loaded.feature_gates == {**defaults, "haPopulateNonLeaderDatastore": True, **(changed or {})}


def test_the_deprecated_data_layer_gate_warns() -> None:
    loaded = _load(GIE + "featureGates: [dataLayer]\nplugins:\n- type: queue-scorer\n")
    assert loaded.warnings == ["featureGates[0]: the dataLayer feature gate is deprecated; the data layer is always on"]


# ----------------------------------------------------------------------------------------- flowControl


def test_flow_control_settings_without_the_gate_are_rejected() -> None:
    problems = _problems(
        GIE
        + """\
        plugins:
        - type: queue-scorer
        flowControl:
          maxRequests: "1k"
          maxBytes: 1Gi
          defaultRequestTTL: 30s
        """
    )
    assert problems == [f"flowControl (maxBytes, maxRequests, defaultRequestTTL): {FLOW_CONTROL_WITHOUT_GATE}"]


def test_flow_control_with_the_gate_builds_the_bands() -> None:
    loaded = _load(
        GIE
        + """\
        featureGates: [flowControl]
        plugins:
        - type: queue-scorer
        - {name: rr, type: round-robin-fairness-policy}
        - {name: edf, type: edf-ordering-policy}
        - {name: hold, type: priority-holdback-policy, parameters: {minCeiling: 0.5}}
        flowControl:
          maxRequests: "1k"
          maxBytes: 1Gi
          defaultRequestTTL: 30s
          usageLimitPolicyPluginRef: hold
          defaultPriorityBand: {maxRequests: 7}
          defaultNegativePriorityBand: {maxRequests: 3}
          priorityBands:
          - {priority: 5, fairnessPolicyRef: rr, orderingPolicyRef: edf, maxBytes: 1k}
        """
    )
    fc = loaded.flow_control
    assert fc is not None
    assert (fc.max_requests, fc.max_bytes, fc.request_ttl, fc.no_endpoint_request_ttl) == (1000, 2**30, 30.0, 30.0)
    assert fc.usage_limit is loaded.plugins["hold"]
    band5 = fc.bands[5]
    assert band5.fairness is loaded.plugins["rr"] and band5.ordering is loaded.plugins["edf"]
    assert (band5.max_bytes, band5.max_requests) == (1000, 0)  # GIE: no band request limit by default
    assert fc.band_for(0).max_requests == 7 and fc.band_for(9).max_requests == 7
    assert fc.band_for(-2).max_requests == 3 and fc.band_for(-2).max_bytes == 1_000_000_000
    assert fc.band_for(0).fairness.typed_name.type == "global-strict-fairness-policy"
    assert fc.band_for(0).ordering.typed_name.type == "fcfs-ordering-policy"
    assert not loaded.warnings, "policies the flowControl section uses are not reported unused"


def test_flow_control_defaults_follow_the_api_version() -> None:
    gie = _load(GIE + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n").flow_control
    router_text = GIE.replace("inference.networking.x-k8s.io/v1alpha1", "llm-d.ai/v1alpha1")
    router = _load(router_text + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n").flow_control
    assert gie is not None and router is not None
    assert (gie.request_ttl, gie.band_for(0).max_requests) == (None, 0)  # GIE v1.5.0: wait for the client
    assert (router.request_ttl, router.no_endpoint_request_ttl, router.band_for(0).max_requests) == (60.0, 60.0, 5000)
    split = _load(
        router_text + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
        "flowControl: {defaultRequestTTL: 5s, noEndpointRequestTTL: 0s}\n"
    ).flow_control
    assert split is not None and (split.request_ttl, split.no_endpoint_request_ttl) == (5.0, None)


@pytest.mark.parametrize(
    ("section", "fragment"),
    [
        ("{defaultPriorityBand: {orderingPolicyRef: nope}}", "no plugin named 'nope' is defined"),
        ("{priorityBands: [{priority: 1, fairnessPolicyRef: queue-scorer}]}", "is not a fairness policy"),
        ("{usageLimitPolicyPluginRef: queue-scorer}", "is not a usage limit policy"),
        ("{priorityBands: [{priority: 1}, {priority: 1}]}", "priority 1 is configured twice"),
        ("{defaultRequestTTL: soon}", "flowControl.defaultRequestTTL: invalid duration"),
        ("{defaultRequestTTL: -1s}", "must not be negative"),
    ],
)
def test_flow_control_problems(section: str, fragment: str) -> None:
    problems = _problems(GIE + f"featureGates: [flowControl]\nplugins:\n- type: queue-scorer\nflowControl: {section}\n")
    assert any(fragment in p for p in problems), problems


def test_enable_eviction_uses_the_declared_policies_or_the_built_in_ones() -> None:
    base = GIE + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
    off = _load(base).flow_control
    assert off is not None and off.eviction is None
    on = _load(base + "flowControl: {enableEviction: true}\n").flow_control
    assert on is not None and on.eviction is not None
    assert on.eviction.ordering.typed_name.type == "priority-then-time-eviction-order-policy"
    assert on.eviction.filter.typed_name.type == "sheddable-eviction-filter"
    named = _load(
        GIE + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n"
        "- {name: mine, type: sheddable-eviction-filter}\nflowControl: {enableEviction: true}\n"
    ).flow_control
    assert named is not None and named.eviction is not None and named.eviction.filter.typed_name.name == "mine"
    # an ordering policy of queued requests is no eviction order
    queued = _load(
        GIE + "featureGates: [flowControl]\nplugins:\n- type: queue-scorer\n- type: fcfs-ordering-policy\n"
        "flowControl: {enableEviction: true}\n"
    ).flow_control
    assert queued is not None and queued.eviction is not None
    assert queued.eviction.ordering.typed_name.type == "priority-then-time-eviction-order-policy"


def test_flow_control_quantities_are_kubernetes_quantities() -> None:
    problems = _problems(GIE + "flowControl:\n  maxBytes: 1 GB\n  priorityBands:\n  - {priority: 1, maxRequests: 2x}\n")
    assert problems[0].startswith("flowControl.maxBytes: ")
    assert "'1 GB' is not a quantity; expected a Kubernetes quantity such as 1000, 1k, 500Mi" in problems[0]
    assert problems[1].startswith("flowControl.priorityBands[0].maxRequests: ")


def test_flow_control_values_parse_with_go_zero_values() -> None:
    from llm_epp.config.schema import EndpointPickerConfigSpec

    spec = EndpointPickerConfigSpec.model_validate(
        {"flowControl": {"maxRequests": "1k", "maxBytes": "1Gi", "defaultPriorityBand": {"maxBytes": "5e3"}}}
    )
    fc = spec.flow_control
    assert fc is not None and fc.default_priority_band is not None
    assert (fc.max_requests, fc.max_bytes) == (1000, 1 << 30)
    assert (fc.default_priority_band.priority, fc.default_priority_band.max_bytes) == (0, 5000)


def test_gie_missing_ordering_policy_case_is_rejected() -> None:
    # the shape of GIE's `errorFlowControlMissingPluginText`: a band names an ordering policy nobody declared
    problems = _problems(
        GIE
        + """\
        plugins:
        - name: best
          type: max-score-picker
        schedulingProfiles:
        - name: only
          plugins: [{pluginRef: best}]
        featureGates: [flowControl]
        flowControl:
          priorityBands:
          - priority: 10
            orderingPolicyRef: no-such-ordering
        """
    )
    assert problems == [
        "flowControl.priorityBands[0].orderingPolicyRef: no plugin named 'no-such-ordering' is defined; declare a "
        "ordering policy under plugins (e.g. `- type: fcfs-ordering-policy`) and refer to it by name"
    ]


# ---------------------------------------------------------------------------------- saturationDetector


def test_the_default_detector_may_be_referenced_without_being_declared() -> None:
    loaded = _load(GIE + "plugins:\n- type: queue-scorer\nsaturationDetector: {pluginRef: utilization-detector}\n")
    assert loaded.saturation is not None and loaded.saturation.typed_name.type == "utilization-detector"


def test_an_empty_detector_ref_means_the_default() -> None:
    loaded = _load(GIE + "plugins:\n- type: queue-scorer\nsaturationDetector: {}\n")
    assert loaded.saturation is not None and loaded.saturation.typed_name.name == "utilization-detector"


def test_a_declared_default_detector_keeps_its_parameters() -> None:
    loaded = _load(
        GIE
        + """\
        plugins:
        - type: queue-scorer
        - type: utilization-detector
          parameters: {queueDepthThreshold: 9}
        """
    )
    assert loaded.saturation is loaded.plugins["utilization-detector"]
    assert loaded.plugin_params["utilization-detector"] == {"queueDepthThreshold": 9}


def test_flow_control_saturation_detector_is_llm_d_routers_place_and_wins() -> None:
    loaded = _load(
        LLMD
        + """\
        plugins:
        - type: queue-scorer
        - name: by-load
          type: concurrency-detector
        saturationDetector: {pluginRef: utilization-detector}
        flowControl:
          saturationDetector: {pluginRef: by-load}
        """
    )
    assert loaded.saturation is loaded.plugins["by-load"]


def test_a_detector_ref_to_another_kind_of_plugin_is_rejected() -> None:
    problems = _problems(
        GIE + "plugins:\n- type: queue-scorer\nflowControl:\n  saturationDetector: {pluginRef: queue-scorer}\n"
    )
    assert problems == [
        "flowControl.saturationDetector.pluginRef: 'queue-scorer' (queue-scorer) is not a saturation detector"
    ]


# ------------------------------------------------------------------------------------------- dataLayer


def test_gie_empty_sources_turn_collection_off() -> None:
    assert _load(GIE + "plugins:\n- type: queue-scorer\ndataLayer: {sources: []}\n").data_sources == []


def test_llm_d_router_injects_the_metrics_source_unless_told_not_to() -> None:
    injected = _load(LLMD + "plugins:\n- type: queue-scorer\ndataLayer: {sources: []}\n")
    assert [b.source.typed_name.type for b in injected.data_sources] == ["metrics-data-source"]
    assert [e.typed_name.type for b in injected.data_sources for e in b.extractors] == ["core-metrics-extractor"]
    off = _load(LLMD + "plugins:\n- type: queue-scorer\ndataLayer: {injectDefaults: false}\n")
    assert off.data_sources == []


def test_inject_defaults_true_works_with_the_gie_api_version() -> None:
    loaded = _load(GIE + "plugins:\n- type: queue-scorer\ndataLayer: {injectDefaults: true}\n")
    assert [b.source.typed_name.name for b in loaded.data_sources] == ["metrics-data-source"]


def test_a_configured_metrics_source_is_not_injected_twice() -> None:
    loaded = _load(
        LLMD
        + """\
        plugins:
        - type: queue-scorer
        - type: metrics-data-source
          parameters: {path: /stats}
        - name: sglang
          type: core-metrics-extractor
          parameters: {defaultEngine: sglang}
        dataLayer:
          sources:
          - pluginRef: metrics-data-source
            extractors: [{pluginRef: sglang}]
        """
    )
    [binding] = loaded.data_sources
    assert binding.source is loaded.plugins["metrics-data-source"]
    assert binding.extractors == (loaded.plugins["sglang"],)
    assert loaded.data_source is binding.source and loaded.extractor is loaded.plugins["sglang"]


def test_two_polled_sources_are_not_supported_yet() -> None:
    problems = _problems(
        LLMD
        + """\
        plugins:
        - {name: a, type: metrics-data-source}
        - {name: x, type: core-metrics-extractor}
        dataLayer:
          sources:
          - {pluginRef: a, extractors: [{pluginRef: x}]}
        """
    )
    assert problems == [
        "dataLayer.sources: 2 sources feed a metrics extractor (a, metrics-data-source); more than one is not "
        "supported yet"
    ]


def test_sources_and_extractors_must_fit_each_other() -> None:
    problems = _problems(
        LLMD
        + """\
        plugins:
        - {name: models, type: models-data-source}
        - {name: gpu, type: dcgm-extractor}
        - {name: dcgm, type: dcgm-data-source}
        - {name: list, type: models-data-extractor}
        dataLayer:
          sources:
          - {pluginRef: models, extractors: [{pluginRef: gpu}]}
          - {pluginRef: dcgm, extractors: [{pluginRef: list}, {pluginRef: gpu}, {pluginRef: gpu}]}
          - {pluginRef: dcgm, extractors: []}
        """
    )
    assert problems == [
        "dataLayer.sources[0].extractors: 'gpu' (dcgm-extractor) cannot read what 'models' (models-data-source) "
        "hands it (a JSON answer)",
        "dataLayer.sources[1].extractors: 'list' (models-data-extractor) cannot read what 'dcgm' (dcgm-data-source) "
        "hands it (a Prometheus metrics page)",
        "dataLayer.sources[1].extractors: extractor type 'dcgm-extractor' is listed twice for this source",
        "dataLayer.sources[2].extractors: a data source needs at least one extractor",
    ]


def test_several_sources_each_with_its_extractors() -> None:
    loaded = _load(
        LLMD
        + """\
        plugins:
        - {name: dcgm, type: dcgm-data-source, parameters: {interval: 1s}}
        - {name: gpu, type: dcgm-extractor}
        - {name: models, type: models-data-source}
        - {name: list, type: models-data-extractor}
        dataLayer:
          sources:
          - {pluginRef: dcgm, extractors: [{pluginRef: gpu}]}
          - {pluginRef: models, extractors: [{pluginRef: list}]}
        """
    )
    assert [(b.source.typed_name.name, [e.typed_name.name for e in b.extractors]) for b in loaded.data_sources] == [
        ("dcgm", ["gpu"]),
        ("models", ["list"]),
        ("metrics-data-source", ["core-metrics-extractor"]),  # injected by default (llm-d apiVersion)
    ]
    assert loaded.data_source is loaded.data_sources[2].source


def test_a_discovery_reference_must_name_a_discovery_plugin() -> None:
    assert _problems(LLMD + "plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: files}\n") == [
        "dataLayer.discovery.pluginRef: no plugin named 'files' is defined; declare it under plugins (e.g. type "
        "file-discovery with parameters.path)"
    ]
    assert _problems(LLMD + "plugins:\n- type: queue-scorer\ndataLayer:\n  discovery: {pluginRef: queue-scorer}\n") == [
        "dataLayer.discovery.pluginRef: 'queue-scorer' (queue-scorer) is not an endpoint discovery plugin"
    ]


@pytest.mark.parametrize(
    ("section", "problem"),
    [
        ("crossReplicaSyncerPluginRef: syncer", "dataLayer.crossReplicaSyncerPluginRef: syncing endpoint data"),
        ("crossReplicaSyncInterval: 5s", "dataLayer.crossReplicaSyncerPluginRef: syncing endpoint data"),
    ],
)
def test_data_layer_features_without_an_implementation_are_rejected(section: str, problem: str) -> None:
    [found] = _problems(LLMD + f"plugins:\n- type: queue-scorer\ndataLayer:\n  {section}\n")
    assert found.startswith(problem) and "not supported yet" in found


# ----------------------------------------------------------------------------------------------- parsers


def test_request_handler_parsers_resolve_in_order() -> None:
    loaded = _load(
        LLMD
        + """\
        plugins:
        - type: queue-scorer
        - {name: first, type: test-json-parser}
        - {name: second, type: test-json-parser}
        requestHandler:
          parsers: [{pluginRef: second}, {pluginRef: first}]
        """,
        compat_registry(),
    )
    assert [p.typed_name.name for p in loaded.parsers] == ["second", "first"]


def test_gie_parser_section_and_the_newer_one_wins() -> None:
    registry = compat_registry()
    gie = _load(GIE + "plugins:\n- {name: p, type: test-json-parser}\nparser: {pluginRef: p}\n", registry)
    assert [p.typed_name.name for p in gie.parsers] == ["p"]
    both = _load(
        LLMD
        + """\
        plugins:
        - {name: old, type: test-json-parser}
        - {name: new, type: test-json-parser}
        parser: {pluginRef: old}
        requestHandler: {parsers: [{pluginRef: new}]}
        """,
        compat_registry(),
    )
    assert [p.typed_name.name for p in both.parsers] == ["new"]


def test_a_parser_type_referenced_but_not_declared_is_created() -> None:
    loaded = _load(LLMD + "requestHandler: {parsers: [{pluginRef: test-json-parser}]}\n", compat_registry())
    [parser] = loaded.parsers
    assert isinstance(parser, JsonParser) and loaded.plugin_types["test-json-parser"] == "test-json-parser"


def test_a_parser_type_that_needs_parameters_must_be_declared() -> None:
    [problem] = _problems(LLMD + "requestHandler: {parsers: [{pluginRef: test-model-parser}]}\n", compat_registry())
    assert problem.startswith("requestHandler.parsers[0].pluginRef: 'test-model-parser' needs parameters; declare it")
    loaded = _load(
        LLMD
        + """\
        plugins:
        - {type: test-model-parser, parameters: {model: m}}
        requestHandler: {parsers: [{pluginRef: test-model-parser}]}
        """,
        compat_registry(),
    )
    assert [p.typed_name.type for p in loaded.parsers] == ["test-model-parser"]


def test_an_undeclared_parser_type_is_created_as_upstream_does() -> None:
    loaded = _load(GIE + "plugins:\n- type: queue-scorer\nparser: {pluginRef: openai-parser}\n")
    assert [p.typed_name.type for p in loaded.parsers] == ["openai-parser"]
    assert _load(LLMD + "plugins:\n- type: queue-scorer\nrequestHandler: {}\n").parsers == []


def test_a_parser_ref_to_another_kind_of_plugin_is_rejected() -> None:
    problems = _problems(
        LLMD + "plugins:\n- type: queue-scorer\nrequestHandler: {parsers: [{pluginRef: queue-scorer}]}\n"
    )
    assert problems == ["requestHandler.parsers[0].pluginRef: 'queue-scorer' (queue-scorer) is not a parser"]


# ------------------------------------------------------------------------------- unknown plugin parameters

UNKNOWN_PARAMS = (
    GIE
    + """\
plugins:
- name: top
  type: max-score-picker
  parameters: {maxNumOfEndpoint: 2}
- type: core-metrics-extractor
  parameters:
    engineConfigs:
    - name: vllm
      queuedRequestsSpec: "vllm:num_requests_waiting"
      kvUsageSpc: "vllm:kv_cache_usage_perc"
"""
)


def test_unknown_parameters_load_with_a_warning_naming_plugin_key_and_suggestion() -> None:
    loaded = _load(UNKNOWN_PARAMS)
    assert loaded.warnings == [
        "plugins[0].parameters.maxNumOfEndpoint: unknown parameter of 'top' (max-score-picker), ignored; "
        "did you mean 'maxNumOfEndpoints'?",
        "plugins[1].parameters.engineConfigs.0.kvUsageSpc: unknown parameter of 'core-metrics-extractor' "
        "(core-metrics-extractor), ignored; did you mean 'kvUsageSpec'?",
    ]
    assert loaded.plugin_params["top"] == {"maxNumOfEndpoint": 2}  # as written


def test_unknown_parameters_fail_under_strict() -> None:
    problems = _problems(UNKNOWN_PARAMS, strict=True)
    assert problems == [
        "plugins[0].parameters.maxNumOfEndpoint: unknown parameter of 'top' (max-score-picker); did you mean "
        "'maxNumOfEndpoints'?",
        "plugins[1].parameters.engineConfigs.0.kvUsageSpc: unknown parameter of 'core-metrics-extractor' "
        "(core-metrics-extractor); did you mean 'kvUsageSpec'?",
    ]


def test_an_ignored_unknown_parameter_leaves_the_others_in_effect() -> None:
    loaded = _load(GIE + "plugins:\n- {name: p, type: max-score-picker, parameters: {maxNumOfEndpoints: 3, x: 1}}\n")
    assert loaded.plugins["p"].max_endpoints == 3  # type: ignore[attr-defined]


# -------------------------------------------------------------------------------------------- data graph


def test_a_consumer_gets_its_default_producer_built_with_its_parameters() -> None:
    loaded = _load(GIE + "plugins:\n- type: test-colour-scorer\n  parameters: {scale: 7}\n", compat_registry())
    producer = loaded.plugins["test-colour-producer"]
    assert isinstance(producer, ColourProducer) and producer.params.scale == 7
    assert loaded.prepare_data == [producer]


def test_default_producers_are_created_transitively_and_ordered_before_consumers() -> None:
    loaded = _load(GIE + "plugins:\n- type: test-shade-scorer\n", compat_registry())
    assert [p.typed_name.type for p in loaded.prepare_data] == ["test-colour-producer", "test-shade-producer"]


def test_configured_producers_run_before_their_consumers_whatever_the_order_written() -> None:
    loaded = _load(
        GIE
        + """\
        plugins:
        - type: test-shade-producer
        - type: test-colour-producer
        - type: test-shade-scorer
        """,
        compat_registry(),
    )
    assert [p.typed_name.type for p in loaded.prepare_data] == ["test-colour-producer", "test-shade-producer"]


def test_the_prefix_scorer_gets_the_approx_producer_from_the_table() -> None:
    loaded = _load(GIE + "plugins:\n- type: prefix-cache-scorer\n  parameters: {blockSizeTokens: 64}\n")
    assert loaded.plugin_params["approx-prefix-cache-producer"] == {"blockSizeTokens": 64}
    assert [p.typed_name.type for p in loaded.pre_request] == ["approx-prefix-cache-producer"]


def test_a_consumed_key_nothing_can_produce_is_rejected() -> None:
    problems = _problems(GIE + "plugins:\n- type: test-scent-scorer\n", compat_registry())
    assert problems == [
        "plugins: 'test-scent-scorer' (test-scent-scorer) consumes 'scent', which no configured plugin produces and "
        "no plugin type is the default producer of; add a plugin that produces it"
    ]


def test_a_default_producer_that_is_not_implemented_yet_is_named() -> None:
    registry = compat_registry()
    registry.set_default_producer("scent", "test-nose")  # no such plugin type
    [problem] = _problems(GIE + "plugins:\n- type: test-scent-scorer\n", registry)
    assert problem == (
        "plugins: the test-nose created for 'test-scent-scorer' (test-scent-scorer) failed: plugin type "
        "'test-nose' is not implemented yet; configure another producer of the data"
    )


def test_a_producer_cycle_is_rejected() -> None:
    problems = _problems(
        GIE + "plugins:\n- type: test-ping\n- type: test-pong\n- type: queue-scorer\n", compat_registry()
    )
    assert problems == [
        "plugins: the data dependencies of 'test-ping' (test-ping), 'test-pong' (test-pong) form a cycle; no order "
        "runs each producer first"
    ]


def test_a_producer_that_runs_after_its_consumer_is_rejected() -> None:
    problems = _problems(GIE + "plugins:\n- type: test-taste-consumer\n- type: test-late-producer\n", compat_registry())
    assert problems == [
        "plugins: 'test-late-producer' (test-late-producer) produces 'taste' while scheduling, after "
        "'test-taste-consumer' (test-taste-consumer) needs it in request control; the producer must run first"
    ]


# ------------------------------------------------------------------------------------------ unused plugins


def test_a_declared_plugin_nothing_uses_is_reported() -> None:
    loaded = _load(
        GIE
        + """\
        plugins:
        - type: queue-scorer
        - type: kv-cache-utilization-scorer
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: queue-scorer}]
        """
    )
    assert loaded.warnings == [
        "plugins[1]: 'kv-cache-utilization-scorer' (kv-cache-utilization-scorer) is declared but no profile, hook or "
        "section uses it, so it has no effect"
    ]


def test_a_plugin_another_plugin_names_in_its_parameters_is_not_reported() -> None:
    text = """\
        plugins:
        - type: queue-scorer
        - {name: spare, type: kv-cache-utilization-scorer}
        - {name: chooser, type: test-referrer, parameters: {target: TARGET}}
        schedulingProfiles:
        - name: default
          plugins: [{pluginRef: queue-scorer}]
        """
    named = _load(GIE + text.replace("TARGET", "spare"), compat_registry())
    assert named.warnings == []
    other = _load(GIE + text.replace("TARGET", "elsewhere"), compat_registry())
    assert [w.split(":")[0] for w in other.warnings] == ["plugins[1]"]


def test_in_flight_load_producer_names_must_name_an_inflight_load_producer() -> None:
    ok = _load(
        LLMD
        + """\
        plugins:
        - {name: load, type: inflight-load-producer}
        - {type: token-load-scorer, parameters: {inFlightLoadProducerName: load}}
        - {type: active-request-scorer, parameters: {inFlightLoadProducerName: inflight-load-producer}}
        """
    )
    assert ok.plugin_types["load"] == "inflight-load-producer"
    problems = _problems(
        LLMD
        + """\
        plugins:
        - {name: load, type: queue-scorer}
        - {type: token-load-scorer, parameters: {inFlightLoadProducerName: load}}
        - {type: concurrency-detector, parameters: {inFlightLoadProducerName: elsewhere}}
        """
    )
    assert problems == [
        "plugins[1].parameters.inFlightLoadProducerName: 'load' is a queue-scorer; name an inflight-load-producer "
        "(declare `- type: inflight-load-producer` with name 'load') or leave the parameter out",
        "plugins[2].parameters.inFlightLoadProducerName: 'elsewhere' names no plugin; name an inflight-load-producer "
        "(declare `- type: inflight-load-producer` with name 'elsewhere') or leave the parameter out",
    ]


def test_an_extractor_that_failed_to_build_is_reported_once() -> None:
    problems = _problems(
        LLMD
        + """\
        plugins:
        - type: endpoint-notification-source
        - {type: precise-prefix-cache-producer, parameters: {tokenProcessorConfig: {blockSize: -3}}}
        - type: queue-scorer
        dataLayer:
          sources:
          - {pluginRef: endpoint-notification-source, extractors: [{pluginRef: precise-prefix-cache-producer}]}
        """
    )
    assert len(problems) == 1 and problems[0].startswith("plugins[1].parameters"), problems
