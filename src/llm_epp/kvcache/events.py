"""Decoding of KV-cache event batches published by vLLM and SGLang over ZMQ.

A message is three frames: topic (`kv@<ip:port>@<model>`), an 8-byte big-endian sequence number and a
msgpack batch. The batch is `[ts, [event, ...], data_parallel_rank]` or the same as a map; each event is
either a positional array with its tag first (older vLLM, SGLang; trailing fields equal to their default
are left out) or a map with the tag under `"type"` (newer vLLM). Block hashes are unsigned 64-bit ints or
raw bytes, of which the last 8 (big-endian) are used; negative ints (SGLang publishes signed 64-bit
values) are read as their two's complement.

SGLang's BlockStored ends after `medium` (`[tag, block_hashes, parent, token_ids, block_size, lora_id,
medium]`, its batch `[ts, events, attn_dp_rank]`); a salted request's BlockStored carries one more field
there, a map `{"cache_salt": ...}`, where vLLM has `lora_name`. Its medium names are `GPU`, `CPU_PINNED`,
`DISK` and `EXTERNAL` (lower-cased here, like vLLM's).

Nothing here raises on bad input: `decode_batch` returns the events it could read and counts the rest in
a `DecodeStats`."""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

_U64 = (1 << 64) - 1
_decoder = msgspec.msgpack.Decoder()

# positional field order after the tag (vLLM's struct order; SGLang stops after extra_keys)
_STORED_FIELDS = (
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "lora_id",
    "medium",
    "lora_name",
    "extra_keys",
    "group_idx",
    "kv_cache_spec_kind",
    "kv_cache_spec_sliding_window",
)
_REMOVED_FIELDS = ("block_hashes", "medium", "group_idx")
_BATCH_FIELDS = ("ts", "events", "data_parallel_rank")


class MalformedEvent(ValueError):
    """An event or batch that does not follow the schema; the message says which field is wrong."""


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[int, ...]
    parent_block_hash: int | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str = ""  # lower-case ("gpu", "cpu"); "" when the engine did not say
    lora_id: int | None = None
    lora_name: str | None = None
    extra_keys: tuple[tuple[Any, ...] | None, ...] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    cache_salt: str | None = None  # SGLang's metadata; vLLM sends its salt in extra_keys


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[int, ...]
    medium: str = ""
    group_idx: int | None = None


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


Event = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[Event, ...]
    data_parallel_rank: int | None = None


@dataclass(slots=True)
class DecodeStats:
    """Counters of what could not be used. Mutated by the decoder; read by metrics and tests."""

    malformed_messages: int = 0  # wrong frame count, short sequence, undecodable batch
    malformed_events: int = 0  # one event skipped, the rest of its batch kept
    unknown_events: int = 0  # a tag this decoder does not know (skipped)
    last_error: str = ""
    by_reason: dict[str, int] = field(default_factory=dict)

    def count(self, kind: str, reason: str) -> None:
        if kind == "message":
            self.malformed_messages += 1
        elif kind == "unknown":
            self.unknown_events += 1
        else:
            self.malformed_events += 1
        self.last_error = reason
        key = reason.split(":", 1)[0]
        if key in self.by_reason or len(self.by_reason) < 64:  # bounded: reasons are fixed strings
            self.by_reason[key] = self.by_reason.get(key, 0) + 1


def hash_value(raw: object, what: str = "block hash") -> int:
    """A block hash as an unsigned 64-bit int: ints as they are (negative ones as two's complement), byte
    strings by their last 8 bytes read big-endian (shorter ones left-padded with zeros)."""
    if isinstance(raw, bool):
        raise MalformedEvent(f"{what}: expected an int or bytes, got bool")
    if isinstance(raw, int):
        return raw & _U64
    if isinstance(raw, (bytes, bytearray, memoryview)):
        data = bytes(raw)
        if not data:
            raise MalformedEvent(f"{what}: empty byte string")
        return int.from_bytes(data[-8:], "big")
    raise MalformedEvent(f"{what}: expected an int or bytes, got {type(raw).__name__}")


def _int(raw: object, what: str) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    raise MalformedEvent(f"{what}: expected an int, got {type(raw).__name__}")


def _opt_int(raw: object, what: str, *, non_negative: bool = False) -> int | None:
    if raw is None:
        return None
    value = _int(raw, what)
    if non_negative and value < 0:
        raise MalformedEvent(f"{what}: negative value {value}")
    return value


def _opt_str(raw: object, what: str) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        return raw
    raise MalformedEvent(f"{what}: expected a string, got {type(raw).__name__}")


def _list(raw: object, what: str) -> list[Any]:
    if isinstance(raw, list):
        return raw
    raise MalformedEvent(f"{what}: expected an array, got {type(raw).__name__}")


def _tokens(raw: object) -> tuple[int, ...]:
    items = _list(raw, "token_ids")
    for t in items:
        if not isinstance(t, int) or isinstance(t, bool) or t < 0 or t > 0xFFFFFFFF:
            raise MalformedEvent(f"token_ids: {t!r} is not a token id")
    return tuple(items)


def _extra_keys(raw: object) -> tuple[tuple[Any, ...] | None, ...] | None:
    if raw is None:
        return None
    out: list[tuple[Any, ...] | None] = []
    for i, item in enumerate(_list(raw, "extra_keys")):
        if item is None:
            out.append(None)
        elif isinstance(item, list):
            out.append(tuple(item))
        else:
            raise MalformedEvent(f"extra_keys[{i}]: expected an array or nil, got {type(item).__name__}")
    return tuple(out)


def _fields(raw: object) -> tuple[str, list[Any]]:
    """(tag, positional fields after the tag) of an array- or map-encoded event."""
    if isinstance(raw, list):
        if not raw:
            raise MalformedEvent("event: empty array (no tag)")
        tag = raw[0]
        if not isinstance(tag, str):
            raise MalformedEvent(f"event: tag is not a string ({type(tag).__name__})")
        return tag, raw[1:]
    if isinstance(raw, dict):
        tag = raw.get("type")
        if not isinstance(tag, str):
            raise MalformedEvent('event: map without a string "type" tag')
        order = _STORED_FIELDS if tag == "BlockStored" else _REMOVED_FIELDS if tag == "BlockRemoved" else ()
        return tag, [raw.get(name) for name in order]
    raise MalformedEvent(f"event: neither an array nor a map ({type(raw).__name__})")


def _at(fields: Sequence[Any], i: int) -> Any:
    return fields[i] if i < len(fields) else None


def decode_event(raw: object) -> Event | None:
    """One event; None for an unknown tag. Raises MalformedEvent."""
    tag, f = _fields(raw)
    if tag == "BlockStored":
        if len(f) < 4:
            raise MalformedEvent(f"BlockStored: {len(f)} fields, at least 4 needed")
        parent = f[1]
        tail = _at(f, 6)
        cache_salt: str | None = None
        if isinstance(tail, dict):  # SGLang's salted BlockStored: {"cache_salt": ...} after medium
            cache_salt = _opt_str(tail.get("cache_salt"), "metadata.cache_salt")
            tail = None
        return BlockStored(
            block_hashes=tuple(hash_value(h) for h in _list(f[0], "block_hashes")),
            parent_block_hash=None if parent is None else hash_value(parent, "parent_block_hash"),
            token_ids=_tokens(f[2]),
            block_size=_int(f[3], "block_size"),
            lora_id=_opt_int(_at(f, 4), "lora_id"),
            medium=(_opt_str(_at(f, 5), "medium") or "").lower(),
            lora_name=_opt_str(tail, "lora_name"),
            extra_keys=_extra_keys(_at(f, 7)),
            group_idx=_opt_int(_at(f, 8), "group_idx", non_negative=True),
            kv_cache_spec_kind=_opt_str(_at(f, 9), "kv_cache_spec_kind"),
            kv_cache_spec_sliding_window=_opt_int(_at(f, 10), "kv_cache_spec_sliding_window"),
            cache_salt=cache_salt,
        )
    if tag == "BlockRemoved":
        if len(f) < 1:
            raise MalformedEvent("BlockRemoved: no block_hashes")
        return BlockRemoved(
            block_hashes=tuple(hash_value(h) for h in _list(f[0], "block_hashes")),
            medium=(_opt_str(_at(f, 1), "medium") or "").lower(),
            group_idx=_opt_int(_at(f, 2), "group_idx", non_negative=True),
        )
    if tag == "AllBlocksCleared":
        return AllBlocksCleared()
    return None


def decode_batch(payload: bytes, stats: DecodeStats) -> EventBatch | None:
    """A msgpack batch; None (counted) when the batch itself is unreadable. Bad events are skipped and
    counted; the others are kept in order."""
    try:
        raw = _decoder.decode(payload)
    except (msgspec.DecodeError, ValueError, TypeError) as e:
        stats.count("message", f"undecodable msgpack: {e}")
        return None
    if isinstance(raw, dict):
        raw = [raw.get(name) for name in _BATCH_FIELDS]
    if not isinstance(raw, list) or len(raw) < 2:
        stats.count("message", "batch: expected [ts, events, dp_rank] or a map with ts and events")
        return None
    ts, events = raw[0], raw[1]
    if not isinstance(ts, (int, float)) or isinstance(ts, bool) or not isinstance(events, list):
        stats.count("message", "batch: ts must be a number and events an array")
        return None
    rank = _at(raw, 2)
    out: list[Event] = []
    for item in events:
        try:
            event = decode_event(item)
        except MalformedEvent as e:
            stats.count("event", str(e))
            continue
        if event is None:
            stats.count("unknown", "unknown event tag")
            continue
        out.append(event)
    return EventBatch(ts=float(ts), events=tuple(out), data_parallel_rank=rank if isinstance(rank, int) else None)


SEQ = struct.Struct(">Q")
END_OF_REPLAY = (1 << 64) - 1  # the replay end marker: eight 0xFF bytes


def decode_seq(frame: bytes) -> int | None:
    """The sequence number of a message, or None if the frame is shorter than 8 bytes."""
    if len(frame) < 8:
        return None
    return int(SEQ.unpack_from(frame, 0)[0])


def parse_topic(topic: str) -> tuple[str, str]:
    """(pod id, model) from `kv@<pod>@<model>`; (topic, "") when it has another shape. Anything from a NUL
    byte on is metadata, not topic: an SGLang publisher with a snapshot endpoint appends
    `\x00sgl-kv-epoch=<id>` (and on snapshot barriers `\x00sgl-kv-snapshot=<id>`) to the configured topic."""
    parts = topic.split("\x00", 1)[0].split("@")
    if len(parts) == 3:
        return parts[1], parts[2]
    return topic, ""
