"""The in-memory `KVIndexService`: one `KVBlockIndex` and one subscriber thread per opened index.

Plugins reach it through `llm_epp.framework.kvindex` only. The application may install it explicitly and
start every opened index's subscribers eagerly, following the pool (`start(endpoints_fn)`), and stop them
on shutdown (`stop()`); without that, an index starts its subscribers the first time its plugin calls
`follow()` (from PrepareData)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence

from llm_epp.framework.kvindex import KVIndexSettings
from llm_epp.framework.types import Endpoint
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.subscriber import KVEventsRunner, sources_for


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
            self.index, topic_filter=settings.topic_filter, bind_endpoint=settings.zmq_endpoint
        )
        self._clock = clock

    @property
    def block_size(self) -> int:
        return self.index.block_size

    def request_keys(self, tokens: Sequence[int], model: str, cache_salt: str = "") -> list[int]:
        return self.index.hasher.keys(tokens, model, cache_salt=cache_salt)

    def score(self, keys: Sequence[int], candidates: Collection[str]) -> dict[str, float]:
        self.index.expire_speculative(self._clock())
        return self.index.score(keys, candidates)

    def matched_blocks(self, keys: Sequence[int], candidates: Collection[str]) -> dict[str, int]:
        counts: dict[str, int] = {}
        active: set[str] | None = None
        for holders in self.index.lookup(keys, candidates):
            active = set(holders) if active is None else active & set(holders)
            if not active:
                break
            for pod in active:
                counts[pod] = counts.get(pod, 0) + 1
        return counts

    def add_speculative(self, keys: Sequence[int], endpoints: Sequence[str], ttl: float) -> None:
        self.index.add_speculative(keys, endpoints, self._clock() + ttl)

    def follow(self, endpoints: Sequence[Endpoint]) -> None:
        s = self.settings
        if s.discover_pods:
            self.runner.set_sources(sources_for(endpoints, s.socket_port, s.replay_socket_port))
        else:
            self.index.retain_pods({e.hostport for e in endpoints})
        if (s.discover_pods or s.zmq_endpoint) and not self.runner.running():
            self.runner.start()

    def start(self, endpoints_fn: Callable[[], Sequence[Endpoint]]) -> None:
        s = self.settings
        if s.discover_pods:
            self.runner.start(lambda: sources_for(endpoints_fn(), s.socket_port, s.replay_socket_port))
        elif s.zmq_endpoint:
            self.runner.start()

    def stop(self) -> None:
        self.runner.stop()


class InMemoryKVIndexService:
    """Opens `InMemoryKVIndex`es and starts/stops their subscribers together."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._indexes: list[InMemoryKVIndex] = []
        self._endpoints_fn: Callable[[], Sequence[Endpoint]] | None = None

    def open(self, name: str, settings: KVIndexSettings) -> InMemoryKVIndex:
        index = InMemoryKVIndex(name, settings)
        with self._lock:
            self._indexes.append(index)
            endpoints_fn = self._endpoints_fn
        if endpoints_fn is not None:
            index.start(endpoints_fn)
        return index

    def indexes(self) -> list[InMemoryKVIndex]:
        with self._lock:
            return list(self._indexes)

    def start(self, endpoints_fn: Callable[[], Sequence[Endpoint]]) -> None:
        """Follows the pool with every index opened so far and later; `endpoints_fn` must be safe to call
        from another thread (a datastore snapshot is)."""
        with self._lock:
            self._endpoints_fn = endpoints_fn
            indexes = list(self._indexes)
        for index in indexes:
            index.start(endpoints_fn)

    def stop(self) -> None:
        with self._lock:
            indexes, self._indexes = self._indexes, []
            self._endpoints_fn = None
        for index in indexes:
            index.stop()
