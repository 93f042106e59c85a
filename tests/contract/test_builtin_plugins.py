"""Contract tests for every entry of `builtin_registry()`: naming, module layout, documented headings,
parameter validation, and the extension points the built plugin implements."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from llm_epp.framework import Filter, Picker, ProfileHandler, Registry, Scorer, ScorerCategory
from llm_epp.framework.datalayer import (
    BodyExtractor,
    DataSource,
    EndpointDiscovery,
    EndpointEventExtractor,
    EndpointEventSource,
    Extractor,
    ObjectEventExtractor,
    ObjectEventSource,
    PageAttributeExtractor,
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
from llm_epp.framework.registry import PluginParamsError
from llm_epp.framework.requestcontrol import Admission, PrepareData, PreRequest, ResponseComplete, ResponseReceived
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.disagg.common import Decider
from tests.unit.builders import FakeHandle

REGISTRY = builtin_registry()
TYPES = REGISTRY.types()
HEADINGS = ("Scheduling intent", "Inputs consumed", "Configuration")
EXTENSION_POINTS: tuple[Any, ...] = (
    FairnessPolicy,
    OrderingPolicy,
    UsageLimitPolicy,
    EvictionOrderingPolicy,
    EvictionFilterPolicy,
    Filter,
    Scorer,
    Picker,
    ProfileHandler,
    SaturationDetector,
    PrepareData,
    Admission,
    PreRequest,
    ResponseReceived,
    ResponseComplete,
    DataSource,
    Extractor,
    PageAttributeExtractor,
    BodyExtractor,
    EndpointDiscovery,
    EndpointEventSource,
    EndpointEventExtractor,
    ObjectEventSource,
    ObjectEventExtractor,
    Parser,
    Decider,
)
TESTS_ROOT = Path(__file__).resolve().parents[1]

# Parameters as they appear in reference EndpointPickerConfig files.
_PREFIX = {
    "autoTune": False,
    "blockSizeTokens": 16,
    "maxPrefixBlocksToMatch": 256,
    "maxPrefixTokensToMatch": 4096,
    "lruCapacityPerServer": 31250,
}
# Parameters with the keys reference (GIE v1.5 / llm-d) EndpointPickerConfig files use.
REFERENCE_PARAMS: dict[str, dict[str, Any]] = {
    "max-score-picker": {"maxNumOfEndpoints": 2},
    "priority-holdback-policy": {"minCeiling": 0.5},
    "utilization-filter": {"conditions": [{"metric": "waiting-queue", "maxValue": 4}]},
    "random-picker": {"maxNumOfEndpoints": 2},
    "weighted-random-picker": {"maxNumOfEndpoints": 2},
    "prefix-cache-scorer": _PREFIX,
    "approx-prefix-cache-producer": _PREFIX,
    "token-load-scorer": {"queueThresholdTokens": 4194304},
    "utilization-detector": {
        "queueDepthThreshold": 8,
        "kvCacheUtilThreshold": 0.85,
        "metricsStalenessThreshold": "200ms",
        "headroom": 0.1,
    },
    "concurrency-detector": {"concurrencyMode": "tokens", "maxConcurrency": 64, "maxTokenConcurrency": 500000},
    "prefix-cache-affinity-filter": {
        "affinityThreshold": 0.8,
        "explorationProbability": 0.01,
        "maxTTFTPenaltyMs": 5000,
    },
    "active-request-scorer": {"idleThreshold": 0, "maxBusyScore": 1.0, "requestTimeout": "2m"},
    "no-hit-lru-scorer": {"lruSize": 1024},
    "metrics-data-source": {"scheme": "http", "path": "/metrics", "insecureSkipVerify": True},
    "core-metrics-extractor": {
        "engineLabelKey": "inference.networking.k8s.io/engine-type",
        "defaultEngine": "sglang",
        "engineConfigs": [
            {
                "name": "vllm",
                "queuedRequestsSpec": "vllm:num_requests_waiting",
                "runningRequestsSpec": "vllm:num_requests_running",
                "kvUsageSpec": "vllm:kv_cache_usage_perc",
            }
        ],
    },
    "label-selector-filter": {"matchLabels": {"llm-d.ai/role": "decode"}},
    "session-affinity-scorer": {"encodedEndpointHeaderConfig": {"header": "x-session-token"}},
    "session-affinity-filter": {
        "strategy": "session_id",
        "sessionIdConfig": {
            "sources": [{"header": "x-session-id"}, {"attribute": "agent-identity"}],
            "evictionTtlSeconds": 300,
            "evictionSweepSeconds": 10,
        },
    },
    "session-id-producer": {"headerName": "x-session-id"},
    "agent-identity": {"additionalSessionHeaders": ["x-my-agent-session", "x-another-agent-id"]},
    "header-label-affinity-scorer": {"headerName": "x-disagg-slice", "labelKey": "disaggregatedset.x-k8s.io/slice"},
    "header-profile-handler": {"defaultProfile": "prefill"},
    "p2p-source-producer": {
        "prefixMatchInfoProducerName": "approx-prefix-cache-producer",
        "prefillProfileName": "prefill",
        "minCachedTokenDelta": 1,
    },
    "predicted-latency-producer": {
        "streamingMode": True,
        "sloBufferFactor": 1.0,
        "contextTTL": "5m",
        "predictInPrepareData": True,
        "samplingMean": 1000,
        "maxDecodeTokenSamplesForPrediction": 0,
        "endpointRoleLabel": "llm-d.ai/role",
    },
    "latency-scorer": {
        "ttftWeight": 0.8,
        "tpotWeight": 0.2,
        "headroomSelectionStrategy": "least",
        "compositeKVWeight": 1,
        "compositeQueueWeight": 1,
        "compositePrefixWeight": 1,
    },
    "slo-headroom-tier-filter": {"epsilonExploreNeg": 0.01},
    "predicted-latency-scorer": {
        "samplingMean": 1000,
        "maxSampledTokens": 0,
        "sloBufferFactor": 1,
        "negHeadroomTTFTWeight": 0.8,
        "negHeadroomTPOTWeight": 0.2,
        "headroomTTFTWeight": 0.8,
        "headroomTPOTWeight": 0.2,
        "headroomSelectionStrategy": "least",
        "compositeKVWeight": 1,
        "compositeQueueWeight": 1,
        "compositePrefixWeight": 1,
        "epsilonExploreSticky": 0.01,
        "epsilonExploreNeg": 0.01,
        "affinityGateTau": 0.8,
        "affinityGateTauGlobal": 0.99,
        "affinityMaxTTFTPenaltyMs": 5000,
        "contextTTL": "5m",
        "selectionMode": "linear",
        "streamingMode": True,
        "endpointRoleLabel": "llm-d.ai/role",
    },
    "request-attribute-reporter": {
        "attributes": [
            {
                "key": {"namespace": "envoy.lb", "name": "x-gateway-inference-request-cost"},
                "expression": "usage.prompt_tokens + usage.completion_tokens",
                "condition": "has(usage.prompt_tokens) && has(usage.completion_tokens)",
            }
        ]
    },
    "disagg-profile-handler": {
        "profiles": {"decode": "decode", "prefill": "prefill"},
        "deciders": {"prefill": "prefix-based-pd-decider"},
    },
    "pd-profile-handler": {
        "decodeProfile": "decode",
        "prefillProfile": "prefill",
        "deciderPluginName": "prefix-based-pd-decider",
        "prefixPluginType": "prefix-cache-scorer",
        "primaryPort": 8000,
    },
    "prefix-based-pd-decider": {"nonCachedTokens": 16},
    "data-parallel-profile-handler": {"primaryPort": 8000},
    "disagg-headers-handler": {"prefillProfile": "prefill", "encodeProfile": "encode"},
    "prefill-header-handler": {"prefillProfile": "prefill"},
    "context-length-aware": {"label": "llm-d.ai/context-length-range", "enableFiltering": True},
    "disaggregatedset-rollout-screener": {
        "scope": {"labelSelector": "disaggregatedset.x-k8s.io/name=my-set"},
        "headerSelectors": [
            {
                "name": "revision",
                "headerName": "x-disagg-revision",
                "labelKey": "disaggregatedset.x-k8s.io/revision",
                "mode": "strict",
            },
            {
                "name": "slice",
                "headerName": "x-disagg-slice",
                "labelKey": "disaggregatedset.x-k8s.io/slice",
                "mode": "prefer",
            },
        ],
        "revisionGating": {"mode": "max-role", "requireRoles": {"values": ["prefill", "decode"]}},
    },
    "dcgm-data-source": {"port": 9400, "useNodeAddress": True, "interval": "1s"},
    "models-data-source": {"scheme": "http", "path": "/v1/models", "insecureSkipVerify": True, "interval": "5s"},
    "endpoint-attribute-filter": {
        "attribute": "GPUUtilization/dcgm-extractor",
        "onMissing": "Pass",
        "fallbackOnEmpty": True,
        "algorithm": {"type": "threshold", "threshold": {"operator": "LessThanOrEqual", "value": 0.90}},
    },
    "endpoint-attribute-scorer": {
        "attributeKey": "GPUUtilization/dcgm-extractor",
        "algorithm": {"type": "linear_lower_is_better", "normalization": {"fixedRange": {"min": 0.0, "max": 1.0}}},
    },
    "file-discovery": {"path": "/etc/epp/endpoints.yaml", "watchFile": True},
    "k8s-notification-source": {"group": "", "version": "v1", "kind": "Pod"},
    "topology-extractor": {"hostname": "kubernetes.io/hostname", "zone": "topology.kubernetes.io/zone"},
    "topology-affinity-filter": {"minAffinity": "rack", "topologyProducerName": "topology-extractor"},
    "topology-affinity-scorer": {"topologyProducerName": "topology-extractor"},
    "mm-embeddings-cache-producer": {"cacheSizeInMBPerServer": 2048},
    "mm-embeddings-cache-scorer": {"producerName": "mm-embeddings-cache-producer"},
    "burst-prefix-cache-producer": {
        "windowDurationMs": 100,
        "maxPerReplica": -1,
        "blockSizeTokens": 64,
        "maxPrefixTokensToMatch": 0,
        "minColocateBlocks": 0,
        "maxBatchSize": 1000,
        "balanceBy": "requests",
    },
}
# Types whose reference factory refuses to build without parameters: their defaults must be rejected
# (naming what is missing), and the other contract checks use the reference parameters.
REQUIRED_PARAMS: dict[str, str] = {
    "session-id-producer": "headerName or cookieName",
    "header-label-affinity-scorer": "headerName",
    "request-attribute-reporter": "exactly one entry",
    "priority-holdback-policy": "minCeiling",
    "utilization-filter": "conditions",
    "disaggregatedset-rollout-screener": "scope",
    "endpoint-attribute-filter": "attribute",
    "endpoint-attribute-scorer": "attributeKey",
    "file-discovery": "path",
    "k8s-notification-source": "version",
}


def _params(plugin_type: str) -> dict[str, Any] | None:
    return REFERENCE_PARAMS[plugin_type] if plugin_type in REQUIRED_PARAMS else None


def _module(plugin_type: str) -> ModuleType:
    return sys.modules[REGISTRY.entry(plugin_type).factory.__module__]


def _camel(plugin_type: str) -> str:
    return "".join(part.capitalize() for part in plugin_type.split("-"))


def test_the_registry_is_not_empty() -> None:
    assert TYPES


@pytest.mark.parametrize("plugin_type", TYPES)
def test_default_params_are_valid(plugin_type: str) -> None:
    if plugin_type in REQUIRED_PARAMS:
        with pytest.raises(PluginParamsError, match=REQUIRED_PARAMS[plugin_type]):
            REGISTRY.parse_params(plugin_type, None)
        return
    params = REGISTRY.parse_params(plugin_type, None)
    assert isinstance(params, REGISTRY.entry(plugin_type).params_model)


@pytest.mark.parametrize("plugin_type", TYPES)
def test_unknown_parameter_keys_are_rejected_by_name(plugin_type: str) -> None:
    with pytest.raises(PluginParamsError) as info:
        REGISTRY.parse_params(plugin_type, {**(_params(plugin_type) or {}), "noSuchParameter": 1})
    assert info.value.problems == [("noSuchParameter", "unknown parameter")]
    assert "noSuchParameter" in str(info.value)


@pytest.mark.parametrize("plugin_type", sorted(REFERENCE_PARAMS))
def test_builds_from_reference_params(plugin_type: str) -> None:
    assert plugin_type in REGISTRY
    plugin = REGISTRY.build(plugin_type, "custom", REFERENCE_PARAMS[plugin_type], FakeHandle())
    assert plugin.typed_name.name == "custom"


@pytest.mark.parametrize("plugin_type", TYPES)
def test_module_docstring_has_the_readme_headings(plugin_type: str) -> None:
    doc = _module(plugin_type).__doc__ or ""
    for heading in HEADINGS:
        assert re.search(rf"^{heading}:?[ \t]*$", doc, re.MULTILINE), f"missing heading {heading!r}"


@pytest.mark.parametrize("plugin_type", TYPES)
def test_module_exports_type_params_and_factory(plugin_type: str) -> None:
    module = _module(plugin_type)
    entry = REGISTRY.entry(plugin_type)
    assert module.TYPE == plugin_type
    assert entry.params_model is module.Params
    assert entry.factory is module.factory


@pytest.mark.parametrize("plugin_type", TYPES)
def test_names_are_mechanical(plugin_type: str) -> None:
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", plugin_type), "types are kebab-case"
    module = _module(plugin_type)
    snake = plugin_type.replace("-", "_")
    assert module.__name__.rsplit(".", 1)[1] == snake
    plugin = REGISTRY.build(plugin_type, plugin_type, _params(plugin_type), FakeHandle())
    assert type(plugin).__name__ == _camel(plugin_type)
    assert (TESTS_ROOT / "unit" / "plugins" / f"test_{snake}.py").is_file(), "each plugin has a test module"


@pytest.mark.parametrize("plugin_type", TYPES)
def test_built_plugin_implements_an_extension_point(plugin_type: str) -> None:
    plugin = REGISTRY.build(plugin_type, "instance", _params(plugin_type), FakeHandle())
    assert plugin.typed_name.type == plugin_type
    assert plugin.typed_name.name == "instance"
    implemented = [p.__name__ for p in EXTENSION_POINTS if isinstance(plugin, p)]
    module = sys.modules[type(plugin).__module__]
    if getattr(module, "COMPATIBILITY_ONLY", False):  # accepted in configs; the core does its work
        assert not implemented, "a compatibility-only plugin must not hook into anything"
        return
    assert implemented, "implements no extension point"
    if isinstance(plugin, Scorer):
        assert isinstance(plugin.category, ScorerCategory)


def test_the_registry_refuses_duplicate_registration() -> None:
    module = _module(TYPES[0])
    registry = Registry()
    registry.register(module.TYPE, module.Params, module.factory)
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(module.TYPE, module.Params, module.factory)


def test_builtin_registry_is_fresh_each_time() -> None:
    assert builtin_registry() is not REGISTRY
    assert builtin_registry().types() == TYPES


def test_known_but_unsupported_reference_types_say_so() -> None:
    from llm_epp.framework.registry import UnknownPluginTypeError, UnsupportedPluginTypeError
    from llm_epp.plugins import UNSUPPORTED

    landed = sorted(set(UNSUPPORTED) & set(TYPES))
    assert not landed, f"registered types stay listed as not supported yet in UNSUPPORTED: {landed}"
    waiting = sorted(set(UNSUPPORTED) - set(TYPES))
    assert "multicluster-queue-scorer" in waiting
    for plugin_type in waiting:
        with pytest.raises(UnsupportedPluginTypeError) as info:
            REGISTRY.entry(plugin_type)
        assert "not supported yet by llm-epp" in str(info.value)
        assert UNSUPPORTED[plugin_type] in str(info.value)
    with pytest.raises(UnknownPluginTypeError) as unknown:
        REGISTRY.entry("no-such-scorer")
    assert not isinstance(unknown.value, UnsupportedPluginTypeError)
    assert "unknown plugin type" in str(unknown.value)


def test_docs_plugins_md_lists_every_type() -> None:
    from llm_epp.plugins import UNSUPPORTED

    text = (TESTS_ROOT.parent / "docs" / "plugins.md").read_text()
    missing = [t for t in [*TYPES, *UNSUPPORTED] if f"`{t}`" not in text]
    assert not missing, f"docs/plugins.md does not list {missing}"
    for reason in set(UNSUPPORTED.values()):
        assert reason in text, f"docs/plugins.md does not name the feature {reason!r}"


def test_a_config_naming_an_unsupported_reference_type_is_refused_saying_so() -> None:
    from llm_epp.config import ConfigError, load_config_text
    from llm_epp.framework import NullRecorder

    text = (
        "apiVersion: inference.networking.x-k8s.io/v1alpha1\nkind: EndpointPickerConfig\n"
        "plugins:\n- type: multicluster-queue-scorer\n- type: queue-scorer\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text, builtin_registry(), NullRecorder())
    assert info.value.problems == [
        "plugins[0].type: plugin type 'multicluster-queue-scorer' is not supported yet by llm-epp "
        "(multi-cluster routing)"
    ]
