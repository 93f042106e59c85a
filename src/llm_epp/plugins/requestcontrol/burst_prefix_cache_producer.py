"""burst-prefix-cache-producer

Scheduling intent:
    Keep a burst of requests that share a prompt (the `n` samples of one prompt in an RL rollout step, say)
    together, so the shared prefix is prefilled once instead of on every replica. When such a burst
    arrives every cache is cold, a cache-state producer finds no hits and load balancing would scatter
    it. This producer gathers the requests that arrive within a window and places them jointly; it
    writes a `PrefixMatch` (a full match on the replica it chose, nothing elsewhere) for a
    `prefix-cache-scorer` whose `prefixMatchInfoProducerName` names this producer.

    PrepareData: the request's token ids (the `TokenizedPrompt`: the first prompt of a multi-prompt
    completions request, where the reference hashes every prompt) are cut into blocks of `blockSizeTokens`
    (a trailing partial block included) and hashed in a chain: seed = xxh64(target model + cache_salt),
    block i = xxh64(le64(xxh64(block tokens as le32)) + le64(hash i-1)), at most 2048 blocks (or
    maxPrefixTokensToMatch / blockSizeTokens). The request joins the open window (the first request opens
    it) and waits until it closes `windowDurationMs` later; a window already holding `maxBatchSize`
    requests refuses more (that request gets no match). The director waits up to the window plus 300 ms
    for this producer.

    When the window closes: requests with identical block hashes form a group; a group of two or more is a
    placement unit, and a single request is one only when `minColocateBlocks` > 0 and its first
    `minColocateBlocks` blocks equal those of another request in the window. Units are placed longest
    prefix first, groups before single requests, over the candidates of the window's first request: a
    unit's first replica is the one already holding the longest run of its leading blocks from units
    placed in this window (at least `minColocateBlocks`, only when `minColocateBlocks` > 0), among
    replicas below their fair share of the window (ceil(total / replicas)) and below `maxPerReplica` for
    this unit; otherwise the least loaded replica with room (load in the window, then running requests,
    then namespace/name). A unit larger than `maxPerReplica` spills its remaining requests the same way.
    The load counted is requests (`balanceBy: requests`) or prefix blocks (`tokens`: a unit's blocks minus
    the leading blocks the replica already holds, charged once per replica). Requests that share no prefix
    with another, and prompts without tokens, get a match on no replica.

    Each request then writes its `PrefixMatch`: total = its block count, matched = total on its assigned
    replica when that replica is still a candidate, none elsewhere.

Inputs consumed:
    The CycleState's `TokenizedPrompt` (token ids, cache_salt), written by `token-producer` (created by
    the loader when none is configured); InferenceRequest.target_model; the candidates' running requests.

Configuration:
    windowDurationMs (int, default 100, 1..10000): the window; every request waits up to this long.
    maxPerReplica (int, default -1 = unlimited): at most this many requests of one unit per replica.
    blockSizeTokens (int, default 64, > 0): block size for the prefix hashes.
    maxPrefixTokensToMatch (int, default 0): when > 0 (and >= blockSizeTokens), at most this many tokens
        are hashed.
    minColocateBlocks (int, default 0): shared leading blocks that make single requests a unit and steer a
        unit to a replica already holding its prefix; 0 places identical groups only, load-balanced.
    maxBatchSize (int, default 1000; -1 = unlimited): requests one window may hold.
    balanceBy (`requests` (default) or `tokens`): what is balanced across replicas within a window.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Sequence
from typing import Literal

import xxhash
from pydantic import Field, field_validator, model_validator

from llm_epp.framework import CycleState, Endpoint, EndpointKey, Handle, InferenceRequest, PluginParams, TypedName
from llm_epp.framework.tokenization import TOKENIZED_PROMPT_KEY
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import PrefixMatch, prefix_match_key

log = logging.getLogger(__name__)

TYPE = "burst-prefix-cache-producer"
UNLIMITED = -1
DEFAULT_MAX_PREFIX_BLOCKS = 2048
MAX_WINDOW_MS = 10_000
TIMEOUT_MARGIN_S = 0.3
_LE64 = struct.Struct("<Q")


class Params(PluginParams):
    window_duration_ms: int = Field(default=100, ge=1, le=MAX_WINDOW_MS, alias="windowDurationMs")
    max_per_replica: int = Field(default=UNLIMITED, alias="maxPerReplica")
    block_size_tokens: int = Field(default=64, gt=0, alias="blockSizeTokens")
    max_prefix_tokens_to_match: int = Field(default=0, ge=0, alias="maxPrefixTokensToMatch")
    min_colocate_blocks: int = Field(default=0, ge=0, alias="minColocateBlocks")
    max_batch_size: int = Field(default=1000, alias="maxBatchSize")
    balance_by: Literal["requests", "tokens", ""] = Field(default="requests", alias="balanceBy")

    @field_validator("max_per_replica", "max_batch_size")
    @classmethod
    def _unlimited_or_positive(cls, value: int) -> int:
        if value != UNLIMITED and value < 1:
            raise ValueError(f"must be -1 (unlimited) or >= 1, got {value}")
        return value

    @model_validator(mode="after")
    def _prefix_tokens(self) -> Params:
        if 0 < self.max_prefix_tokens_to_match < self.block_size_tokens:
            raise ValueError(
                f"maxPrefixTokensToMatch ({self.max_prefix_tokens_to_match}) must be 0 or >= blockSizeTokens "
                f"({self.block_size_tokens}); a smaller positive value yields zero prefix blocks"
            )
        return self

    @property
    def max_blocks(self) -> int:
        if self.max_prefix_tokens_to_match > 0:
            return self.max_prefix_tokens_to_match // self.block_size_tokens
        return DEFAULT_MAX_PREFIX_BLOCKS


def block_hashes(tokens: Sequence[int], model: str, cache_salt: str, block_size: int, max_blocks: int) -> list[int]:
    """The chained prefix hashes of `tokens` (see the module docstring)."""
    prev = xxhash.xxh64_intdigest(model.encode() + cache_salt.encode())
    out: list[int] = []
    for start in range(0, len(tokens), block_size):
        if len(out) >= max_blocks:
            break
        chunk = tokens[start : start + block_size]
        block_id = xxhash.xxh64_intdigest(struct.pack(f"<{len(chunk)}I", *chunk))
        prev = xxhash.xxh64_intdigest(_LE64.pack(block_id) + _LE64.pack(prev))
        out.append(prev)
    return out


class _Entry:
    __slots__ = ("assigned", "endpoints", "hashes")

    def __init__(self, hashes: list[int], endpoints: Sequence[Endpoint]) -> None:
        self.hashes = hashes
        self.endpoints = endpoints
        self.assigned: Endpoint | None = None


class _Batch:
    __slots__ = ("closed", "entries", "sealed")

    def __init__(self) -> None:
        self.entries: list[_Entry] = []
        self.sealed = asyncio.Event()
        self.closed = False


# --- the joint assignment (pure) -----------------------------------------------------------------------


def _name(e: Endpoint) -> str:
    return str(e.key)


def _less(a: Endpoint, b: Endpoint, load: dict[EndpointKey, int]) -> bool:
    """a before b: lower load in the window, then fewer running requests, then lower namespace/name."""
    la, lb = load.get(a.key, 0), load.get(b.key, 0)
    if la != lb:
        return la < lb
    ra, rb = a.metrics.running_requests, b.metrics.running_requests
    if ra != rb:
        return ra < rb
    return _name(a) < _name(b)


def _least_loaded(
    replicas: Sequence[Endpoint], per_replica: dict[EndpointKey, int], k: int, load: dict[EndpointKey, int]
) -> Endpoint:
    best: Endpoint | None = None
    for r in replicas:
        if k != UNLIMITED and per_replica.get(r.key, 0) >= k:
            continue
        if best is None or _less(r, best, load):
            best = r
    if best is not None:
        return best
    for r in replicas:  # every replica at the cap: the least loaded of all
        if best is None or _less(r, best, load):
            best = r
    assert best is not None
    return best


def _pick(
    replicas: Sequence[Endpoint],
    per_replica: dict[EndpointKey, int],
    k: int,
    load: dict[EndpointKey, int],
    matches: dict[EndpointKey, int],
    min_colocate: int,
    max_share: int,
    prefer_match: bool,
) -> Endpoint:
    if prefer_match:
        best: Endpoint | None = None
        best_match = 0
        for r in replicas:
            if k != UNLIMITED and per_replica.get(r.key, 0) >= k:
                continue
            if load.get(r.key, 0) >= max_share:
                continue  # at its fair share: co-locating here would unbalance the window
            m = matches.get(r.key, 0)
            if m < min_colocate:
                continue
            if best is None or m > best_match or (m == best_match and _less(r, best, load)):
                best, best_match = r, m
        if best is not None:
            return best
    return _least_loaded(replicas, per_replica, k, load)


def _longest_prefix(holders: dict[int, set[EndpointKey]], hashes: Sequence[int]) -> dict[EndpointKey, int]:
    """Per replica, the leading blocks of `hashes` held by units already placed in this window."""
    out: dict[EndpointKey, int] = {}
    for h in hashes:
        held = holders.get(h)
        if not held:
            break
        for key in held:
            out[key] = out.get(key, 0) + 1
    return out


def assign(entries: Sequence[_Entry], k: int, min_colocate: int, by_tokens: bool) -> None:
    """Sets `assigned` on the entries of a closed window (see the module docstring)."""
    groups: dict[tuple[int, ...], list[_Entry]] = {}
    replicas: Sequence[Endpoint] | None = None
    for e in entries:
        if not e.hashes:
            continue
        groups.setdefault(tuple(e.hashes), []).append(e)
        if replicas is None:
            replicas = e.endpoints
    if not replicas:
        return
    shared: set[tuple[int, ...]] = set()
    if min_colocate > 0:
        per_signature: dict[tuple[int, ...], int] = {}
        for key, members in groups.items():
            if len(key) >= min_colocate:
                sig = key[:min_colocate]
                per_signature[sig] = per_signature.get(sig, 0) + len(members)
        shared = {key for key in groups if len(key) >= min_colocate and per_signature[key[:min_colocate]] >= 2}
    group_units = [key for key, members in groups.items() if len(members) >= 2]
    single_units = [key for key, members in groups.items() if len(members) == 1 and key in shared]
    if not group_units and not single_units:
        return
    group_units.sort(key=len, reverse=True)  # stable: longest prefix first, then arrival order
    single_units.sort(key=len, reverse=True)
    units = group_units + single_units
    total = sum(len(key) if by_tokens else len(groups[key]) for key in units)
    max_share = -(-total // len(replicas))
    holders: dict[int, set[EndpointKey]] = {}
    load: dict[EndpointKey, int] = {}
    for key in units:
        members = groups[key]
        prefer = min_colocate > 0
        matches = _longest_prefix(holders, key) if prefer or by_tokens else {}
        per_replica: dict[EndpointKey, int] = {}
        i = 0
        while i < len(members):
            target = _pick(replicas, per_replica, k, load, matches, min_colocate, max_share, prefer)
            placed = per_replica.get(target.key, 0)
            run = len(members) - i
            if k != UNLIMITED:
                run = min(run, max(1, k - placed))  # more members than k x replicas: one more, rebalance
            for member in members[i : i + run]:
                member.assigned = target
            per_replica[target.key] = placed + run
            if not by_tokens:
                load[target.key] = load.get(target.key, 0) + run
            elif placed == 0:  # a unit's prefix is prefilled once per replica, minus what it holds
                load[target.key] = load.get(target.key, 0) + max(0, len(key) - matches.get(target.key, 0))
            i += run
            prefer = False  # only the unit's first replica gets the prefix preference
        for member in members:
            if member.assigned is not None:
                for h in key:
                    holders.setdefault(h, set()).add(member.assigned.key)


# --- the plugin ----------------------------------------------------------------------------------------


class BurstPrefixCacheProducer:
    """PrepareData; see the module docstring."""

    consumes = frozenset({TOKENIZED_PROMPT_KEY.name})

    def __init__(self, name: str, params: Params) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.params = params
        self.match_key = prefix_match_key(name)
        self.produces = frozenset({self.match_key.name})
        self.window_s = params.window_duration_ms / 1000.0
        self.prepare_data_timeout_s = self.window_s + TIMEOUT_MARGIN_S
        self._by_tokens = params.balance_by == "tokens"
        self._batch: _Batch | None = None
        self.windows = 0  # closed windows (for tests and logs)

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        params = self.params
        prompt = cycle.read(TOKENIZED_PROMPT_KEY)
        hashes = (
            block_hashes(
                prompt.token_ids, request.target_model, prompt.cache_salt, params.block_size_tokens, params.max_blocks
            )
            if prompt is not None
            else []
        )
        entry = _Entry(hashes, endpoints)
        batch = self._batch
        if batch is None:
            batch = self._batch = _Batch()
            asyncio.get_running_loop().call_later(self.window_s, self._seal, batch)
        if params.max_batch_size != UNLIMITED and len(batch.entries) >= params.max_batch_size:
            raise RuntimeError(f"burst prefix batch full: maxBatchSize {params.max_batch_size} reached")
        batch.entries.append(entry)
        await batch.sealed.wait()
        total = len(hashes)
        matches: dict[EndpointKey, int] = {}
        assigned = entry.assigned
        if assigned is not None:
            if any(e.key == assigned.key for e in endpoints):
                matches[assigned.key] = total
            else:
                log.debug("burst_prefix_assigned_absent plugin=%s assigned=%s", self._typed_name, assigned.key)
        cycle.write(self.match_key, PrefixMatch(hashes, matches, params.block_size_tokens))

    def _seal(self, batch: _Batch) -> None:
        if batch.closed:
            return
        batch.closed = True
        if self._batch is batch:
            self._batch = None
        self.windows += 1
        assign(batch.entries, self.params.max_per_replica, self.params.min_colocate_blocks, self._by_tokens)
        batch.sealed.set()


def factory(name: str, params: Params, handle: Handle) -> BurstPrefixCacheProducer:
    return BurstPrefixCacheProducer(name, params)
