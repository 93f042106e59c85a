"""approx-prefix-cache-producer

Scheduling intent:
    Estimate, without help from the model servers, how much of a request's prompt each endpoint already
    holds in its prefix (KV) cache, so that `prefix-cache-scorer`, `prefix-cache-affinity-filter` and
    `no-hit-lru-scorer` can send requests where their prefix is cached. The EPP remembers which prompt
    blocks it sent where: one LRU of block hashes per endpoint, sized like the endpoint's KV cache, plus a
    reverse index from block hash to the endpoints holding it.

    PrepareData: the prompt text (see below) is cut into blocks of `blockSizeTokens` x 4 characters (at
    most `maxPrefixBlocksToMatch` blocks; a trailing partial block is dropped, a prompt shorter than one
    block gives no blocks). Hashes are chained xxh64: seed = xxh64(target model bytes + cache_salt
    bytes), block i = xxh64(block bytes + little-endian uint64 of hash i-1), so a block hash stands for
    the whole prefix up to it. Matching walks the hashes in order and stops at the first hash no
    endpoint holds; every endpoint holding a visited hash gets +1 matched block. As in the reference, an
    endpoint that misses a block in the middle still counts the later blocks it holds (possible only
    after LRU eviction), so a count is "blocks held within the commonly held prefix", not strictly
    "leading blocks held by this endpoint". The result goes into the request's CycleState under
    `PREFIX_MATCH_KEY` when the producer has its default name (its type name), else under its own key
    `prefix-cache-match-info/<name>`, read by consumers whose `prefixMatchInfoProducerName` is that name.
    So two producers with different names (say a small LRU standing for GPU memory and a large one for a
    CPU offload tier) keep independent indexes, each fed by its own PreRequest; a consumer's score is
    matched blocks / total blocks.

    PreRequest: the request's hashes are added to the LRU of the primary profile's first target endpoint
    and, when a profile named `prefill` produced a target, of its first target too (reference P/D hook).
    The index is updated synchronously, so the next request already sees it (the reference updates it
    in a goroutine).

    Housekeeping (run from PrepareData, no background task): endpoints that left the pool are dropped
    from the index every 2 minutes; the index size (entries summed over endpoints) goes to
    `inference_extension_prefix_indexer_size` at most once per second; every scheduled request with at
    least one block records its hit ratio and hit length in characters (matched blocks x block size x 4).

    Text hashed per API (as the reference's `getUserInputBytes`): completions, the prompt (an array is
    joined with single spaces); chat completions, the JSON of `messages` as Go marshals the reference's
    Message struct (`role` omitted when empty, content a string or an array of content blocks); responses,
    the JSON of `[{"instructions": ...}?, {"tools": ...}?, {"input": ...}]`; conversations, the JSON of
    `items` (type, role, content); embeddings, the JSON of `input`; Anthropic messages, the JSON of
    `[system, messages]`; a pre-tokenized prompt (`RequestBody.token_ids`: vLLM and SGLang generate APIs),
    its token ids as little-endian uint32, so a block is exactly `blockSizeTokens` tokens. JSON is compact
    with Go's escaping of `<`, `>`, `&`, U+2028 and U+2029, and object keys inside free-form values sorted
    as Go does. Only the first `maxBlocks x blockChars` bytes are ever serialised, and a small memo (keyed
    by a 128-bit digest of those bytes) skips the per-block hashing when the same window comes again, e.g.
    a shared system prompt longer than the window.

Inputs consumed:
    InferenceRequest.target_model, body (payload, api, cache_salt); the first candidate's
    Metrics.cache_block_size (autoTune); the target's Metrics.cache_num_blocks (autoTune);
    Handle.endpoints() (housekeeping); Handle.now(); the SchedulingResult (PreRequest).

Configuration:
    autoTune (bool, default true): take the block size from the first candidate's `cache_block_size`
        and each endpoint's LRU capacity from its `cache_num_blocks` when those metrics are > 0. (The
        reference fixes an endpoint's capacity when it first indexes it; here the capacity follows the
        metric, and a smaller value evicts down to it.)
    blockSizeTokens (int, default 16): block size in tokens (x 4 characters per token).
    blockSize (int, deprecated, characters): as in the reference it is not used; it is an error only
        together with blockSizeTokens <= 0 (the reference fills defaults first, so `blockSize` alone is
        accepted and ignored; llm-epp logs a warning).
    maxPrefixBlocksToMatch (int, default 256): at most this many leading blocks are hashed.
    maxPrefixTokensToMatch (int, default 0 = unused): when > 0, max blocks = this / block size in tokens.
    lruCapacityPerServer (int, default 31250): LRU capacity (block hashes) per endpoint when autoTune
        has no `cache_num_blocks`. (The reference v1.5 falls back to the constant 31250 here and never
        reads this parameter; llm-epp honours it.)
    A `prefix-cache-scorer` configured without this producer makes the loader create one named
    `approx-prefix-cache-producer` with the scorer's parameters.
"""

from __future__ import annotations

import functools
import logging
import struct
from collections import OrderedDict, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from itertools import filterfalse, islice, repeat
from typing import Any

import orjson
import xxhash
from pydantic import Field, model_validator

from llm_epp.framework import (
    ApiKind,
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
from llm_epp.framework.types import RequestBody

log = logging.getLogger(__name__)

TYPE = "approx-prefix-cache-producer"

AVERAGE_CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_SIZE_TOKENS = 16
DEFAULT_MAX_PREFIX_BLOCKS = 256
DEFAULT_LRU_CAPACITY_PER_SERVER = 31250
PREFILL_PROFILE = "prefill"
PURGE_INTERVAL_S = 120.0  # the reference's podActiveCheckInterval
REPORT_INTERVAL_S = 1.0

_xxh64 = xxhash.xxh64_intdigest
_xxh128 = xxhash.xxh3_128_intdigest
_HASH_MEMO_SIZE = 256


def _consume(iterator: Iterable[object]) -> None:
    deque(iterator, maxlen=0)


class PrefixMatch:
    """What the producer found for one request: the chained block hashes and, per endpoint in the index,
    how many of the walked blocks it holds. Read-only for consumers."""

    __slots__ = ("block_size_tokens", "hashes", "matches", "total_blocks")

    def __init__(self, hashes: Sequence[int], matches: Mapping[EndpointKey, int], block_size_tokens: int) -> None:
        self.hashes = hashes
        self.matches = matches
        self.total_blocks = len(hashes)
        self.block_size_tokens = block_size_tokens

    def matched_blocks(self, key: EndpointKey) -> int:
        return self.matches.get(key, 0)

    def score(self, key: EndpointKey) -> float:
        """Matched blocks / total blocks; 0 when the prompt has no full block."""
        total = self.total_blocks
        return self.matches.get(key, 0) / total if total else 0.0

    def __repr__(self) -> str:
        return f"PrefixMatch(total_blocks={self.total_blocks}, matches={dict(self.matches)!r})"


PREFIX_MATCH_KEY: StateKey[PrefixMatch] = StateKey("prefix-cache-match-info")
"""Where the producer leaves a request's `PrefixMatch` in the CycleState (the reference's
`PrefixCacheMatchInfoKey` endpoint attribute)."""


PRECISE_PRODUCER = "precise-prefix-cache-producer"


def prefix_match_key(producer_name: str) -> StateKey[PrefixMatch]:
    """Where the prefix producer named `producer_name` leaves its `PrefixMatch` (a consumer's
    `prefixMatchInfoProducerName`). `""` and the approximate producer's type name, the name it gets when the
    configuration leaves it unnamed, select the shared `PREFIX_MATCH_KEY`; any other name selects that
    instance's own key, `prefix-cache-match-info/<name>`, which the loader requires some declared producer
    to publish."""
    if producer_name in ("", TYPE):
        return PREFIX_MATCH_KEY
    key = _NAMED_MATCH_KEYS.get(producer_name)
    if key is None:  # one key object per name: the CycleState matches keys by identity
        key = _NAMED_MATCH_KEYS.setdefault(producer_name, StateKey(f"{PREFIX_MATCH_KEY.name}/{producer_name}"))
    return key


_NAMED_MATCH_KEYS: dict[str, StateKey[PrefixMatch]] = {}
"""Producer name -> its key; names come from configurations only, so this stays small."""


def check_prefix_producer_name(value: str) -> str:
    """Validates a consumer's `prefixMatchInfoProducerName`: the name of a declared prefix producer instance
    (whether one by that name exists is checked by the loader's data graph), or empty for the default."""
    if value != value.strip() or "/" in value:
        raise ValueError(
            f"prefixMatchInfoProducerName {value!r} is not a plugin name: give the `name` of a declared "
            f"{TYPE} or {PRECISE_PRODUCER} plugin, or leave the parameter out for the default"
        )
    return value


class Params(PluginParams):
    auto_tune: bool = Field(default=True, alias="autoTune")
    block_size_tokens: int = Field(default=DEFAULT_BLOCK_SIZE_TOKENS, alias="blockSizeTokens")
    block_size: int = Field(default=0, alias="blockSize")
    max_prefix_blocks_to_match: int = Field(default=DEFAULT_MAX_PREFIX_BLOCKS, ge=0, alias="maxPrefixBlocksToMatch")
    max_prefix_tokens_to_match: int = Field(default=0, ge=0, alias="maxPrefixTokensToMatch")
    lru_capacity_per_server: int = Field(default=DEFAULT_LRU_CAPACITY_PER_SERVER, gt=0, alias="lruCapacityPerServer")

    @model_validator(mode="after")
    def _check(self) -> Params:
        # The reference's rule, applied after defaults: `blockSize` is an error only with blockSizeTokens <= 0.
        if self.block_size > 0 and self.block_size_tokens <= 0:
            raise ValueError(
                f"blockSize ({self.block_size}) is deprecated; use blockSizeTokens to set the cache block size "
                "in tokens (blockSize was in characters: tokens = characters / 4)"
            )
        if not self.auto_tune and self.block_size_tokens <= 0:
            raise ValueError(f"blockSizeTokens must be > 0 when autoTune is false (got {self.block_size_tokens})")
        return self


# --- prompt text and hashing ---------------------------------------------------------------------------


def _go_escape(data: bytes) -> bytes:
    """orjson output turned into Go encoding/json output (HTML-safe escaping, line/paragraph separators)."""
    if b"<" in data:
        data = data.replace(b"<", b"\\u003c")
    if b">" in data:
        data = data.replace(b">", b"\\u003e")
    if b"&" in data:
        data = data.replace(b"&", b"\\u0026")
    # a one-byte test first: memchr is far faster than a multi-byte search, and most prompts are ASCII
    if b"\xe2" in data and (b"\xe2\x80\xa8" in data or b"\xe2\x80\xa9" in data):
        data = data.replace(b"\xe2\x80\xa8", b"\\u2028").replace(b"\xe2\x80\xa9", b"\\u2029")
    return data


def _clip(value: Any, budget: int) -> tuple[Any, int]:
    """A copy of a JSON value whose serialisation starts with the same `budget` bytes as the original's
    (long strings cut, long arrays shortened), and a lower bound of the copy's serialised length.

    Escaping and UTF-8 only lengthen text, so a string cut to `budget` characters still serialises to more
    than `budget` bytes before it differs from the original; an array is cut only once the elements kept
    already fill `budget` bytes. Either way the first difference lies beyond `budget` bytes."""
    if isinstance(value, str):
        if len(value) > budget:
            value = value[:budget]
        return value, len(value) + 2
    if isinstance(value, list):
        out: list[Any] = []
        size = 0  # bytes up to the end of the last element kept: "[" or "," before each element
        for item in value:
            clipped, n = _clip(item, budget)
            out.append(clipped)
            size += n + 1
            if size >= budget:
                break
        return out, size + 1
    if isinstance(value, dict):
        size = 1
        obj: dict[str, Any] = {}
        for k, v in value.items():
            clipped, n = _clip(v, budget)
            obj[k] = clipped
            size += n + len(k) + 3
        return obj, size
    return value, 1


def _text_block(block: Any) -> dict[str, Any]:
    """A chat content block as the reference's ContentBlock marshals it (unknown fields dropped)."""
    if not isinstance(block, dict):
        block = {}

    def s(v: Any) -> str:
        return v if isinstance(v, str) else ""

    def sub(name: str, fields: tuple[str, ...]) -> dict[str, str]:
        raw = block.get(name)
        raw = raw if isinstance(raw, dict) else {}
        return {f: s(raw.get(f)) for f in fields if s(raw.get(f))}

    out: dict[str, Any] = {"type": s(block.get("type"))}
    text = s(block.get("text"))
    if text:
        out["text"] = text
    out["image_url"] = sub("image_url", ("url",))
    out["input_audio"] = sub("input_audio", ("data", "format"))
    out["video_url"] = sub("video_url", ("url",))
    return out


def _chat_messages(messages: Any, budget: int) -> list[dict[str, Any]]:
    """`messages` as the reference's []Message marshals it, clipped to what the first `budget` bytes need."""
    out: list[dict[str, Any]] = []
    if not isinstance(messages, list):
        return out
    size = 0  # a lower bound of the bytes up to the end of the last message kept
    for m in messages:
        if not isinstance(m, dict):
            m = {}
        msg: dict[str, Any] = {}
        role = m.get("role")
        if isinstance(role, str) and role:
            msg["role"] = role
        content = m.get("content")
        if isinstance(content, str):
            if len(content) > budget:
                content = content[:budget]
            msg["content"] = content
            size += len(content) + 15  # {"content":""} plus the "[" or "," before it
        elif isinstance(content, list):
            blocks, n = _clip([_text_block(b) for b in content], budget)
            msg["content"] = blocks
            size += n + 13
        else:
            msg["content"] = ""
            size += 15
        out.append(msg)
        if size >= budget:
            break
    return out


def _completion_text(prompt: Any, limit: int) -> str | None:
    if isinstance(prompt, str):
        return prompt[:limit]
    if not isinstance(prompt, list):
        return None
    parts: list[str] = []
    size = -1  # length of the parts joined with single spaces
    for p in prompt:
        text = p if isinstance(p, str) else str(p)
        parts.append(text)
        size += len(text) + 1
        if size >= limit:
            break
    return " ".join(parts)[:limit]


def _conversation_items(items: Any, limit: int) -> bytes:
    """`items` as the reference's []ConversationItem marshals it: fields in declaration order (type, role,
    content; empty strings and null content omitted), object keys inside `content` sorted."""
    out: list[bytes] = []
    if not isinstance(items, list):
        return b"null" if items is None else b"[]"
    size = 0
    for item in items:
        if not isinstance(item, dict):
            item = {}
        fields: list[bytes] = []
        n = 2
        for name in ("type", "role"):
            value = item.get(name)
            if isinstance(value, str) and value:
                value = value[:limit]
                fields.append(b'"' + name.encode() + b'":' + orjson.dumps(value))
                n += len(value) + len(name) + 5
        content = item.get("content")
        if content is not None:
            content, c = _clip(content, limit)
            fields.append(b'"content":' + orjson.dumps(content, option=orjson.OPT_SORT_KEYS))
            n += c + 10
        out.append(b"{" + b",".join(fields) + b"}")
        size += n + 1
        if size >= limit:
            break
    return b"[" + b",".join(out) + b"]"


def prompt_bytes(body: RequestBody, limit: int) -> bytes:
    """The reference's text for prefix hashing (see the module docstring), cut to at most `limit` bytes.
    Returns b"" when the body has nothing to hash."""
    if limit <= 0:
        return b""
    if body.token_ids:  # a pre-tokenized prompt: 4 bytes per token, so a block is blockSizeTokens tokens
        ids = body.token_ids[: limit // 4]
        return struct.pack(f"<{len(ids)}I", *ids)
    payload = body.payload
    api = body.api
    try:
        if api is ApiKind.COMPLETIONS:
            text = _completion_text(payload.get("prompt"), limit)
            return b"" if text is None else text.encode("utf-8", "surrogatepass")[:limit]
        if api is ApiKind.CHAT_COMPLETIONS:
            data = orjson.dumps(_chat_messages(payload.get("messages"), limit))
        elif api is ApiKind.RESPONSES:
            combined = [{name: payload[name]} for name in ("instructions", "tools") if payload.get(name) is not None]
            combined.append({"input": payload.get("input")})
            data = orjson.dumps(_clip(combined, limit)[0], option=orjson.OPT_SORT_KEYS)
        elif api is ApiKind.CONVERSATIONS:
            data = _conversation_items(payload.get("items"), limit)
        elif api is ApiKind.EMBEDDINGS:
            data = orjson.dumps(_clip(payload.get("input"), limit)[0], option=orjson.OPT_SORT_KEYS)
        elif api is ApiKind.MESSAGES:
            conversation = [payload.get("system"), payload.get("messages")]
            data = orjson.dumps(_clip(conversation, limit)[0], option=orjson.OPT_SORT_KEYS)
        else:
            return b""
    except (TypeError, ValueError):  # orjson.JSONEncodeError is a TypeError; odd values hash nothing
        return b""
    return _go_escape(data)[:limit]


def seed_hash(target_model: str, cache_salt: str = "") -> int:
    """xxh64 of the target model name followed by the cache salt (when set)."""
    return _xxh64(target_model.encode("utf-8", "surrogatepass") + cache_salt.encode("utf-8", "surrogatepass"))


def block_hashes(data: bytes, seed: int, block_chars: int, max_blocks: int) -> list[int]:
    """Chained xxh64 hashes of the full `block_chars`-byte blocks of `data`, at most `max_blocks` of them:
    h_i = xxh64(block_i + little-endian uint64 h_{i-1}), h_{-1} = `seed`."""
    if block_chars <= 0:
        return []
    n = min(len(data) // block_chars, max_blocks)
    if n <= 0:
        return []
    out: list[int] = []
    append = out.append
    prev = seed
    xxh = _xxh64
    pack = _U64.pack
    for block in _splitter(block_chars, n).unpack_from(data):  # every block in one C call
        prev = xxh(block + pack(prev))
        append(prev)
    return out


_U64 = struct.Struct("<Q")


@functools.lru_cache(maxsize=512)
def _splitter(block_chars: int, count: int) -> struct.Struct:
    return struct.Struct(f"{block_chars}s" * count)


def hash_prompt(request: InferenceRequest, block_size_tokens: int, max_blocks: int) -> list[int]:
    """The request's chained block hashes (empty when the prompt is shorter than one block)."""
    block_chars = block_size_tokens * AVERAGE_CHARS_PER_TOKEN
    if block_chars <= 0 or max_blocks <= 0:
        return []
    data = prompt_bytes(request.body, block_chars * max_blocks)
    if len(data) < block_chars:
        return []
    return block_hashes(data, seed_hash(request.target_model, request.body.cache_salt), block_chars, max_blocks)


class BlockHasher:
    """`hash_prompt` with a small LRU memo keyed by a 128-bit digest of the bytes hashed. Requests whose
    hashed window is identical (a shared system prompt longer than the window, later turns of a long
    conversation) skip the per-block loop, which is most of the producer's cost."""

    __slots__ = ("_memo", "_size")

    def __init__(self, size: int = _HASH_MEMO_SIZE) -> None:
        self._memo: OrderedDict[tuple[int, int, int, int], tuple[int, ...]] = OrderedDict()
        self._size = size

    def __len__(self) -> int:
        return len(self._memo)

    def __call__(self, request: InferenceRequest, block_size_tokens: int, max_blocks: int) -> tuple[int, ...]:
        block_chars = block_size_tokens * AVERAGE_CHARS_PER_TOKEN
        if block_chars <= 0 or max_blocks <= 0:
            return ()
        data = prompt_bytes(request.body, block_chars * max_blocks)
        n = min(len(data) // block_chars, max_blocks)
        if n <= 0:
            return ()
        seed = seed_hash(request.target_model, request.body.cache_salt)
        memo = self._memo
        key = (_xxh128(memoryview(data)[: n * block_chars]), seed, block_chars, n)
        hashes = memo.get(key)
        if hashes is not None:
            memo.move_to_end(key)
            return hashes
        hashes = tuple(block_hashes(data, seed, block_chars, n))
        memo[key] = hashes
        if len(memo) > self._size:
            memo.popitem(last=False)
        return hashes


# --- the index -----------------------------------------------------------------------------------------


class PrefixIndex:
    """Block hash -> endpoints holding it, plus one LRU of hashes per endpoint. Eviction from an LRU removes
    the endpoint from the reverse index, so the two always agree.

    Holders are tuples; a block held by one endpoint (the usual case) points at that endpoint's one shared
    1-tuple, which saves an object per entry and lets inserts and evictions run as C-level batch operations
    (identity tells a sole holder apart)."""

    __slots__ = ("_capacity", "_entries", "_holders", "_lrus", "_sole")

    def __init__(self) -> None:
        self._holders: dict[int, tuple[EndpointKey, ...]] = {}
        self._lrus: dict[EndpointKey, OrderedDict[int, None]] = {}
        self._capacity: dict[EndpointKey, int] = {}
        self._sole: dict[EndpointKey, tuple[EndpointKey]] = {}
        self._entries = 0

    def __len__(self) -> int:
        """Entries summed over the endpoints' LRUs (what the reference reports as the indexer size)."""
        return self._entries

    def holders(self, block_hash: int) -> tuple[EndpointKey, ...]:
        return self._holders.get(block_hash, ())

    def endpoints(self) -> list[EndpointKey]:
        return list(self._lrus)

    def endpoint_entries(self, key: EndpointKey) -> int:
        lru = self._lrus.get(key)
        return len(lru) if lru is not None else 0

    def hashes_of(self, key: EndpointKey) -> list[int]:
        """The hashes an endpoint holds, least recently used first."""
        return list(self._lrus.get(key, ()))

    def capacity(self, key: EndpointKey) -> int:
        return self._capacity.get(key, 0)

    def distinct_hashes(self) -> int:
        return len(self._holders)

    def match(self, hashes: Sequence[int]) -> dict[EndpointKey, int]:
        """Per endpoint, the number of held blocks among the leading blocks that some endpoint holds."""
        # Consecutive blocks mostly share one holders tuple (an endpoint's shared 1-tuple), so count runs of
        # the same tuple object and add each run once per holder: a dict update per run, not per block.
        counts: dict[EndpointKey, int] = {}
        run: tuple[EndpointKey, ...] = ()
        n = 0
        for holders in map(self._holders.get, hashes):
            if holders is run:
                n += 1
                continue
            for key in run:
                counts[key] = counts.get(key, 0) + n
            if holders is None:  # the walk stops at the first block nobody holds
                return counts
            run, n = holders, 1
        for key in run:
            counts[key] = counts.get(key, 0) + n
        return counts

    def add(self, hashes: Sequence[int], key: EndpointKey, capacity: int) -> None:
        """Marks `hashes` as most recently used on `key`, evicting its oldest entries beyond `capacity`."""
        lru = self._lrus.get(key)
        if lru is None:
            lru = self._lrus[key] = OrderedDict()
            self._sole[key] = (key,)
        self._capacity[key] = capacity
        # Whatever was or was not present, the hashes end up as the newest entries in request order: insert
        # the new ones, then move every one to the end. Only the new ones touch the reverse index.
        new = list(dict.fromkeys(filterfalse(lru.__contains__, hashes)))
        if new:
            holders = self._holders
            sole = self._sole[key]
            # One lookup per new block: a block nobody held gets `key`'s shared 1-tuple; `key` holds none of
            # them, so a block that comes back with anything else was held by others and gains `key`.
            before = list(map(holders.setdefault, new, repeat(sole)))
            if before.count(sole) != len(before):
                for h, t in zip(new, before, strict=True):
                    if t is not sole:
                        holders[h] = (*t, key)
            lru.update(dict.fromkeys(new))
            self._entries += len(new)
        _consume(map(lru.move_to_end, hashes))
        excess = len(lru) - capacity
        if excess > 0:
            oldest = list(islice(lru, excess))
            _consume(map(lru.pop, oldest))
            self._drop(oldest, key)
            self._entries -= excess

    def _drop(self, hashes: list[int], key: EndpointKey) -> None:
        """Removes `key` from the holders of `hashes` (all of which it holds)."""
        holders = self._holders
        sole = self._sole[key]
        held = list(map(holders.pop, hashes))  # one lookup each; blocks others hold too are put back below
        if held.count(sole) == len(held):  # tuple equality: identity first, so the usual case stays in C
            return
        for h, t in zip(hashes, held, strict=True):
            if len(t) == 1:  # `key` alone held it: it stays removed
                continue
            i = t.index(key)
            rest = t[:i] + t[i + 1 :]
            holders[h] = self._sole.get(rest[0], rest) if len(rest) == 1 else rest

    def remove_endpoint(self, key: EndpointKey) -> int:
        """Forgets an endpoint; returns how many entries it had."""
        lru = self._lrus.pop(key, None)
        self._capacity.pop(key, None)
        if lru is None:
            return 0
        self._drop(list(lru), key)
        del self._sole[key]
        self._entries -= len(lru)
        return len(lru)


# --- the plugin ----------------------------------------------------------------------------------------


class ApproxPrefixCacheProducer:
    """PrepareData + PreRequest; see the module docstring."""

    consumes: frozenset[str] = frozenset()

    def __init__(self, name: str, params: Params, handle: Handle) -> None:
        self._typed_name = TypedName(TYPE, name)
        self.match_key = prefix_match_key(name)
        self.produces = frozenset({self.match_key.name})
        self.params = params
        self._handle = handle
        self.index = PrefixIndex()
        self._hasher = BlockHasher()
        now = handle.now()
        self._next_purge = now + PURGE_INTERVAL_S
        self._next_report = now
        if params.block_size > 0:
            log.warning(
                "prefix_block_size_deprecated plugin=%s blockSize=%d: ignored; blockSizeTokens=%d is used",
                name,
                params.block_size,
                params.block_size_tokens,
            )

    @property
    def typed_name(self) -> TypedName:
        return self._typed_name

    # --- configuration resolved per request ---------------------------------------------------------------
    def block_size_tokens(self, endpoints: Sequence[Endpoint]) -> int:
        """The first candidate's cache block size under autoTune, else `blockSizeTokens`."""
        if self.params.auto_tune and endpoints:
            size = endpoints[0].metrics.cache_block_size
            if size > 0:
                return size
        return self.params.block_size_tokens

    def max_blocks(self, block_size_tokens: int) -> int:
        tokens = self.params.max_prefix_tokens_to_match
        if tokens > 0 and block_size_tokens > 0:
            return tokens // block_size_tokens
        return self.params.max_prefix_blocks_to_match

    def capacity_for(self, endpoint: Endpoint) -> int:
        """LRU capacity for an endpoint: its `cache_num_blocks` under autoTune, else lruCapacityPerServer."""
        if self.params.auto_tune:
            blocks = endpoint.metrics.cache_num_blocks
            if blocks > 0:
                return blocks
        return self.params.lru_capacity_per_server

    # --- extension points -------------------------------------------------------------------------------
    def compute(self, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> PrefixMatch:
        """The request's hashes and matches against the current index (no side effects on the index)."""
        block_size = self.block_size_tokens(endpoints)
        hashes = self._hasher(request, block_size, self.max_blocks(block_size))
        return PrefixMatch(hashes, self.index.match(hashes), block_size)

    async def prepare_data(self, cycle: CycleState, request: InferenceRequest, endpoints: Sequence[Endpoint]) -> None:
        self.housekeeping()
        cycle.write(self.match_key, self.compute(request, endpoints))

    def pre_request(self, cycle: CycleState, request: InferenceRequest, result: SchedulingResult) -> None:
        match = cycle.read(self.match_key)
        primary = result.primary
        if match is None or primary is None or not primary.target_endpoints:
            return
        target = primary.target_endpoints[0]
        hashes = match.hashes
        if not hashes:
            return
        index = self.index
        index.add(hashes, target.key, self.capacity_for(target))
        prefill = result.profile_results.get(PREFILL_PROFILE)
        if prefill is not None and prefill.target_endpoints:
            other = prefill.target_endpoints[0]
            if other.key != target.key:
                index.add(hashes, other.key, self.capacity_for(other))
        matched = match.matches.get(target.key, 0)
        self._handle.recorder.prefix_match(
            matched / len(hashes), matched * match.block_size_tokens * AVERAGE_CHARS_PER_TOKEN
        )

    # --- housekeeping -------------------------------------------------------------------------------------
    def housekeeping(self) -> None:
        """Purges endpoints that left the pool (every 2 minutes) and reports the index size (at most once a
        second). Cheap when nothing is due; called from `prepare_data`."""
        now = self._handle.now()
        if now >= self._next_purge:
            self._next_purge = now + PURGE_INTERVAL_S
            pool = self._handle.endpoints()
            if pool:  # an empty snapshot (pool not synced yet, or no discovery wired) purges nothing
                self.purge([e.key for e in pool])
        if now >= self._next_report:
            self._next_report = now + REPORT_INTERVAL_S
            self._handle.recorder.prefix_index_size(len(self.index))

    def purge(self, live_keys: Collection[EndpointKey]) -> list[EndpointKey]:
        """Drops every indexed endpoint not in `live_keys`; returns the dropped keys."""
        live = live_keys if isinstance(live_keys, (set, frozenset)) else set(live_keys)
        gone = [k for k in self.index.endpoints() if k not in live]
        for key in gone:
            entries = self.index.remove_endpoint(key)
            log.debug("prefix_index_endpoint_removed endpoint=%s entries=%d", key, entries)
        return gone


def factory(name: str, params: Params, handle: Handle) -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(name, params, handle)
