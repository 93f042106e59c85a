"""The KV-block index: which endpoints hold which blocks, fed by KV events and read by the scheduler.

Two kinds of keys (llm-d-kv-cache's dual-key design):

- request keys, computed by the EPP from token ids (`request_keys.RequestKeyHasher`); the index maps each to
  the endpoints holding it and on which medium ("gpu", "cpu", ...);
- engine keys, the hashes the engine publishes. Per endpoint, each engine key maps to the request keys its
  tokens produced, so a BlockRemoved (which carries engine keys only) finds what to remove and a later
  BlockStored finds its parent's request key to chain from.

Lookups therefore only hash the prompt's tokens; the engine's hash algorithm and PYTHONHASHSEED never need
to be reproduced. Memory is bounded: at most `size` request keys (least recently added first out), at most
`pod_cache_size` holder entries per key, and per endpoint at most `size` engine keys.

Speculative entries (medium `SPECULATIVE`) are added for a request's keys on the endpoint it was routed to
and expire after a TTL unless the engine's own events keep the key alive under a real medium.

Every public method takes the index lock: events are applied from the subscriber thread, lookups run on
the event loop or in a worker thread."""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence

from llm_epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch
from llm_epp.kvcache.request_keys import RequestKeyHasher

DEFAULT_SIZE = 100_000_000  # llm-d's inMemoryConfig.size default (keys)
DEFAULT_POD_CACHE_SIZE = 10  # llm-d's inMemoryConfig.podCacheSize default (holders per key)
DEFAULT_MEDIUM = "gpu"  # what an event without a medium means
SPECULATIVE = "speculative"
DEFAULT_MEDIUM_WEIGHTS: Mapping[str, float] = {"gpu": 1.0, "cpu": 0.8}
_INDEXABLE_KINDS = frozenset({"full_attention", "mla_attention", "sink_full_attention"})

Holder = tuple[str, str]  # (endpoint id "ip:port", medium)


class IngestStats:
    """Counts of events applied and skipped (per reason), and of block keys the events added (admissions)
    and took away (evictions: BlockRemoved, AllBlocksCleared, restarts). Bounded: reasons are fixed strings."""

    __slots__ = ("admissions", "applied", "evictions", "skipped")

    def __init__(self) -> None:
        self.applied = 0
        self.admissions = 0
        self.evictions = 0
        self.skipped: dict[str, int] = {}

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


class KVBlockIndex:
    def __init__(
        self,
        hasher: RequestKeyHasher,
        *,
        size: int = DEFAULT_SIZE,
        pod_cache_size: int = DEFAULT_POD_CACHE_SIZE,
        medium_weights: Mapping[str, float] = DEFAULT_MEDIUM_WEIGHTS,
    ) -> None:
        if size <= 0 or pod_cache_size <= 0:
            raise ValueError("index size and podCacheSize must be > 0")
        self.hasher = hasher
        self.size = size
        self.pod_cache_size = pod_cache_size
        self.medium_weights = dict(medium_weights)
        self.stats = IngestStats()
        self._lock = threading.Lock()
        self._data: OrderedDict[int, dict[Holder, None]] = OrderedDict()
        self._pod_keys: dict[str, dict[int, None]] = {}
        self._engine: dict[str, OrderedDict[int, tuple[int, ...]]] = {}
        self._speculative: deque[tuple[float, tuple[int, ...], tuple[str, ...]]] = deque()

    @property
    def block_size(self) -> int:
        return self.hasher.block_size

    # --- reading ---------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._data)

    def pods(self) -> list[str]:
        with self._lock:
            return list(self._pod_keys)

    def holders(self, key: int) -> dict[str, set[str]]:
        """Endpoint -> media holding one request key."""
        with self._lock:
            out: dict[str, set[str]] = {}
            for pod, medium in self._data.get(key, ()):
                out.setdefault(pod, set()).add(medium)
            return out

    def request_keys_of(self, pod: str, engine_key: int) -> tuple[int, ...]:
        with self._lock:
            engine = self._engine.get(pod)
            return engine.get(engine_key, ()) if engine is not None else ()

    def lookup(self, keys: Sequence[int], candidates: Collection[str] | None = None) -> list[dict[str, set[str]]]:
        """For the leading keys, the candidate endpoints holding each and on which media; stops at the first
        key no candidate holds."""
        out: list[dict[str, set[str]]] = []
        with self._lock:
            data = self._data
            for key in keys:
                entries = data.get(key)
                found: dict[str, set[str]] = {}
                for pod, medium in entries or ():
                    if candidates is None or pod in candidates:
                        found.setdefault(pod, set()).add(medium)
                if not found:
                    break
                out.append(found)
        return out

    def score(self, keys: Sequence[int], candidates: Collection[str] | None = None) -> dict[str, float]:
        """LongestPrefix: per endpoint, the sum over leading keys of the weight of its best medium for the
        key, while it holds every key so far (gpu 1.0, cpu 0.8 by default; unknown media and speculative
        entries 1.0)."""
        return longest_prefix(self.lookup(keys, candidates), self.medium_weights)

    # --- writing ---------------------------------------------------------------------------------------
    def _add(self, key: int, holder: Holder) -> None:
        data = self._data
        entries = data.get(key)
        if entries is None:
            entries = data[key] = {}
        else:
            data.move_to_end(key)
        if holder in entries:
            del entries[holder]
        entries[holder] = None
        while len(entries) > self.pod_cache_size:
            old = next(iter(entries))
            del entries[old]
            self._forget_pod_key(old[0], key, entries)
        self._pod_keys.setdefault(holder[0], {})[key] = None
        while len(data) > self.size:
            old_key, old_entries = data.popitem(last=False)
            for pod, _ in old_entries:
                keys = self._pod_keys.get(pod)
                if keys is not None:
                    keys.pop(old_key, None)

    def _forget_pod_key(self, pod: str, key: int, entries: Mapping[Holder, None]) -> None:
        if any(p == pod for p, _ in entries):
            return
        keys = self._pod_keys.get(pod)
        if keys is not None:
            keys.pop(key, None)

    def _remove(self, key: int, holder: Holder) -> None:
        entries = self._data.get(key)
        if entries is None or holder not in entries:
            return
        del entries[holder]
        if not entries:
            del self._data[key]
        self._forget_pod_key(holder[0], key, entries)

    def add(self, keys: Iterable[int], pod: str, medium: str = DEFAULT_MEDIUM) -> None:
        with self._lock:
            for key in keys:
                self._add(key, (pod, medium))

    def clear_pod(self, pod: str) -> int:
        """Forgets everything an endpoint holds (AllBlocksCleared, restart, or the endpoint left the pool).
        Returns how many keys it held."""
        with self._lock:
            return self._clear_pod(pod)

    def _clear_pod(self, pod: str) -> int:
        keys = self._pod_keys.pop(pod, {})
        self.stats.evictions += len(keys)
        self._engine.pop(pod, None)
        data = self._data
        for key in keys:
            entries = data.get(key)
            if entries is None:
                continue
            for holder in [h for h in entries if h[0] == pod]:
                del entries[holder]
            if not entries:
                del data[key]
        return len(keys)

    def retain_pods(self, live: Collection[str]) -> list[str]:
        """Drops every endpoint not in `live`; returns the dropped ones."""
        with self._lock:
            gone = [p for p in self._pod_keys if p not in live]
            gone += [p for p in self._engine if p not in live and p not in gone]
            for pod in gone:
                self._clear_pod(pod)
            return gone

    # --- speculative entries ---------------------------------------------------------------------------
    def add_speculative(self, keys: Sequence[int], pods: Sequence[str], expires_at: float) -> None:
        if not keys or not pods:
            return
        with self._lock:
            for pod in pods:
                for key in keys:
                    self._add(key, (pod, SPECULATIVE))
            self._speculative.append((expires_at, tuple(keys), tuple(pods)))

    def expire_speculative(self, now: float) -> int:
        """Removes speculative entries whose TTL has passed; returns how many batches expired."""
        n = 0
        queue = self._speculative
        if not queue or queue[0][0] > now:
            return 0
        with self._lock:
            while queue and queue[0][0] <= now:
                _, keys, pods = queue.popleft()
                for pod in pods:
                    for key in keys:
                        self._remove(key, (pod, SPECULATIVE))
                n += 1
        return n

    # --- KV events -------------------------------------------------------------------------------------
    def apply(self, pod: str, model: str, batch: EventBatch) -> None:
        """Applies one engine batch for endpoint `pod` serving `model`, in order. Block keys are hashed
        outside the lock, so lookups never wait for hashing. Call it from one thread per index (the
        subscriber thread): a BlockStored reads its parent, hashes, then writes."""
        for event in batch.events:
            if isinstance(event, BlockStored):
                self._stored(pod, model, event)
            elif isinstance(event, BlockRemoved):
                with self._lock:
                    self._removed(pod, event)
            elif isinstance(event, AllBlocksCleared):
                with self._lock:
                    self._clear_pod(pod)
                    self.stats.applied += 1

    def _stored(self, pod: str, model: str, ev: BlockStored) -> None:
        stats = self.stats
        if ev.group_idx is not None and ev.kv_cache_spec_kind is not None:
            if ev.kv_cache_spec_kind not in _INDEXABLE_KINDS:
                stats.skip("unsupported_cache_kind")
                return
        medium = ev.medium or DEFAULT_MEDIUM
        if not ev.token_ids:
            # an existing block moved to another medium (e.g. offloaded to CPU): re-tag what we know
            with self._lock:
                known_map: Mapping[int, tuple[int, ...]] = self._engine.get(pod, {})
                known = [known_map[h] for h in ev.block_hashes if h in known_map]
                if not known:
                    stats.skip("unknown_block")
                    return
                for rks in known:
                    for rk in rks:
                        self._add(rk, (pod, medium))
                stats.applied += 1
            return
        parent: int | None = None
        if ev.parent_block_hash is not None:
            with self._lock:
                parents = self._engine.get(pod)
                parent_keys = parents.get(ev.parent_block_hash) if parents is not None else None
            if not parent_keys:
                stats.skip("unknown_parent")
                return
            parent = parent_keys[-1]
        name = ev.lora_name or model
        extra = _extra_strings(ev, self.hasher.block_size, name)
        keys = self.hasher.keys(ev.token_ids, name, parent=parent, extra=extra, cache_salt=ev.cache_salt or "")
        if not keys:
            stats.skip("no_full_block")
            return
        mapping = _map_engine_keys(ev.block_hashes, keys) if ev.block_hashes else {}
        with self._lock:
            for key in keys:
                self._add(key, (pod, medium))
            stats.admissions += len(keys)
            engine = self._engine.setdefault(pod, OrderedDict())
            for engine_key, rks in mapping.items():
                engine[engine_key] = rks
                engine.move_to_end(engine_key)
            while len(engine) > self.size:
                engine.popitem(last=False)
            stats.applied += 1

    def _removed(self, pod: str, ev: BlockRemoved) -> None:
        medium = ev.medium or DEFAULT_MEDIUM
        engine = self._engine.get(pod)
        if engine is None:
            self.stats.skip("unknown_block")
            return
        for h in ev.block_hashes:
            rks = engine.get(h)
            if rks is None:
                continue
            for rk in rks:
                self._remove(rk, (pod, medium))
            self.stats.evictions += len(rks)
            still = any(
                holder[0] == pod and holder[1] != SPECULATIVE for rk in rks for holder in self._data.get(rk, ())
            )
            if not still:
                del engine[h]
        self.stats.applied += 1


def _map_engine_keys(engine_keys: Sequence[int], request_keys: Sequence[int]) -> dict[int, tuple[int, ...]]:
    """Engine key -> request keys covering the same tokens (1:1 when the block sizes agree)."""
    n, m = len(engine_keys), len(request_keys)
    if n == m:
        return {e: (r,) for e, r in zip(engine_keys, request_keys, strict=True)}
    out: dict[int, list[int]] = {}
    for j, rk in enumerate(request_keys):
        out.setdefault(engine_keys[min(n - 1, j * n // m)], []).append(rk)
    return {e: tuple(v) for e, v in out.items()}


def _extra_strings(ev: BlockStored, block_size: int, lora: str) -> list[list[str] | None] | None:
    """Per EPP block, the extra strings of the engine block its tokens start in (multimodal identifiers and
    cache_salt; the LoRA name, already in the chain's root, and integer LoRA ids are left out)."""
    if not ev.extra_keys:
        return None
    per_engine: list[list[str] | None] = []
    for item in ev.extra_keys:
        if item is None:
            per_engine.append(None)
            continue
        strings: list[str] = []
        for part in item:
            if isinstance(part, str):
                if part != lora:
                    strings.append(part)
            elif isinstance(part, list) and part and isinstance(part[0], str):
                strings.append(part[0])
        per_engine.append(strings or None)
    engine_block = ev.block_size if ev.block_size > 0 else block_size
    n = len(ev.token_ids) // block_size
    out: list[list[str] | None] = []
    for i in range(n):
        j = (i * block_size) // engine_block
        out.append(per_engine[j] if j < len(per_engine) else None)
    return out if any(out) else None


def longest_prefix(found: Sequence[Mapping[str, Collection[str]]], weights: Mapping[str, float]) -> dict[str, float]:
    """Weighted consecutive-hit count per endpoint over `found` (holders per leading key)."""
    if not found:
        return {}

    def best(media: Collection[str]) -> float:
        return max(weights.get(m, 1.0) for m in media)

    scores = {pod: best(media) for pod, media in found[0].items()}
    active = set(scores)
    for holders in found[1:]:
        if not active:
            break
        for pod in list(active):
            media = holders.get(pod)
            if media is None:
                active.discard(pod)
            else:
                scores[pod] += best(media)
    return scores
