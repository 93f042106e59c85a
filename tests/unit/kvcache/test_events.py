from __future__ import annotations

import msgspec
import pytest

from llm_epp.kvcache.events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeStats,
    decode_batch,
    decode_seq,
    hash_value,
    parse_topic,
)

enc = msgspec.msgpack.encode
BIG = (1 << 64) - 5  # above 2**63: a msgpack uint64


def test_legacy_array_batch_with_trailing_defaults_omitted() -> None:
    events = [
        ["BlockStored", [1, BIG], None, list(range(32)), 16, None, "GPU"],  # ends after medium
        ["BlockStored", [3], BIG, list(range(16)), 16],  # ends after block_size
        ["BlockRemoved", [1]],
        ["BlockRemoved", [BIG], "CPU", 2],
        ["AllBlocksCleared"],
    ]
    stats = DecodeStats()
    batch = decode_batch(enc([1.5, events, 0]), stats)
    assert batch is not None and stats.malformed_events == 0
    assert batch.ts == 1.5 and batch.data_parallel_rank == 0
    a, b, c, d, e = batch.events
    assert a == BlockStored((1, BIG), None, tuple(range(32)), 16, medium="gpu")
    assert b == BlockStored((3,), BIG, tuple(range(16)), 16)
    assert c == BlockRemoved((1,))
    assert d == BlockRemoved((BIG,), medium="cpu", group_idx=2)
    assert isinstance(e, AllBlocksCleared)


def test_full_legacy_block_stored_with_every_field() -> None:
    ev = ["BlockStored", [7], 6, [1, 2], 2, 3, "GPU", "adapter", [["adapter", "salt"]], 1, "full_attention", None]
    batch = decode_batch(enc([0.0, [ev]]), DecodeStats())
    assert batch is not None
    (s,) = batch.events
    assert isinstance(s, BlockStored)
    assert (s.lora_id, s.lora_name, s.extra_keys, s.group_idx, s.kv_cache_spec_kind) == (
        3,
        "adapter",
        (("adapter", "salt"),),
        1,
        "full_attention",
    )


def test_map_encoded_events_and_batch() -> None:
    stored = {
        "type": "BlockStored",
        "block_hashes": [b"\x00" * 24 + (5).to_bytes(8, "big")],
        "parent_block_hash": None,
        "token_ids": [9] * 16,
        "block_size": 16,
        "medium": "GPU",
        "lora_name": None,
        "group_idx": 0,
    }
    removed = {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"}
    for payload in (
        enc([2.0, [stored, removed, {"type": "AllBlocksCleared"}], 0]),
        enc({"ts": 2.0, "events": [stored, removed, {"type": "AllBlocksCleared"}], "data_parallel_rank": 1}),
    ):
        batch = decode_batch(payload, DecodeStats())
        assert batch is not None
        s, r, c = batch.events
        assert s == BlockStored((5,), None, (9,) * 16, 16, medium="gpu", group_idx=0)
        assert r == BlockRemoved((5,), medium="gpu")
        assert isinstance(c, AllBlocksCleared)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (5, 5),
        (BIG, BIG),
        (-1, (1 << 64) - 1),
        (bytes(range(32)), int.from_bytes(bytes(range(24, 32)), "big")),
        (b"\x01\x02", 0x0102),
    ],
    ids=["int", "uint64", "negative", "sha256-bytes", "short-bytes"],
)
def test_hash_values(raw: object, expected: int) -> None:
    assert hash_value(raw) == expected


def test_bad_events_are_counted_and_skipped_and_the_rest_kept() -> None:
    good = ["BlockRemoved", [1]]
    bad = [
        [],
        [42],
        ["BlockStored", [1], None],  # too short
        ["BlockStored", "x", None, [1], 16],
        ["BlockStored", [1.5], None, [1], 16],
        ["BlockStored", [1], None, [-1], 16],
        ["BlockRemoved", [b""]],
        {"no": "type"},
        "text",
    ]
    stats = DecodeStats()
    batch = decode_batch(enc([0.0, [*bad, good, ["Mystery", 1]], None]), stats)
    assert batch is not None
    assert batch.events == (BlockRemoved((1,)),)
    assert stats.malformed_events == len(bad)
    assert stats.unknown_events == 1
    assert stats.malformed_messages == 0


@pytest.mark.parametrize("payload", [b"\xc1", enc("x"), enc([1.0]), enc(["t", []]), enc({"ts": 1})])
def test_bad_batches_are_counted_never_raised(payload: bytes) -> None:
    stats = DecodeStats()
    assert decode_batch(payload, stats) is None
    assert stats.malformed_messages == 1 and stats.last_error


def test_sequence_and_topic() -> None:
    assert decode_seq((7).to_bytes(8, "big")) == 7
    assert decode_seq(b"\x00" * 7) is None
    assert parse_topic("kv@10.0.0.1:8000@Qwen/Qwen3-32B") == ("10.0.0.1:8000", "Qwen/Qwen3-32B")
    assert parse_topic("other") == ("other", "")
    # SGLang with a snapshot endpoint: epoch (and barrier) metadata after a NUL byte
    epoch = "kv@10.0.0.1:30000@Qwen/Qwen3-32B\x00sgl-kv-epoch=3f2a"
    assert parse_topic(epoch) == ("10.0.0.1:30000", "Qwen/Qwen3-32B")
    assert parse_topic(epoch + "\x00sgl-kv-snapshot=77") == ("10.0.0.1:30000", "Qwen/Qwen3-32B")
