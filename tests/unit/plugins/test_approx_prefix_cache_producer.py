"""Tests for approx-prefix-cache-producer: the text hashed per API, chained xxh64 block hashes, matching,
the per-endpoint LRU index with its reverse index, autoTune, housekeeping and the PreRequest update."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from typing import Any

import pytest
import xxhash
from pydantic import ValidationError

from llm_epp.framework import (
    ApiKind,
    CycleState,
    Endpoint,
    EndpointKey,
    EndpointMetadata,
    InferenceRequest,
    InFlightLoad,
    Metrics,
    ProfileResult,
    RequestBody,
    SchedulingResult,
    TypedName,
)
from llm_epp.framework.requestcontrol import PrepareData, PreRequest
from llm_epp.plugins.requestcontrol import approx_prefix_cache_producer as mod
from llm_epp.plugins.requestcontrol.approx_prefix_cache_producer import (
    PREFIX_MATCH_KEY,
    ApproxPrefixCacheProducer,
    BlockHasher,
    Params,
    PrefixIndex,
    PrefixMatch,
    block_hashes,
    hash_prompt,
    prompt_bytes,
    seed_hash,
)
from tests.unit.builders import FakeHandle, key

# --- builders ------------------------------------------------------------------------------------------


def ep(name: str, block_size: int = 0, num_blocks: int = 0, requests: int = 0) -> Endpoint:
    i = sum(map(ord, name)) % 250 + 1
    meta = EndpointMetadata(key(name), f"10.0.1.{i}", 8000)
    return Endpoint(meta, Metrics(cache_block_size=block_size, cache_num_blocks=num_blocks), InFlightLoad(requests))


def req(
    text: Any = "",
    api: ApiKind = ApiKind.COMPLETIONS,
    model: str = "m",
    salt: str = "",
    payload: dict[str, Any] | None = None,
) -> InferenceRequest:
    if payload is None:
        payload = {"model": model, "prompt": text} if api is ApiKind.COMPLETIONS else {"model": model}
    return InferenceRequest("r", model, model, RequestBody(api, payload, cache_salt=salt))


def producer(handle: FakeHandle | None = None, **params: Any) -> ApproxPrefixCacheProducer:
    return ApproxPrefixCacheProducer(mod.TYPE, Params.model_validate(params), handle or FakeHandle())


def result(primary: Endpoint, prefill: Endpoint | None = None, primary_name: str = "default") -> SchedulingResult:
    profiles: dict[str, ProfileResult | None] = {primary_name: ProfileResult((primary,))}
    if prefill is not None:
        profiles["prefill"] = ProfileResult((prefill,))
    return SchedulingResult(profiles, primary_name)


def schedule(
    p: ApproxPrefixCacheProducer, request: InferenceRequest, candidates: list[Endpoint], to: Endpoint
) -> PrefixMatch:
    """PrepareData, then PreRequest as if the scheduler chose `to`; returns the match seen before the update."""
    cycle = CycleState()
    asyncio.run(p.prepare_data(cycle, request, candidates))
    match = cycle.read(PREFIX_MATCH_KEY)
    assert match is not None
    p.pre_request(cycle, request, result(to))
    return match


def go_json(value: Any, sort: bool = False) -> bytes:
    """Go's encoding/json output, computed independently with the standard library."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, sort_keys=sort)
    for raw, esc in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(raw, esc)
    return text.encode()


def chained(data: bytes, model: str, block: int, salt: str = "") -> list[int]:
    """The reference algorithm written out plainly: seed, then xxh64(block || LE uint64(prev))."""
    prev = xxhash.xxh64((model + salt).encode()).intdigest()
    out = []
    for i in range(len(data) // block):
        prev = xxhash.xxh64(data[i * block : (i + 1) * block] + struct.pack("<Q", prev)).intdigest()
        out.append(prev)
    return out


# --- text per API --------------------------------------------------------------------------------------

BLOCKS = {"type": "text", "text": "look", "extra": 1}
IMAGE = {"type": "image_url", "image_url": {"url": "http://x/a.png", "detail": "high"}}


@pytest.mark.parametrize(
    ("api", "payload", "expected"),
    [
        (ApiKind.COMPLETIONS, {"prompt": "hello <world>"}, b"hello <world>"),
        (ApiKind.COMPLETIONS, {"prompt": ["a", "b c", "d"]}, b"a b c d"),
        (
            ApiKind.CHAT_COMPLETIONS,
            {"messages": [{"role": "system", "content": "be <brief> & kind"}, {"content": "hi", "name": "x"}]},
            b'[{"role":"system","content":"be \\u003cbrief\\u003e \\u0026 kind"},{"content":"hi"}]',
        ),
        (
            ApiKind.CHAT_COMPLETIONS,
            {"messages": [{"role": "user", "content": [BLOCKS, IMAGE]}, {"role": "assistant", "content": None}]},
            b'[{"role":"user","content":[{"type":"text","text":"look","image_url":{},"input_audio":{},"video_url":{}},'
            b'{"type":"image_url","image_url":{"url":"http://x/a.png"},"input_audio":{},"video_url":{}}]},'
            b'{"role":"assistant","content":""}]',
        ),
        (
            ApiKind.RESPONSES,
            {"input": "q", "instructions": "sys", "tools": [{"type": "f", "name": "t"}]},
            b'[{"instructions":"sys"},{"tools":[{"name":"t","type":"f"}]},{"input":"q"}]',
        ),
        (
            ApiKind.RESPONSES,
            {"input": [{"role": "user", "content": "q"}]},
            b'[{"input":[{"content":"q","role":"user"}]}]',
        ),
        (
            ApiKind.CONVERSATIONS,
            {"items": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "x"}], "id": 1}]},
            b'[{"type":"message","role":"user","content":[{"text":"x","type":"input_text"}]}]',
        ),
        (ApiKind.CONVERSATIONS, {"items": [{"role": "", "content": None}]}, b"[{}]"),
        (ApiKind.EMBEDDINGS, {"input": ["one", "two"]}, b'["one","two"]'),
        (ApiKind.EMBEDDINGS, {"input": [1, 2, 3]}, b"[1,2,3]"),
        (ApiKind.NONE, {}, b""),
        (ApiKind.COMPLETIONS, {"prompt": 7}, b""),
    ],
    ids=[
        "completions",
        "completions-array",
        "chat-html-escaped-role-omitted",
        "chat-blocks",
        "responses-all-parts",
        "responses-input-only",
        "conversations",
        "conversations-empty-fields",
        "embeddings-strings",
        "embeddings-tokens",
        "no-body",
        "completions-bad-prompt",
    ],
)
def test_prompt_text_per_api(api: ApiKind, payload: dict[str, Any], expected: bytes) -> None:
    assert prompt_bytes(RequestBody(api, payload), 1 << 20) == expected


def test_json_escapes_match_go() -> None:
    messages = [{"role": "user", "content": 'a\x00\b\f\n\x1f\x7f\u2028\u2029é"\\/ it\u2019s \u2014 \u2027'}]
    got = prompt_bytes(RequestBody(ApiKind.CHAT_COMPLETIONS, {"messages": messages}), 1 << 20)
    assert got == go_json(messages)
    assert b"\\u2028\\u2029" in got and "é".encode() in got and "it\u2019s \u2014 \u2027".encode() in got


LONG = "x" * 50 + "<&>" + "é" * 40
NESTED_INPUT = [{"b": LONG, "a": [LONG, {"z": LONG, "y": 3}]}] * 3


@pytest.mark.parametrize("limit", [1, 7, 16, 49, 50, 53, 64, 100, 131, 257, 400, 10_000])
@pytest.mark.parametrize(
    ("api", "payload", "full"),
    [
        (ApiKind.COMPLETIONS, {"prompt": LONG * 3}, (LONG * 3).encode()),
        (ApiKind.COMPLETIONS, {"prompt": [LONG, "b", LONG]}, f"{LONG} b {LONG}".encode()),
        (
            ApiKind.CHAT_COMPLETIONS,
            {"messages": [{"role": "system", "content": LONG}, {"role": "user", "content": LONG * 2}] * 2},
            go_json([{"role": "system", "content": LONG}, {"role": "user", "content": LONG * 2}] * 2),
        ),
        (ApiKind.EMBEDDINGS, {"input": NESTED_INPUT}, go_json(NESTED_INPUT, sort=True)),
        (ApiKind.EMBEDDINGS, {"input": list(range(500))}, go_json(list(range(500)))),
        (
            ApiKind.RESPONSES,
            {"input": NESTED_INPUT, "instructions": LONG},
            go_json([{"instructions": LONG}, {"input": NESTED_INPUT}], sort=True),
        ),
    ],
    ids=["completions", "completions-array", "chat", "embeddings-nested", "embeddings-tokens", "responses"],
)
def test_text_cut_to_the_limit_is_a_prefix_of_the_full_text(
    api: ApiKind, payload: dict[str, Any], full: bytes, limit: int
) -> None:
    """Only the first maxBlocks x blockChars bytes are serialised; they must equal the full text's."""
    assert prompt_bytes(RequestBody(api, payload), limit) == full[:limit]


def test_anthropic_messages_hash_system_then_messages_and_a_longer_conversation_extends_the_prefix() -> None:
    system = [{"type": "text", "text": "be terse"}]
    first = [{"role": "user", "content": [{"type": "text", "text": LONG}]}]
    longer = [*first, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "more"}]
    short = prompt_bytes(RequestBody(ApiKind.MESSAGES, {"system": system, "messages": first}), 1 << 20)
    assert short == go_json([system, first], sort=True)
    full = prompt_bytes(RequestBody(ApiKind.MESSAGES, {"system": system, "messages": longer}), 1 << 20)
    assert full[: len(short) - 2] == short[:-2]  # only the closing brackets differ


@pytest.mark.parametrize("limit", [3, 4, 64, 1 << 20])
def test_token_ids_are_hashed_as_four_bytes_each(limit: int) -> None:
    ids = tuple(range(1000, 1040))
    got = prompt_bytes(RequestBody(ApiKind.GENERATE, {"token_ids": list(ids)}, token_ids=ids), limit)
    assert got == struct.pack("<40I", *ids)[: limit // 4 * 4]


# --- hashing -------------------------------------------------------------------------------------------


def test_seed_of_empty_model_is_xxh64_of_nothing() -> None:
    assert seed_hash("") == 0xEF46DB3751D8E999  # the published xxh64("") with seed 0


@pytest.mark.parametrize(
    ("prompt", "block_tokens", "model", "salt"),
    [
        ("aaaabbbb", 1, "test-model1", ""),
        ("aaaabbbbcc", 1, "test-model1", ""),
        ("the quick brown fox jumps over the lazy dog " * 20, 16, "llama", ""),
        ("the quick brown fox jumps over the lazy dog " * 20, 16, "llama", "tenant-a"),
        ("ünïcødé ✓ " * 40, 4, "m", "s"),
    ],
    ids=["two-blocks", "partial-tail-dropped", "default-block", "salted", "multibyte"],
)
def test_hashes_match_an_independent_computation(prompt: str, block_tokens: int, model: str, salt: str) -> None:
    got = hash_prompt(req(prompt, model=model, salt=salt), block_tokens, 256)
    assert got == chained(prompt.encode(), model, block_tokens * 4, salt)
    assert len(got) == len(prompt.encode()) // (block_tokens * 4)


def test_shared_prefix_shares_leading_hashes_and_an_early_change_changes_all_later_ones() -> None:
    base = "".join(chr(97 + i % 26) for i in range(64 * 6))
    same_start = base[: 64 * 4] + "Z" * 64 * 2
    early_change = base[:10] + "#" + base[11:]
    h_base, h_same, h_early = (hash_prompt(req(t), 16, 256) for t in (base, same_start, early_change))
    assert h_base[:4] == h_same[:4] and h_base[4] != h_same[4] and h_base[5] != h_same[5]
    assert all(a != b for a, b in zip(h_base, h_early, strict=True))


@pytest.mark.parametrize(("model", "salt"), [("other-model", ""), ("m", "salt")], ids=["target-model", "cache-salt"])
def test_model_and_cache_salt_change_every_hash(model: str, salt: str) -> None:
    text = "p" * 64 * 3
    plain = hash_prompt(req(text), 16, 256)
    other = hash_prompt(req(text, model=model, salt=salt), 16, 256)
    assert len(plain) == len(other) == 3
    assert not set(plain) & set(other)
    assert seed_hash("m", "salt") == seed_hash("msalt") != seed_hash("m")


@pytest.mark.parametrize(("length", "expected"), [(0, 0), (1, 0), (63, 0), (64, 1), (127, 1), (128, 2)], ids=str)
def test_short_inputs_give_no_hashes_and_partial_blocks_are_dropped(length: int, expected: int) -> None:
    assert len(hash_prompt(req("a" * length), 16, 256)) == expected


def test_block_hashes_edge_cases() -> None:
    assert block_hashes(b"abcd" * 10, 1, 0, 10) == []
    assert block_hashes(b"abcd" * 10, 1, 4, 0) == []
    assert len(block_hashes(b"abcd" * 10, 1, 4, 3)) == 3
    assert hash_prompt(req("a" * 1000), 0, 256) == []


def test_the_memoised_hasher_gives_the_same_hashes() -> None:
    hasher = BlockHasher(size=3)
    texts = ["s" * 64 * 5, "s" * 64 * 5 + "tail", "t" * 64 * 9, "u" * 63, "s" * 64 * 5]
    cases = [(t, salt, bs, mb) for t in texts for salt in ("", "x") for bs, mb in ((16, 256), (16, 2), (4, 256))]
    for _ in range(2):
        for text, salt, block_size, max_blocks in cases:
            request = req(text, salt=salt)
            assert list(hasher(request, block_size, max_blocks)) == hash_prompt(request, block_size, max_blocks)
    assert len(hasher) == 3
    assert hasher(req("x" * 1000), 0, 256) == () and hasher(req("x" * 1000), 16, 0) == ()


@pytest.mark.parametrize(
    ("params", "block_size_metric", "expected_blocks"),
    [
        ({}, 0, 256),
        ({"maxPrefixBlocksToMatch": 10}, 0, 10),
        ({"maxPrefixBlocksToMatch": 0}, 0, 0),
        ({"maxPrefixTokensToMatch": 160}, 0, 10),  # 160 tokens / 16 tokens per block
        ({"maxPrefixTokensToMatch": 160, "maxPrefixBlocksToMatch": 3}, 0, 10),  # tokens win
        ({"maxPrefixTokensToMatch": 160}, 32, 5),  # divided by the auto-tuned block size
        ({"blockSizeTokens": 8, "autoTune": False}, 32, 256),
    ],
    ids=["default-256", "blocks", "zero-blocks", "tokens", "tokens-win", "tokens-autotuned", "autotune-off"],
)
def test_max_blocks_caps_the_hashes(params: dict[str, Any], block_size_metric: int, expected_blocks: int) -> None:
    p = producer(**params)
    match = p.compute(req("y" * 200_000), [ep("a", block_size=block_size_metric)])
    assert match.total_blocks == expected_blocks


@pytest.mark.parametrize(
    ("auto_tune", "metrics", "expected_block", "expected_capacity"),
    [
        (True, (0, 0), 16, 31250),
        (True, (32, 1000), 32, 1000),
        (False, (32, 1000), 16, 31250),
    ],
    ids=["no-metrics", "from-metrics", "autotune-off"],
)
def test_autotune_block_size_and_capacity(
    auto_tune: bool, metrics: tuple[int, int], expected_block: int, expected_capacity: int
) -> None:
    p = producer(autoTune=auto_tune)
    first = ep("a", *metrics)
    assert p.block_size_tokens([first, ep("b", 64, 5)]) == expected_block
    assert p.capacity_for(first) == expected_capacity
    match = p.compute(req("z" * expected_block * 4 * 3), [first])
    assert match.total_blocks == 3 and match.block_size_tokens == expected_block


def test_block_size_comes_from_the_first_candidate_only() -> None:
    assert producer().block_size_tokens([ep("a"), ep("b", 64)]) == 16
    assert producer().block_size_tokens([]) == 16


def test_lru_capacity_per_server_is_used_without_metrics() -> None:
    p = producer(lruCapacityPerServer=3)
    a = ep("a")
    schedule(p, req("q" * 64 * 5), [a], a)
    assert p.index.endpoint_entries(a.key) == 3 and p.index.capacity(a.key) == 3


# --- matching ------------------------------------------------------------------------------------------


def test_repeated_prompt_matches_where_it_was_sent() -> None:
    p = producer()
    a, b = ep("a"), ep("b")
    first = schedule(p, req("s" * 64 * 4), [a, b], a)
    assert first.total_blocks == 4 and dict(first.matches) == {}
    second = schedule(p, req("s" * 64 * 4 + "t" * 64 * 4), [a, b], b)
    assert second.total_blocks == 8
    assert dict(second.matches) == {a.key: 4}
    assert second.score(a.key) == 0.5 and second.score(b.key) == 0.0
    third = schedule(p, req("s" * 64 * 4 + "t" * 64 * 2), [a, b], a)
    assert dict(third.matches) == {a.key: 4, b.key: 6}


def test_matching_stops_at_the_first_block_nobody_holds() -> None:
    index = PrefixIndex()
    index.add([1, 2, 4], key("a"), 100)
    assert index.match([1, 2, 3, 4]) == {key("a"): 2}
    assert index.match([9, 1, 2]) == {}
    assert index.match([]) == {}


def test_matching_counts_held_blocks_without_per_endpoint_contiguity_as_the_reference() -> None:
    """`a` misses block 2 but `b` holds it, so the walk goes on and `a` also counts block 3."""
    index = PrefixIndex()
    index.add([1, 3], key("a"), 100)
    index.add([1, 2, 3], key("b"), 100)
    assert index.match([1, 2, 3]) == {key("a"): 2, key("b"): 3}


@pytest.mark.parametrize("seed", range(5))
def test_matching_agrees_with_a_block_by_block_count_over_shared_and_evicted_blocks(seed: int) -> None:
    """Runs of blocks with the same holders are counted together; that must equal counting every leading held
    block once per holder, whatever mix of sole, shared and partly evicted holders the index has."""
    rng = random.Random(seed)
    index = PrefixIndex()
    names = [key(n) for n in "abcd"]
    for _ in range(300):
        start = rng.randrange(40)
        index.add(list(range(start, start + rng.randrange(1, 12))), rng.choice(names), rng.choice((8, 25, 100)))
    for _ in range(200):
        start = rng.randrange(50)
        hashes = list(range(start, start + rng.randrange(0, 15)))
        expected: dict[EndpointKey, int] = {}
        for h in hashes:
            holders = index.holders(h)
            if not holders:
                break
            for k in holders:
                expected[k] = expected.get(k, 0) + 1
        assert index.match(hashes) == expected


@pytest.mark.parametrize("seed", range(4))
def test_index_keeps_each_lru_in_request_order_whatever_the_shape_of_the_hashes(seed: int) -> None:
    """Against a plain model of the LRUs (each hash moved to the newest end in request order, the oldest
    evicted past capacity): held-then-new prompts, all-new ones, repeats, reversed orders and duplicates."""
    rng = random.Random(seed)
    index = PrefixIndex()
    names = [key(n) for n in "abc"]
    model: dict[EndpointKey, dict[int, None]] = {k: {} for k in names}
    for _ in range(400):
        start = rng.randrange(60)
        hashes = list(range(start, start + rng.randrange(1, 10)))
        shape = rng.randrange(5)
        if shape == 1:
            hashes.reverse()
        elif shape == 2:
            hashes += hashes[: rng.randrange(1, 3)]
        elif shape == 3:
            hashes = [hashes[0], *hashes]
        target, capacity = rng.choice(names), rng.choice((6, 20, 40))
        index.add(hashes, target, capacity)
        lru = model[target]
        for h in hashes:
            lru.pop(h, None)
            lru[h] = None
        while len(lru) > capacity:
            del lru[next(iter(lru))]
        for k in names:
            assert index.hashes_of(k) == list(model[k])
        assert len(index) == sum(len(lru) for lru in model.values())
    for h in range(80):
        assert set(index.holders(h)) == {k for k in names if h in model[k]}


def test_prefix_match_of_a_prompt_without_blocks_scores_zero() -> None:
    match = PrefixMatch([], {}, 16)
    assert match.total_blocks == 0 and match.score(key("a")) == 0.0 and match.matched_blocks(key("a")) == 0
    assert "total_blocks=0" in repr(match)


# --- the index -----------------------------------------------------------------------------------------


def test_lru_eviction_updates_the_reverse_index() -> None:
    index = PrefixIndex()
    a, b = key("a"), key("b")
    index.add([1, 2], a, 3)
    index.add([1], b, 3)
    index.add([3, 1, 4], a, 3)  # 1 refreshed; 2 is now the oldest and is evicted
    assert index.holders(2) == ()
    assert index.holders(1) == (a, b)
    assert set(index.holders(3)) == {a} and index.holders(4) == (a,)
    assert len(index) == 4 and index.endpoint_entries(a) == 3
    index.add([5, 6], a, 3)  # evicts 3, then 1 (held by b too: only a is removed)
    assert index.holders(3) == () and index.holders(1) == (b,)
    assert index.distinct_hashes() == 4  # 1 (b), 4, 5, 6
    assert len(index) == 4


def test_a_block_left_with_one_holder_is_removed_when_that_holder_evicts_it() -> None:
    index = PrefixIndex()
    a, b = key("a"), key("b")
    index.add([1], a, 1)
    index.add([1], b, 1)
    index.add([2], a, 1)  # a evicts 1: b is its sole holder now
    assert index.holders(1) == (b,)
    index.add([3], b, 1)
    assert index.holders(1) == () and index.distinct_hashes() == 2


@pytest.mark.parametrize("seed", range(5))
def test_random_operations_keep_the_lrus_and_the_reverse_index_in_agreement(seed: int) -> None:
    rng = random.Random(seed)
    index = PrefixIndex()
    keys = [key(f"e{i}") for i in range(5)]
    for _ in range(400):
        k = rng.choice(keys)
        if rng.random() < 0.03:
            index.remove_endpoint(k)
            continue
        start = rng.randrange(40)
        index.add(list(range(start, start + rng.randrange(1, 12))), k, rng.randrange(3, 30))
        held: dict[int, set[Any]] = {}
        for e in index.endpoints():
            lru = index.hashes_of(e)
            assert len(lru) <= index.capacity(e)
            for h in lru:
                held.setdefault(h, set()).add(e)
        assert {h: set(index.holders(h)) for h in range(60) if index.holders(h)} == held
        assert all(len(set(index.holders(h))) == len(index.holders(h)) for h in held)
        assert len(index) == sum(index.endpoint_entries(e) for e in index.endpoints())
        assert index.distinct_hashes() == len(held)


def test_a_request_longer_than_the_capacity_keeps_the_index_consistent() -> None:
    """The reference re-adds evicted hashes to its reverse map after the LRU pass; we never do."""
    index = PrefixIndex()
    index.add([1, 2, 3, 4, 5], key("a"), 2)
    assert [h for h in (1, 2, 3, 4, 5) if index.holders(h)] == [4, 5]
    assert len(index) == 2 == index.distinct_hashes()


def test_capacity_shrinks_when_the_endpoint_reports_fewer_blocks() -> None:
    index = PrefixIndex()
    index.add(range(10), key("a"), 10)
    index.add([], key("a"), 4)
    assert index.endpoint_entries(key("a")) == 4 and len(index) == 4
    assert [h for h in range(10) if index.holders(h)] == [6, 7, 8, 9]


def test_remove_endpoint() -> None:
    index = PrefixIndex()
    index.add([1, 2], key("a"), 10)
    index.add([2, 3], key("b"), 10)
    assert index.remove_endpoint(key("a")) == 2
    assert index.remove_endpoint(key("a")) == 0
    assert index.holders(1) == () and index.holders(2) == (key("b"),)
    assert index.endpoints() == [key("b")] and len(index) == 2


# --- PreRequest ----------------------------------------------------------------------------------------


def test_pre_request_adds_to_the_primary_and_the_prefill_target_and_records_the_match() -> None:
    handle = FakeHandle()
    p = producer(handle)
    a, b, c = ep("a"), ep("b", num_blocks=50), ep("c")
    text = "w" * 64 * 3
    schedule(p, req(text), [a, b, c], a)
    cycle = CycleState()
    asyncio.run(p.prepare_data(cycle, req(text + "v" * 64), [a, b, c]))
    p.pre_request(cycle, req(text), result(a, prefill=b))
    hashes = hash_prompt(req(text + "v" * 64), 16, 256)
    assert all(set(p.index.holders(h)) == {a.key, b.key} for h in hashes)
    assert p.index.holders(hashes[0]) == (a.key, b.key)
    assert p.index.capacity(b.key) == 50 and p.index.capacity(a.key) == 31250
    # first request: no match; second: 3 of 4 blocks on a = 3 x 16 tokens x 4 chars
    assert handle.recorder.prefix_matches == [(0.0, 0), (0.75, 192)]


def test_pre_request_with_a_prefill_profile_as_primary_adds_once() -> None:
    p = producer()
    a = ep("a")
    cycle = CycleState()
    asyncio.run(p.prepare_data(cycle, req("k" * 128), [a]))
    p.pre_request(cycle, req("k" * 128), result(a, prefill=a))
    assert p.index.holders(hash_prompt(req("k" * 128), 16, 256)[0]) == (a.key,)


@pytest.mark.parametrize("case", ["no-state", "no-blocks", "no-target", "failed-primary"])
def test_pre_request_without_anything_to_add_does_nothing(case: str) -> None:
    handle = FakeHandle()
    p = producer(handle)
    a = ep("a")
    cycle = CycleState()
    res = result(a)
    if case == "no-blocks":
        cycle.write(PREFIX_MATCH_KEY, PrefixMatch([], {}, 16))
    elif case == "no-target":
        cycle.write(PREFIX_MATCH_KEY, PrefixMatch([1, 2], {}, 16))
        res = SchedulingResult({"default": ProfileResult(())}, "default")
    elif case == "failed-primary":
        cycle.write(PREFIX_MATCH_KEY, PrefixMatch([1, 2], {}, 16))
        res = SchedulingResult({"default": None}, "default")
    p.pre_request(cycle, req(), res)
    assert len(p.index) == 0 and handle.recorder.prefix_matches == []


# --- housekeeping --------------------------------------------------------------------------------------


def test_purge_drops_endpoints_that_left_the_pool() -> None:
    p = producer()
    a, b = ep("a"), ep("b")
    schedule(p, req("n" * 128), [a, b], a)
    schedule(p, req("o" * 128), [a, b], b)
    assert p.purge([b.key]) == [a.key]
    assert p.index.endpoints() == [b.key] and len(p.index) == 2
    assert p.purge({b.key}) == []


def test_housekeeping_purges_every_two_minutes_from_prepare_data() -> None:
    handle = FakeHandle(clock=1000.0)
    p = producer(handle)
    a, b = ep("a"), ep("b")
    handle.pool = [a, b]
    schedule(p, req("n" * 128), [a, b], a)
    schedule(p, req("o" * 128), [a, b], b)
    handle.pool = [b]
    handle.clock = 1119.0
    schedule(p, req("short"), [b], b)
    assert set(p.index.endpoints()) == {a.key, b.key}  # not due yet
    handle.clock = 1120.0
    schedule(p, req("short"), [b], b)
    assert p.index.endpoints() == [b.key]


def test_an_empty_pool_snapshot_purges_nothing() -> None:
    handle = FakeHandle()
    p = producer(handle)
    a = ep("a")
    schedule(p, req("n" * 128), [a], a)
    handle.clock = 500.0
    p.housekeeping()
    assert p.index.endpoints() == [a.key]


def test_index_size_is_reported_at_most_once_per_second() -> None:
    handle = FakeHandle(clock=10.0)
    p = producer(handle)
    a = ep("a")
    schedule(p, req("n" * 64 * 3), [a], a)  # reports 0 (before the add)
    handle.clock = 10.5
    schedule(p, req("m" * 64 * 2), [a], a)
    handle.clock = 11.0
    schedule(p, req("x"), [a], a)
    assert handle.recorder.prefix_sizes == [0, 5]


# --- plugin surface ------------------------------------------------------------------------------------


def test_identity_and_extension_points() -> None:
    plugin = mod.factory("custom", Params(), FakeHandle())
    assert plugin.typed_name == TypedName(mod.TYPE, "custom")
    assert isinstance(plugin, PrepareData) and isinstance(plugin, PreRequest)
    assert plugin.produces == {"prefix-cache-match-info/custom"}  # a named instance publishes its own key
    assert mod.factory(mod.TYPE, Params(), FakeHandle()).produces == {PREFIX_MATCH_KEY.name}


def test_defaults_are_the_references() -> None:
    p = Params()
    assert (p.auto_tune, p.block_size_tokens, p.block_size) == (True, 16, 0)
    assert (p.max_prefix_blocks_to_match, p.max_prefix_tokens_to_match, p.lru_capacity_per_server) == (256, 0, 31250)


@pytest.mark.parametrize(
    "raw",
    [
        {"blockSize": 64, "blockSizeTokens": 0},
        {"autoTune": False, "blockSizeTokens": 0},
        {"maxPrefixTokensToMatch": -1},
        {"maxPrefixBlocksToMatch": -1},
        {"lruCapacityPerServer": 0},
        {"noSuchParameter": 1},
    ],
    ids=["deprecated-blockSize", "no-block-size", "negative-tokens", "negative-blocks", "zero-capacity", "unknown"],
)
def test_invalid_params_are_rejected(raw: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        Params.model_validate(raw)


@pytest.mark.parametrize(
    "raw",
    [{"blockSize": 64}, {"autoTune": True, "blockSizeTokens": 0}, {"blockSize": 1, "blockSizeTokens": 1}],
    ids=["blockSize-alone-ignored", "autotune-without-size", "both"],
)
def test_params_the_reference_accepts(raw: dict[str, Any]) -> None:
    p = producer(**raw)
    assert p.params.block_size_tokens == raw.get("blockSizeTokens", 16)


def test_autotune_without_any_block_size_hashes_nothing() -> None:
    p = producer(blockSizeTokens=0)
    assert p.compute(req("a" * 1000), [ep("a")]).total_blocks == 0
    assert p.compute(req("a" * 1000), [ep("a", block_size=16)]).total_blocks == 15
