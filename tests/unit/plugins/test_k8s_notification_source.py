"""Tests for k8s-notification-source (pure part): its kind, its parameters, and that its extractors must
read that kind. The watch itself is tested against the in-test API server in tests/unit/k8s."""

from __future__ import annotations

import pytest

from llm_epp.config import ConfigError, load_config_text
from llm_epp.framework import NullRecorder
from llm_epp.framework.datalayer import EVENT_ADD_OR_UPDATE, GroupVersionKind, ObjectEvent, ObjectEventSource
from llm_epp.framework.registry import PluginParamsError
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.k8s_notification_source import K8sNotificationSource, Params, factory
from tests.unit.builders import FakeHandle

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_kind_and_pass_through() -> None:
    source = factory("pods", Params.model_validate({"version": "v1", "kind": "Pod"}), FakeHandle())
    assert isinstance(source, ObjectEventSource)
    assert source.gvk == GroupVersionKind("", "v1", "Pod")
    assert str(source.gvk) == "v1, Kind=Pod"
    assert str(GroupVersionKind("apps", "v1", "Deployment")) == "apps/v1, Kind=Deployment"
    event = ObjectEvent(EVENT_ADD_OR_UPDATE, {"metadata": {"name": "p", "namespace": "ns"}})
    assert source.notify_object(event) is event
    assert (event.name, event.namespace) == ("p", "ns")


@pytest.mark.parametrize("raw", [None, {"kind": "Pod"}, {"version": "v1"}], ids=["none", "no-version", "no-kind"])
def test_version_and_kind_are_required(raw: dict[str, str] | None) -> None:
    with pytest.raises(PluginParamsError):
        builtin_registry().parse_params("k8s-notification-source", raw)


def test_topology_extractor_binds_to_a_configured_pod_source_and_other_kinds_are_refused() -> None:
    text = HEAD + (
        "plugins:\n- {name: pods, type: k8s-notification-source, parameters: {version: v1, kind: Pod}}\n"
        "- type: topology-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: pods\n"
    )
    loaded = load_config_text(text, builtin_registry(), NullRecorder())
    pods = next(b for b in loaded.data_sources if isinstance(b.source, K8sNotificationSource))
    assert pods.source is loaded.plugins["pods"]
    assert [e.typed_name.name for e in pods.extractors] == ["topology-extractor/pod"]
    nodes = text.replace("kind: Pod", "kind: Node")
    with pytest.raises(ConfigError, match="no extractor reads the events of 'pods'"):
        load_config_text(nodes, builtin_registry(), NullRecorder())
    two = text.replace(
        "- type: topology-extractor\n",
        "- type: topology-extractor\n"
        "- {name: more, type: k8s-notification-source, parameters: {version: v1, kind: Pod}}\n",
    ).replace("  - pluginRef: pods\n", "  - pluginRef: pods\n  - pluginRef: more\n")
    with pytest.raises(ConfigError, match="one notification source per kind"):
        load_config_text(two, builtin_registry(), NullRecorder())
