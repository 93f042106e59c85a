"""The precise prefix-cache index as plugins see it.

The index itself (KV-event subscribers, block keys, bounded in-memory storage) is infrastructure outside
the plugin API. A plugin asks the process's `KVIndexService` for an index with `open(name, settings)` and
then uses only the `KVBlockIndexView` protocol below. The service is installed by the application
(`install_kv_index_service`); when none is installed, the one registered under the entry-point group
`llm_epp.kvindex` (name `default`) is loaded on first use, the way out-of-tree plugins are found.

Costs and threading: `request_keys` hashes every full block of a prompt and `match` takes the index lock
(which the event subscriber also takes): run both off the event loop, e.g. in `asyncio.to_thread` inside
PrepareData. The speculative calls are cheap. All methods are safe to call from any thread."""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from llm_epp.framework.types import Endpoint

ENTRY_POINT_GROUP = "llm_epp.kvindex"
DEFAULT_MEDIUM_WEIGHTS: Mapping[str, float] = MappingProxyType({"gpu": 1.0, "cpu": 0.8})


@dataclass(frozen=True, slots=True)
class KVIndexSettings:
    """What a plugin asks of its index (llm-d's tokenProcessorConfig, indexerConfig, kvEventsConfig)."""

    block_size: int = 16
    hash_seed: str = ""
    hash_algorithm: str = ""
    size: int = 100_000_000
    pod_cache_size: int = 10
    medium_weights: Mapping[str, float] = field(default_factory=lambda: DEFAULT_MEDIUM_WEIGHTS)
    zmq_endpoint: str = ""  # bind one SUB socket here (engines connect to it) instead of dialling pods
    topic_filter: str = "kv@"
    engine_type: str = "vllm"
    discover_pods: bool = True
    socket_port: int = 5557
    replay_socket_port: int = 0  # 0: no replay
    concurrency: int = 4  # threads applying events, each endpoint always on the same one
    enable_metrics: bool = False  # the index's admission/eviction counters on /metrics (kvBlockIndexConfig)
    metrics_logging_interval: float = 0.0  # seconds between log lines of the index's counters; 0: none


@dataclass(frozen=True, slots=True)
class PrefixLookup:
    """Per endpoint (`ip:port`): `weighted`, the leading blocks it holds, each counted with the weight of
    the best medium holding it (LongestPrefix); `blocks`, the same count unweighted. Endpoints holding no
    leading block are absent."""

    weighted: Mapping[str, float]
    blocks: Mapping[str, int]


@runtime_checkable
class KVBlockIndexView(Protocol):
    """One precise prefix-cache index. Endpoints are named by `Endpoint.hostport` (`ip:port`)."""

    @property
    def block_size(self) -> int: ...

    def request_keys(
        self,
        tokens: Sequence[int],
        model: str,
        cache_salt: str = "",
        extra: Sequence[Sequence[str] | None] | None = None,
    ) -> list[int]:
        """The block keys of a prompt's full blocks (partial tail dropped); `extra`: per block, the
        multimodal item hashes overlapping it (or None), as the engine's events carry them."""
        ...

    def match(self, keys: Sequence[int], candidates: Collection[str]) -> PrefixLookup:
        """Which leading blocks of `keys` each candidate holds."""
        ...

    def add_speculative(self, keys: Sequence[int], endpoints: Sequence[str], ttl: float) -> None:
        """Marks `keys` as held by `endpoints` until `ttl` seconds from now, unless the engine confirms."""
        ...

    def follow(self, endpoints: Sequence[Endpoint]) -> None:
        """Tells the index which endpoints are in the pool: their KV events are subscribed to, endpoints
        that left are dropped. Cheap; may be called often. Starts the subscribers on first call."""
        ...


class KVIndexService(Protocol):
    def open(self, name: str, settings: KVIndexSettings) -> KVBlockIndexView:
        """An index for the plugin instance `name` (a new one per call)."""
        ...


_lock = threading.Lock()
_service: KVIndexService | None = None


def install_kv_index_service(service: KVIndexService | None) -> None:
    """Sets (or, with None, clears) the process's index service."""
    global _service
    with _lock:
        _service = service


def kv_index_service() -> KVIndexService:
    """The installed service, else the `default` entry point of group `llm_epp.kvindex`. Raises
    LookupError when there is none."""
    global _service
    with _lock:
        if _service is not None:
            return _service
        found = [ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == "default"]
        if not found:
            raise LookupError(
                f"no KV-cache index service: install one with install_kv_index_service() or register an entry "
                f"point 'default' in group {ENTRY_POINT_GROUP!r} (llm-epp registers its own; reinstall the package)"
            )
        loaded = found[0].load()
        service: KVIndexService = loaded() if isinstance(loaded, type) else loaded
        _service = service
        return service
