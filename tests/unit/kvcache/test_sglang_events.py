"""SGLang's KV-event stream: batches encoded the way SGLang's publisher encodes them (msgspec tagged array
structs, signed 64-bit page hashes, an optional salt map after `medium`), decoded and applied to the index."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
import pytest

from llm_epp.kvcache.events import BlockRemoved, BlockStored, DecodeStats, decode_batch
from llm_epp.kvcache.index import KVBlockIndex
from llm_epp.kvcache.request_keys import RequestKeyHasher
from llm_epp.kvcache.sglang_hashing import event_hash, page_digest, page_digests

# The schema of SGLang's publisher (sglang/srt/disaggregation/kv_events.py): tagged structs encoded as
# arrays. Newer SGLang dropped omit_defaults, so `medium` and `attn_dp_rank` are always on the wire; a
# salted store is a subclass with the same tag and one more (keyword-only) field, a map.


class _Batch(msgspec.Struct, array_like=True, gc=False):
    ts: float
    events: list[Any]
    attn_dp_rank: int | None = None


class _Event(msgspec.Struct, array_like=True, gc=False, tag=True):
    pass


class _Stored(_Event, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None = None


class _Metadata(msgspec.Struct, omit_defaults=True, gc=False):
    cache_salt: str


class _StoredWithMetadata(_Stored, tag="BlockStored", kw_only=True):
    metadata: _Metadata


class _Removed(_Event, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: str | None = None


class _Cleared(_Event, tag="AllBlocksCleared"):
    pass


# the older publisher: omit_defaults, no medium, a batch of two fields
class _OldBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class _OldEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class _OldStored(_OldEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None


class _OldRemoved(_OldEvent, tag="BlockRemoved"):
    block_hashes: list[int]


PAGE = 4
U64 = (1 << 64) - 1
POD = "10.0.0.5:30000"


def _chain(tokens: list[int], salt_root: bytes | None = None) -> list[int]:
    return [event_hash(d) for d in page_digests(tokens, PAGE, salt_root)]


def _negative_chain() -> tuple[list[int], list[int]]:
    """Tokens whose first page hash is negative (SGLang sends it as a msgpack int64)."""
    for start in range(1000):
        tokens = list(range(start, start + 3 * PAGE))
        hashes = _chain(tokens)
        if hashes[0] < 0:
            return tokens, hashes
    raise AssertionError("no negative hash found")  # pragma: no cover


def test_page_hash_is_sha256_of_the_prior_digest_and_little_endian_tokens() -> None:
    first = page_digest([1, 2, 3, 4])
    assert first == hashlib.sha256(b"".join(t.to_bytes(4, "little") for t in (1, 2, 3, 4))).digest()
    second = page_digest([5, 6, 7, 8], first)
    assert second == hashlib.sha256(first + b"".join(t.to_bytes(4, "little") for t in (5, 6, 7, 8))).digest()
    assert page_digests([1, 2, 3, 4, 5, 6, 7, 8, 9], PAGE) == [first, second]  # a partial page has no hash
    assert event_hash(first) == int(first.hex()[:16], 16) - (1 << 64 if first[0] >= 0x80 else 0)


def test_newer_sglang_batch_decodes_with_signed_hashes_medium_and_salt() -> None:
    tokens, hashes = _negative_chain()
    events = [
        _Stored(hashes[:2], None, tokens[: 2 * PAGE], PAGE, None, "GPU"),
        _StoredWithMetadata(hashes[2:], hashes[1], tokens[2 * PAGE :], PAGE, None, "GPU", metadata=_Metadata("s1")),
        _Removed(hashes[:1], "CPU_PINNED"),
        _Cleared(),
    ]
    payload = msgspec.msgpack.encode(_Batch(12.5, events, 0))
    raw = msgspec.msgpack.decode(payload)
    assert raw[1][0] == ["BlockStored", hashes[:2], None, tokens[: 2 * PAGE], PAGE, None, "GPU"]
    assert raw[1][1][-1] == {"cache_salt": "s1"}  # the salt map sits where vLLM has lora_name
    stats = DecodeStats()
    batch = decode_batch(payload, stats)
    assert batch is not None and stats.malformed_events == 0 and stats.unknown_events == 0
    assert batch.ts == 12.5 and batch.data_parallel_rank == 0
    plain, salted, removed, _cleared = batch.events
    assert isinstance(plain, BlockStored) and isinstance(salted, BlockStored) and isinstance(removed, BlockRemoved)
    assert plain.block_hashes == tuple(h & U64 for h in hashes[:2]) and plain.block_hashes[0] > 1 << 63
    assert plain.medium == "gpu" and plain.cache_salt is None and plain.lora_name is None
    assert salted.cache_salt == "s1" and salted.parent_block_hash == hashes[1] & U64 and salted.lora_name is None
    assert removed.medium == "cpu_pinned" and removed.block_hashes == (hashes[0] & U64,)


def test_older_sglang_batch_without_medium_or_rank_decodes() -> None:
    tokens, hashes = _negative_chain()
    payload = msgspec.msgpack.encode(
        _OldBatch(1.0, [_OldStored(hashes, None, tokens, PAGE, None), _OldRemoved(hashes[-1:])])
    )
    assert msgspec.msgpack.decode(payload) == [
        1.0,
        [["BlockStored", hashes, None, tokens, PAGE, None], ["BlockRemoved", hashes[-1:]]],
    ]
    batch = decode_batch(payload, DecodeStats())
    assert batch is not None and batch.data_parallel_rank is None
    stored, removed = batch.events
    assert isinstance(stored, BlockStored) and stored.medium == "" and stored.block_size == PAGE
    assert isinstance(removed, BlockRemoved) and removed.block_hashes == (hashes[-1] & U64,)


@pytest.mark.parametrize("salt", ["", "tenant-a"])
def test_index_follows_sglang_stores_and_removals(salt: str) -> None:
    """Pages stored and removed by their signed hashes; a salted store is found only by a request with that
    salt, as SGLang keeps salted prefixes apart."""
    index = KVBlockIndex(RequestKeyHasher(PAGE))
    tokens, hashes = _negative_chain()
    first: _Stored = (
        _StoredWithMetadata(hashes[:1], None, tokens[:PAGE], PAGE, None, "GPU", metadata=_Metadata(salt))
        if salt
        else _Stored(hashes[:1], None, tokens[:PAGE], PAGE, None, "GPU")
    )
    rest = _Stored(hashes[1:], hashes[0], tokens[PAGE:], PAGE, None, "GPU")
    batch = decode_batch(msgspec.msgpack.encode(_Batch(0.0, [first, rest], 0)), DecodeStats())
    assert batch is not None
    index.apply(POD, "m", batch)
    salted_keys = index.hasher.keys(tokens, "m", cache_salt=salt)
    assert len(index.lookup(salted_keys)) == 3
    if salt:
        assert index.lookup(index.hasher.keys(tokens, "m")) == []
    removal = decode_batch(msgspec.msgpack.encode(_Batch(1.0, [_Removed(hashes[1:2], "GPU")], 0)), DecodeStats())
    assert removal is not None
    index.apply(POD, "m", removal)
    assert len(index.lookup(salted_keys)) == 1  # the chain now breaks at the removed page


def test_a_salt_that_is_not_a_string_is_a_counted_bad_event() -> None:
    event = ["BlockStored", [1], None, [1, 2, 3, 4], 4, None, "GPU", {"cache_salt": 7}]
    payload = msgspec.msgpack.encode([0.0, [event], 0])
    stats = DecodeStats()
    batch = decode_batch(payload, stats)
    assert batch is not None and batch.events == () and stats.malformed_events == 1
    assert "metadata.cache_salt" in stats.last_error
