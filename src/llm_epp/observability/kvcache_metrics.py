"""Metrics of the precise prefix-cache index and its KV-event subscribers, read from the index service at
each scrape.

llm-d-router's names where it has them (`llm_d_router_epp_kv_cache_*`, and the deprecated
`kvcache_index_*` twins of the two index counters it still emits); `llm_epp_kv_cache_*` for what it does
not count (decode failures, sequence gaps, replays, publisher restarts, events applied, blocks held).
Label sets are bounded: `pod_identifier` only for endpoints of the pool (subscribed now, or holding
blocks), `reason` and `kind` from fixed lists."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_epp.kvcache.service import KVIndexStats

ROUTER = "llm_d_router_epp_"
OWN = "llm_epp_"


class KVIndexCollector(Collector):
    def __init__(self, stats: Callable[[], KVIndexStats], index_metrics: bool = True) -> None:
        self._stats = stats
        self._index_metrics = index_metrics  # kvBlockIndexConfig.enableMetrics of some configured index

    def collect(self) -> Iterator[Metric]:
        s = self._stats()
        index_families = (ROUTER + "kv_cache_index_", ""), ("kvcache_index_", "Deprecated. ")
        for prefix, deprecated in index_families if self._index_metrics else ():
            yield CounterMetricFamily(
                prefix + "admissions", deprecated + "Total number of KV-block admissions", value=s.admissions
            )
            yield CounterMetricFamily(
                prefix + "evictions", deprecated + "Total number of KV-block evictions", value=s.evictions
            )
        received = CounterMetricFamily(
            ROUTER + "kv_cache_events_messages_received",
            "Total number of messages received from ZMQ subscribers",
            labels=["pod_identifier"],
        )
        for pod, n in sorted(s.messages_by_pod.items()):
            received.add_metric([pod], n)
        yield received
        skipped = CounterMetricFamily(
            ROUTER + "kv_cache_events_stores_skipped",
            "Total number of KV-cache store events skipped before prefix indexing",
            labels=["cache_kind", "reason"],
        )
        for reason, n in sorted(s.skipped.items()):
            skipped.add_metric(["", reason], n)
        yield skipped
        yield GaugeMetricFamily(
            ROUTER + "kv_cache_events_active_subscribers", "Number of ZMQ subscribers currently managed",
            value=s.subscribers,
        )  # fmt: skip
        yield GaugeMetricFamily(
            ROUTER + "kv_cache_events_pool_capacity", "Number of worker shards in the event processing pool",
            value=s.workers,
        )  # fmt: skip
        yield GaugeMetricFamily(
            ROUTER + "kv_cache_events_pool_queue_depth", "Total number of messages queued across all worker shards",
            value=s.queue_depth,
        )  # fmt: skip
        malformed = CounterMetricFamily(
            OWN + "kv_cache_events_malformed",
            "KV-event messages or events that could not be decoded and were skipped",
            labels=["kind"],
        )
        malformed.add_metric(["message"], s.malformed_messages)
        malformed.add_metric(["event"], s.malformed_events)
        malformed.add_metric(["unknown_event"], s.unknown_events)
        yield malformed
        yield CounterMetricFamily(
            OWN + "kv_cache_events_applied", "KV events applied to the index", value=s.events_applied
        )
        yield CounterMetricFamily(OWN + "kv_cache_events_gaps", "Sequence gaps seen on KV-event streams", value=s.gaps)
        yield CounterMetricFamily(
            OWN + "kv_cache_events_replayed", "Batches recovered from a model server's replay socket", value=s.replayed
        )
        yield CounterMetricFamily(
            OWN + "kv_cache_events_replay_failures", "Replay requests that timed out", value=s.replay_failures
        )
        yield CounterMetricFamily(
            OWN + "kv_cache_events_publisher_restarts",
            "KV-event publishers seen restarting (sequence going back); their endpoint's blocks were dropped",
            value=s.restarts,
        )
        yield GaugeMetricFamily(OWN + "kv_cache_index_blocks", "Block keys held by the index", value=s.blocks)


def register_kv_index_metrics(
    registry: CollectorRegistry, stats: Callable[[], KVIndexStats], index_metrics: bool = True
) -> KVIndexCollector:
    """The subscriber metrics always; the index's admission/eviction counters when ``index_metrics``."""
    collector = KVIndexCollector(stats, index_metrics)
    registry.register(collector)
    return collector
