"""The composition root and the event-driven data sources: a declared k8s-notification-source needs Kubernetes
discovery (refused with the reason otherwise), one a plugin added for itself is simply inactive."""

from __future__ import annotations

import pytest

from llm_epp.app import StartupError, build
from llm_epp.options import Options

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"
TOPOLOGY = HEAD + "plugins:\n- type: topology-extractor\n- type: queue-scorer\n"
DECLARED = HEAD + (
    "plugins:\n- {name: pods, type: k8s-notification-source, parameters: {version: v1, kind: Pod}}\n"
    "- type: topology-extractor\n- type: queue-scorer\ndataLayer:\n  sources:\n  - pluginRef: pods\n"
)


def test_a_plugins_own_pod_source_is_inactive_without_kubernetes() -> None:
    c = build(Options(endpoints="10.0.0.1:8000", config_text=TOPOLOGY, allow_experimental_plugins=True))
    assert c.data_layer is not None
    assert c.data_layer.object_events == []
    assert c.data_layer.endpoint_events is not None  # labels still give the topology


def test_a_declared_kubernetes_source_without_kubernetes_is_refused() -> None:
    with pytest.raises(StartupError, match=r"k8s-notification-source watches Kubernetes objects"):
        build(Options(endpoints="10.0.0.1:8000", config_text=DECLARED, allow_experimental_plugins=True))
