from __future__ import annotations

import random

import cbor2
import msgspec

from llm_epp.kvcache.events import AllBlocksCleared, BlockRemoved, BlockStored, DecodeStats, EventBatch, decode_batch
from llm_epp.kvcache.index import KVBlockIndex, longest_prefix
from llm_epp.kvcache.request_keys import RequestKeyHasher, fnv64a

MODEL = "m"
A, B = "10.0.0.1:8000", "10.0.0.2:8000"


def batch(*events) -> EventBatch:
    return EventBatch(0.0, tuple(events))


def index(block_size: int = 4, **kw) -> KVBlockIndex:
    return KVBlockIndex(RequestKeyHasher(block_size, "42"), **kw)


def test_request_keys_follow_the_documented_cbor_fnv_chain() -> None:
    h = RequestKeyHasher(2, "42")
    init = fnv64a(b"42")
    root = fnv64a(cbor2.dumps([init, None, MODEL], canonical=True))
    k0 = fnv64a(cbor2.dumps([root, [1, 2], None], canonical=True))
    k1 = fnv64a(cbor2.dumps([k0, [3, 4], None], canonical=True))
    assert h.keys([1, 2, 3, 4, 5], MODEL) == [k0, k1]
    assert h.keys([3, 4], MODEL, parent=k0) == [k1]
    salted = fnv64a(cbor2.dumps([root, [1, 2], ["s"]], canonical=True))
    assert h.keys([1, 2], MODEL, cache_salt="s") == [salted]
    assert RequestKeyHasher(2, "42", "xxh64").keys([1, 2], MODEL) != [k0]


def test_stored_events_chain_through_engine_keys_and_lookup_uses_prompt_tokens() -> None:
    idx = index()
    tokens = list(range(12))
    # the engine stores the prompt in two events; the second chains from the first via the engine hash
    idx.apply(A, MODEL, batch(BlockStored((101, 102), None, tuple(tokens[:8]), 4, medium="gpu")))
    idx.apply(A, MODEL, batch(BlockStored((103,), 102, tuple(tokens[8:]), 4)))
    keys = idx.hasher.keys(tokens, MODEL)
    assert idx.score(keys) == {A: 3.0}
    assert idx.request_keys_of(A, 103) == (keys[2],)


def test_removed_cleared_and_medium_weights() -> None:
    idx = index()
    tokens = tuple(range(8))
    keys = idx.hasher.keys(tokens, MODEL)
    idx.apply(A, MODEL, batch(BlockStored((1, 2), None, tokens, 4)))
    idx.apply(B, MODEL, batch(BlockStored((1, 2), None, tokens, 4, medium="cpu")))
    assert idx.score(keys) == {A: 2.0, B: 1.6}
    idx.apply(A, MODEL, batch(BlockRemoved((2,))))
    assert idx.score(keys) == {A: 1.0, B: 1.6}
    # a token-less BlockStored re-tags a known block on another medium
    idx.apply(A, MODEL, batch(BlockStored((1,), None, (), 4, medium="cpu")))
    assert idx.lookup(keys[:1])[0][A] == {"gpu", "cpu"}
    idx.apply(B, MODEL, batch(AllBlocksCleared()))
    assert idx.score(keys) == {A: 1.0}
    assert B not in idx.pods()
    assert idx.score(keys, candidates={B}) == {}


def test_unknown_parent_is_skipped_and_counted() -> None:
    idx = index()
    idx.apply(A, MODEL, batch(BlockStored((9,), 999, tuple(range(4)), 4)))
    assert len(idx) == 0 and idx.stats.skipped == {"unknown_parent": 1}


def test_engine_block_size_differs_from_the_index_block_size() -> None:
    idx = index(block_size=4)
    tokens = tuple(range(16))
    idx.apply(A, MODEL, batch(BlockStored((1, 2), None, tokens, 8)))  # engine blocks of 8 tokens
    keys = idx.hasher.keys(tokens, MODEL)
    assert idx.score(keys) == {A: 4.0}
    idx.apply(A, MODEL, batch(BlockRemoved((2,))))
    assert idx.score(keys) == {A: 2.0}


def test_lora_name_seeds_the_chain() -> None:
    idx = index()
    tokens = tuple(range(4))
    idx.apply(A, MODEL, batch(BlockStored((1,), None, tokens, 4, lora_name="ad", extra_keys=(("ad",),))))
    assert idx.score(idx.hasher.keys(tokens, "ad")) == {A: 1.0}
    assert idx.score(idx.hasher.keys(tokens, MODEL)) == {}


def test_memory_is_bounded_and_consistent() -> None:
    idx = index(size=5, pod_cache_size=2)
    for i in range(10):
        idx.apply(A, MODEL, batch(BlockStored((i,), None, (i, i, i, i), 4)))
    assert len(idx) == 5
    key = idx.hasher.keys((9, 9, 9, 9), MODEL)
    for pod in ("p1", "p2", "p3"):
        idx.add(key, pod)
    assert set(idx.holders(key[0])) == {"p2", "p3"}
    assert idx.retain_pods({"p3"}) and set(idx.pods()) == {"p3"}


def test_speculative_entries_expire() -> None:
    idx = index()
    keys = idx.hasher.keys(tuple(range(8)), MODEL)
    idx.add_speculative(keys, [A], expires_at=2.0)
    assert idx.score(keys) == {A: 2.0}
    assert idx.expire_speculative(1.0) == 0
    idx.apply(A, MODEL, batch(BlockStored((1,), None, tuple(range(4)), 4)))  # the engine confirms block 0
    assert idx.expire_speculative(2.0) == 1
    assert idx.score(keys) == {A: 1.0}


def test_longest_prefix_stops_at_the_first_gap() -> None:
    found = [{"a": {"gpu"}, "b": {"cpu", "gpu"}}, {"b": {"cpu"}}, {"a": {"gpu"}, "b": {"gpu"}}]
    assert longest_prefix(found, {"gpu": 1.0, "cpu": 0.8}) == {"a": 1.0, "b": 1.0 + 0.8 + 1.0}


def test_two_replicas_fed_the_same_stream_answer_identically() -> None:
    """Two EPP replicas subscribed to the same publishers hold the same index and answer the same."""
    rng = random.Random(7)
    payloads: list[tuple[str, bytes]] = []
    stored: dict[str, list[int]] = {A: [], B: []}
    for n in range(300):
        pod = rng.choice((A, B))
        r = rng.random()
        if r < 0.6:
            prefix = rng.randrange(5)
            tokens = [prefix] * 4 + [rng.randrange(50) for _ in range(4 * rng.randrange(1, 4))]
            hashes = [n * 10 + i for i in range(len(tokens) // 4)]
            ev = ["BlockStored", hashes, None, tokens, 4, None, rng.choice(["GPU", "CPU"])]
            stored[pod] += hashes
        elif r < 0.95 and stored[pod]:
            ev = {"type": "BlockRemoved", "block_hashes": [rng.choice(stored[pod])]}
        else:
            ev = ["AllBlocksCleared"]
        payloads.append((pod, msgspec.msgpack.encode([float(n), [ev], 0])))
    replicas = [index(), index()]
    for idx in replicas:
        for pod, payload in payloads:
            decoded = decode_batch(payload, DecodeStats())
            assert decoded is not None
            idx.apply(pod, MODEL, decoded)
    for prefix in range(5):
        keys = replicas[0].hasher.keys([prefix] * 4 + list(range(8)), MODEL)
        assert replicas[0].lookup(keys) == replicas[1].lookup(keys)
        assert replicas[0].score(keys) == replicas[1].score(keys)
    assert len(replicas[0]) == len(replicas[1]) > 0


def test_events_with_vllm_block_hashes_as_ints_or_bytes_chain_alike() -> None:
    """A prompt stored in two steps with the engine's real hashes (sha256_cbor, PYTHONHASHSEED=42), once as
    the 64-bit ints vLLM publishes by default and once as the raw 32-byte digests."""
    from llm_epp.kvcache import vllm_hashing

    tokens = list(range(500, 516))
    digests = vllm_hashing.block_hashes(tokens, 4, algorithm="sha256_cbor", python_hash_seed="42")
    for encode in (vllm_hashing.external_hash, lambda d: d):
        idx = index()
        hashes = [encode(d) for d in digests]
        first = msgspec.msgpack.encode([0.0, [["BlockStored", hashes[:2], None, tokens[:8], 4]], 0])
        second = msgspec.msgpack.encode([0.0, [["BlockStored", hashes[2:], hashes[1], tokens[8:], 4]], 0])
        for payload in (first, second):
            decoded = decode_batch(payload, DecodeStats())
            assert decoded is not None
            idx.apply(A, MODEL, decoded)
        keys = idx.hasher.keys(tokens, MODEL)
        assert idx.score(keys) == {A: 4.0}
        removed = decode_batch(msgspec.msgpack.encode([0.0, [["BlockRemoved", [hashes[3]]]], 0]), DecodeStats())
        assert removed is not None
        idx.apply(A, MODEL, removed)
        assert idx.score(keys) == {A: 3.0}
