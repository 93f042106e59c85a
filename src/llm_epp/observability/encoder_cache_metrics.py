"""Metrics of `mm-embeddings-cache-producer` instances, read from their counters at each scrape, under
llm-d-router's names: `llm_d_epp_encoder_cache_queries_total`, `llm_d_epp_encoder_cache_hits_total` and the
histogram `llm_d_epp_encoder_cache_hit_ratio`. Label values are bounded: plugin type and name from the
configuration, `modality` from a fixed list, `pod` only for endpoints the producer keeps an LRU for (pool
members; dropped when they leave)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Protocol, runtime_checkable

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from llm_epp.framework import EndpointKey, TypedName

PREFIX = "llm_d_epp_encoder_cache_"


class EncoderCacheCounters(Protocol):
    bounds: Sequence[float]  # the hit-ratio histogram's upper bounds
    queries: Mapping[str, int]
    hits: Mapping[tuple[EndpointKey, str], int]
    ratio_buckets: Sequence[int]
    ratio_count: int
    ratio_sum: float


@runtime_checkable
class EncoderCacheSource(Protocol):
    @property
    def typed_name(self) -> TypedName: ...

    @property
    def encoder_cache_stats(self) -> EncoderCacheCounters: ...


def _bound(b: float) -> str:
    return "1.0" if b == 1.0 else ("0.0" if b == 0.0 else repr(b))


class EncoderCacheCollector(Collector):
    def __init__(self, producers: Sequence[EncoderCacheSource]) -> None:
        self._producers = list(producers)

    def collect(self) -> Iterator[Metric]:
        queries = CounterMetricFamily(
            PREFIX + "queries",
            "Total number of multimodal item hash lookups made against the encoder-cache affinity LRU.",
            labels=["plugin_type", "plugin_name", "modality"],
        )
        hits = CounterMetricFamily(
            PREFIX + "hits",
            "Total number of multimodal item hash lookups that found a match in the encoder-cache affinity LRU, "
            "by endpoint.",
            labels=["plugin_type", "plugin_name", "pod", "modality"],
        )
        ratio = HistogramMetricFamily(
            PREFIX + "hit_ratio",
            "Ratio of matched multimodal items to total items per endpoint in an encoder-cache lookup.",
            labels=["plugin_type", "plugin_name"],
        )
        for p in self._producers:
            t, n = p.typed_name.type, p.typed_name.name
            s = p.encoder_cache_stats
            for modality, count in sorted(s.queries.items()):
                queries.add_metric([t, n, modality], count)
            for (pod, modality), count in sorted(s.hits.items()):
                hits.add_metric([t, n, str(pod), modality], count)
            buckets = [(_bound(b), c) for b, c in zip(s.bounds, s.ratio_buckets, strict=True)]
            buckets.append(("+Inf", s.ratio_count))
            ratio.add_metric([t, n], buckets, s.ratio_sum)
        yield queries
        yield hits
        yield ratio


def encoder_cache_sources(plugins: Iterable[object]) -> list[EncoderCacheSource]:
    """The configured plugins that keep encoder-cache counters (`mm-embeddings-cache-producer`)."""
    return [p for p in plugins if isinstance(p, EncoderCacheSource)]


def register_encoder_cache_metrics(
    registry: CollectorRegistry, producers: Sequence[EncoderCacheSource]
) -> EncoderCacheCollector:
    collector = EncoderCacheCollector(producers)
    registry.register(collector)
    return collector
