"""The precise index's counters on the metrics registry: llm-d-router's names, bounded labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from llm_epp.app import build
from llm_epp.framework.kvindex import KVIndexSettings, install_kv_index_service
from llm_epp.kvcache.events import BlockStored, EventBatch
from llm_epp.kvcache.service import InMemoryKVIndexService
from llm_epp.observability.kvcache_metrics import register_kv_index_metrics
from llm_epp.options import Options

POD = "10.0.0.1:8000"


def test_counters_are_exported_under_the_upstream_names() -> None:
    service = InMemoryKVIndexService()
    index = service.open("p", KVIndexSettings(block_size=4, concurrency=3))
    index.index.apply(POD, "m", EventBatch(0.0, (BlockStored((7,), None, tuple(range(8)), 4),)))
    stats = index.runner.stats
    stats.messages_by_pod.update({POD: 5, "10.9.9.9:1": 2})  # the second endpoint is not in the index
    stats.gaps, stats.replayed, stats.restarts = 2, 1, 1
    stats.decode.count("message", "frames: expected 3, got 2")
    stats.decode.count("unknown", "unknown event tag")
    registry = CollectorRegistry()
    register_kv_index_metrics(registry, service.stats)
    value = registry.get_sample_value
    assert value("llm_d_router_epp_kv_cache_index_admissions_total") == 2
    assert value("kvcache_index_admissions_total") == 2  # the deprecated twin
    assert value("llm_d_router_epp_kv_cache_index_evictions_total") == 0
    assert value("llm_d_router_epp_kv_cache_events_messages_received_total", {"pod_identifier": POD}) == 5
    assert value("llm_d_router_epp_kv_cache_events_messages_received_total", {"pod_identifier": "10.9.9.9:1"}) is None
    assert value("llm_epp_kv_cache_events_malformed_total", {"kind": "message"}) == 1
    assert value("llm_epp_kv_cache_events_malformed_total", {"kind": "unknown_event"}) == 1
    assert value("llm_epp_kv_cache_events_gaps_total") == 2
    assert value("llm_epp_kv_cache_events_replayed_total") == 1
    assert value("llm_epp_kv_cache_events_publisher_restarts_total") == 1
    assert value("llm_epp_kv_cache_events_applied_total") == 1
    assert value("llm_epp_kv_cache_index_blocks") == 2
    assert value("llm_d_router_epp_kv_cache_events_pool_capacity") == 0  # not running
    index.index.clear_pod(POD)
    assert value("llm_d_router_epp_kv_cache_index_evictions_total") == 2


def test_the_index_counters_follow_enable_metrics_and_the_subscriber_metrics_do_not() -> None:
    service = InMemoryKVIndexService()
    service.open("p", KVIndexSettings(block_size=4))
    registry = CollectorRegistry()
    register_kv_index_metrics(registry, service.stats, index_metrics=False)
    text = generate_latest(registry).decode()
    assert "kv_cache_index_admissions" not in text and "kvcache_index_" not in text
    assert "llm_d_router_epp_kv_cache_events_active_subscribers" in text


PRECISE = """\
plugins:
- type: precise-prefix-cache-producer
  parameters: {kvEventsConfig: {concurrency: 2}}
- type: precise-prefix-cache-scorer
- type: max-score-picker
schedulingProfiles:
- name: default
  plugins: [{pluginRef: precise-prefix-cache-scorer}, {pluginRef: max-score-picker}]
"""


def test_the_app_builds_the_index_service_for_a_precise_configuration(tmp_path: Path) -> None:
    try:
        c = build(Options(endpoints="10.0.0.1:8000", config_text=PRECISE))
        assert c.kv_index is not None
        (index,) = c.kv_index.indexes()
        assert index.runner.pool.workers == 2
        text = generate_latest(c.recorder.registry).decode()
        assert "llm_d_router_epp_kv_cache_events_active_subscribers" in text
        assert "kv_cache_index_admissions" not in text  # enableMetrics defaults to false, as upstream
        install_kv_index_service(None)
        metered = PRECISE.replace(
            "{kvEventsConfig: {concurrency: 2}}", "{indexerConfig: {kvBlockIndexConfig: {enableMetrics: true}}}"
        )
        text = generate_latest(
            build(Options(endpoints="10.0.0.1:8000", config_text=metered)).recorder.registry
        ).decode()
        assert "llm_d_router_epp_kv_cache_index_admissions_total 0.0" in text
        plain = build(Options(endpoints="10.0.0.1:8000"))
        assert plain.kv_index is None
        assert "kv_cache_events" not in generate_latest(plain.recorder.registry).decode()
    finally:
        install_kv_index_service(None)


def test_the_logging_interval_logs_the_counters(caplog: pytest.LogCaptureFixture) -> None:
    service = InMemoryKVIndexService()
    index = service.open("p", KVIndexSettings(block_size=4, metrics_logging_interval=60.0))
    index.index.apply(POD, "m", EventBatch(0.0, (BlockStored((7,), None, tuple(range(8)), 4),)))
    with caplog.at_level("INFO", logger="llm_epp.kvcache.service"):
        service.log_stats()
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kv_cache_index_metrics")]
    assert "admissions=2" in line and "blocks=2" in line
