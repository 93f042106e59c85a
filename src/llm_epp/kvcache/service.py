"""The in-memory `KVIndexService`: one `KVBlockIndex` and one subscriber thread per opened index.

Plugins reach it through `llm_epp.framework.kvindex` only. The application may install it explicitly and
run `service.run(datastore.snapshot)` as a task: it hands the pool to every opened index once a second
(on the event loop, so the datastore is never read from another thread) and stops the subscribers when
cancelled. Without that, an index starts its subscribers the first time its plugin calls `follow()`
(from PrepareData)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

from llm_epp.framework.kvindex import KVIndexSettings, PrefixLookup
from llm_epp.framework.types import Endpoint
from llm_epp.kvcache.index import KVBlockIndex, longest_prefix
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.subscriber import KVEventsRunner, sources_for

log = logging.getLogger(__name__)

__all__ = ["InMemoryKVIndex", "InMemoryKVIndexService", "KVIndexStats", "collect_stats"]


class InMemoryKVIndex:
    """`KVBlockIndexView` over a `KVBlockIndex`, with its subscriber runner."""

    def __init__(self, name: str, settings: KVIndexSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self.name = name
        self.settings = settings
        self.index = KVBlockIndex(
            RequestKeyHasher(settings.block_size, settings.hash_seed, settings.hash_algorithm),
            size=settings.size,
            pod_cache_size=settings.pod_cache_size,
            medium_weights=settings.medium_weights,
        )
        self.runner = KVEventsRunner(
            self.index,
            topic_filter=settings.topic_filter,
            bind_endpoint=settings.zmq_endpoint,
            concurrency=settings.concurrency,
        )
        self._clock = clock

    @property
    def block_size(self) -> int:
        return self.index.block_size

    def request_keys(
        self,
        tokens: Sequence[int],
        model: str,
        cache_salt: str = "",
        extra: Sequence[Sequence[str] | None] | None = None,
    ) -> list[int]:
        return self.index.hasher.keys(tokens, model, extra=extra, cache_salt=cache_salt)

    def match(self, keys: Sequence[int], candidates: Collection[str]) -> PrefixLookup:
        self.index.expire_speculative(self._clock())
        found = self.index.lookup(keys, candidates)
        blocks: dict[str, int] = {}
        active: set[str] | None = None
        for holders in found:
            active = set(holders) if active is None else active & holders.keys()
            if not active:
                break
            for pod in active:
                blocks[pod] = blocks.get(pod, 0) + 1
        return PrefixLookup(longest_prefix(found, self.index.medium_weights), blocks)

    def add_speculative(self, keys: Sequence[int], endpoints: Sequence[str], ttl: float) -> None:
        self.index.add_speculative(keys, endpoints, self._clock() + ttl)

    def follow(self, endpoints: Sequence[Endpoint]) -> None:
        s = self.settings
        if s.discover_pods:
            self.runner.set_sources(sources_for(endpoints, s.socket_port, s.replay_socket_port))
        elif endpoints:  # an empty snapshot (pool not synced yet) drops nothing
            self.index.retain_pods({e.hostport for e in endpoints})
        if (s.discover_pods or s.zmq_endpoint) and not self.runner.running():
            self.runner.start()

    def stop(self) -> None:
        self.runner.stop()


@dataclass(frozen=True, slots=True)
class KVIndexStats:
    """Counters summed over a service's indexes (for metrics). `messages_by_pod` covers the endpoints
    subscribed to now or, with a central socket, those the index holds blocks of (the pool: bounded)."""

    messages_by_pod: Mapping[str, int]
    messages: int = 0
    malformed_messages: int = 0
    malformed_events: int = 0
    unknown_events: int = 0
    gaps: int = 0
    replayed: int = 0
    replay_failures: int = 0
    restarts: int = 0
    duplicates: int = 0
    events_applied: int = 0
    skipped: Mapping[str, int] = field(default_factory=dict)
    admissions: int = 0
    evictions: int = 0
    blocks: int = 0
    subscribers: int = 0
    workers: int = 0
    queue_depth: int = 0


def collect_stats(indexes: Sequence[InMemoryKVIndex]) -> KVIndexStats:
    by_pod: dict[str, int] = {}
    skipped: dict[str, int] = {}
    totals = dict.fromkeys(
        ("messages", "malformed_messages", "malformed_events", "unknown_events", "gaps", "replayed",
         "replay_failures", "restarts", "duplicates", "events_applied", "admissions", "evictions", "blocks",
         "subscribers", "workers", "queue_depth"),
        0,
    )  # fmt: skip
    for ix in indexes:
        r, st, d = ix.runner, ix.runner.stats, ix.runner.stats.decode
        live = set(r.subscribed()) | set(ix.index.pods())
        for pod, n in list(st.messages_by_pod.items()):
            if pod in live:
                by_pod[pod] = by_pod.get(pod, 0) + n
        for reason, n in list(ix.index.stats.skipped.items()):
            skipped[reason] = skipped.get(reason, 0) + n
        values = {
            "messages": st.messages, "malformed_messages": d.malformed_messages,
            "malformed_events": d.malformed_events, "unknown_events": d.unknown_events, "gaps": st.gaps,
            "replayed": st.replayed, "replay_failures": st.replay_failures, "restarts": st.restarts,
            "duplicates": st.duplicates, "events_applied": ix.index.stats.applied,
            "admissions": ix.index.stats.admissions, "evictions": ix.index.stats.evictions,
            "blocks": len(ix.index), "subscribers": len(r.subscribed()) if r.running() else 0,
            "workers": r.pool.workers if r.running() else 0, "queue_depth": r.pool.depth(),
        }  # fmt: skip
        for k, v in values.items():
            totals[k] += v
    return KVIndexStats(messages_by_pod=by_pod, skipped=skipped, **totals)


class InMemoryKVIndexService:
    """Opens `InMemoryKVIndex`es and starts/stops their subscribers together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._indexes: list[InMemoryKVIndex] = []

    def open(self, name: str, settings: KVIndexSettings) -> InMemoryKVIndex:
        index = InMemoryKVIndex(name, settings)
        with self._lock:
            self._indexes.append(index)
        return index

    def indexes(self) -> list[InMemoryKVIndex]:
        with self._lock:
            return list(self._indexes)

    def follow(self, endpoints: Sequence[Endpoint]) -> None:
        """Hands the pool to every opened index (starting their subscribers)."""
        for index in self.indexes():
            if endpoints or index.settings.zmq_endpoint:
                index.follow(endpoints)

    async def run(self, endpoints_fn: Callable[[], Sequence[Endpoint]], interval: float = 1.0) -> None:
        """Follows the pool every `interval` seconds until cancelled, then stops every subscriber. Logs the
        counters every `metrics_logging_interval` (the shortest one configured), if any."""
        periods = [i.settings.metrics_logging_interval for i in self.indexes() if i.settings.metrics_logging_interval]
        log_every = min(periods) if periods else 0.0
        last_log = time.monotonic()
        try:
            while True:
                self.follow(endpoints_fn())
                if log_every and time.monotonic() - last_log >= log_every:
                    last_log = time.monotonic()
                    self.log_stats()
                await asyncio.sleep(min(interval, log_every) if log_every else interval)
        finally:
            self.stop()

    def log_stats(self) -> None:
        s = self.stats()
        log.info(
            "kv_cache_index_metrics admissions=%d evictions=%d blocks=%d events_applied=%d subscribers=%d "
            "malformed_messages=%d gaps=%d replayed=%d publisher_restarts=%d",
            s.admissions,
            s.evictions,
            s.blocks,
            s.events_applied,
            s.subscribers,
            s.malformed_messages,
            s.gaps,
            s.replayed,
            s.restarts,
        )

    def stop(self) -> None:
        with self._lock:
            indexes = list(self._indexes)
        for index in indexes:
            index.stop()

    def stats(self) -> KVIndexStats:
        return collect_stats(self.indexes())
