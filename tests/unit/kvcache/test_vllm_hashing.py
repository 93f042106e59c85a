from __future__ import annotations

import hashlib
import pickle

import pytest
import xxhash

from llm_epp.kvcache import vllm_hashing as vh


def _cbor_uint(n: int, major: int = 0) -> bytes:
    """Hand-written canonical CBOR head (RFC 8949 §3), independent of cbor2."""
    m = major << 5
    if n < 24:
        return bytes([m | n])
    if n < 0x100:
        return bytes([m | 24, n])
    if n < 0x10000:
        return bytes([m | 25]) + n.to_bytes(2, "big")
    return bytes([m | 26]) + n.to_bytes(4, "big")


def _cbor_block(parent: bytes, tokens: list[int], extra: tuple[str, ...] | None) -> bytes:
    out = _cbor_uint(3, 4) + _cbor_uint(len(parent), 2) + parent
    out += _cbor_uint(len(tokens), 4) + b"".join(_cbor_uint(t) for t in tokens)
    if extra is None:
        out += b"\xf6"
    else:
        out += _cbor_uint(len(extra), 4) + b"".join(_cbor_uint(len(s.encode()), 3) + s.encode() for s in extra)
    return out


def _cbor_text(s: str) -> bytes:
    return _cbor_uint(len(s.encode()), 3) + s.encode()


def test_sha256_cbor_matches_a_hand_encoded_chain() -> None:
    tokens = [*range(100, 108), 300, 70000, 5, 6]  # 12 tokens: 3 blocks of 4
    none = hashlib.sha256(_cbor_text("42")).digest()
    expected = []
    prev = none
    for i in range(3):
        extra = ("adapter", "salt") if i == 0 else ("adapter",)
        prev = hashlib.sha256(_cbor_block(prev, tokens[i * 4 : i * 4 + 4], extra)).digest()
        expected.append(prev)
    got = vh.block_hashes(
        [*tokens, 1, 2], 4, algorithm="sha256_cbor", python_hash_seed="42", lora_name="adapter", cache_salt="salt"
    )
    assert got == expected
    assert vh.none_hash("sha256_cbor", "42") == none


def test_xxhash_cbor_uses_xxh3_128() -> None:
    tokens = [1, 2, 3, 4]
    none = xxhash.xxh3_128_digest(_cbor_text("0"))
    expected = xxhash.xxh3_128_digest(_cbor_block(none, tokens, None))
    assert vh.block_hashes(tokens, 4, algorithm="xxhash_cbor", python_hash_seed="0") == [expected]


@pytest.mark.parametrize(
    ("algorithm", "digest"),
    [("sha256", lambda b: hashlib.sha256(b).digest()), ("xxhash", xxhash.xxh3_128_digest)],
)
def test_pickle_based_algorithms(algorithm, digest) -> None:
    tokens = [7, 8, 9, 10, 11, 12]
    none = digest(pickle.dumps("1", protocol=5))
    first = digest(pickle.dumps((none, (7, 8, 9), None), protocol=5))
    second = digest(pickle.dumps((first, (10, 11, 12), None), protocol=5))
    assert vh.block_hashes(tokens, 3, algorithm=algorithm, python_hash_seed="1") == [first, second]


def test_seed_changes_every_hash_and_only_full_blocks_count() -> None:
    a = vh.block_hashes(list(range(10)), 4, algorithm="sha256_cbor", python_hash_seed="1")
    b = vh.block_hashes(list(range(10)), 4, algorithm="sha256_cbor", python_hash_seed="2")
    assert len(a) == 2 and not set(a) & set(b)


def test_external_hash_is_the_low_64_bits_big_endian() -> None:
    h = bytes(range(32))
    assert vh.external_hash(h) == int.from_bytes(h[24:], "big")


def test_unknown_algorithm_is_named() -> None:
    with pytest.raises(ValueError, match="sha256_cbor"):
        vh.hash_function("md5")
