"""mm-embeddings-cache-producer

Scheduling intent:
    Send a request whose prompt carries images (or video, audio) to an endpoint that recently encoded the
    same items, so the model server reuses its encoder (embeddings) cache instead of running the vision
    encoder again. The EPP remembers, per endpoint, an LRU of the multimodal item hashes it routed there;
    `mm-embeddings-cache-scorer` scores endpoints by the share of the request's items they hold.

    PrepareData: the request's items are the distinct hashes of `TokenizedPrompt.mm_features` (the
    token-producer's render backend reports them; a repeated item counts once, each has size 1). A request
    without items gets nothing. Otherwise every candidate gets an `EncoderCacheMatch`: the request's items
    and those of them in the endpoint's LRU, written to the CycleState under this producer's key.

    PreRequest: the request's items are added to the LRU of every target endpoint of the primary profile.

    Housekeeping: an endpoint's LRU is dropped when an `endpoint-notification-source` this producer is
    listed under reports the endpoint deleted, and every 2 minutes (checked from PrepareData) for
    endpoints no longer in the pool.

    Metrics (as the reference's, on the EPP's `/metrics`): `llm_d_epp_encoder_cache_queries_total`
    {plugin_type, plugin_name, modality} per item looked up, `llm_d_epp_encoder_cache_hits_total`
    {plugin_type, plugin_name, pod, modality} per item an endpoint's LRU holds (every endpoint with an LRU,
    not only the candidates), and the histogram `llm_d_epp_encoder_cache_hit_ratio` {plugin_type,
    plugin_name} of matched / request items per candidate. `modality` is `image`, `video`, `audio` or
    `other`; `pod` only names endpoints with an LRU (dropped with it).

Inputs consumed:
    The CycleState's `TokenizedPrompt` (`mm_features`), written by `token-producer` (created by the loader
    when none is configured); Handle.endpoints() and Handle.now() (housekeeping); the SchedulingResult
    (PreRequest); endpoint delete events when listed under an `endpoint-notification-source`.

Configuration:
    cacheSizeInMBPerServer (int, default 4096): the model servers' encoder cache budget, in MiB, per
        endpoint. The LRU holds cacheSizeInMBPerServer / 2 entries per endpoint (a fixed 2 MiB per item,
        as the reference assumes); a value <= 0 means the default.
    A scorer configured without this producer makes the loader create one named
    `mm-embeddings-cache-producer`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import Field

from llm_epp.framework import (
    CycleState,
    Endpoint,
    EndpointKey,
    Handle,
    InferenceRequest,
    PluginParams,
    StateKey,
    TypedName,
)
from llm_epp.framework.datalayer import EVENT_DELETE, AttributeUpdates, EndpointEvent
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY
from llm_epp.framework.types import SchedulingResult

TYPE = "mm-embeddings-cache-producer"
DEFAULT_CACHE_SIZE_MB = 4096
MB_PER_ITEM = 2  # the reference's fixed assumption: one tracked item stands for 2 MiB of encoder cache
CLEANUP_INTERVAL_S = 120.0

_MATCH_KEYS: dict[str, StateKey[EncoderCacheMatch]] = {}
MODALITIES = frozenset({"image", "video", "audio"})
HIT_RATIO_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)


class EncoderCacheStats:
    """Counters behind the producer's metrics. Mutated on the event loop; read at scrape time."""

    __slots__ = ("hits", "queries", "ratio_buckets", "ratio_count", "ratio_sum")
    bounds = HIT_RATIO_BUCKETS

    def __init__(self) -> None:
        self.queries: dict[str, int] = {}  # modality -> lookups
        self.hits: dict[tuple[EndpointKey, str], int] = {}  # (endpoint, modality) -> lookups found
        self.ratio_buckets = [0] * len(HIT_RATIO_BUCKETS)  # observations <= each bound
        self.ratio_count = 0
        self.ratio_sum = 0.0

    def observe_ratio(self, ratio: float) -> None:
        self.ratio_count += 1
        self.ratio_sum += ratio
        for i, bound in enumerate(HIT_RATIO_BUCKETS):
            if ratio <= bound:
                self.ratio_buckets[i] += 1

    def forget(self, key: EndpointKey) -> None:
        for k in [k for k in self.hits if k[0] == key]:
            del self.hits[k]


@dataclass(frozen=True, slots=True)
class MatchItem:
    """One distinct multimodal item of a request."""

    hash: str
    modality: str
    size: int = 1


@dataclass(frozen=True, slots=True)
class EncoderCacheMatch:
    """A request's multimodal items and, per endpoint, the ones that endpoint probably has encoded."""

    items: tuple[MatchItem, ...]
    matched: dict[EndpointKey, tuple[MatchItem, ...]]

    def score(self, key: EndpointKey) -> float:
        """Matched size / total size (0 without items)."""
        total = sum(i.size for i in self.items)
        if total <= 0:
            return 0.0
        return sum(i.size for i in self.matched.get(key, ())) / total


def match_key(producer_name: str) -> StateKey[EncoderCacheMatch]:
    """Where the producer named `producer_name` ("" for the default, `mm-embeddings-cache-producer`) leaves
    its `EncoderCacheMatch`. One key object per name (the CycleState matches keys by identity)."""
    name = producer_name or TYPE
    key = _MATCH_KEYS.get(name)
    if key is None:
        key = _MATCH_KEYS.setdefault(name, StateKey(f"mm-embeddings-cache-match-info/{name}"))
    return key


DEFAULT_MATCH_KEY = match_key(TYPE)


def lru_capacity(cache_size_mb: int) -> int:
    """Items per endpoint for a budget of `cache_size_mb` MiB (the default when <= 0; at least 1)."""
    if cache_size_mb <= 0:
        cache_size_mb = DEFAULT_CACHE_SIZE_MB
    return max(1, cache_size_mb // MB_PER_ITEM)


class Params(PluginParams):
    cache_size_in_mb_per_server: int = Field(default=DEFAULT_CACHE_SIZE_MB, alias="cacheSizeInMBPerServer")


class MmEmbeddingsCacheProducer:
    """PrepareData + PreRequest + endpoint event extractor; see the module docstring."""

    consumes = frozenset({TOKENIZED_PROMPT_KEY.name})

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = match_key(name)
        self.produces = frozenset({self.match_key.name})
        self.capacity = lru_capacity(params.cache_size_in_mb_per_server)
        self._handle = handle
        self._items_key: StateKey[tuple[MatchItem, ...]] = StateKey(f"mm-embeddings-cache-items/{name}")
        self.caches: dict[EndpointKey, OrderedDict[str, None]] = {}
        self.encoder_cache_stats = EncoderCacheStats()
        self._next_cleanup = float("-inf")

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self._cleanup()
        prompt = cycle.read(TOKENIZED_PROMPT_KEY)
        if prompt is None or not prompt.mm_features:
            return
        by_hash: dict[str, MatchItem] = {}
        for feature in prompt.mm_features:
            if feature.hash:
                modality = feature.modality if feature.modality in MODALITIES else "other"
                by_hash[feature.hash] = MatchItem(feature.hash, modality)
        items = tuple(by_hash.values())
        if not items:
            return
        stats = self.encoder_cache_stats
        for item in items:
            stats.queries[item.modality] = stats.queries.get(item.modality, 0) + 1
            for pod, held in self.caches.items():
                if item.hash in held:
                    stats.hits[(pod, item.modality)] = stats.hits.get((pod, item.modality), 0) + 1
        matched: dict[EndpointKey, tuple[MatchItem, ...]] = {}
        for endpoint in endpoints:
            lru = self.caches.get(endpoint.key)
            found = tuple(i for i in items if i.hash in lru) if lru else ()
            stats.observe_ratio(len(found) / len(items))
            if found:
                matched[endpoint.key] = found
        cycle.write(self.match_key, EncoderCacheMatch(items, matched))
        cycle.write(self._items_key, items)

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        items = cycle.read(self._items_key)
        primary = result.primary
        if not items or primary is None:
            return
        for endpoint in primary.target_endpoints:
            cache = self.caches.get(endpoint.key)
            if cache is None:
                cache = self.caches[endpoint.key] = OrderedDict()
            for item in items:
                cache[item.hash] = None
                cache.move_to_end(item.hash)
            while len(cache) > self.capacity:
                cache.popitem(last=False)

    def extract_endpoint_event(self, event: EndpointEvent) -> AttributeUpdates:
        """Listed under an `endpoint-notification-source`: a deleted endpoint's LRU goes at once."""
        if event.type == EVENT_DELETE:
            self.caches.pop(event.endpoint.key, None)
            self.encoder_cache_stats.forget(event.endpoint.key)
        return {}

    def _cleanup(self) -> None:
        now = self._handle.now()
        if now < self._next_cleanup:
            return
        self._next_cleanup = now + CLEANUP_INTERVAL_S
        pool = {e.key for e in self._handle.endpoints()}
        if not pool:  # as the reference: an empty pod list purges nothing
            return
        for key in [k for k in self.caches if k not in pool]:
            del self.caches[key]
            self.encoder_cache_stats.forget(key)


def factory(name: str, params: Params, handle: Handle) -> MmEmbeddingsCacheProducer:
    return MmEmbeddingsCacheProducer(name, params, handle)
