"""Tests for endpoint-notification-source: it passes endpoint events on, and only endpoint-event extractors
may be listed under it."""

from __future__ import annotations

import pytest

from llm_epp.config import ConfigError, load_config_text
from llm_epp.framework import EndpointKey, EndpointMetadata, NullRecorder
from llm_epp.framework.datalayer import EVENT_DELETE, EndpointEvent, EndpointEventSource
from llm_epp.plugins import builtin_registry
from llm_epp.plugins.datalayer.endpoint_notification_source import EndpointNotificationSource

HEAD = "apiVersion: llm-d.ai/v1alpha1\nkind: EndpointPickerConfig\n"


def test_events_pass_through_unchanged() -> None:
    source = EndpointNotificationSource("events")
    assert isinstance(source, EndpointEventSource)
    event = EndpointEvent(EVENT_DELETE, EndpointMetadata(EndpointKey("ns", "a"), "10.0.0.1", 8000))
    assert source.notify_endpoint(event) is event


def test_only_endpoint_event_extractors_may_be_listed() -> None:
    text = HEAD + (
        "plugins:\n- type: endpoint-notification-source\n- type: dcgm-extractor\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: endpoint-notification-source\n"
        "    extractors: [{pluginRef: dcgm-extractor}]\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config_text(text, builtin_registry(), NullRecorder())
    assert info.value.problems == [
        "dataLayer.sources[0].extractors: 'dcgm-extractor' (dcgm-extractor) cannot read what "
        "'endpoint-notification-source' (endpoint-notification-source) hands it (endpoint events)"
    ]
    alone = HEAD + (
        "plugins:\n- type: endpoint-notification-source\n- type: queue-scorer\n"
        "dataLayer:\n  sources:\n  - pluginRef: endpoint-notification-source\n"
    )
    with pytest.raises(ConfigError, match="no extractor reads the events of 'endpoint-notification-source'"):
        load_config_text(alone, builtin_registry(), NullRecorder())
