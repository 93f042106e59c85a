"""precise-prefix-cache-producer

Scheduling intent:
    Know, not guess, which endpoints hold a request's prompt prefix in their KV cache. The model servers
    publish every block they store or evict (vLLM `--kv-events-config`, SGLang KV events) over ZMQ; this
    producer keeps an index of those blocks per endpoint and, for each request, finds how many leading
    blocks of its prompt each candidate holds.

    PrepareData: the prompt's token ids (from `token-producer`, or ids the client sent) are cut into
    blocks of `tokenProcessorConfig.blockSizeTokens`; each full block gets a key chained from the
    previous one and seeded with the target model (`hashSeed`, `hashAlgorithm`). A block's extras are the
    hashes of the prompt's multimodal items whose placeholder tokens overlap it (from the token-producer's
    render backend, as the engine's BlockStored extra keys carry them), then cache_salt on block 0.
    The index answers, per candidate, the LongestPrefix count: leading blocks held, each weighted by the
    best medium holding it (`kvCacheBackendConfigs`, default gpu 1.0, cpu 0.8). The result goes to the
    CycleState twice: `PRECISE_MATCH_KEY` (weighted, for `precise-prefix-cache-scorer`) and
    `PREFIX_MATCH_KEY` (unweighted leading blocks held, for `prefix-cache-scorer`, `no-hit-lru-scorer`,
    `prefix-cache-affinity-filter` and P/D deciders), and the unweighted record once more under
    `prefix-cache-match-info/<name>` for consumers whose `prefixMatchInfoProducerName` names this
    instance. A request without tokens gets none of them.

    The index keys blocks by keys the EPP computes itself from the token ids in each BlockStored event,
    chained from the parent block's key (found through the engine's hash), so neither the engine's hash
    algorithm nor its PYTHONHASHSEED matter, and every EPP replica fed the same events holds the same
    index. Endpoints are identified as `ip:port`.

    KV events (off the request path, one background thread): with `kvEventsConfig.discoverPods` (the
    default) the producer subscribes to every pool endpoint at `tcp://<ip>:<socketPort + DP rank>` with
    `topicFilter`, fills sequence gaps from `replaySocketPort` when set, drops an endpoint's blocks when
    its publisher restarts or it leaves the pool. With `zmqEndpoint` it binds one socket there instead and
    the engines connect to it. Subscribers start with the first request that sees a non-empty pool (or
    eagerly when the application starts the KV index service); listed as an extractor under an
    `endpoint-notification-source`, the index follows every pool change as it happens.

    PreRequest (`speculativeIndexing`): the request's keys are added for the primary target and the
    first target of a profile named `prefill`, marked speculative, and removed after `speculativeTTL`
    unless the engine's events confirmed them, so a burst sharing a new prefix does not scatter before
    the first BlockStored arrives.

Inputs consumed:
    The request's `TokenizedPrompt` (`TOKENIZED_PROMPT_KEY`, from `token-producer`; a `token-producer`
    with the estimate backend is created when none is configured) or RequestBody.token_ids;
    InferenceRequest.target_model; candidate endpoints' address and port; Handle.endpoints() (the pool to
    subscribe to); the SchedulingResult (PreRequest).

Configuration:
    tokenProcessorConfig.blockSizeTokens (int, default 16; `blockSize` is its deprecated name): tokens per
        block key. It must divide the engine's `--block-size` (equal is simplest), so engine blocks map onto
        whole keys.
    tokenProcessorConfig.hashSeed (string, default ""): seeds the key chain.
    tokenProcessorConfig.hashAlgorithm ("cbor-fnv" (default) or "xxh64").
    indexerConfig.kvBlockIndexConfig.inMemoryConfig.size (int, default 1e8): most keys kept (LRU).
    indexerConfig.kvBlockIndexConfig.inMemoryConfig.podCacheSize (int, default 10): most endpoints per key.
    indexerConfig.kvCacheBackendConfigs (list of {name, weight}, default gpu 1.0, cpu 0.8): medium weights.
    indexerConfig.kvBlockIndexConfig.enableMetrics (bool, default false): export the index's admission and
        eviction counters (`llm_d_router_epp_kv_cache_index_*` and the deprecated `kvcache_index_*`) on the
        metrics port; the KV-event subscriber metrics are exported either way (see docs/metrics.md).
    indexerConfig.kvBlockIndexConfig.metricsLoggingInterval (Go duration: nanoseconds as a number, or a
        string such as "1m"; default 0 = off): log the index's counters at this interval.
    indexerConfig: `redisConfig` and `costAwareMemoryConfig` are not supported yet;
        `tokenizersPoolConfig` is rejected as upstream does (configure a `token-producer`).
    kvEventsConfig.zmqEndpoint (string): bind here instead of dialling each endpoint.
    kvEventsConfig.topicFilter (string, default "kv@"): ZMQ subscription prefix.
    kvEventsConfig.engineType ("vllm" (default) or "sglang"): both use the same decoder.
    kvEventsConfig.discoverPods (bool, default true); podDiscoveryConfig.socketPort (int, default 5557),
        replaySocketPort (int, default 0 = no replay). podLabelSelector and podNamespace other than their
        defaults are not supported yet: endpoints come from the pool, as in llm-d's current producer.
    kvEventsConfig.concurrency (int, default 4; 0 means the default): threads applying decoded events to
        the index, each endpoint always on the same thread so its events keep their order.
    speculativeIndexing (bool, default false); speculativeTTL (duration, default "2s").
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    SchedulingResult,
    StateKey,
    TypedName,
)
from llm_epp.framework.datalayer import AttributeUpdates, EndpointEvent
from llm_epp.framework.durations import parse_go_duration
from llm_epp.framework.kvindex import KVBlockIndexView, KVIndexSettings, PrefixLookup, kv_index_service
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY, MultiModalFeature
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFILL_PROFILE,
    PREFIX_MATCH_KEY,
    PrefixMatch,
    prefix_match_key,
)

log = logging.getLogger(__name__)

TYPE = "precise-prefix-cache-producer"
FOLLOW_INTERVAL_S = 1.0


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class TokenProcessorConfig(_Strict):
    block_size: int = Field(default=0, alias="blockSize")
    block_size_tokens: int = Field(default=0, alias="blockSizeTokens")
    hash_seed: str = Field(default="", alias="hashSeed")
    hash_algorithm: str = Field(default="", alias="hashAlgorithm")

    @model_validator(mode="after")
    def _check(self) -> TokenProcessorConfig:
        if self.effective_block_size <= 0:
            raise ValueError(f"blockSizeTokens must be greater than 0, got {self.block_size_tokens or self.block_size}")
        if self.hash_algorithm not in ("", "cbor-fnv", "xxh64"):
            raise ValueError(
                f"unsupported hashAlgorithm {self.hash_algorithm!r}: accepted values are 'cbor-fnv' and 'xxh64'"
            )
        return self

    @property
    def effective_block_size(self) -> int:
        if self.block_size_tokens:
            return self.block_size_tokens
        return self.block_size if self.block_size else 16


class InMemoryConfig(_Strict):
    size: int = Field(default=100_000_000, gt=0)
    pod_cache_size: int = Field(default=10, gt=0, alias="podCacheSize")


class KVBlockIndexConfig(_Strict):
    in_memory_config: InMemoryConfig | None = Field(default=None, alias="inMemoryConfig")
    redis_config: dict[str, Any] | None = Field(default=None, alias="redisConfig")
    cost_aware_memory_config: dict[str, Any] | None = Field(default=None, alias="costAwareMemoryConfig")
    enable_metrics: bool = Field(default=False, alias="enableMetrics")
    metrics_logging_interval: Any = Field(default=None, alias="metricsLoggingInterval")

    @model_validator(mode="after")
    def _check(self) -> KVBlockIndexConfig:
        if self.redis_config is not None:
            raise ValueError(
                "kvBlockIndexConfig.redisConfig (Redis/Valkey index) is not supported yet; use inMemoryConfig"
            )
        if self.cost_aware_memory_config is not None:
            raise ValueError("kvBlockIndexConfig.costAwareMemoryConfig is not supported yet; use inMemoryConfig")
        self.logging_interval()  # raises with a clear message
        return self

    def logging_interval(self) -> float:
        """`metricsLoggingInterval` in seconds (a Go duration: nanoseconds as a number, or "1m"); 0: off."""
        value = self.metrics_logging_interval
        if value is None or value == 0 or value == "":
            return 0.0
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"kvBlockIndexConfig.metricsLoggingInterval: expected a duration, got {value!r}")
        seconds = value / 1e9 if isinstance(value, int | float) else parse_go_duration(value)
        if seconds < 0:
            raise ValueError(f"kvBlockIndexConfig.metricsLoggingInterval must not be negative, got {value!r}")
        return float(seconds)


class BackendConfig(_Strict):
    name: str
    weight: float = Field(ge=0)


class IndexerConfig(_Strict):
    kv_block_index_config: KVBlockIndexConfig | None = Field(default=None, alias="kvBlockIndexConfig")
    kv_cache_backend_configs: list[BackendConfig] | None = Field(default=None, alias="kvCacheBackendConfigs")
    tokenizers_pool_config: dict[str, Any] | None = Field(default=None, alias="tokenizersPoolConfig")

    @model_validator(mode="after")
    def _check(self) -> IndexerConfig:
        if self.tokenizers_pool_config is not None:
            raise ValueError("tokenizersPoolConfig is not supported; configure a token-producer plugin instead")
        return self


_DEFAULT_POD_SELECTOR = "llm-d.ai/inference-serving=true"


class PodDiscoveryConfig(_Strict):
    pod_label_selector: str = Field(default=_DEFAULT_POD_SELECTOR, alias="podLabelSelector")
    pod_namespace: str = Field(default="", alias="podNamespace")
    socket_port: int = Field(default=5557, gt=0, lt=65536, alias="socketPort")
    replay_socket_port: int = Field(default=0, lt=65536, alias="replaySocketPort")

    @model_validator(mode="after")
    def _check(self) -> PodDiscoveryConfig:
        if self.pod_label_selector != _DEFAULT_POD_SELECTOR or self.pod_namespace:
            raise ValueError(
                "podLabelSelector and podNamespace are not supported yet: llm-epp subscribes to the endpoints of "
                "its own pool (the InferencePool, --endpoint-selector or the endpoints file); leave them out"
            )
        return self


class KVEventsConfig(_Strict):
    zmq_endpoint: str = Field(default="", alias="zmqEndpoint")
    topic_filter: str = Field(default="kv@", alias="topicFilter")
    concurrency: int = Field(default=4, ge=0, le=256)  # event-applying workers, sharded by endpoint
    engine_type: str = Field(default="vllm", alias="engineType")
    discover_pods: bool = Field(default=True, alias="discoverPods")
    pod_discovery_config: PodDiscoveryConfig | None = Field(default=None, alias="podDiscoveryConfig")

    @model_validator(mode="after")
    def _check(self) -> KVEventsConfig:
        if self.engine_type not in ("", "vllm", "sglang"):
            raise ValueError(f"engineType {self.engine_type!r}: use 'vllm' or 'sglang'")
        if self.zmq_endpoint and not self.zmq_endpoint.startswith(("tcp://", "ipc://")):
            raise ValueError(f"zmqEndpoint {self.zmq_endpoint!r}: expected tcp://host:port or ipc://path")
        return self


class Params(PluginParams):
    token_processor_config: TokenProcessorConfig | None = Field(default=None, alias="tokenProcessorConfig")
    indexer_config: IndexerConfig | None = Field(default=None, alias="indexerConfig")
    kv_events_config: KVEventsConfig | None = Field(default=None, alias="kvEventsConfig")
    speculative_indexing: bool = Field(default=False, alias="speculativeIndexing")
    speculative_ttl: str = Field(default="", alias="speculativeTTL")

    @model_validator(mode="after")
    def _check(self) -> Params:
        if self.speculative_ttl:
            parse_go_duration(self.speculative_ttl)  # raises with a clear message
        return self

    def settings(self) -> KVIndexSettings:
        tp = self.token_processor_config or TokenProcessorConfig()
        ix = self.indexer_config or IndexerConfig()
        kb = ix.kv_block_index_config
        mem = (kb and kb.in_memory_config) or InMemoryConfig()
        ev = self.kv_events_config or KVEventsConfig()
        pd = ev.pod_discovery_config or PodDiscoveryConfig()
        weights = {b.name.lower(): b.weight for b in ix.kv_cache_backend_configs or ()} or {"gpu": 1.0, "cpu": 0.8}
        return KVIndexSettings(
            block_size=tp.effective_block_size,
            hash_seed=tp.hash_seed,
            hash_algorithm=tp.hash_algorithm,
            size=mem.size,
            pod_cache_size=mem.pod_cache_size,
            medium_weights=weights,
            zmq_endpoint=ev.zmq_endpoint,
            topic_filter=ev.topic_filter,
            engine_type=ev.engine_type or "vllm",
            discover_pods=ev.discover_pods and not ev.zmq_endpoint,
            socket_port=pd.socket_port,
            replay_socket_port=max(0, pd.replay_socket_port),
            concurrency=ev.concurrency or 4,
            enable_metrics=bool(kb and kb.enable_metrics),
            metrics_logging_interval=kb.logging_interval() if kb else 0.0,
        )

    def ttl(self) -> float:
        ttl = parse_go_duration(self.speculative_ttl) if self.speculative_ttl else 0.0
        return ttl if ttl > 0 else 2.0


@dataclass(frozen=True, slots=True)
class PreciseMatch:
    """What the producer found for one request: its block keys, and per candidate the medium-weighted
    count of leading blocks held (LongestPrefix)."""

    keys: tuple[int, ...]
    weighted: Mapping[EndpointKey, float]
    block_size_tokens: int

    @property
    def total_blocks(self) -> int:
        return len(self.keys)

    def score(self, key: EndpointKey) -> float:
        """min(1, weighted match / total blocks); 0 without blocks."""
        total = len(self.keys)
        return min(1.0, self.weighted.get(key, 0.0) / total) if total else 0.0


def mm_block_extras(
    features: Sequence[MultiModalFeature], block_size: int, n_tokens: int
) -> list[list[str] | None] | None:
    """Per full block, the hashes of the multimodal items whose placeholder tokens overlap it (in placeholder
    order), as the engine lists them in the block's extra keys; None without such items. Items without a
    placeholder range are left out."""
    items = sorted((f for f in features if f.length > 0), key=lambda f: f.offset)
    if not items or block_size <= 0:
        return None
    out: list[list[str] | None] = []
    for i in range(n_tokens // block_size):
        start, end = i * block_size, (i + 1) * block_size
        hashes = [f.hash for f in items if f.offset < end and f.offset + f.length > start]
        out.append(hashes or None)
    return out if any(out) else None


PRECISE_MATCH_KEY: StateKey[PreciseMatch] = StateKey("precise-prefix-cache-match-info")


class PrecisePrefixCacheProducer:
    """PrepareData + PreRequest; see the module docstring."""

    consumes = frozenset({TOKENIZED_PROMPT_KEY.name})

    def __init__(self, name: str, params: Params, handle: Handle, index: KVBlockIndexView | None = None) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.own_match_key = prefix_match_key(name)
        self.produces = frozenset({PRECISE_MATCH_KEY.name, PREFIX_MATCH_KEY.name, self.own_match_key.name})
        self.params = params
        self._handle = handle
        self.index = index if index is not None else kv_index_service().open(name, params.settings())
        self.speculative = params.speculative_indexing
        self.ttl = params.ttl()
        self._next_follow = float("-inf")
        self._warned_inexact = False

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    def follow_pool(self) -> None:
        """Hands the pool to the index (at most once a second); subscribers start once it is non-empty."""
        now = self._handle.now()
        if now < self._next_follow:
            return
        self._next_follow = now + FOLLOW_INTERVAL_S
        pool = self._handle.endpoints()
        if pool:
            self.index.follow(pool)

    def extract_endpoint_event(self, event: EndpointEvent) -> AttributeUpdates:
        """Listed under an `endpoint-notification-source`: the pool changed, so the index follows it now
        (subscribers of joining endpoints start, those of leaving ones stop) rather than at the next request."""
        self._next_follow = float("-inf")
        self.follow_pool()
        return {}

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.follow_pool()
        prompt = cycle.read(TOKENIZED_PROMPT_KEY)
        tokens = prompt.token_ids if prompt is not None else request.body.token_ids
        salt = prompt.cache_salt if prompt is not None else request.body.cache_salt
        if prompt is not None and not prompt.exact and not self._warned_inexact:
            self._warned_inexact = True
            log.warning(
                "precise_prefix_inexact_tokens plugin=%s: the token-producer estimates tokens; configure its "
                "vllm (render) or tokenizerPath backend for precise prefix-cache routing",
                self._typed_name,
            )
        if len(tokens) < self.index.block_size:
            return
        by_addr = {e.hostport: e.key for e in endpoints}
        extra = mm_block_extras(prompt.mm_features, self.index.block_size, len(tokens)) if prompt is not None else None
        keys, found = await asyncio.to_thread(self._lookup, tokens, request.target_model, salt, by_addr.keys(), extra)
        self.publish(cycle, keys, found, by_addr)

    def _lookup(
        self,
        tokens: Sequence[int],
        model: str,
        salt: str,
        candidates: Collection[str],
        extra: list[list[str] | None] | None = None,
    ) -> tuple[list[int], PrefixLookup]:
        """Hashing and lookup, in a worker thread."""
        keys = self.index.request_keys(tokens, model, salt, extra)
        return keys, self.index.match(keys, candidates)

    def publish(
        self, cycle: CycleState, keys: Sequence[int], found: PrefixLookup, by_addr: Mapping[str, EndpointKey]
    ) -> PreciseMatch:
        """Writes both match records for the candidates in `by_addr` (`ip:port` -> key)."""
        weighted = {by_addr[a]: s for a, s in found.weighted.items() if a in by_addr}
        match = PreciseMatch(tuple(keys), weighted, self.index.block_size)
        cycle.write(PRECISE_MATCH_KEY, match)
        counts = {by_addr[a]: n for a, n in found.blocks.items() if a in by_addr}
        prefix = PrefixMatch(match.keys, counts, match.block_size_tokens)
        cycle.write(PREFIX_MATCH_KEY, prefix)
        cycle.write(self.own_match_key, prefix)
        return match

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        if not self.speculative:
            return
        match = cycle.read(PRECISE_MATCH_KEY)
        primary = result.primary
        if match is None or not match.keys or primary is None or not primary.target_endpoints:
            return
        targets = [primary.target_endpoints[0].hostport]
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.target_endpoints:
            other = prefill.target_endpoints[0].hostport
            if other not in targets:
                targets.append(other)
        self.index.add_speculative(match.keys, targets, self.ttl)


def factory(name: str, params: Params, handle: Handle) -> PrecisePrefixCacheProducer:
    return PrecisePrefixCacheProducer(name, params, handle)
